"""Sparse multi-class EP, SEP and GFITC for GP classification (spec ep-sep-multiclass)."""

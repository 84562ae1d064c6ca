"""Shared site algebra: dense Gaussian sites with diagonal precisions (the B-trick)."""

from gpinfer.sites.dense import DiagonalSiteAlgebra

__all__ = ["DiagonalSiteAlgebra"]

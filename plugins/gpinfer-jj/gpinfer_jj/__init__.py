"""Collapsed JJ / Taylor variational inducing-point classifiers (spec jj-taylor-svi §2)."""

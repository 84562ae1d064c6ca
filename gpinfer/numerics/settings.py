"""Numerical knobs named in one place (never buried as literals in method code)."""

from __future__ import annotations

#: first jitter added to the diagonal (relative to the mean diagonal) when a Cholesky fails
JITTER_START = 1e-10
#: largest relative jitter tried before giving up
JITTER_MAX = 1e-2
#: factor between successive jitter attempts
JITTER_FACTOR = 10.0
#: default number of Gauss-Hermite nodes for expectations under moderate variances
GAUSS_HERMITE_POINTS = 40

"""Shared numerics: Cholesky with jitter escalation, stable normal functions, quadrature."""

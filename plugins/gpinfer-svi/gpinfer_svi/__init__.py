"""svi: stochastic variational inducing-point GP classification (spec jj-taylor-svi §3)."""

"""HMC sampling and annealed importance sampling for ``log Z`` (spec binary §3)."""

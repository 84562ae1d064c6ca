"""gpinfer plugin: Laplace approximation for binary GP classification (entry point ``laplace``)."""

from gpinfer_laplace.evidence import LaplaceEvidence, laplace_gradient
from gpinfer_laplace.method import Laplace
from gpinfer_laplace.sites import LaplaceSites

__all__ = ["Laplace", "LaplaceEvidence", "LaplaceSites", "laplace_gradient"]

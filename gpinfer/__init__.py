"""gpinfer: approximate inference for Gaussian-process classification.

``GPClassifier`` and ``GPRegressor`` are the scikit-learn style entry points; they, and the
sub-packages ``gpinfer.kernels`` and ``gpinfer.likelihoods``, are imported on first use so that
``import gpinfer`` stays light (no scikit-learn, MLflow or Hydra at import time).
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from gpinfer import errors

if TYPE_CHECKING:
    from gpinfer import kernels, likelihoods
    from gpinfer.estimator import GPClassifier
    from gpinfer.regressor import GPRegressor

try:
    __version__: str = _metadata.version("gpinfer")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["GPClassifier", "GPRegressor", "__version__", "errors", "kernels", "likelihoods"]

#: sub-packages reachable as attributes after ``import gpinfer`` (imported on first access)
_SUBMODULES = ("kernels", "likelihoods")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"gpinfer.{name}")
    if name == "GPClassifier":
        from gpinfer.estimator import GPClassifier

        return GPClassifier
    if name == "GPRegressor":
        from gpinfer.regressor import GPRegressor

        return GPRegressor
    raise AttributeError(f"module 'gpinfer' has no attribute {name!r}")

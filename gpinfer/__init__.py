"""gpinfer: approximate inference for Gaussian-process classification.

``GPClassifier`` is the scikit-learn style entry point; it is imported on first use so that
``import gpinfer`` stays light (no scikit-learn, MLflow or Hydra at import time).
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from gpinfer import errors

if TYPE_CHECKING:
    from gpinfer.estimator import GPClassifier
    from gpinfer.regressor import GPRegressor

try:
    __version__: str = _metadata.version("gpinfer")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["GPClassifier", "GPRegressor", "__version__", "errors"]


def __getattr__(name: str) -> Any:
    if name == "GPClassifier":
        from gpinfer.estimator import GPClassifier

        return GPClassifier
    if name == "GPRegressor":
        from gpinfer.regressor import GPRegressor

        return GPRegressor
    raise AttributeError(f"module 'gpinfer' has no attribute {name!r}")

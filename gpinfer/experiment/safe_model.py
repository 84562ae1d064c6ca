"""The fitted estimator in a format that is not pickle: ``skops``.

**Security note.** The MLflow model ``model`` of a run (``model_logging.log_estimator``) is a
cloudpickle: loading it (``mlflow.sklearn.load_model``, ``mlflow.pyfunc.load_model``) runs
whatever code the file says, with the rights of whoever loads it. Load such a model only from a
store whose writers you trust. For everyone else each run also logs the artifact
``model_skops/model.skops`` (``log_skops``): the same deployable model as ``model``
(``model_logging.deployable_model``: a scikit-learn ``Pipeline`` that standardises the raw
features, then the fitted estimator) in scikit-learn's ``skops`` format, which stores arrays
as ``.npy`` (never pickled) and the objects as a tree of type names and values.
``load_skops`` rebuilds only the classes of gpinfer and of its registered plugins (code
installed here, not taken from the file), the scikit-learn types of that pipeline
(``DEPLOYABLE_TYPES``) and what skops trusts by default, and refuses a file naming any other
type unless the caller trusts it by name::

    from mlflow.artifacts import download_artifacts
    from gpinfer.experiment.safe_model import load_skops

    path = download_artifacts(run_id=run_id, artifact_path="model_skops/model.skops")
    model = load_skops(path)              # predict_proba(X_raw): the MLflow model's probabilities

``save_skops`` / ``load_skops`` work on any fitted ``GPClassifier`` / ``GPRegressor`` and on
such a pipeline.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpinfer.errors import InputError

if TYPE_CHECKING:
    from gpinfer.experiment.tracking import RunLogger

__all__ = ["DEPLOYABLE_TYPES", "SKOPS_DIR", "SKOPS_FILE", "gpinfer_packages", "import_skops_io",
           "load_skops", "log_skops", "save_skops"]

#: the artifact ``<SKOPS_DIR>/<SKOPS_FILE>`` of every run with ``mlflow.log_model=true``
SKOPS_DIR = "model_skops"
SKOPS_FILE = "model.skops"

#: scikit-learn's types in a run's deployable model (``model_logging.deployable_model``: the
#: pipeline, its standardising step, a regressor's target scaling), trusted by ``load_skops``
#: whatever skops trusts by default; plain data-holding estimators without user code
DEPLOYABLE_TYPES = frozenset({
    "sklearn.pipeline.Pipeline",
    "sklearn.preprocessing._data.StandardScaler",
    "sklearn.compose._target.TransformedTargetRegressor",
})


#: top-level packages that skops' import would import and does not need (see
#: ``import_skops_io``)
_NOT_FOR_SKOPS = ("torch", "pytest", "_pytest")


class _Refuse(importlib.abc.MetaPathFinder):
    """An import finder that refuses ``packages`` (``ImportError``), as if not installed."""

    def __init__(self, packages: Iterable[str]) -> None:
        self.packages = frozenset(packages)

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.split(".", 1)[0] in self.packages:
            raise ImportError(f"{name} is not imported for skops' list of trusted types")
        return None


def import_skops_io() -> ModuleType:
    """``skops.io``, imported without importing PyTorch or pytest where they are not imported
    yet.

    The import walks every scikit-learn package to list the estimators it trusts. With PyTorch
    installed that walk imports it (``sklearn.externals.array_api_compat.torch``): 1.3 s of a
    3.1 s import; with pytest installed it imports pytest (``sklearn.utils._testing``'s test
    markers, optional there): 0.1 s CPU and over a second of wall time on a busy machine. The
    list is the same without them. A model holding torch arrays is a model whose run imported
    PyTorch already; later imports of either are not affected.
    """
    if "skops.io" in sys.modules:
        return sys.modules["skops.io"]
    refused = [name for name in _NOT_FOR_SKOPS if name not in sys.modules]
    if not refused:
        return importlib.import_module("skops.io")
    finder = _Refuse(refused)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("skops.io")
    finally:
        sys.meta_path.remove(finder)


def save_skops(estimator: Any, path: str | os.PathLike[str]) -> Path:
    """Write the fitted ``estimator`` to ``path`` in the ``skops`` format (no pickle)."""
    sio = import_skops_io()

    path = Path(path)
    sio.dump(estimator, path)
    return path


def gpinfer_packages() -> set[str]:
    """Top-level packages whose classes ``load_skops`` rebuilds: ``gpinfer`` and those of every
    registered plugin (methods, likelihoods, kernels, datasets)."""
    from gpinfer import registry

    packages = {"gpinfer"}
    for group in registry.GROUPS:
        for entry in registry.entries(group):
            packages.add(entry.value.split(":", 1)[0].split(".", 1)[0])
    return packages


def _own(type_name: str, packages: Iterable[str]) -> bool:
    return type_name.split(".", 1)[0] in set(packages)


def load_skops(path: str | os.PathLike[str], trusted: Sequence[str] = ()) -> Any:
    """The estimator saved by ``save_skops``, rebuilt without pickle.

    The classes of gpinfer and its registered plugins and the scikit-learn types of a run's
    deployable model (``DEPLOYABLE_TYPES``) are rebuilt (besides what skops trusts by default:
    numpy, scipy, scikit-learn's estimators and builtin containers); any other type the file
    names must be listed in ``trusted`` (full names, e.g. ``"mymodule.MyKernel"``), else
    ``InputError`` lists them.
    """
    sio = import_skops_io()
    path = Path(path)
    try:
        named = sio.get_untrusted_types(file=path)
    except Exception as exc:  # noqa: BLE001 - not a zip, no schema, ...: one clear line
        raise InputError(f"{str(path)!r} is not a readable .skops file: "
                         f"{type(exc).__name__}: {exc}") from exc
    packages = gpinfer_packages()
    allowed = DEPLOYABLE_TYPES | set(trusted)
    foreign = sorted(t for t in named if not _own(t, packages) and t not in allowed)
    if foreign:
        raise InputError(
            f"{str(path)!r} names types that are neither gpinfer's nor trusted: "
            f"{', '.join(foreign)}; load it only if you trust them: "
            "load_skops(path, trusted=[...])")
    return sio.load(path, trusted=list(named))


def log_skops(logger: RunLogger, model: Any, out_dir: str | os.PathLike[str]) -> str:
    """Save ``model`` (the run's deployable model, or a bare fitted estimator) as
    ``<out_dir>/model.skops`` and log it as the run's artifact ``model_skops/model.skops``;
    returns that artifact path."""
    path = save_skops(model, Path(out_dir) / SKOPS_FILE)
    logger.log_artifact(path, artifact_path=SKOPS_DIR)
    return f"{SKOPS_DIR}/{SKOPS_FILE}"

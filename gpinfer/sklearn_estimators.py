"""``GPClassifier`` and ``GPRegressor``: the estimators of ``gpinfer.estimator`` and
``gpinfer.regressor`` with scikit-learn's base classes (``get_params``, ``set_params``, ``clone``,
``score``, tags, ``GridSearchCV``).

The fitting and prediction code lives in ``GPClassifierCore`` and ``GPRegressorCore``, which do
not import scikit-learn (its import costs about 1.3 CPU s, most of it scipy.stats and pandas):
the experiment runner fits a core and, where a scikit-learn model is published, turns it into
the estimator here with ``from_core``. The classes keep the public names
``gpinfer.estimator.GPClassifier`` and ``gpinfer.regressor.GPRegressor`` (their ``__module__``),
so pickles, skops files and reprs are those of before the split.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifierCore, _load_method
from gpinfer.kernels.base import Kernel
from gpinfer.regressor import GPRegressorCore

__all__ = ["GPClassifier", "GPRegressor"]

_E = TypeVar("_E")


def _adopt(cls: type[_E], core: Any, core_cls: type) -> _E:
    """``core`` (a ``core_cls``, fitted or not) as an instance of ``cls`` sharing its parameters
    and fitted attributes (no copy of the arrays)."""
    if not isinstance(core, core_cls):
        raise TypeError(f"{cls.__name__}.from_core needs a {core_cls.__name__}; "
                        f"got {type(core).__name__}")
    estimator = cls.__new__(cls)
    estimator.__dict__.update(vars(core))
    return estimator


class _EstimatorParams(BaseEstimator):
    """scikit-learn's parameter handling for both estimators, with nested ``kernel__*`` names
    checked against the kernel before any is set."""

    def set_params(self, **params: Any) -> Any:
        """scikit-learn's ``set_params``; nested ``kernel__*`` names need a ``Kernel`` object as
        ``kernel`` (``InputError`` naming the fix for a kernel name)."""
        nested = sorted(key for key in params if key.startswith("kernel__"))
        kernel = params.get("kernel", getattr(self, "kernel", None))
        if nested and not isinstance(kernel, Kernel):
            raise InputError(
                f"{', '.join(nested)}: nested kernel parameters need a Kernel object as kernel, "
                f"not {kernel!r}; pass e.g. kernel=gpinfer.kernels.RBF() (then "
                "kernel__lengthscale sets its lengthscale)"
            )
        if nested and isinstance(kernel, Kernel):
            known = kernel.get_params(deep=True)
            unknown = [key for key in nested if key.removeprefix("kernel__") not in known]
            if unknown:
                raise InputError(
                    f"invalid parameter(s) {unknown} for {type(self).__name__}: kernel "
                    f"{type(kernel).__name__} has the parameters "
                    f"{', '.join('kernel__' + k for k in known)}"
                )
        return super().set_params(**params)


class GPClassifier(ClassifierMixin, GPClassifierCore, _EstimatorParams):
    """Gaussian-process classification with any registered approximate-inference method, as a
    scikit-learn estimator: ``GPClassifierCore`` (its parameters, attributes and methods) with
    scikit-learn's base classes (``get_params``, ``set_params``, ``clone``, ``score``, tags).
    """

    @classmethod
    def from_core(cls, core: GPClassifierCore) -> GPClassifier:
        """A ``GPClassifierCore`` (the runner's, fitted) as a ``GPClassifier``."""
        return _adopt(cls, core, GPClassifierCore)

    def __sklearn_tags__(self) -> Any:
        """Estimator tags; ``multi_class`` follows the method's ``multiclass`` declaration."""
        tags = super().__sklearn_tags__()
        try:
            method_cls = _load_method(self.method)
        except Exception:  # tags must never raise; fit reports a bad method name properly
            return tags
        tags.classifier_tags.multi_class = bool(method_cls.multiclass)
        return tags


class GPRegressor(RegressorMixin, GPRegressorCore, _EstimatorParams):
    """Gaussian-process regression with any registered method whose ``tasks`` include
    regression, as a scikit-learn estimator: ``GPRegressorCore`` (its parameters, attributes
    and methods) with scikit-learn's base classes."""

    @classmethod
    def from_core(cls, core: GPRegressorCore) -> GPRegressor:
        """A ``GPRegressorCore`` (the runner's, fitted) as a ``GPRegressor``."""
        return _adopt(cls, core, GPRegressorCore)


# the public names (pickles, skops' trusted types and reprs name the class by its module)
GPClassifier.__module__ = "gpinfer.estimator"
GPRegressor.__module__ = "gpinfer.regressor"


def as_sklearn(model: GPClassifierCore | GPRegressorCore) -> GPClassifier | GPRegressor:
    """A core estimator (fitted or not) as its scikit-learn estimator; itself when it is one."""
    if isinstance(model, GPClassifier | GPRegressor):
        return model
    if isinstance(model, GPClassifierCore):
        return GPClassifier.from_core(model)
    return GPRegressor.from_core(model)

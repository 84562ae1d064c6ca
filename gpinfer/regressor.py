"""``GPRegressor``: the scikit-learn style estimator for GP regression (beside ``GPClassifier``).

``GPRegressor(method="pep", M=50).fit(X, y).predict(X_test, return_std=True)`` looks the method
up in the registry, checks that it handles regression, builds a ``Problem`` with real targets
``y [N]`` and a Gaussian likelihood, and predicts through the fitted posterior:
``predict -> mean [N*]`` (and ``std [N*]`` of ``y*``, noise included, with ``return_std``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

import numpy as np

from gpinfer.errors import InputError
from gpinfer.estimator import _GPEstimatorBase
from gpinfer.interfaces import FitCallback, Likelihood, Method
from gpinfer.likelihoods.gaussian import Gaussian
from gpinfer.validation import check_targets

if TYPE_CHECKING:
    from gpinfer.sklearn_estimators import GPRegressor

Array = np.ndarray

__all__ = ["GPRegressor", "GPRegressorCore", "check_targets"]


def __getattr__(name: str) -> Any:
    """``GPRegressor`` (scikit-learn's base classes over ``GPRegressorCore``) is defined in
    ``gpinfer.sklearn_estimators`` and imported on first use: importing this module (the
    runner's fit path) does not import scikit-learn."""
    if name == "GPRegressor":
        from gpinfer.sklearn_estimators import GPRegressor

        return GPRegressor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: parameters added after the first release of ``GPRegressor``, with their defaults
_ADDED_PARAMETERS: dict[str, Any] = {"standardize": False, "backend": None, "device": None,
                                     "dtype": None}


class GPRegressorCore(_GPEstimatorBase):
    """Gaussian-process regression with any registered method whose ``tasks`` include regression.

    ``GPRegressorCore`` fits and predicts without scikit-learn (the experiment runner's
    estimator); ``gpinfer.GPRegressor`` is the same estimator with scikit-learn's base classes
    (``gpinfer.sklearn_estimators``).

    Parameters are those of ``GPClassifier`` (``method``, ``M``, ``kernel``, ``likelihood``,
    ``optimize``, ``max_iter``, ``batch_size``, ``random_state``, ``method_options``,
    ``verbose``, ``baseline_failure``, and early stopping: ``validation_fraction`` (a random,
    not stratified, part), ``validation_interval``, ``n_iter_no_change``, ``refit`` (not
    ``"average"``: each fold learns its own noise variance),
    ``validation_folds``, ``refit_rule``, ``choice_rule``: not ``"log_one_se"``, the NLL of a
    density can be negative, ``refine_iter``: for a method with ``Method.refines``),
    ``standardize``, ``backend``, ``device``, ``dtype``), fitted by
    the same sequence, except that ``likelihood`` defaults to a Gaussian
    with noise variance ``0.01 var(y)`` (the reference initialisation ``sigma = 0.1 std(y)``),
    that the fit guard's baseline is a Gaussian with the targets' mean and variance, and that
    ``standardize`` defaults to False (the inputs as given, as before the parameter existed;
    True or ``"auto"``: as the classifier's, the scaling kept as ``scaler_`` and applied at
    prediction; the targets are never rescaled). ``backend``/``device``/``dtype`` are checked
    against the method before training (the same ``InputError``s as the classifier's); the
    regression methods installed here (pep) run on numpy only.

    Attributes (after ``fit``): ``n_features_in_``, ``kernel_``, ``likelihood_``,
    ``log_evidence_``, ``n_iter_``, ``history_``, ``posterior_``, ``method_``, ``fit_result_``,
    ``feature_names_in_``, ``scaler_``, ``backend_`` and the early-stopping ones, as
    ``GPClassifier``.
    """

    def __init__(
        self,
        method: str = "pep",
        M: Any = None,
        kernel: Any = "rbf",
        likelihood: Any = None,
        optimize: bool | None = True,
        max_iter: int = 100,
        batch_size: int | None = None,
        random_state: Any = None,
        method_options: Any = None,
        verbose: bool | str = False,
        validation_fraction: float | None = None,
        validation_interval: int = 1,
        n_iter_no_change: int = 10,
        refit: bool | str = "auto",
        validation_folds: int | None = None,
        refit_rule: str = "iterations",
        choice_rule: str = "one_se",
        refine_iter: int | None = None,
        choice_refine_iter: int = 0,
        standardize: bool | str = False,
        backend: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        baseline_failure: str = "raise",
    ):
        self._store_params(locals())

    _task = "regression"
    _default_likelihood = "gaussian"

    def _build_likelihood(self, method_cls: type[Method], n_classes: int, y: Array
                          ) -> Likelihood:
        """``likelihood`` (a copy, or made from its name), else a Gaussian with noise variance
        ``0.01 var(y)`` of the rows' targets ``y [n]``."""
        from gpinfer.likelihoods import Gaussian, make_likelihood

        if self.likelihood is None:
            return Gaussian(variance=max(0.01 * float(np.var(y)), 1e-6))
        import copy

        lik = (copy.deepcopy(self.likelihood) if isinstance(self.likelihood, Likelihood)
               else make_likelihood(self.likelihood))
        if lik.task != "regression":
            raise InputError(f"likelihood {type(lik).__name__} is for {lik.task}; "
                             "GPRegressor needs a regression likelihood (e.g. gaussian)")
        return lik

    def _targets(self, y: Array) -> tuple[Array, Array | None]:
        """Real targets ``y [N]`` as float64 (``check_targets``); no classes."""
        return check_targets(y), None

    def fit(self, X: Any, y: Any, sample_weight: Any = None,
            callback: FitCallback | None = None) -> Self:
        """Fit on ``X [N, D]`` and real targets ``y [N]``; validated before training (the same
        sequence as ``GPClassifier.fit``). ``sample_weight`` as in ``GPClassifier.fit``
        (weights other than 0/1 need a method with ``supports_sample_weight``)."""
        self._fit(X, y, sample_weight, callback)
        return self

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A regressor pickled before it had ``standardize``, ``backend``, ``device`` and
        ``dtype`` loads with their defaults (``get_params``, ``clone`` and a refit work)."""
        state = {**_ADDED_PARAMETERS, **state}
        parent = getattr(super(), "__setstate__", None)  # scikit-learn's, on GPRegressor
        if parent is None:
            self.__dict__.update(state)
        else:
            parent(state)

    def predict(self, X: Any, return_std: bool = False) -> Array | tuple[Array, Array]:
        """Predictive mean ``[N*]`` of ``y*``; with ``return_std`` also its std ``[N*]``
        (latent variance plus the noise variance); not fitted: scikit-learn's
        ``NotFittedError`` (``predict_f``)."""
        mean, var = self.predict_f(X)
        mean, var = mean[:, 0], var[:, 0]
        if not return_std:
            return mean
        lik = self.likelihood_
        if not isinstance(lik, Gaussian):
            raise InputError(f"return_std needs the Gaussian likelihood; got {type(lik).__name__}")
        return mean, np.sqrt(var + float(lik.variance))

    def log_predictive(self, X: Any, y: Any) -> Array:
        """``log p(y_n | x_n, data)`` for test points, ``[N*]``."""
        mean, var = self.predict_f(X)
        return self.likelihood_.log_predictive(check_targets(y), mean[:, 0], var[:, 0])

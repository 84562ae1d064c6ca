"""A scikit-learn style estimator over every registered inference method.

``GPClassifier(method="ep", M=0.1).fit(X, y).predict_proba(X_test)`` looks the method up in the
registry (entry-point group ``gpinfer.methods``), validates the problem against what the method
declares, builds a ``Problem`` and calls the method's ``fit``. Prediction goes through the one
fitted-posterior type, so it never depends on the method.

Shapes: ``X [N, D]``, ``y [N]`` (any label type), ``classes_ [C]``, ``predict_proba -> [N*, C]``,
``predict_f -> (mean [N*, L], var [N*, L])`` with ``L = 1`` for binary and ``C`` for multi-class.

``backend``, ``device`` and ``dtype`` choose the array backend of a method that has one
(``Method.backends``: numpy, or PyTorch on a CPU or a CUDA GPU; ``gpinfer.backend``); they are
checked against the method and its likelihood's expectation rule before any training. Inputs
may be torch tensors: they are brought to host memory (the methods stream batches to the
device) and predictions are numpy arrays.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Self, cast

import numpy as np

from gpinfer.allocator import prime_allocator
from gpinfer.backend import ops
from gpinfer.backend.choice import Backend, resolve_backend
from gpinfer.data.limits import dense_limit_gb
from gpinfer.data.source import ColumnStats, RowSource, SourceRows, as_source, sample_rows
from gpinfer.errors import InputError, NumericalError
from gpinfer.fit_guard import (
    BestIterate,
    check_against_baseline,
    check_baseline_failure,
    check_objective_limit,
    internal_values,
    posterior_kernel,
    restore_best,
    tracker_for,
)
from gpinfer.interfaces import FitCallback, FitResult, Likelihood, Method, Problem
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.initialisation import set_lengthscales, standardised_lengthscale
from gpinfer.out_of_core import (
    check_group_shards,
    check_out_of_core,
    check_unit_weights,
    checked_inputs,
    fitted_scaler,
    predicted_chunks,
    scaled_rows,
    start_lengthscale,
    take_rows,
)
from gpinfer.posterior import AveragedPosterior, Posterior, class_columns
from gpinfer.progress import progress_callback
from gpinfer.threads import blas_threads, training_threads
from gpinfer.training import distributed
from gpinfer.training.early_stopping import (
    EarlyStopping,
    RefitStop,
    ValidationChoice,
    ValidationMonitor,
    averaged_result,
    mean_nll,
    renumbered,
    validation_splits,
)
from gpinfer.validation import (
    check_features_vary,
    check_inducing,
    check_method_compatible,
    check_sample_weight,
    check_weight_support,
    check_X,
    check_X_y,
    class_counts,
    encode_labels,
    feature_names,
    host_input,
    tensor_device,
)

if TYPE_CHECKING:
    from gpinfer.sklearn_estimators import GPClassifier

Array = np.ndarray
#: ``setup(X [n, D], y [n], max_iter)``: a method and its problem on those rows (``max_iter``
#: None: the estimator's)
Setup = Callable[[Any, "int | None"], tuple[Method, Problem]]

__all__ = ["GPClassifier", "GPClassifierCore"]


def __getattr__(name: str) -> Any:
    """``GPClassifier`` (scikit-learn's base classes over ``GPClassifierCore``) is defined in
    ``gpinfer.sklearn_estimators`` and imported on first use, so that importing this module
    (the runner's fit path) does not import scikit-learn."""
    if name == "GPClassifier":
        from gpinfer.sklearn_estimators import GPClassifier

        return GPClassifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def class_probabilities(P: Any, n_rows: int, n_classes: int, method: object = "?") -> Array:
    """A posterior's ``predict_proba`` output as ``[N*, C]`` class probabilities: a binary
    method's ``p(class 1)`` (``[N*]`` or ``[N*, 1]``) becomes two columns, negative values are
    clipped and rows renormalised to sum to one. ``RuntimeError`` for any other shape."""
    P = class_columns(P, n_classes)
    if P.shape != (n_rows, n_classes):
        raise RuntimeError(
            f"method {method!r} predicted probabilities of shape {P.shape}; "
            f"expected {(n_rows, n_classes)}"
        )
    P = np.clip(P, 0.0, None)
    return P / P.sum(axis=1, keepdims=True)


def _load_method(spec: Any) -> type[Method]:
    """The ``Method`` subclass for ``spec``: a registered name, or a ``Method`` subclass itself.

    Passing the class lets a plugin author try a method before registering it.
    """
    from gpinfer import registry  # resolved at call time: tests may substitute load_method

    if isinstance(spec, type) and issubclass(spec, Method):
        return spec
    if not isinstance(spec, str):
        raise InputError(
            f"method must be a registered method name (str) or a Method subclass; got {spec!r}"
        )
    return registry.load_method(spec)


def _method_name(method_cls: type[Method], spec: Any) -> str:
    """The name a method is reported under (its registered name, else its class name)."""
    return method_cls.name or getattr(spec, "__name__", str(spec))


def _setting_name(value: Any) -> Any:
    """A ``device`` or ``dtype`` given as an object (``torch.device("cuda")``, ``np.float32``,
    ``torch.float32``) as its name; anything else unchanged (``resolve_backend`` judges it)."""
    if value is None or isinstance(value, str):
        return value
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        return str(value).removeprefix("torch.")
    try:
        return np.dtype(value).name
    except TypeError:
        return value


def _check_feature_names(estimator: Any, X: Any) -> None:
    """scikit-learn's check of ``X``'s column names against ``feature_names_in_`` at prediction
    (a ``ValueError`` for other names, a ``UserWarning`` when one side has none)."""
    try:
        from sklearn.utils.validation import _check_feature_names as check
    except ImportError:  # scikit-learn < 1.6: a method of BaseEstimator
        estimator._check_feature_names(X, reset=False)
        return
    check(estimator, X, reset=False)


def _check_refinable(settings: EarlyStopping, method_cls: type[Method], method_name: str) -> None:
    """``InputError`` for a ``choice_refine_iter`` or ``refine_iter`` that ``method_cls``
    cannot run (``Method.refines``)."""
    if method_cls.refines:
        return
    for name, count in (("choice_refine_iter", settings.choice_refine_iter),
                        ("refine_iter", settings.refine_iter)):
        if count:
            raise InputError(f"{name}={count}: method {method_name!r} cannot refine a fit at "
                             f"fixed hyper-parameters (Method.refines); use {name}=0")


class _GPEstimatorBase:
    """What ``GPClassifier`` and ``GPRegressor`` share: building the problem, running the
    method, the fitted attributes and latent prediction. Subclasses keep their own explicit
    ``__init__`` (scikit-learn reads the parameters from its signature), which hands its
    ``locals()`` to ``_store_params``.

    No scikit-learn here: ``GPClassifierCore`` / ``GPRegressorCore`` fit and predict without
    it (the runner fits them, so a run's process never imports scikit-learn), and
    ``gpinfer.sklearn_estimators`` adds scikit-learn's base classes (``get_params``,
    ``set_params``, ``clone``, tags) to make ``GPClassifier`` / ``GPRegressor``.
    """

    # the parameters every subclass's ``__init__`` sets
    method: Any
    M: Any
    kernel: Any
    likelihood: Any
    optimize: bool | None
    max_iter: int
    batch_size: int | None
    random_state: Any
    method_options: Mapping[str, Any] | None
    validation_fraction: float | None
    validation_interval: int
    n_iter_no_change: int
    refit: bool | str
    validation_folds: int | None
    refit_rule: str
    choice_rule: str
    refine_iter: int | None
    choice_refine_iter: int
    standardize: bool | str
    backend: str | None
    device: Any
    dtype: Any
    baseline_failure: str
    verbose: bool | str
    #: the task the estimator fits (``Method.tasks``) and the likelihood name checked against
    #: the method when ``likelihood`` is None (None: the method's own default)
    _task: ClassVar[str]
    _default_likelihood: ClassVar[str | None] = None

    def _store_params(self, values: Mapping[str, Any]) -> None:
        """Each argument of the subclass's ``__init__`` (its ``locals()``) as the attribute of
        its name, unchanged (scikit-learn's convention: ``__init__`` only stores)."""
        for name, value in values.items():
            if name != "self" and not name.startswith("__"):
                setattr(self, name, value)

    def _build_kernel(self, input_dim: int) -> Kernel:
        if isinstance(self.kernel, Kernel):
            return self.kernel.copy()
        if isinstance(self.kernel, str):
            from gpinfer.kernels import make_kernel

            return make_kernel(self.kernel, input_dim=input_dim, ard=False)
        raise InputError(f"kernel must be a kernel name or a Kernel object; got {self.kernel!r}")

    def _likelihood_name(self) -> str | None:
        """The likelihood name to check against the method (``None`` for an object without one)."""
        if self.likelihood is None:
            return None
        if isinstance(self.likelihood, str):
            return self.likelihood
        if isinstance(self.likelihood, Likelihood):
            # an unnamed custom object is checked by its capabilities (likelihood_requirements)
            return self.likelihood.name or None
        raise InputError(
            f"likelihood must be None, a likelihood name or a Likelihood object; "
            f"got {self.likelihood!r}"
        )

    def _check_settings(self) -> None:
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, numbers.Integral):
            raise InputError(f"max_iter must be an int >= 1; got {self.max_iter!r}")
        if self.max_iter < 1:
            raise InputError(f"max_iter must be an int >= 1; got {self.max_iter!r}")
        if self.optimize is not None and not isinstance(self.optimize, bool | np.bool_):
            raise InputError(
                f"optimize must be True, False or None (the method's default); got "
                f"{self.optimize!r}"
            )
        if self.method_options is not None and not isinstance(self.method_options, Mapping):
            raise InputError(f"method_options must be a dict or None; got {self.method_options!r}")
        check_baseline_failure(self.baseline_failure)
        blas_threads()  # the thread policy's setting is checked before any training

    def _resolve_backend(self) -> Backend:
        """The ``Backend`` of ``backend``/``device``/``dtype`` (``InputError`` naming the fix:
        an unknown setting, torch or CUDA missing), before any training; the method and its
        likelihood's rule are checked on it by ``check_method_compatible``."""
        return resolve_backend(self.backend, _setting_name(self.device),
                               _setting_name(self.dtype))

    def _host_inputs(self, **arrays: Any) -> list[Any]:
        """The arrays as given, torch tensors brought to host numpy arrays: allowed for a
        method with a torch backend, an ``InputError`` naming the fix for a numpy-only one."""
        if all(tensor_device(a) is None for a in arrays.values()):
            return list(arrays.values())
        method_cls = _load_method(self.method)
        name = _method_name(method_cls, self.method)
        backends = tuple(getattr(method_cls, "backends", ("numpy",)))
        return [host_input(a, key, name, backends) for key, a in arrays.items()]

    def _rng(self) -> np.random.Generator:
        seed = self.random_state
        if isinstance(seed, np.random.RandomState):
            seed = int(seed.randint(np.iinfo(np.int32).max))
        try:
            return np.random.default_rng(seed)
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"random_state must be None, an int or a numpy Generator; got {seed!r}"
            ) from exc

    def _instantiate(self, method_cls: type[Method]) -> Method:
        """The method object with ``method_options``; unknown options are an ``InputError``."""
        try:
            return method_cls(**dict(self.method_options or {}))
        except (TypeError, ValueError) as exc:
            raise InputError(str(exc)) from exc

    def _problem(
        self, X: Array, y: Array, n_classes: int, kernel: Kernel, likelihood: Likelihood,
        inducing: int | Array | None, method_cls: type[Method] | None = None,
        backend: Backend | None = None, sample_weight: Array | None = None,
        max_iter: int | None = None,
    ) -> Problem:
        """The validated ``Problem`` handed to the method's ``fit``; ``optimize=None`` means the
        method's ``optimize_by_default`` (True when ``method_cls`` is not given); ``backend``:
        from ``_resolve_backend`` (None: numpy); ``sample_weight [N]`` from ``_weighted_rows``;
        ``max_iter``: None for the estimator's (the refit after early stopping gives the chosen
        number)."""
        optimize = self.optimize
        if optimize is None:
            optimize = getattr(method_cls, "optimize_by_default", True)
        return Problem(
            X=X,
            y=y,
            n_classes=n_classes,
            kernel=kernel,
            likelihood=likelihood,
            inducing=inducing,
            optimize=bool(optimize),
            max_iter=int(self.max_iter if max_iter is None else max_iter),
            batch_size=None if self.batch_size is None else int(self.batch_size),
            rng=self._rng(),
            **({} if backend is None else {"backend": backend}),
            sample_weight=sample_weight,
            kernel_given=isinstance(self.kernel, Kernel),
        )

    def _weighted_rows(
        self, sample_weight: Any, X: Array, y: Array, method_cls: type[Method], method_name: str
    ) -> tuple[Array, Array, Array | None]:
        """``(X [N', D], y [N'], weights [N'] or None)``: the rows of positive weight (a row of
        weight zero is a row removed, for every method) and their weights, ``None`` when they
        are all one. Other weights need a method with ``supports_sample_weight``; every
        ``InputError`` comes before training."""
        weights = check_sample_weight(sample_weight, X.shape[0])
        if weights is None:
            return X, y, None
        keep = weights > 0
        if not keep.all():
            X, y, weights = X[keep], y[keep], weights[keep]
        if np.all(weights == 1.0):
            return X, y, None
        check_weight_support(method_cls, method_name)
        return X, y, weights

    def _set_feature_names(self, X: Any) -> None:
        """``feature_names_in_ [D]`` from a DataFrame's string column names (``InputError``
        for duplicate or non-string ones); removed for any other input, as scikit-learn does."""
        names = feature_names(X)
        if names is None:
            self.__dict__.pop("feature_names_in_", None)
        else:
            self.feature_names_in_ = names

    def _set_early_stopping(self, result: FitResult, early_stopping: bool) -> None:
        """``best_iteration_``, ``validation_scores_`` and ``best_validation_score_`` (the names
        of ``MLPClassifier``), all ``None`` without early stopping. A score is scikit-learn's
        kind, higher is better: the negative mean validation NLL of a checked iteration (the
        curve that chose the number of iterations, ``fit_result_.state["val_nll"]``, averaged
        over the folds where there are several; ``val_nll`` in ``history_`` for a fit that kept
        its best validation iterate)."""
        if not early_stopping:
            self.best_iteration_ = self.validation_scores_ = self.best_validation_score_ = None
            return
        curve = result.state.get("val_nll") if isinstance(result.state, Mapping) else None
        if curve is not None:
            self.validation_scores_ = [-float(v) for v in np.asarray(curve).reshape(-1)]
        else:
            self.validation_scores_ = [-float(h["val_nll"]) for h in result.history
                                       if "val_nll" in h]
        found = result.diagnostics
        best = found.get("best_iteration", found.get("best_val_iteration"))
        self.best_iteration_ = None if best is None else int(best)
        best_nll = found.get("best_val_nll")
        self.best_validation_score_ = None if best_nll is None else -float(best_nll)

    def _early_stopping(self, y: Array, n_classes: int, method_cls: type[Method]
                        ) -> tuple[EarlyStopping, list[tuple[Array, Array]]] | None:
        """The early-stopping settings, ``refit="auto"`` resolved to ``method_cls``'s rule
        (``EarlyStopping.resolved``, ``Method.early_stopping_rule``), and the ``(train,
        validation)`` row splits of ``y [N]`` (one hold-out, or K folds:
        ``validation_splits``); ``None`` without ``validation_fraction``. ``InputError`` for
        bad settings, before any training."""
        settings = EarlyStopping.from_settings(
            self.validation_fraction, self.validation_interval, self.n_iter_no_change,
            self.refit, self.validation_folds, self.refit_rule, self.choice_rule,
            self.refine_iter, self.choice_refine_iter)
        if settings is None:
            return None
        settings = settings.resolved(method_cls.early_stopping_rule, classifier=bool(n_classes))
        if not n_classes and settings.choice_rule == "log_one_se":
            raise InputError("choice_rule='log_one_se' needs a positive validation NLL; a "
                             "regression's (a density's) can be negative: use 'one_se'")
        if not n_classes and settings.averages:
            raise InputError("refit='average' is for classifiers (the mean of the folds' class "
                             "probabilities); a regressor's folds learn their own noise "
                             "variances: use refit=True")
        return settings, validation_splits(y, settings, self._rng(), n_classes)

    def _run(self, method: Method, method_name: str, problem: Problem,
             callback: FitCallback | None, ranks_iterates: bool = True
             ) -> tuple[FitResult, BestIterate]:
        """``method.fit(problem)`` under the fit guard's ``BestIterate`` (wrapping ``callback``;
        ``ranks_iterates=False`` where a validation monitor ranks them), its result checked;
        returns the result and the tracker."""
        tracker = tracker_for(type(method), callback, method_name, problem.X, problem.y,
                              self._rng(), minibatch=problem.batch_size is not None,
                              ranks_iterates=ranks_iterates,
                              sample_weight=problem.sample_weight)
        with training_threads():
            result = method.fit(problem, tracker)
        if not isinstance(result, FitResult):
            raise TypeError(
                f"method {method_name!r} returned {type(result).__name__} from fit; "
                "a method's fit must return gpinfer.interfaces.FitResult"
            )
        check_objective_limit(float(result.log_evidence), type(method).objective_limit,
                              method_name, problem.n)
        return result, tracker

    def _fit_plain(self, method: Method, method_name: str, problem: Problem,
                   callback: FitCallback | None) -> FitResult:
        """One fit, the best iterate restored by the fit guard where the method allows it."""
        result, tracker = self._run(method, method_name, problem, callback)
        if type(method).restore_best_iterate:
            result = restore_best(result, tracker)
        return result

    def _fit_validated(
        self, first: tuple[Method, Problem], setup: Setup, X: Array, y: Array, method_name: str,
        callback: FitCallback | None, settings: EarlyStopping, splits: list[tuple[Array, Array]],
    ) -> tuple[Method, Problem, FitResult]:
        """Early stopping (``gpinfer.training.early_stopping``): one monitored fit per split
        (``first`` is the first split's method and problem), the number of iterations chosen on
        their validation NLL, then, with ``refit``, a fit on all of ``X [N, D]``, ``y [N]`` for
        that many iterations (``setup(rows, max_iter)`` builds a method and its problem on
        ``X[rows]``), or with ``refit="average"`` the average of the fits' best iterates
        (``averaged_result``; the returned problem is that of all the rows). The held-out
        rows live only in this call (never pickled with the fitted model). Returns the fitted
        model's method, problem and result."""
        _check_refinable(settings, type(first[0]), method_name)
        method, problem, monitors, results, offset = self._fit_splits(
            first, setup, X, y, method_name, callback, settings, splits)
        choice = ValidationChoice(monitors, settings.choice_rule)
        if settings.averages:  # the fit guard judges the average on all the rows
            averaged = averaged_result(monitors, results, choice)
            if settings.refine_iter:  # each member's posterior on all the rows
                averaged = self._refine_members(method, method_name, setup, averaged,
                                                int(settings.refine_iter))
            return method, setup(slice(None), None)[1], averaged
        if not settings.refit:
            return method, problem, monitors[0].restore(results[-1])
        return self._refit_all(method, problem, setup, method_name, callback, settings, choice,
                               monitors, offset)

    def _fit_splits(
        self, first: tuple[Method, Problem], setup: Setup, X: Array, y: Array, method_name: str,
        callback: FitCallback | None, settings: EarlyStopping, splits: list[tuple[Array, Array]],
    ) -> tuple[Method, Problem, list[ValidationMonitor], list[FitResult], int]:
        """One monitored fit per split ``(train, val)`` of the rows of ``X [N, D]``, ``y [N]``
        (``first``: the first split's method and problem; the callback's iterations numbered
        on across folds). Returns the last split's method and problem, the monitors and results
        per split, and the number of iterations reported."""
        monitors: list[ValidationMonitor] = []
        results: list[FitResult] = []
        several = len(splits) > 1
        offset = 0
        for f, (train, val) in enumerate(splits):
            method, problem = first if f == 0 else setup(train, None)
            monitor = ValidationMonitor(
                mean_nll(X[val], y[val]), settings,
                renumbered(callback, offset, "fold_iteration") if several else callback,
                n_points=problem.n)
            result, _ = self._run(method, method_name, problem, monitor, ranks_iterates=False)
            if settings.choice_refine_iter:  # rank the iterates by their refined posteriors
                monitor.rescore(self._refiner(method, method_name, setup(
                    train, settings.choice_refine_iter)[1], result.kernel))
            monitors.append(monitor)
            results.append(result)
            offset += monitor.last_iteration
        return method, problem, monitors, results, offset

    def _refit_all(
        self, method: Method, problem: Problem, setup: Setup, method_name: str,
        callback: FitCallback | None, settings: EarlyStopping, choice: ValidationChoice,
        monitors: list[ValidationMonitor], offset: int,
    ) -> tuple[Method, Problem, FitResult]:
        """The fit on all the rows for the chosen number of iterations (or to the folds'
        objective level, ``settings.refit_rule``), refined with ``settings.refine_iter``;
        ``method``/``problem`` are the last split's, ``offset`` the iterations reported so
        far. Returns the refit's method, problem and result."""
        # no finite validation NLL at all: train on everything for as long as the folds did
        k = choice.best_iteration or max(m.last_iteration for m in monitors) or int(self.max_iter)
        # a noisy (mini-batch) or surrogate objective says nothing per iteration: the count
        comparable = problem.batch_size is None and type(method).objective_kind != "surrogate"
        target = choice.refit_target(settings.refit_rule) if comparable else None
        method, problem = setup(slice(None), k if target is None else None)
        inner = renumbered(callback, offset, "refit_iteration")
        stop = None if target is None else RefitStop(settings.refit_rule, target, problem.n,
                                                     inner)
        result = self._fit_plain(method, method_name, problem, inner if stop is None else stop)
        if settings.refine_iter:  # q(u) / the sites on, hyper-parameters fixed
            result = self._refine(method, method_name, setup(slice(None),
                                                             int(settings.refine_iter))[1],
                                  result, renumbered(callback, offset + result.n_iter,
                                                     "refine_iteration"))
        return method, problem, choice.record(result, refitted=True, stop=stop)

    def _build_likelihood(self, method_cls: type[Method], n_classes: int, y: Array
                          ) -> Likelihood:
        """The likelihood of a problem with ``n_classes`` classes (0: regression) on the
        targets ``y [n]`` of its rows; an ``InputError`` for one of another task."""
        raise NotImplementedError

    def _targets(self, y: Array) -> tuple[Array, Array | None]:
        """The checked targets ``y [N]`` as the method sees them (class indices, or real
        numbers) and the classes ``[C]`` (None for a regressor)."""
        raise NotImplementedError

    def _fit(self, X: Any, y: Any, sample_weight: Any, callback: FitCallback | None
             ) -> Array | None:
        """``_fit_sequence``; in a process group an exception leaving it on this rank ends the
        group first (``distributed.leave_on_failure``), so the other ranks raise at once."""
        with distributed.leave_on_failure():
            return self._fit_sequence(X, y, sample_weight, callback)

    def _fit_sequence(self, X: Any, y: Any, sample_weight: Any,
                      callback: FitCallback | None) -> Array | None:
        """The one fit sequence of both estimators: validate everything before training
        (inputs, targets, settings, method, weights, scaling, backend, compatibility, early
        stopping), build the method and its problem, fit (``_fit_problem``). Returns the
        classes ``[C]`` of a classifier (None for a regressor), which its ``fit`` keeps. In a
        process group the checks end in one agreement of the ranks
        (``distributed.checks_agreed``): one rank's failure raises on every rank. Primes the C
        allocator first (``gpinfer.allocator.prime_allocator``: a step's temporaries stay on
        the heap instead of being faulted in afresh at every step)."""
        prime_allocator()
        with distributed.checks_agreed():
            c = self._checked_problem(X, y, sample_weight)
        method, problem = c.first
        with progress_callback(self.verbose, problem.max_iter, c.name, callback) as callback:
            self._fit_problem(method, c.name, problem, callback, c.setup, (c.X, c.y), c.early)
        return c.classes

    def _checked_problem(self, X: Any, y: Any, sample_weight: Any) -> _Checked:
        """``_fit_sequence``'s checks and set-up of the inputs ``X [N, D]``, targets ``y [N]``
        and weights, up to the first method and problem (``_Checked``)."""
        self._set_feature_names(X)
        source, stats = self._fit_source(X), None
        if source is None:
            X, y = check_X_y(*self._host_inputs(X=X, y=y))
        else:  # out of core: the method first, then every row checked in chunks (one read)
            streamer = _load_method(self.method)
            check_out_of_core(streamer, _method_name(streamer, self.method), self.batch_size,
                              source.n_rows, self._task)
            check_group_shards(source, distributed.current())
            X, y, stats = checked_inputs(source, y)
        y, classes = self._targets(y)
        n_classes = 0 if classes is None else len(classes)
        self._check_settings()
        method_cls = _load_method(self.method)
        name = _method_name(method_cls, self.method)
        if stats is None:
            X, y, weights = self._weighted_rows(sample_weight, X, y, method_cls, name)
        else:
            check_unit_weights(check_sample_weight(sample_weight, X.shape[0]))
            weights = None
        if classes is not None:
            _check_two_classes(classes, y)
        if stats is None:
            check_features_vary(X.min(axis=0), X.max(axis=0), X.shape[0])
        else:
            check_features_vary(stats.minimum, stats.maximum, stats.n)
        X = self._scale_inputs(X, weights) if stats is None else self._scale_source(X, stats)
        backend = self._resolve_backend()
        check_method_compatible(
            method_cls, n_classes, self._task, self.batch_size,
            self._likelihood_name() or self._default_likelihood,
            likelihood=self.likelihood if isinstance(self.likelihood, Likelihood) else None,
            backend=backend, options=self.method_options)
        early = self._early_stopping(y, n_classes, method_cls)
        setup = _ProblemSetup(self, method_cls, name, backend, X, y, n_classes, weights)
        first = setup(slice(None) if early is None else early[1][0][0])
        return _Checked(name, X, y, early, setup, first, classes)

    def _refine_members(self, method: Method, method_name: str, setup: Setup,
                        averaged: FitResult, refine_iter: int) -> FitResult:
        """``refit="average"`` with ``refine_iter``: every member of ``averaged``'s
        ``AveragedPosterior`` refined on all the rows at its own hyper-parameters
        (``Method.refine``, from the member's posterior); ``diagnostics["refined"]`` the mean
        of their refinement iterations."""
        members, counts = [], []
        for member in cast(AveragedPosterior, averaged.posterior).members:
            start = FitResult(member, 0.0, posterior_kernel(member, averaged.kernel), 0)
            out = self._refine(method, method_name, setup(slice(None), refine_iter)[1], start,
                               None)
            members.append(out.posterior)
            counts.append(out.diagnostics["refined"])
        averaged.posterior = AveragedPosterior(members)
        averaged.diagnostics["refined"] = float(np.mean(counts))
        averaged.n_iter += int(sum(counts))
        return averaged

    def _refiner(self, method: Method, method_name: str, problem: Problem, kernel: Kernel
                 ) -> Callable[[Posterior], Posterior]:
        """``posterior -> `` that posterior refined on ``problem`` (``_refine``, from a fit
        whose kernel is ``kernel`` where the posterior has none): the early-stopping choice's
        ``choice_refine_iter`` (``ValidationMonitor.rescore``)."""
        def refine(posterior: Posterior) -> Posterior:
            start = FitResult(posterior, 0.0, posterior_kernel(posterior, kernel), 0)
            return self._refine(method, method_name, problem, start, None).posterior

        return refine

    def _refine(self, method: Method, method_name: str, problem: Problem, fitted: FitResult,
                callback: FitCallback | None) -> FitResult:
        """``method.refine(problem, fitted)`` under the fit guard (as ``_fit_plain``); the
        result counts ``fitted``'s iterations and history too, ``diagnostics["refined"]``
        the refinement's iterations."""
        tracker = tracker_for(type(method), callback, method_name, problem.X, problem.y,
                              self._rng(), minibatch=problem.batch_size is not None,
                              sample_weight=problem.sample_weight)
        with training_threads():
            result = method.refine(problem, fitted, tracker)
        check_objective_limit(float(result.log_evidence), type(method).objective_limit,
                              method_name, problem.n)
        if type(method).restore_best_iterate:
            result = restore_best(result, tracker)
        result.diagnostics["refined"] = float(result.n_iter)
        result.n_iter += fitted.n_iter
        result.history = [*fitted.history, *({**h, "refine": 1.0} for h in result.history)]
        return result

    def _fit_problem(
        self, method: Method, method_name: str, problem: Problem, callback: FitCallback | None,
        setup: Setup | None = None, data: tuple[Array, Array] | None = None,
        early: tuple[EarlyStopping, list[tuple[Array, Array]]] | None = None,
    ) -> None:
        """Fit and set the fitted attributes common to every estimator.

        Without ``early``: ``method.fit(problem)``. With ``early`` (from ``_early_stopping``),
        ``method`` and ``problem`` are those of the first split's training rows, ``setup(rows,
        max_iter)`` builds a method and its problem for other rows of ``data = (X [N, D],
        y [N])`` (all the rows, held-out ones included), and ``_fit_validated`` runs. The fit
        guard checks the result (``check_against_baseline``; a non-finite quantity computed
        during the fit is a ``NumericalError``, ``internal_values``)."""
        with internal_values(method_name):  # what the method and the guard compute
            if early is None:
                result = self._fit_plain(method, method_name, problem, callback)
            else:
                if setup is None or data is None:
                    raise ValueError("early stopping needs setup and data")
                method, problem, result = self._fit_validated(
                    (method, problem), setup, data[0], data[1], method_name, callback, *early)
                # the rule that ran (``refit="auto"`` resolved): refit / averaged, and this
                result.diagnostics["refine_iter"] = float(early[0].refine_iter or 0)
            result = check_against_baseline(
                result, method_name, problem.X, problem.y, problem.n_classes, self._rng(),
                check_baseline_failure(self.baseline_failure),
                problem.sample_weight, type(method).baseline_measure)
        self.n_features_in_ = problem.X.shape[1]
        self.backend_ = problem.backend
        self.method_ = method
        self.fit_result_ = result
        self.posterior_ = result.posterior
        self.kernel_ = result.kernel
        self.likelihood_ = result.posterior.likelihood
        self.log_evidence_ = float(result.log_evidence)
        se = result.log_evidence_se
        self.log_evidence_se_ = None if se is None else float(se)
        self.n_iter_ = int(result.n_iter)
        self.history_ = list(result.history)
        self.fit_warnings_ = list(result.warnings)
        self._set_early_stopping(result, early is not None)

    def _validate_for_predict(self, X: Any) -> Array:
        """``X [N*, D]`` checked against the fit (features, their names) and scaled as the
        training inputs were; scikit-learn's ``NotFittedError`` before ``fit`` (the cores
        included: they have no scikit-learn tags for ``check_is_fitted`` to read)."""
        self._check_fitted()
        _check_feature_names(self, X)
        X = check_X(host_input(X, "X"), "X")
        if X.shape[1] != self.n_features_in_:
            raise InputError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        scaler = getattr(self, "scaler_", None)
        return X if scaler is None else scaler.transform(X)

    def _check_fitted(self) -> None:
        """scikit-learn's ``NotFittedError`` before ``fit``."""
        if not hasattr(self, "posterior_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator.")

    def _scale_inputs(self, X: Array, sample_weight: Array | None = None) -> Array:
        """``X [N, D]`` standardised when ``_standardizes()`` (the fitted scaling kept as
        ``scaler_`` and applied at prediction); else ``X`` itself, with a
        ``FeatureScaleWarning`` when its scales really differ (``gpinfer.scaling``).
        ``sample_weight [N]`` (from ``_weighted_rows``): weighted statistics, so that a row of
        weight ``k`` is scaled as the row repeated ``k`` times."""
        from gpinfer.data import Standardizer
        from gpinfer.scaling import check_feature_scales

        if self._standardizes():
            self.scaler_: Standardizer | None = Standardizer().fit(X, sample_weight)
            return self.scaler_.transform(X)
        self.scaler_ = None
        check_feature_scales(X, type(self).__name__,
                             self.kernel if isinstance(self.kernel, Kernel) else None)
        return X

    def _fit_source(self, X: Any) -> RowSource | None:
        """The row source ``fit`` reads ``X`` from, or None for the in-memory path: a
        ``numpy.memmap`` is read out of core by a method with ``supports_out_of_core`` and
        ``batch_size``, and otherwise loaded into memory as an array when its float64 copy fits
        ``gpinfer.data.limits.dense_limit_gb()`` (scikit-learn passes small read-only memmaps),
        above that the out-of-core path's ``InputError`` names the methods that stream;
        shards, Parquet and ``RowSource`` objects are always read out of core."""
        source = as_source(X)
        if source is None or not isinstance(X, np.memmap):
            return source
        method_cls = _load_method(self.method)
        if getattr(method_cls, "supports_out_of_core", False) and self.batch_size is not None:
            return source
        return source if X.size * 8 > dense_limit_gb() * 1e9 else None

    def _scale_source(self, X: SourceRows, stats: ColumnStats) -> SourceRows:
        """``_scale_inputs`` for inputs out of core: the scaling from the chunked statistics
        ``stats`` (equal to ``Standardizer().fit`` on ``X``), applied per batch; the scale
        warning judged on a fixed subsample (``sample_rows``)."""
        from gpinfer.kernels.initialisation import MEDIAN_SUBSET
        from gpinfer.scaling import check_feature_scales

        if self._standardizes():
            self.scaler_ = fitted_scaler(stats)
            return scaled_rows(X, stats, self.scaler_)
        self.scaler_ = None
        check_feature_scales(sample_rows(X, MEDIAN_SUBSET), type(self).__name__,
                             self.kernel if isinstance(self.kernel, Kernel) else None)
        return scaled_rows(X, stats, None)

    def _predicted(self, X: Any, predict: Callable[[Any], Any]) -> list[Any] | None:
        """``predict(rows)`` on the fit's device for each chunk of an out-of-core ``X``
        (``gpinfer.out_of_core.predicted_chunks``); None for inputs in memory."""
        source = as_source(X)
        if source is None:
            return None
        self._check_fitted()
        return list(predicted_chunks(source, self.n_features_in_,
                                     getattr(self, "scaler_", None),
                                     lambda rows: predict(self._on_fit_device(rows))))

    def _standardizes(self) -> bool:
        """Whether ``fit`` standardises the inputs: ``standardize`` itself, or for ``"auto"``
        whether the kernel is given by name (its unit length-scale and variance are made for
        standardised inputs); a ``Kernel`` object's parameters are in the units of ``X`` as
        given, so ``"auto"`` leaves ``X`` alone under it. ``InputError`` for other values."""
        standardize = self.standardize
        if isinstance(standardize, str) and standardize == "auto":
            return not isinstance(self.kernel, Kernel)
        if not isinstance(standardize, bool | np.bool_):
            raise InputError(f"standardize must be 'auto', True or False; got {standardize!r}")
        return bool(standardize)

    def _on_fit_device(self, X: Array) -> Any:
        """Checked inputs ``X [N*, D]`` on the device the fit ran on (float64), where that
        device is usable here; the host array otherwise (numpy fits, or a model loaded on a
        machine without the GPU or without torch)."""
        backend = getattr(self, "backend_", None)
        if backend is None or backend.is_numpy:
            return X
        try:
            usable = resolve_backend(backend.name, backend.device, "float64")
        except InputError:
            return X
        return usable.asarray(X)

    def predict_f(self, X: Any) -> tuple[Array, Array]:
        """Latent predictive means and variances at ``X [N*, D]``, each ``[N*, L]`` (numpy;
        computed on the fit's device where it is usable); a ``NumericalError`` naming the rows
        where they are not finite (``_finite_latents``)."""
        chunks = self._predicted(X, lambda rows: tuple(
            ops.to_host(a) for a in self.posterior_.predict_f(rows)))
        if chunks is not None:
            return _finite_latents(np.concatenate([c[0] for c in chunks]),
                                   np.concatenate([c[1] for c in chunks]))
        X = self._validate_for_predict(X)
        mean, var = self.posterior_.predict_f(self._on_fit_device(X))
        return _finite_latents(ops.to_host(mean), ops.to_host(var))


def _finite_latents(mean: Array, var: Array) -> tuple[Array, Array]:
    """``predict_f``'s host ``mean [N*, L]`` and ``var [N*, L]``; a ``NumericalError`` where
    one is NaN or infinite. The inputs were checked finite, but a finite input far outside the
    training data's scale can overflow the kernel (e.g. a linear kernel's ``x^T x``, or
    ``inf - inf`` in a variance): a silent NaN without this check (``predict_proba``'s is the
    likelihood's input check)."""
    finite = np.isfinite(mean) & np.isfinite(var)
    if not finite.all():
        rows = np.flatnonzero(~finite.reshape(finite.shape[0], -1).all(axis=1))
        raise NumericalError(
            f"the latent predictions at {rows.size} row(s) of X are not finite (first at row "
            f"{rows[0]}): the kernel overflowed, inputs far outside the training data's scale?",
            quantity="predict_f")
    return mean, var



def _check_two_classes(classes: Array, y_index: Array) -> None:
    """``InputError`` when the rows of positive weight, ``y_index [N']`` (indices into
    ``classes [C]``), hold a single class. Counted in chunks (``class_counts``), not by
    ``np.unique``, whose sort copies all of ``y_index`` (80 MB at ``N' = 1e7``)."""
    kept = np.flatnonzero(class_counts(y_index, len(classes)))
    if kept.size < 2:
        raise InputError(
            f"sample_weight leaves only class {classes[kept].tolist()[0]!r} with a positive "
            "weight; classification needs at least two classes of positive weight"
        )


class _Checked(NamedTuple):
    """A fit's checked set-up (``_checked_problem``): the method's name, the checked (scaled)
    inputs ``X [N, D]`` and targets ``y [N]``, the early-stopping settings and splits (None:
    none), the problem set-up, the first method and problem, the classes ``[C]`` (None for a
    regressor)."""

    name: str
    X: Any
    y: Array
    early: tuple[EarlyStopping, list[tuple[Array, Array]]] | None
    setup: Setup
    first: tuple[Method, Problem]
    classes: Array | None


class _ProblemSetup:
    """``setup(rows, max_iter=None)``: a fresh method and its problem on the rows ``rows`` (an
    index array or a slice) of the checked, weighted and scaled ``X [N, D]`` and ``y [N]``
    (``weights [N]`` or None); ``max_iter`` None: the estimator's (the refit after early
    stopping gives the chosen number). A named kernel on standardised inputs starts at
    ``standardised_lengthscale(X)``."""

    def __init__(self, estimator: _GPEstimatorBase, method_cls: type[Method], name: str,
                 backend: Backend, X: Array, y: Array, n_classes: int,
                 weights: Array | None) -> None:
        self.estimator, self.method_cls, self.name, self.backend = (estimator, method_cls, name,
                                                                    backend)
        self.X, self.y, self.n_classes, self.weights = X, y, n_classes, weights
        self.start_lengthscale = (
            (start_lengthscale(X) if isinstance(X, SourceRows) else standardised_lengthscale(X))
            if estimator.scaler_ is not None and not isinstance(estimator.kernel, Kernel)
            else None)

    def __call__(self, rows: Any, max_iter: int | None = None) -> tuple[Method, Problem]:
        est, X_rows, y_rows = self.estimator, take_rows(self.X, rows), self.y[rows]
        d = X_rows.shape[1]
        inducing = check_inducing(est.M, X_rows.shape[0], d, self.name,
                                  self.method_cls.uses_inducing_points)
        kernel = est._build_kernel(d)
        if self.start_lengthscale is not None:
            set_lengthscales(kernel, self.start_lengthscale)
        problem = est._problem(
            X_rows, y_rows, self.n_classes, kernel,
            est._build_likelihood(self.method_cls, self.n_classes, y_rows), inducing,
            self.method_cls, self.backend, None if self.weights is None else self.weights[rows],
            max_iter)
        return est._instantiate(self.method_cls), problem


class GPClassifierCore(_GPEstimatorBase):
    """Gaussian-process classification with any registered approximate-inference method.

    ``GPClassifierCore`` fits and predicts without scikit-learn (the experiment runner's
    estimator); ``gpinfer.GPClassifier`` is the same estimator with scikit-learn's base classes
    (``gpinfer.sklearn_estimators``).

    Parameters
    ----------
    method : str
        Registered method name (entry-point group ``gpinfer.methods``), e.g. ``"laplace"``.
    M : None, int, float or array [M, D]
        Inducing points: a count ``1..N``, a fraction of ``N`` in ``(0, 1]``, or initial
        inducing inputs. Only for methods with inducing points; ``None`` = method default.
    kernel : str or Kernel
        A kernel name (built with ``make_kernel(name, input_dim=D, ard=False)``) or a ``Kernel``
        object, which is copied and never modified. The methods with a median heuristic (ep,
        sep, gfitc, svi, vi-robustmax, the vi-jj family; option ``lengthscale_init``, default
        ``"auto"``) start a named kernel, or one whose parameters are optimised
        (``optimize=True``), at squared length-scale = the median pairwise distance; a
        ``Kernel`` object with ``optimize=False`` is fitted as given, its length-scales kept
        (scikit-learn's ``optimizer=None``). ``method_options={"lengthscale_init": "median"}``
        or ``"kernel"`` forces either (``gpinfer.kernels.initialisation``).
    likelihood : None, str or Likelihood
        ``None`` picks the first entry of the method's ``likelihoods`` that suits the number of
        classes (binary or multi-class); a name is built with ``make_likelihood``; an object is
        copied.
    optimize : None or bool
        Whether to fit kernel parameters (and inducing inputs) as well as the approximation;
        ``None``: the method's default (``optimize_by_default``: True but for mcmc-ais and fv).
    max_iter : int
        Outer iterations (hyper-parameter steps, or sweeps when ``optimize`` is False).
    batch_size : None or int
        Mini-batch size, for methods that support mini-batches.
    random_state : None, int or numpy Generator
        Seed of the run's generator (``np.random.default_rng(random_state)``).
    method_options : None or dict
        Method-specific options (see the method's ``default_options``).
    verbose : bool or "auto"
        A progress bar (tqdm: rate, ETA, objective) on stderr while fitting; ``"auto"``: only
        when stderr is a terminal outside CI.
    validation_fraction : None or float in (0, 0.5]
        Early stopping: hold out this fraction of the training data (stratified by class),
        compute its NLL every ``validation_interval`` iterations, stop after
        ``n_iter_no_change`` checks without improvement and keep the best iterate
        (``gpinfer.training.early_stopping``). ``None`` (default): train on everything for
        ``max_iter`` iterations.
    validation_interval : int
        Iterations between two validation checks (``k``).
    n_iter_no_change : int
        Checks without a better validation NLL before training stops (patience).
    refit : "auto", bool or "average"
        With ``validation_fraction``: ``"auto"`` (default) the method's own rule
        (``Method.early_stopping_rule``, ``(refit, refine_iter)``): svi and its presets such as
        vi-robustmax ``("average", 250)``, sep ``(True, 50)``, every other method ``(True, 0)``; a
        regressor refits where the rule says ``"average"`` (``fit_result_.diagnostics``: ``refit``,
        ``averaged``, ``refine_iter`` say what ran). True trains the method again on all the data
        (the held-out part included) for the number of iterations with the best validation NLL, and
        that is the fitted model; False keeps the best validation iterate of the fit on the reduced
        data; ``"average"`` keeps every validation fold's model at its own best validation iterate
        and predicts with the mean of their class probabilities (``posterior_`` is a
        ``gpinfer.posterior.AveragedPosterior`` of K members, each trained on ``(K - 1) / K`` of the
        data; no refit; K times the prediction cost; with one hold-out, the one model: as False;
        ``best_iteration_`` is still the folds' choice, reported but unused,
        ``fit_result_.state["member_iteration"]`` each member's). ``fit_result_.diagnostics`` holds
        ``best_iteration`` and ``best_val_nll``, ``fit_result_.state`` the per-check
        ``val_iteration`` and ``val_nll``. Ignored without ``validation_fraction``.
    validation_folds : None or int
        How the number of iterations is chosen: ``None`` (default) one hold-out of
        ``validation_fraction``, or, where that would hold fewer than 200 points (with
        ``refit``), stratified K-fold cross-validation with ``K = round(1 /
        validation_fraction)`` (the validation NLL averaged over the folds; the earliest
        iteration within one standard error of its minimum, the error of the folds' paired
        differences); ``1``: always one hold-out;
        ``K >= 2``: always K folds (needs ``refit``).
    refit_rule : "iterations", "objective" or "gain"
        Where the refit on all the data stops: ``"iterations"`` (default) after the chosen
        number of iterations; ``"objective"`` at the first iteration whose training objective
        per point reaches the level the monitored fits had at their chosen iteration (or at
        ``max_iter``); ``"gain"`` where it has gained as much per point since its first
        iteration. Mini-batch fits and surrogate objectives take the count
        (``gpinfer.training.early_stopping``).
    choice_rule : "one_se", "log_one_se", "min" or "median"
        How K folds choose the number of iterations from their validation NLL curves
        (``gpinfer.training.early_stopping.choose_check``): ``"one_se"`` (default) the earliest
        iteration within one paired standard error of the mean curve's minimum;
        ``"log_one_se"`` the same on the folds' log NLL (classification only: ``InputError``
        in regression); ``"min"`` the mean curve's minimum; ``"median"`` the median over the
        folds of each fold's own best iteration. A single hold-out takes its minimum.
    refine_iter : None or int
        ``None`` (default): the count of the method's rule with ``refit="auto"``, else 0.
        With ``refit=True``: after the refit, up to this many further iterations on the
        approximate posterior alone (``q(u)`` for svi and its presets such as vi-robustmax,
        the tied sites for sep), on all the data, the kernel parameters and inducing inputs
        held at the refit's values (they are what over-fits with iterations; at fixed
        hyper-parameters the posterior approximation does not). With ``refit="average"``:
        every fold's model so trained on all the data at its own hyper-parameters.
        (``Method.refine``; ``InputError`` for a method that cannot.) 0: none.
    choice_refine_iter : int
        0 (default): the validation checks score each iterate's posterior as fitted. K > 0:
        each checked iterate's posterior is first refined K iterations at its frozen
        hyper-parameters on the validation fit's own rows (``Method.refine``), and the choice
        (the count, the folds' best iterates) ranks the refined posteriors, since the model
        that early stopping returns is refined (``refine_iter``); one refinement per check
        (``gpinfer.training.early_stopping``; ``InputError`` for a method that cannot refine).
    standardize : "auto" or bool
        True: fit a per-feature ``(X - mean) / std`` on the training inputs (constant columns:
        std 1), keep it as ``scaler_`` and apply it at prediction, so that the fit does not
        depend on the units of ``X``. ``"auto"`` (default): True when ``kernel`` is a name (its
        starting length-scale 1 and variance 1 are meant for standardised inputs), False when
        it is a ``Kernel`` object (its parameters are in the units of ``X`` as given: the
        paper protocols and oracles pass one, on inputs they standardised themselves). False:
        ``X`` is used as given, and a ``gpinfer.scaling.FeatureScaleWarning`` says when the
        scales of its non-constant columns are far from the kernel's or from one another.
        A named kernel on standardised inputs starts at length-scale ``sqrt(max(D', 2) / 2)``
        (``D'`` non-constant features: 1 up to two features), so that two typical points have
        prior correlation ``e^-2`` whatever the number of features (the methods with a median
        heuristic, ep, sep, gfitc, svi, vi-robustmax and the vi-jj family, still apply theirs:
        their ``lengthscale_init="auto"``, under ``kernel`` below).
    backend : None, "numpy" or "torch"
        Array backend of the training hot path (``gpinfer.backend``). ``None`` (default):
        numpy, or torch when ``device`` is a GPU. ``"torch"`` only for the methods that declare
        it (``Method.backends``; ``docs/backends.md``; ``pip install gpinfer[torch]``) and the
        likelihood expectation rules that do (``Likelihood.supported_backends``); anything else
        is an ``InputError`` naming the methods and rules that would run.
    device : None or str
        ``"cpu"`` (``None``), ``"cuda"`` or ``"cuda:N"``; a GPU needs the torch backend and a
        CUDA build of torch. The data stay in host memory; the method moves mini-batches.
    dtype : None, "float64" or "float32"
        Floating-point type of the torch backend (``None``: float64). ``"float32"`` only with
        ``backend="torch"`` and for the methods stable in single precision (``Method.float32``).
        All three (backend, device, dtype) are checked, with the method and its likelihood's
        expectation rule, before any training (``InputError`` naming the fix: an unknown value,
        torch or CUDA missing, a numpy-only method or rule).
    baseline_failure : "raise" or "warn"
        What a fit whose training NLL is no better than predicting the class frequencies does
        (``gpinfer.fit_guard``): ``"raise"`` (default) a ``gpinfer.errors.FitFailedError`` (a
        ``NumericalError``) with a summary of the objective trace; ``"warn"`` a
        ``ConvergenceWarning``, keeping the model (``fit_warnings_`` says
        ``no_better_than_baseline``).

    Attributes (after ``fit``)
    --------------------------
    classes_ [C], n_features_in_, kernel_, likelihood_, log_evidence_, n_iter_, history_,
    posterior_, method_ (the fitted method instance), fit_result_ (its ``FitResult``),
    log_evidence_se_ (standard error of a Monte-Carlo evidence such as AIS, else None),
    fit_warnings_ (codes of what the fit guard found, ``gpinfer.fit_guard``),
    scaler_ (the ``gpinfer.data.Standardizer`` applied to every input, or None),
    backend_ (the ``gpinfer.backend.Backend`` the fit ran on; ``backend_.params()`` gives
    ``{"backend", "device", "dtype"}``), feature_names_in_ [D] (a DataFrame's column names; absent
    for arrays), and with early stopping, as ``MLPClassifier``: best_iteration_ (the chosen
    number of iterations), validation_scores_ (the negative mean validation NLL of every check,
    from the curve that chose it, ``fit_result_.state["val_nll"]``: averaged over the folds
    where there are several; also ``val_nll`` in ``history_`` with ``refit=False``) and
    best_validation_score_ (the score at best_iteration_: the maximum for one hold-out) (all
    three ``None`` without early stopping).

    A ``Kernel`` given as ``kernel`` is a scikit-learn parameter container: nested names such as
    ``kernel__lengthscale`` (or ``kernel__0__lengthscale`` for a sum's first part) work in
    ``set_params`` and ``GridSearchCV``.
    """

    def __init__(
        self,
        method: str = "laplace",
        M: Any = None,
        kernel: Any = "rbf",
        likelihood: Any = None,
        optimize: bool | None = None,
        max_iter: int = 100,
        batch_size: int | None = None,
        random_state: Any = None,
        method_options: Mapping[str, Any] | None = None,
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
        standardize: bool | str = "auto",
        backend: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        baseline_failure: str = "raise",
    ):
        self._store_params(locals())

    # -- building the problem -----------------------------------------------------------------
    _task = "classification"

    def _build_likelihood(self, method_cls: type[Method], n_classes: int, y: Array
                          ) -> Likelihood:
        """``likelihood`` (a copy, or made from its name), else the first of the method's
        likelihoods suited to ``n_classes`` (``y`` unused)."""
        from gpinfer.likelihoods import default_likelihood, make_likelihood

        if isinstance(self.likelihood, Likelihood):
            likelihood = copy.deepcopy(self.likelihood)
        elif isinstance(self.likelihood, str):
            likelihood = make_likelihood(self.likelihood)
        else:
            found = default_likelihood(method_cls.likelihoods, n_classes)
            if found is None:
                raise InputError(
                    f"method {method_cls.name!r} declares no likelihoods; pass likelihood="
                )
            likelihood = found
        if likelihood.task != "classification":
            raise InputError(
                f"likelihood {type(likelihood).__name__} is for {likelihood.task}; "
                "GPClassifier needs a classification likelihood"
            )
        if n_classes > 2 and not likelihood.multiclass:
            raise InputError(
                f"likelihood {type(likelihood).__name__} is binary but y has {n_classes} "
                "classes; choose a multi-class likelihood (e.g. softmax, robustmax)"
            )
        return likelihood

    # -- fit / predict ---------------------------------------------------------------------------
    def fit(self, X: Any, y: Any, sample_weight: Any = None,
            callback: FitCallback | None = None) -> Self:
        """Fit the approximate posterior (and hyper-parameters when ``optimize``).

        ``X [N, D]`` (a DataFrame's string column names become ``feature_names_in_``),
        ``y [N]`` (any label type with at least two classes). ``sample_weight``: ``None``, a
        number or ``[N]`` non-negative weights; a row of weight 0 is dropped (any method), other
        weights multiply each point's term of the objective and need a method with
        ``supports_sample_weight`` (laplace, svi, vi-robustmax). Everything is validated before
        training starts. ``callback`` receives an ``IterationInfo`` once per outer iteration.
        Returns ``self``. ``X`` and ``y`` may be torch tensors (for a method with a torch
        backend): they are copied to host memory. ``X`` may be out of core (a ``numpy.memmap``,
        a ``.npy`` path or a list of them, a ``.parquet`` path, a ``gpinfer.data.source.
        RowSource``) for a method with ``supports_out_of_core`` (sep, ep, svi) and
        ``batch_size``: it is then checked in chunks and read by batches, never held whole
        (``gpinfer.out_of_core``). Every fit first lifts glibc malloc's dynamic thresholds
        (``gpinfer.allocator.prime_allocator``), so that a step's temporaries are reused
        rather than faulted in afresh at every step; the values are unchanged.
        """
        classes = self._fit(X, y, sample_weight, callback)
        assert classes is not None  # a classifier's targets always have classes
        self.classes_ = classes
        return self

    def _targets(self, y: Array) -> tuple[Array, Array | None]:
        """Labels ``y [N]`` as class indices ``[N]`` and the classes ``[C]`` (``InputError``
        for fewer than two)."""
        classes, y_index = encode_labels(y)
        return y_index, classes

    def predict_proba(self, X: Any) -> Array:
        """Class probabilities ``[N*, C]``, columns ordered as ``classes_``; rows sum to one.

        ``X [N*, D]``: a numpy array or a torch tensor, or out of core as in ``fit`` (then
        predicted in chunks of ``gpinfer.out_of_core.PREDICT_CHUNK`` rows); the result is numpy,
        whatever backend the fit ran on (the prediction itself runs on the fit's device where
        it is usable)."""
        chunks = self._predicted(X, lambda rows: class_probabilities(
            self.posterior_.predict_proba(rows), rows.shape[0], len(self.classes_),
            self.method))
        if chunks is not None:
            return np.concatenate(chunks)
        X = self._validate_for_predict(X)
        P = self.posterior_.predict_proba(self._on_fit_device(X))
        return class_probabilities(P, X.shape[0], len(self.classes_), self.method)

    def predict_log_proba(self, X: Any) -> Array:
        """Log class probabilities ``[N*, C]`` (``log`` of ``predict_proba``)."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> Array:
        """Most probable class label for each row of ``X [N*, D]``, ``[N*]`` (from ``classes_``)."""
        P = self.predict_proba(X)
        return self.classes_[np.argmax(P, axis=1)]


"""One experiment run: validate, load and split the data, fit, evaluate, log, write result.json.

``run_experiment(cfg)`` takes the composed Hydra config (``conf/config.yaml``) and does, in order:

1. checks the plain settings (seed, iterations, M, batch_size, ...), the array backend
   (``backend``, ``device``, ``dtype``: ``gpinfer.backend``) against the method, the output
   folder and the MLflow store, the method, kernel and dataset names, the method options and
   the problem against what the method declares (classes, inducing points, mini-batches,
   likelihood):
   every problem is a ``gpinfer.errors`` error naming it, raised before any training and
   before any MLflow run exists;
2. loads the dataset, splits it with the run's seed, standardises on the training part;
3. starts the MLflow run (params = the flattened resolved config, with ``backend``, ``device``
   and ``dtype`` as resolved; tags, config artifact) and fits a ``GPClassifierCore``
   (``GPClassifier`` without scikit-learn) with a callback that logs the objective and
   elapsed time every iteration and the test error and test NLL every ``eval_every`` iterations
   (``eval/test_error``, ``eval/test_nll``; also to the run log ``gpinfer.log``), moves the
   progress bar (``gpinfer.progress``, config ``progress.bar``), and stops the run on a
   non-finite objective. A regression dataset (``Dataset.task == "regression"``) gets a
   ``GPRegressorCore`` on targets standardised with the training part instead, and test RMSE and
   NLL in the original units of ``y``;
4. logs the final metrics (``FINAL_METRICS``: once each, under the names of ``result.json``,
   so MLflow, ``result.json``, the printed line and both reports show the same numbers) and the
   fitted state, then what MLflow users expect besides
   (``publish.publish_run``: learned hyper-parameters, the model, dataset inputs, plots),
   writes ``result.json`` and prints one line. The run's name is readable and unique
   (``sep-waveform-rbf-s0-3fa2c1``).

A run that raises ends FAILED (Ctrl-C or SIGTERM: KILLED) with what it had logged kept, and its
``result.json`` records the status, the error and the last iteration reached. A fit no better
than predicting the class frequencies (``gpinfer.fit_guard``) raises, and its run ends FAILED
with the guard's ``fit_warnings``, ``train_nll`` and ``baseline_nll`` recorded; with
``baseline_failure=warn`` the model is kept and evaluated, and the run still ends FAILED.
"""

from __future__ import annotations

import logging
import math
import numbers
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gpinfer.backend.choice import NUMPY, Backend, check_method_backend, resolve_backend
from gpinfer.errors import FitFailedError, InputError, NumericalError
from gpinfer.experiment import results as res
from gpinfer.experiment import tracking
from gpinfer.experiment.figures import TrainingCurve
from gpinfer.experiment.redact import redact_text, redact_uri, scrub_files, store_error
from gpinfer.experiment.render import FigureJob
from gpinfer.fit_guard import WORSE_THAN_BASELINE, check_baseline_failure
from gpinfer.interfaces import IterationInfo
from gpinfer.progress import ProgressBar
from gpinfer.threads import blas_threads
from gpinfer.training.early_stopping import EarlyStopping, validation_size

Array = np.ndarray
_log = logging.getLogger("gpinfer.run")

#: keys of the dataset group that the runner handles (everything else is an error)
_DATASET_KEYS = {
    "name",
    "options",
    "path",
    "test_fraction",
    "standardize",
    "stratify",
    "features",
    "keep_classes",
    "n_max",
}
#: kernel group keys that are not constructor parameters
_KERNEL_META = {"name", "ard", "noise"}
#: the run's final numbers: result.json's keys and MLflow metrics of the same names, each logged
#: once (``RunLogger.log_final``), so that MLflow's value of the key is the reported number
FINAL_METRICS = ("test_error", "test_rmse", "test_nll", "log_evidence", "train_time_s", "n_iter",
                 "peak_rss_mb", "train_nll", "baseline_nll", "stopped_early",
                 "best_val_iteration", "best_validation_score")
#: prefix of the test metrics computed every ``eval_every`` iterations (``eval/test_error``, ...):
#: the history of the test metrics, kept apart from the final numbers
EVAL_PREFIX = "eval/"
#: raw training rows kept for the logged model's input example
_EXAMPLE_ROWS = 5
#: per-iteration metric names the runner owns (method extras with these names get a prefix)
_RESERVED = {"objective", "elapsed_s", *FINAL_METRICS}


@dataclass
class Settings:
    """The validated plain settings of one run (see ``conf/config.yaml``)."""

    method: str
    likelihood: str | None
    method_options: dict[str, Any]
    dataset: str
    dataset_cfg: dict[str, Any]
    kernel: str
    kernel_cfg: dict[str, Any]
    optimizer: str
    optimizer_options: dict[str, Any]
    M: int | float | None
    seed: int
    iterations: int
    optimize: bool | None
    batch_size: int | None
    eval_every: int
    early_stopping: EarlyStopping | None = None
    #: the array backend as asked for (top-level ``backend``, ``device``, ``dtype``; null: the
    #: default), resolved and checked against the method by ``prepare``
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    #: what a fit no better than the class frequencies does: "raise" or "warn" (the model is
    #: kept; either way the MLflow run ends FAILED)
    baseline_failure: str = "raise"
    progress: dict[str, Any] = field(default_factory=dict)
    mlflow: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared:
    """Everything checked and loaded before training starts."""

    settings: Settings
    out_dir: Path
    method_cls: type
    X_train: Array
    y_train: Array
    X_test: Array
    y_test_index: Array
    classes: Array
    n_classes: int
    task: str
    M_count: int | None
    kernel: Any
    method_options: dict[str, Any]
    optimizer_applied: bool
    logger: tracking.RunLogger
    config: dict[str, Any]
    #: regression: the training mean and std of ``y`` (the model sees ``(y - shift) / scale``;
    #: ``y_test_index`` then holds the real test targets in their original units)
    y_shift: float = 0.0
    y_scale: float = 1.0
    #: the array backend the fit runs on (resolved from the settings, checked for the method)
    backend: Backend = NUMPY
    #: the training part's standardisation of the inputs (``None``: inputs used as loaded)
    standardizer: Any = None
    #: the first training rows as loaded (raw features ``[n, D]``): the logged model's example
    X_train_raw_head: Array | None = None


# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------


def config_to_dict(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The resolved run config as plain containers, without the ``hydra`` node."""
    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True)
        except Exception as exc:  # an interpolation that cannot be resolved
            raise InputError(f"the configuration cannot be resolved: {exc}") from exc
    else:
        data = OmegaConf.to_container(OmegaConf.create(dict(cfg)), resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return data


def _group(conf: Mapping[str, Any], name: str) -> dict[str, Any]:
    node = conf.get(name)
    if not isinstance(node, Mapping) or not node.get("name"):
        raise InputError(
            f"config group {name!r} is missing or has no 'name'; choose one with {name}=<name> "
            f"(see conf/{name}/)"
        )
    return dict(node)


def _int(value: Any, key: str, minimum: int | None = None, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{key} must be an integer; got {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(f"{key} must be >= {minimum}; got {value!r}")
    return int(value)


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{key} must be a mapping (key: value); got {value!r}")
    return dict(value)


def _optional_text(value: Any, key: str, allowed: str) -> str | None:
    """A top-level setting that is null or a name (``device=0`` composes as an int)."""
    if value is None or isinstance(value, str):
        return value
    raise InputError(f"{key} must be null or one of {allowed}; got {value!r}")


def _check_backend(s: Settings, method_cls: type) -> Backend:
    """The run's ``Backend`` from ``backend``/``device``/``dtype``, checked against the method
    (``InputError`` naming the fix) before any MLflow run exists."""
    backend = resolve_backend(s.backend, s.device, s.dtype)
    check_method_backend(method_cls, s.method, backend)
    return backend


def parse_settings(conf: Mapping[str, Any]) -> Settings:
    """Check the plain values of the config; ``InputError`` naming the key otherwise."""
    method = _group(conf, "method")
    dataset = _group(conf, "dataset")
    kernel = _group(conf, "kernel")
    optimizer = _group(conf, "optimizer")
    unknown = sorted(set(dataset) - _DATASET_KEYS)
    if unknown:
        raise InputError(
            f"dataset config {dataset['name']!r} has unknown key(s) {unknown}; known: "
            f"{', '.join(sorted(_DATASET_KEYS))} (generator/loader options go under "
            "dataset.options)"
        )
    M = conf.get("M")
    if M is not None and (isinstance(M, bool) or not isinstance(M, numbers.Real)):
        raise InputError(
            f"M must be null, a count of inducing points (M=50) or a fraction of the training "
            f"size (M=0.1); got {M!r}"
        )
    optimize = conf.get("optimize")
    if optimize is not None and not isinstance(optimize, bool):
        raise InputError(
            f"optimize must be true, false or null (the method's default); got {optimize!r}"
        )
    likelihood = method.get("likelihood")
    if likelihood is not None and not isinstance(likelihood, str):
        raise InputError(f"method.likelihood must be a name or null; got {likelihood!r}")
    tf = dataset.get("test_fraction")
    if tf is not None and (
        isinstance(tf, bool) or not isinstance(tf, numbers.Real) or not 0.0 < float(tf) < 1.0
    ):
        raise InputError(
            f"dataset.test_fraction must be in (0, 1) or null (the dataset's standard split); "
            f"got {tf!r}"
        )
    return Settings(
        method=str(method["name"]),
        likelihood=likelihood,
        method_options=_mapping(method.get("options"), "method.options"),
        dataset=str(dataset["name"]),
        dataset_cfg=dataset,
        kernel=str(kernel["name"]),
        kernel_cfg=kernel,
        optimizer=str(optimizer["name"]),
        optimizer_options=_mapping(optimizer.get("options"), "optimizer.options"),
        M=M,
        seed=_int(conf.get("seed", 0), "seed", minimum=0),
        iterations=_int(conf.get("iterations"), "iterations", minimum=1),
        optimize=optimize,
        batch_size=_int(conf.get("batch_size"), "batch_size", minimum=1, allow_none=True),
        eval_every=_int(conf.get("eval_every", 10), "eval_every", minimum=1),
        early_stopping=EarlyStopping.from_settings(conf.get("validation_fraction"),
                                                   conf.get("validation_interval", 1),
                                                   conf.get("n_iter_no_change", 10),
                                                   conf.get("refit", True),
                                                   conf.get("validation_folds"),
                                                   conf.get("refit_rule", "iterations"),
                                                   conf.get("choice_rule", "one_se"),
                                                   conf.get("refine_iter", 0)),
        backend=_optional_text(conf.get("backend"), "backend", "numpy or torch"),
        device=_optional_text(conf.get("device"), "device", "cpu, cuda or cuda:N"),
        dtype=_optional_text(conf.get("dtype"), "dtype", "float64 or float32"),
        baseline_failure=check_baseline_failure(conf.get("baseline_failure", "raise")),
        progress=_mapping(conf.get("progress"), "progress"),
        mlflow=_mapping(conf.get("mlflow"), "mlflow"),
    )


def _hydra_output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception as exc:
        raise InputError(
            "no output folder: run through gpinfer-run (Hydra chooses one) or pass "
            "run_experiment(cfg, output_dir=...)"
        ) from exc


def _hydra_job_tags() -> dict[str, str]:
    """Sweep bookkeeping when running under Hydra (empty otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except Exception:
        return {}
    tags = {"hydra.mode": str(hc.mode.name if hc.mode is not None else "RUN")}
    if hc.mode == RunMode.MULTIRUN:
        tags["hydra.job.num"] = str(hc.job.num)
        tags["hydra.sweep.dir"] = str(hc.sweep.dir)
        tags["hydra.overrides"] = " ".join(hc.overrides.task)
    return tags


# --------------------------------------------------------------------------------------------
# everything before training
# --------------------------------------------------------------------------------------------


def _check_method(s: Settings) -> tuple[type, dict[str, Any], bool]:
    """Load the method class and build its options (optimizer included when it declares one)."""
    from gpinfer import registry

    method_cls = registry.load_method(s.method)
    options = dict(s.method_options)
    declared = dict(getattr(method_cls, "default_options", {}) or {})
    applied = "optimizer" in declared
    if applied:
        options.setdefault("optimizer", s.optimizer)
        if "optimizer_options" in declared and s.optimizer_options:
            options.setdefault("optimizer_options", dict(s.optimizer_options))
    try:  # unknown names, and values against the method's declaration (gpinfer.options)
        method_cls(**options)
    except (TypeError, ValueError) as exc:
        raise InputError(f"method.options: {exc}") from exc
    if applied and options["optimizer"] is not None:  # None: the method chooses
        _check_optimizer(str(options["optimizer"]), options.get("optimizer_options") or {})
    return method_cls, options, applied


def _check_optimizer(name: str, options: Mapping[str, Any]) -> None:
    """Build the optimiser once so that a bad name or option fails before training."""
    try:
        from gpinfer.optim import make_optimizer
    except ImportError:  # pragma: no cover - the optimisers are part of the core
        return
    try:
        make_optimizer(name, **dict(options))
    except (TypeError, ValueError) as exc:
        raise InputError(f"optimizer {name!r}: {exc}") from exc


def _check_kernel_name(name: str) -> None:
    from gpinfer import registry

    registry.find(registry.KERNELS, name)  # UnknownNameError with the nearest names


def _load_split(s: Settings) -> tuple[Any, Any]:
    """Load the dataset and split it with the run's seed (``InputError`` naming the problem)."""
    from gpinfer.data import load_dataset, train_test_split

    d = s.dataset_cfg
    options = _mapping(d.get("options"), "dataset.options")
    if "path" in d:
        if d["path"] is None:
            raise InputError(
                f"dataset {s.dataset!r} needs a file: add dataset.path=/path/to/data.npz "
                "(.npz, .csv or LIBSVM)"
            )
        options.setdefault("path", str(d["path"]))
    for key in ("features", "keep_classes", "n_max"):
        if d.get(key) is not None:
            options[key] = list(d[key]) if isinstance(d[key], list | tuple) else d[key]
    try:
        ds = load_dataset(s.dataset, **options)
    except (OSError, EOFError) as exc:
        raise InputError(f"dataset {s.dataset!r} could not be read: {exc}") from exc
    split = train_test_split(
        ds,
        test_fraction=None if d.get("test_fraction") is None else float(d["test_fraction"]),
        seed=s.seed,
        stratify=bool(d.get("stratify", True)),
    )
    return ds, split


def _check_classes(s: Settings, split: Any) -> tuple[Array, int, Array]:
    """Classes of the training part ``[C]``, ``C`` and the test labels as class indices."""
    classes = np.unique(split.y_train)
    n_classes = int(classes.size)
    if n_classes < 2:
        raise InputError(
            f"dataset {s.dataset!r}: the training part has a single class ({classes.tolist()}); "
            "check keep_classes / test_fraction"
        )
    y_test_index = np.searchsorted(classes, split.y_test)
    unseen = (y_test_index >= n_classes) | (
        classes[np.minimum(y_test_index, n_classes - 1)] != split.y_test
    )
    if np.any(unseen):
        raise InputError(
            f"dataset {s.dataset!r}: the test part has classes "
            f"{sorted(set(split.y_test[unseen].tolist()))} that the training part lacks; "
            "use a stratified split or a smaller test_fraction"
        )
    return classes, n_classes, y_test_index


def _check_likelihood_task(s: Settings, task: str) -> None:
    """A named likelihood must suit the dataset's task (probit on a regression set, say)."""
    if s.likelihood is None:
        return
    from gpinfer.likelihoods import make_likelihood

    lik_task = make_likelihood(s.likelihood).task
    if lik_task != task:
        raise InputError(
            f"method.likelihood={s.likelihood} is for {lik_task} but dataset {s.dataset!r} is "
            f"a {task} dataset; use method.likelihood="
            f"{'gaussian' if task == 'regression' else 'null'} (or null: the method's default)"
        )


def prepare(
    cfg: DictConfig | Mapping[str, Any], output_dir: str | Path | None = None
) -> Prepared:
    """Every check and every load that comes before training; nothing is logged yet."""
    from gpinfer.data import Standardizer
    from gpinfer.kernels import make_kernel
    from gpinfer.validation import check_inducing, check_method_compatible

    conf = config_to_dict(cfg)
    s = parse_settings(conf)
    blas_threads()  # the thread policy (GPINFER_BLAS_THREADS), checked before any MLflow run
    method_cls, options, applied = _check_method(s)
    backend = _check_backend(s, method_cls)
    _check_kernel_name(s.kernel)
    out_dir = res.check_output_dir(output_dir if output_dir is not None else _hydra_output_dir())
    uri = tracking.resolve_tracking_uri(s.mlflow.get("tracking_uri"))
    logger = tracking.RunLogger(
        uri,
        experiment=s.mlflow.get("experiment") or "gpinfer",
        artifact_location=s.mlflow.get("artifact_location"),
        flush_every=s.mlflow.get("flush_every", 100),
        flush_interval_s=s.mlflow.get("flush_interval_s", 2.0),
    )
    if isinstance(conf.get("mlflow"), dict) and conf["mlflow"].get("tracking_uri"):
        # the stored config (params, config.yaml artifact) never holds credentials
        conf["mlflow"]["tracking_uri"] = redact_uri(str(conf["mlflow"]["tracking_uri"]))
    ds, split = _load_split(s)
    task = ds.task
    y_train, y_shift, y_scale = split.y_train, 0.0, 1.0
    if task == "classification":
        classes, n_classes, y_test_index = _check_classes(s, split)
    else:
        from gpinfer.regressor import check_targets

        classes, n_classes = np.zeros(0), 0
        y_train, y_test_index = check_targets(split.y_train), check_targets(split.y_test)
    if split.X_test.shape[0] == 0:
        raise InputError(f"dataset {s.dataset!r}: the test part is empty")
    if task == "regression" and not backend.is_numpy:
        raise InputError(f"dataset {s.dataset!r} is a regression dataset, and regression runs "
                         f"on numpy only: leave backend and device unset (got {backend})")

    X_train, X_test = split.X_train, split.X_test
    st = None
    if s.dataset_cfg.get("standardize", True):
        st = Standardizer().fit(X_train)
        X_train, X_test = st.transform(X_train), st.transform(X_test)
        if task == "regression":
            y_shift, y_scale = float(np.mean(y_train)), float(np.std(y_train)) or 1.0
            y_train = (y_train - y_shift) / y_scale

    n, d = X_train.shape
    _check_likelihood_task(s, task)
    check_method_compatible(method_cls, n_classes, task, s.batch_size,
                            s.likelihood or ("gaussian" if task == "regression" else None))
    inducing = check_inducing(s.M, n, d, s.method, bool(method_cls.uses_inducing_points))
    M_count = None if inducing is None else int(inducing)

    k = s.kernel_cfg
    params = {key: v for key, v in k.items() if key not in _KERNEL_META and v is not None}
    kernel = make_kernel(
        s.kernel, input_dim=d, ard=bool(k.get("ard", False)), noise=k.get("noise"), **params
    )
    return Prepared(
        settings=s,
        out_dir=out_dir,
        method_cls=method_cls,
        X_train=X_train,
        y_train=y_train,
        X_test=X_test,
        y_test_index=y_test_index,
        classes=classes,
        n_classes=n_classes,
        task=task,
        M_count=M_count,
        kernel=kernel,
        method_options=options,
        optimizer_applied=applied,
        logger=logger,
        config=conf,
        y_shift=y_shift,
        y_scale=y_scale,
        backend=backend,
        standardizer=st,
        X_train_raw_head=np.array(split.X_train[:_EXAMPLE_ROWS], dtype=np.float64),
    )


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------


def evaluate_test(posterior: Any, X: Array, y_index: Array,
                  P: Array | None = None) -> dict[str, float]:
    """Test error and mean negative log predictive of ``posterior`` at ``X [N*, D]``
    (``P``: ``posterior.predict_proba(X)`` when already computed)."""
    from gpinfer.metrics import error_rate, nll

    P = np.asarray(posterior.predict_proba(X) if P is None else P, dtype=float)
    if P.ndim == 2 and P.shape[1] == 1:  # p(class 1) of a binary problem as a column
        P = P[:, 0]
    out = {"test_error": error_rate(y_index, P)}
    try:
        out["test_nll"] = nll(None, log_predictive=np.asarray(posterior.log_predictive(X, y_index)))
    except (NotImplementedError, AttributeError):
        out["test_nll"] = nll(y_index, P)
    return out


def evaluate_regression(posterior: Any, X: Array, y: Array, shift: float = 0.0,
                        scale: float = 1.0) -> dict[str, float]:
    """Test RMSE and mean negative log predictive density of real targets ``y [N*]`` (original
    units) for a ``posterior`` fitted to ``(y - shift) / scale``."""
    mean, var = posterior.predict_f(X)
    z = (np.asarray(y, dtype=float) - shift) / scale
    log_p = np.asarray(posterior.likelihood.log_predictive(z, mean[:, 0], var[:, 0]))
    return {"test_rmse": float(scale * np.sqrt(np.mean((mean[:, 0] - z) ** 2))),
            "test_nll": float(np.log(scale) - np.mean(log_p))}


def _evaluate(p: Prepared, posterior: Any, P: Array | None = None) -> dict[str, float]:
    """The test metrics of ``p``'s task (``P``: a classifier's test predictions, if known)."""
    if p.task == "regression":
        return evaluate_regression(posterior, p.X_test, p.y_test_index, p.y_shift, p.y_scale)
    return evaluate_test(posterior, p.X_test, p.y_test_index, P)


class _Callback:
    """The fit callback: metrics to MLflow, the training curve, the progress bar, test metrics
    to the run log, a finite-objective guard."""

    def __init__(self, p: Prepared, progress: ProgressBar) -> None:
        self.p = p
        self.progress = progress
        self.curve = TrainingCurve()
        self.start = time.perf_counter()  # reset when training starts
        self.last_iteration = 0
        self.overhead_s = 0.0  # time spent evaluating and logging (not training)

    def __call__(self, info: IterationInfo) -> None:
        t0 = time.perf_counter()
        it = int(info.iteration)
        self.last_iteration = it
        objective = float(info.objective)
        metrics: dict[str, float] = {"objective": objective, "elapsed_s": float(info.elapsed)}
        for key, value in (info.extra or {}).items():
            name = f"extra.{key}" if key in _RESERVED else str(key)
            try:
                metrics[name] = float(value)
            except (TypeError, ValueError):
                continue
        every = self.p.settings.eval_every
        tests: dict[str, float] = {}
        # the last scheduled iteration is evaluated once, by the final evaluation after the fit
        if info.posterior is not None and it % every == 0 and it < self.p.settings.iterations:
            tests = _evaluate(self.p, info.posterior())
            metrics.update({EVAL_PREFIX + key: value for key, value in tests.items()})
            _log.info("iteration %d/%d: objective %.6g, %s", it, self.p.settings.iterations,
                      objective, ", ".join(f"{k} {v:.4g}" for k, v in tests.items()))
        self.p.logger.log_metrics(metrics, step=it)
        self.curve.add(t0 - self.start - self.overhead_s, objective, tests)
        self.progress.update(it, objective, tests.get("test_error"))
        self.overhead_s += time.perf_counter() - t0
        if not math.isfinite(objective):
            raise NumericalError(
                f"the objective became {objective} during training", iteration=it,
                quantity="objective",
            )


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM (a cluster's or a launcher's stop) into KeyboardInterrupt while training."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # not allowed here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _tags(p: Prepared) -> dict[str, str]:
    s = p.settings
    dist, version = tracking.plugin_distribution(s.method)
    commit = tracking.git_commit()
    from gpinfer import __version__ as core_version

    tags = {
        "method": s.method,
        "method.distribution": dist,
        "method.version": version,
        "dataset": s.dataset,
        "kernel": s.kernel,
        "optimizer": s.optimizer,
        "optimizer.applied": str(p.optimizer_applied).lower(),
        "likelihood": s.likelihood or "default",
        "M": "null" if s.M is None else str(s.M),
        "seed": str(s.seed),
        "git_commit": commit,
        "git_dirty": tracking.git_dirty(),
        "gpinfer.version": str(core_version),
        "output_dir": str(p.out_dir),
        "mlflow.source.name": "gpinfer-run",
        "mlflow.source.type": "LOCAL",
    }
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit
    tags.update({k: redact_text(v, p.logger.tracking_uri) for k, v in _hydra_job_tags().items()})
    from gpinfer.experiment import stale_runs  # imports MLflow: only once a run is logged

    tags.update(stale_runs.run_tags())  # host and pid: a later run can tell this one died
    return tags


def _end_stale_runs(logger: tracking.RunLogger, stream: TextIO | None) -> None:
    """End as KILLED the store's runs of this host whose process is gone (never fails a run)."""
    try:
        from gpinfer.experiment import stale_runs

        ended = tracking.store_call(stale_runs.end_stale_runs)(logger.client)
    except Exception as exc:  # a store that cannot be searched must not stop this run
        _log.warning("could not check the store for stale runs: %s",
                     store_error(exc, logger.tracking_uri))
        return
    for run in ended:
        print(f"gpinfer-run: ended stale run {run.run_id} ({run.run_name}) as KILLED: "
              f"{run.reason}", file=stream if stream is not None else sys.stderr, flush=True)


def _params(p: Prepared) -> dict[str, str]:
    params = tracking.flatten_config(p.config)
    params.update(
        {
            "data.n_train": str(_n_fit(p)),
            "data.n_validation": str(p.X_train.shape[0] - _n_fit(p)),
            "data.n_test": str(p.X_test.shape[0]),
            "data.n_features": str(p.X_train.shape[1]),
            "data.n_classes": str(p.n_classes),
            "M_count": "null" if p.M_count is None else str(p.M_count),
            "data.task": p.task,
        }
    )
    params.update(p.backend.params())  # as resolved: numpy/cpu/float64 when left unset
    if p.task == "regression":  # log_evidence is that of the standardised targets
        params.update({"data.y_shift": repr(p.y_shift), "data.y_scale": repr(p.y_scale)})
    return params


def _n_fit(p: Prepared) -> int:
    """The training rows the fitted model was trained on: all of ``X_train``, less the
    early-stopping validation part (``validation_size``) where the model is the best iterate of
    the fit on the rest (``refit=False``; a refit trains on all of them); with
    ``refit="average"``, the rows of one of the averaged models (``n - n // K`` for K folds,
    the largest of them)."""
    n, es = int(p.X_train.shape[0]), p.settings.early_stopping
    if es is None or es.refit is True:
        return n
    folds = es.n_folds(n)
    if folds > 1:
        return n - n // folds
    return n - validation_size(p.y_train, es.validation_fraction, p.n_classes)


def fitted_inducing_count(posterior: object) -> int | None:
    """Inducing points per latent of a fitted sparse posterior (``Z [M, D]`` or a list of
    them; an ``AveragedPosterior``'s first member's); None for a posterior without inducing
    inputs."""
    members = getattr(posterior, "members", None)
    Z = getattr(posterior if members is None else members[0], "Z", None)
    if Z is None:
        return None
    first = Z[0] if isinstance(Z, list | tuple) else Z
    return int(np.asarray(first).shape[0])


def _base_result(p: Prepared) -> dict[str, Any]:
    s = p.settings
    return {
        "method": s.method,
        "dataset": s.dataset,
        "M": s.M,
        "seed": s.seed,
        "test_error": None,
        **({"test_rmse": None} if p.task == "regression" else {}),
        "test_nll": None,
        "log_evidence": None,
        "train_time_s": None,
        "n_iter": 0,
        "peak_rss_mb": None,
        "status": None,
        "kernel": s.kernel,
        "likelihood": s.likelihood,
        "M_count": p.M_count,
        "iterations": s.iterations,
        "optimize": (s.optimize if s.optimize is not None
                     else bool(getattr(p.method_cls, "optimize_by_default", True))),
        "n_train": _n_fit(p),
        "n_test": int(p.X_test.shape[0]),
        "n_features": int(p.X_train.shape[1]),
        "n_classes": p.n_classes,
        "output_dir": str(p.out_dir),
        "mlflow_run_id": p.logger.run_id,
        "mlflow_tracking_uri": redact_uri(p.logger.tracking_uri),
    }


def _record_fit_report(logger: tracking.RunLogger, result: dict[str, Any], report: Any) -> None:
    """The fit guard's codes and numbers (``FitResult.warnings`` and ``diagnostics``) into
    ``result`` and the MLflow tag ``fit_warnings``."""
    result["fit_warnings"] = list(report.warnings)
    result.update({k: float(v) for k, v in report.diagnostics.items()})
    logger.set_tags({"fit_warnings": ",".join(report.warnings) or "none"})


def _publish(p: Prepared, estimator: Any, callback: _Callback, result: dict[str, Any],
             P_test: Any = None, figures: FigureJob | None = None) -> float:
    """Learned hyper-parameters, model, datasets and plots to MLflow (``publish.publish_run``;
    ``P_test``: the posterior's test predictions of a classifier, for the reliability diagram;
    ``figures``: the figures' worker started before training, ``render.FigureJob``);
    returns the seconds it took (not part of the training time); each part's seconds go to
    ``result["publish.<part>_s"]``."""
    from gpinfer.estimator import class_probabilities
    from gpinfer.experiment.model_logging import deployable_model
    from gpinfer.experiment.publish import publish_run

    s = p.settings
    start = time.perf_counter()
    classification = p.task == "classification"
    y_train = np.searchsorted(p.classes, p.y_train) if classification else p.y_train
    callback.curve.add_tests(float(result["train_time_s"]), {
        key: float(result[key]) for key in ("test_error", "test_rmse", "test_nll")
        if result.get(key) is not None and (classification or key != "test_error")})
    parts = publish_run(
        p.logger, estimator, settings=s.mlflow, out_dir=p.out_dir, method=s.method,
        dataset=s.dataset, title=f"{s.method} on {s.dataset} (seed {s.seed})",
        step=max(int(result["n_iter"]), callback.last_iteration), curve=callback.curve,
        data=(p.X_train, y_train, p.X_test, p.y_test_index), classification=classification,
        model=deployable_model(estimator, p.standardizer,  # imports scikit-learn: only when
                               None if classification else (p.y_shift, p.y_scale))  # logged
        if s.mlflow.get("log_model", True) else None,
        model_example=p.X_train_raw_head,
        P_test=None if P_test is None else class_probabilities(
            P_test, p.X_test.shape[0], p.n_classes, s.method),
        figures=figures,
    )
    result.update({f"publish.{name.replace('-', '_')}_s": seconds
                   for name, seconds in parts.items()})
    return time.perf_counter() - start


def run_experiment(
    cfg: DictConfig | Mapping[str, Any],
    *,
    output_dir: str | Path | None = None,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
) -> dict[str, Any]:
    """Run one experiment (see the module docstring); returns the ``result.json`` content.

    ``output_dir``: the run folder (default: Hydra's output folder for this job). ``stream``
    receives the one-line summary (stdout), ``progress_stream`` the progress lines (stderr).
    """
    from gpinfer.estimator import GPClassifierCore
    from gpinfer.regressor import GPRegressorCore

    p = prepare(cfg, output_dir)
    s = p.settings
    res.reset_peak_rss()
    # the cores: the estimators without scikit-learn, whose import a run does not need
    estimator = (GPRegressorCore if p.task == "regression" else GPClassifierCore)(
        method=s.method,
        M=p.M_count,
        kernel=p.kernel,
        likelihood=s.likelihood,
        optimize=s.optimize,
        max_iter=s.iterations,
        batch_size=s.batch_size,
        random_state=s.seed,
        method_options=p.method_options,
        baseline_failure=s.baseline_failure,
        **({} if s.early_stopping is None else {
            "validation_fraction": s.early_stopping.validation_fraction,
            "validation_interval": s.early_stopping.validation_interval,
            "n_iter_no_change": s.early_stopping.n_iter_no_change,
            "refit": s.early_stopping.refit,
            "validation_folds": s.early_stopping.folds,
            "refit_rule": s.early_stopping.refit_rule,
            "choice_rule": s.early_stopping.choice_rule,
            "refine_iter": s.early_stopping.refine_iter}),
        **({} if p.task == "regression" else p.backend.params()),
    )
    label = f"{s.method}/{s.dataset} s{s.seed}"
    progress = ProgressBar(s.iterations, label, show=s.progress.get("bar", "auto"),
                           stream=progress_stream)
    callback = _Callback(p, progress)
    scrub_files(p.out_dir / ".hydra", p.logger.tracking_uri)  # Hydra's record of the overrides
    config_path = p.out_dir / "config.yaml"
    config_path.write_text(OmegaConf.to_yaml(OmegaConf.create(p.config)))
    run_name = tracking.unique_run_name(
        [s.method, s.dataset, s.kernel] + ([f"M{s.M}"] if s.M is not None else []) + [f"s{s.seed}"]
    )
    _log.info("run %s: %s (output folder %s)", run_name, label, p.out_dir)
    result = _base_result(p)
    logger = p.logger
    _end_stale_runs(logger, progress_stream)
    with logger.run(run_name, tags=_tags(p), params=_params(p)):
        result["mlflow_run_id"] = logger.run_id
        logger.log_artifact(config_path)
        figures: FigureJob | None = None
        start = callback.start = time.perf_counter()
        try:
            if s.mlflow.get("log_plots", True):  # its matplotlib import overlaps the fit
                figures = FigureJob.spawn(p.out_dir)
                start = callback.start = time.perf_counter()
            with _sigterm_as_interrupt(), progress:
                estimator.fit(p.X_train, p.y_train, callback=callback)
            wall = time.perf_counter() - start
            # the classifier's test predictions: the final numbers and the reliability diagram
            P_test = (None if p.task == "regression"
                      else estimator.posterior_.predict_proba(p.X_test))
            final = _evaluate(p, estimator.posterior_, P_test)
            result.update(
                final,
                log_evidence=float(estimator.log_evidence_),
                train_time_s=max(wall - callback.overhead_s, 0.0),
                wall_time_s=wall,
                n_iter=int(estimator.n_iter_),
                peak_rss_mb=res.peak_rss_mb(),
                status=tracking.FINISHED,
            )
            if p.M_count is None:  # report the number of inducing points the method chose
                result["M_count"] = fitted_inducing_count(estimator.posterior_)
            fit_report = estimator.fit_result_
            _record_fit_report(logger, result, fit_report)
            if getattr(estimator, "best_validation_score_", None) is not None:
                result["best_validation_score"] = float(estimator.best_validation_score_)
            if WORSE_THAN_BASELINE in fit_report.warnings:  # kept (baseline_failure=warn)
                what = "a constant Gaussian" if p.task == "regression" else "the class frequencies"
                result.update(status=tracking.FAILED, error=(
                    f"training NLL {result['train_nll']:.4g} is no better than predicting {what} "
                    f"({result['baseline_nll']:.4g}); the model was kept (baseline_failure=warn)"))
            logger.log_final({key: result[key] for key in FINAL_METRICS if key in result},
                             step=max(result["n_iter"], callback.last_iteration))
            state = tracking.collect_state(
                estimator.fit_result_,
                extra={"classes": p.classes, "M_count": np.asarray(p.M_count or 0)},
            )
            state_path = tracking.save_state(p.out_dir / "state.npz", state)
            logger.log_artifact(state_path)
            result["publish_s"] = _publish(p, estimator, callback, result, P_test, figures)
            res.write_result(p.out_dir, result)
            logger.log_artifact(p.out_dir / res.RESULT_FILE)
            if result["status"] == tracking.FAILED:
                logger.set_tags({"error": result["error"]})
                logger.end(tracking.FAILED)
        except BaseException as exc:
            if figures is not None:  # a worker given nothing to draw exits
                figures.cancel()
            interrupted = isinstance(exc, KeyboardInterrupt)
            if isinstance(exc, FitFailedError) and exc.result is not None:
                _record_fit_report(logger, result, exc.result)
            result.update(
                status=tracking.KILLED if interrupted else tracking.FAILED,
                error=f"{type(exc).__name__}: {exc}",
                n_iter=callback.last_iteration,
                error_iteration=getattr(exc, "iteration", None),
                train_time_s=time.perf_counter() - start - callback.overhead_s,
                peak_rss_mb=res.peak_rss_mb(),
            )
            try:
                res.write_result(p.out_dir, result)
                logger.log_artifact(p.out_dir / res.RESULT_FILE)
            except Exception:  # never hide the original error
                pass
            raise
    out = stream if stream is not None else sys.stdout
    line = res.summary_line(result)
    _log.info("%s", line)
    print(line, file=out, flush=True)
    return result

"""Everything a run checks and loads before training (``prepare`` -> ``Prepared``); nothing
is logged yet and no MLflow run exists.

The plain settings (``gpinfer.experiment.settings``), the thread policy, the method and its options
(optimizer included), the array backend's settings and the method on it
(``gpinfer.validation.check_method_backend``), the kernel name, under ``torchrun`` the process group
and the method in it (``check_process_group``), the output folder, the MLflow store; then the
dataset, loaded and split with the run's seed, its targets checked for the task, the inputs (and a
regression's targets) standardised on the training part, the problem checked against what the method
declares (task, classes, mini-batches, likelihood, the method and its likelihood's expectation rule
on the backend: the estimator's own check, ``gpinfer.validation.check_method_compatible``; inducing
points) and the kernel built. Every problem is a ``gpinfer.errors`` error naming it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gpinfer.backend.choice import NUMPY, Backend, resolve_backend
from gpinfer.errors import InputError
from gpinfer.experiment import results as res
from gpinfer.experiment import tracking
from gpinfer.experiment.config_paths import core_conf_dir
from gpinfer.experiment.redact import redact_uri
from gpinfer.experiment.settings import Settings, as_mapping, config_to_dict, parse_settings
from gpinfer.interfaces import Method
from gpinfer.kernels.initialisation import resolve_lengthscale_init
from gpinfer.threads import blas_threads
from gpinfer.training import distributed
from gpinfer.validation import check_method_backend, check_process_group

if TYPE_CHECKING:
    from gpinfer.data import Standardizer
    from gpinfer.data.base import Dataset
    from gpinfer.data.source import RowSource
    from gpinfer.data.source_files import SourceDataset
    from gpinfer.data.splits import Split
    from gpinfer.kernels.base import Kernel

Array = np.ndarray

#: kernel group keys that are not constructor parameters
_KERNEL_META = {"name", "ard", "noise"}


#: raw training rows kept for the logged model's input example
_EXAMPLE_ROWS = 5


@dataclass
class Prepared:
    """Everything checked and loaded before training starts."""

    settings: Settings
    out_dir: Path
    method_cls: type[Method]
    #: the inputs as the model sees them: arrays, or for a dataset read out of core
    #: (``dataset.format=npy|parquet``) row sources that read them in blocks
    X_train: Array | RowSource
    y_train: Array
    X_test: Array | RowSource
    y_test_index: Array
    classes: Array
    n_classes: int
    task: str
    M_count: int | None
    kernel: Kernel
    method_options: dict[str, Any]
    optimizer_applied: bool
    #: the MLflow store; ``None`` on a rank other than 0 of a process group (``torchrun``):
    #: only rank 0 writes to MLflow and the output folder
    store: tracking.RunLogger | None
    config: dict[str, Any]
    #: regression: the training mean and std of ``y`` (the model sees ``(y - shift) / scale``;
    #: ``y_test_index`` then holds the real test targets in their original units)
    y_shift: float = 0.0
    y_scale: float = 1.0
    #: the array backend the fit runs on (resolved from the settings, checked for the method)
    backend: Backend = NUMPY
    #: the training part's standardisation of the inputs (``None``: inputs used as loaded)
    standardizer: Standardizer | None = None
    #: the first training rows as loaded (raw features ``[n, D]``): the logged model's example
    X_train_raw_head: Array | None = None

    @property
    def logger(self) -> tracking.RunLogger:
        """The MLflow store (``RuntimeError`` on a rank that records nothing)."""
        if self.store is None:
            raise RuntimeError("only rank 0 of a process group writes to MLflow")
        return self.store


def _hydra_output_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception as exc:
        raise InputError(
            "no output folder: run through gpinfer-run (Hydra chooses one) or pass "
            "run_experiment(cfg, output_dir=...)"
        ) from exc


def _check_method(s: Settings) -> tuple[type[Method], dict[str, Any], bool]:
    """Load the method class and build its options (optimizer included when it declares one,
    and the optimiser it runs for the run's ``batch_size``, ``Method.optimizer_for``, built once;
    ``lengthscale_init`` resolved for the run's named kernel: ``"auto"`` is ``"median"``);
    returns the class, the options and whether the optimizer group is the one the method runs
    (the run's ``optimizer.applied`` tag: false for a method without an ``optimizer`` option,
    or whose ``method.options.optimizer`` names another one or null, the method's choice, or
    that runs another for the run's ``batch_size`` (``optimizer_for``), or without the
    group's options, ``_group_options_reach``; group options set off the group's file that
    would not reach the method are an ``InputError``, ``_check_group_options_kept``)."""
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
    runs = method_cls.optimizer_for(options, s.batch_size)  # the method's choice for null
    if runs is not None:
        _check_optimizer(str(runs), options.get("optimizer_options") or {})
    reach = _group_options_reach(s, options)
    if not reach:
        _check_group_options_kept(s, "optimizer_options" in declared)
    if "lengthscale_init" in declared:  # the run's kernel is named: its length-scale a placeholder
        given = str(options.get("lengthscale_init", declared["lengthscale_init"]))
        optimize = bool(method_cls.optimize_by_default if s.optimize is None else s.optimize)
        options["lengthscale_init"] = resolve_lengthscale_init(
            given, kernel_given=False, optimize=optimize, owner=f"method.options of {s.method}")
        if given == "auto" and not optimize:
            _warn_median_replaces(s)
    return method_cls, options, (applied and options["optimizer"] == s.optimizer
                                 and runs == s.optimizer and reach)


def _group_options_reach(s: Settings, options: Mapping[str, Any]) -> bool:
    """Whether the method runs with the optimizer group's options: the group has none, or
    the method's ``optimizer_options`` are they (a method that does not declare that option,
    pep/fitc/vfe, takes the group's name only)."""
    return not s.optimizer_options or dict(options.get("optimizer_options") or {}) == dict(
        s.optimizer_options)


def _check_group_options_kept(s: Settings, takes_options: bool) -> None:
    """``InputError`` naming the first of the optimizer group's options that the run sets off
    the group's own file (``conf/optimizer/<name>.yaml``) when the method does not run with
    them (``_group_options_reach``): they were dropped while the run logged them as params
    (and tagged ``optimizer.applied`` true). Left at the group's own values they are only
    the group's record, and the tag says false."""
    path = core_conf_dir() / "optimizer" / f"{s.optimizer}.yaml"
    if not path.is_file():  # a plugin's optimizer group: its defaults are not known here
        return
    own = OmegaConf.to_container(OmegaConf.load(path)).get("options") or {}  # type: ignore[union-attr]
    changed = [key for key, value in s.optimizer_options.items()
               if key not in own or own[key] != value]
    if not changed:
        return
    key = changed[0]
    why = (f"the method's method.options.optimizer_options are not the group's (set "
           f"method.options.optimizer_options.{key} instead)" if takes_options else
           f"{s.method} takes the optimizer group's name only, not its options (its own "
           f"settings are in method.options: conf/method/{s.method}.yaml)")
    raise InputError(f"optimizer.options.{key}={s.optimizer_options[key]!r} would not reach "
                     f"method {s.method!r}: {why}")


def _warn_median_replaces(s: Settings) -> None:
    """gpinfer-run's trap: with fixed hyper-parameters, a ``kernel.lengthscale`` moved off the
    kernel groups' 1.0 is still replaced by the median heuristic (``lengthscale_init="auto"``
    is ``"median"`` for the run's named kernel): a ``UserWarning`` naming the way to keep it."""
    value = s.kernel_cfg.get("lengthscale")
    try:
        if value is None or np.all(np.asarray(value, dtype=float) == 1.0):
            return
    except (TypeError, ValueError):  # not a number: the kernel's build names it
        return
    warnings.warn(
        f"gpinfer-run: kernel.lengthscale={value} is replaced by the median heuristic with "
        f"optimize=false ({s.method}'s lengthscale_init='auto' is 'median' for the run's "
        "kernel): method.options.lengthscale_init=kernel keeps it (=median: the median, "
        "without this warning)", UserWarning, stacklevel=2)


def _check_optimizer(name: str, options: Mapping[str, Any]) -> None:
    """Build the optimiser once so that a bad name or option fails before training."""
    try:
        from gpinfer.optim import make_optimizer
    except ImportError:  # pragma: no cover - the optimisers are part of the core
        return
    try:
        make_optimizer(name, **dict(options))
    except (TypeError, ValueError) as exc:
        prefix = f"optimizer {name!r}"  # once: the optimisers' own messages may start with it
        text = str(exc)
        raise InputError(text if text.startswith(prefix) else f"{prefix}: {text}") from exc


def _check_kernel_name(name: str) -> None:
    from gpinfer import registry

    registry.find(registry.KERNELS, name)  # UnknownNameError with the nearest names


def _load_split(s: Settings) -> tuple[Dataset | SourceDataset, Split]:
    """Load the dataset and split it with the run's seed (``InputError`` naming the problem);
    a dataset read out of core (``gpinfer.experiment.source_data``) is opened, not loaded."""
    from gpinfer.data import load_dataset, train_test_split
    from gpinfer.data.source_files import source_format

    d = s.dataset_cfg
    fmt = source_format(d.get("path"), d.get("format"))
    if fmt is not None:
        from gpinfer.experiment import source_data

        return source_data.load_split(s, fmt)
    stray = [k for k in ("labels", "test_path", "test_labels") if d.get(k) is not None]
    if stray:
        raise InputError(f"dataset {s.dataset!r}: dataset.{stray[0]} applies to files read out "
                         "of core (dataset.format=npy or parquet); an .npz, CSV or LIBSVM file "
                         "holds its labels and test part itself")
    options = as_mapping(d.get("options"), "dataset.options")
    if "path" in d:
        if d["path"] is None:
            raise InputError(
                f"dataset {s.dataset!r} needs a file: add dataset.path=/path/to/data.npz "
                "(.npz, .csv or LIBSVM)"
            )
        options.setdefault("path", str(d["path"]))
        if d.get("format") is not None:
            options.setdefault("format", str(d["format"]))
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


def _check_classes(s: Settings, split: Split) -> tuple[Array, int, Array]:
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


def _check_likelihood_task(s: Settings, method_cls: type[Method], task: str,
                           n_classes: int) -> None:
    """A named likelihood must suit the dataset's task (probit on a regression set, say) and,
    for more than two classes, be a multi-class one (probit on waveform, say; the message
    names ``method_cls``'s multi-class likelihoods)."""
    if s.likelihood is None:
        return
    from gpinfer.likelihoods import make_likelihood

    likelihood = make_likelihood(s.likelihood)
    lik_task = likelihood.task
    if lik_task != task:
        raise InputError(
            f"method.likelihood={s.likelihood} is for {lik_task} but dataset {s.dataset!r} is "
            f"a {task} dataset; use method.likelihood="
            f"{'gaussian' if task == 'regression' else 'null'} (or null: the method's default)"
        )
    if task == "classification" and n_classes > 2 and not likelihood.multiclass:
        multi = [name for name in method_cls.likelihoods if make_likelihood(name).multiclass]
        raise InputError(
            f"method.likelihood={s.likelihood} is binary but dataset {s.dataset!r} has "
            f"{n_classes} classes; use method.likelihood=null (the method's default)"
            + (f" or one of method {s.method}'s multi-class likelihoods: {', '.join(multi)}"
               if multi else "")
        )


def _open_store(s: Settings, conf: dict[str, Any]) -> tracking.RunLogger:
    """The MLflow store's ``RunLogger`` (no run yet); the stored config's tracking URI is
    redacted in ``conf`` (params and the config.yaml artifact never hold credentials)."""
    uri = tracking.resolve_tracking_uri(s.mlflow.get("tracking_uri"))
    logger = tracking.RunLogger(
        uri,
        experiment=s.mlflow.get("experiment") or "gpinfer",
        artifact_location=s.mlflow.get("artifact_location"),
        flush_every=s.mlflow.get("flush_every", 100),
        flush_interval_s=s.mlflow.get("flush_interval_s", 2.0),
    )
    if isinstance(conf.get("mlflow"), dict) and conf["mlflow"].get("tracking_uri"):
        conf["mlflow"]["tracking_uri"] = redact_uri(str(conf["mlflow"]["tracking_uri"]))
    return logger


@dataclass
class _Targets:
    """The split's targets as the model sees them: classes ``[C]`` (empty for regression),
    ``C`` (0), the training targets ``y [n]`` (labels, or real targets not yet standardised)
    and the test targets ``[N*]`` (class indices, or real targets)."""

    classes: Array
    n_classes: int
    y_train: Array
    y_test: Array


def _targets(s: Settings, split: Split, task: str, backend: Backend
             ) -> _Targets:
    """The task's targets of ``split`` (``InputError`` for an empty test part, classes the
    training part lacks, non-finite regression targets, a regression off numpy)."""
    if task == "classification":
        classes, n_classes, y_test_index = _check_classes(s, split)
        targets = _Targets(classes, n_classes, split.y_train, y_test_index)
    else:
        from gpinfer.regressor import check_targets

        targets = _Targets(np.zeros(0), 0, check_targets(split.y_train),
                           check_targets(split.y_test))
    if split.n_test == 0:
        raise InputError(f"dataset {s.dataset!r}: the test part is empty")
    if task == "regression" and not backend.is_numpy:
        raise InputError(f"dataset {s.dataset!r} is a regression dataset, and regression runs "
                         f"on numpy only: leave backend and device unset (got {backend})")
    return targets


def _standardise(s: Settings, ds: Dataset | SourceDataset, split: Split,
                 y_train: Array) -> tuple[Any, Any, Array, Standardizer | None, float, float]:
    """``(X_train, X_test, y_train, standardizer, y_shift, y_scale)``: the inputs standardised
    on the training part (``dataset.standardize``, default true), and a regression's targets
    too (``(y - shift) / scale``); unchanged (None, 0, 1) otherwise. A dataset read out of
    core is checked in chunks and standardised per block (``source_data.standardise``)."""
    from gpinfer.data import Standardizer
    from gpinfer.experiment.source_data import SourceSplit, standardise

    if isinstance(split, SourceSplit):
        X_train, X_test, scaler = standardise(cast("SourceDataset", ds), split,
                                              bool(s.dataset_cfg.get("standardize", True)))
        return X_train, X_test, y_train, scaler, 0.0, 1.0
    task = ds.task
    if not s.dataset_cfg.get("standardize", True):
        return split.X_train, split.X_test, y_train, None, 0.0, 1.0
    st = Standardizer().fit(split.X_train)
    y_shift, y_scale = 0.0, 1.0
    if task == "regression":
        y_shift, y_scale = float(np.mean(y_train)), float(np.std(y_train)) or 1.0
        y_train = (y_train - y_shift) / y_scale
    return st.transform(split.X_train), st.transform(split.X_test), y_train, st, y_shift, y_scale


def _build_kernel(s: Settings, input_dim: int) -> Kernel:
    """The kernel group's kernel on ``input_dim`` features."""
    from gpinfer.kernels import make_kernel

    k = s.kernel_cfg
    params = {key: v for key, v in k.items() if key not in _KERNEL_META and v is not None}
    return make_kernel(
        s.kernel, input_dim=input_dim, ard=bool(k.get("ard", False)), noise=k.get("noise"),
        **params
    )


def _check_problem(s: Settings, method_cls: type[Method], options: Mapping[str, Any],
                   backend: Backend, task: str, n_classes: int, n: int, d: int) -> int | None:
    """The problem against what the method (with its ``options``) declares: task, classes,
    mini-batches, likelihood, and the method and its likelihood's expectation rule on
    ``backend``; returns the inducing-point count (None: the method chooses, or none)."""
    from gpinfer.validation import check_inducing, check_method_compatible

    _check_likelihood_task(s, method_cls, task, n_classes)
    check_method_compatible(method_cls, n_classes, task, s.batch_size,
                            s.likelihood or ("gaussian" if task == "regression" else None),
                            backend=backend, options=options)
    inducing = check_inducing(s.M, n, d, s.method, bool(method_cls.uses_inducing_points))
    return None if inducing is None else int(inducing)


def _check_features_vary(s: Settings, X_train: Any) -> None:
    """``InputError`` when every feature of the training inputs ``X_train [n, d]`` (an array,
    or rows read out of core with their chunked statistics, ``RowSource.checked``) is constant
    (``gpinfer.validation.check_features_vary``), before any MLflow run: the estimator would
    find it only inside the run."""
    from gpinfer.validation import check_features_vary

    stats = getattr(X_train, "checked", None)
    if stats is not None:
        check_features_vary(stats.minimum, stats.maximum, stats.n,
                            f"dataset {s.dataset!r}'s training inputs")
    elif hasattr(X_train, "min"):
        check_features_vary(X_train.min(axis=0), X_train.max(axis=0), X_train.shape[0],
                            f"dataset {s.dataset!r}'s training inputs")


def _check_fit_rows(s: Settings, method_cls: type[Method], task: str, y: Array,
                    n_classes: int) -> None:
    """The rows each fit of the run trains on, checked before any MLflow run (the fit would
    find them only inside it): the early-stopping splits of the training targets ``y [N]``
    (class indices; real targets for a regression) as the estimator draws them
    (``validation_splits``: ``InputError`` for more folds than rows, a class too small to
    split), and ``batch_size`` no larger than the fewest rows a fit trains on (all ``N``, or
    a fold's or the hold-out's rest)."""
    from gpinfer.training.early_stopping import validation_splits

    rows, es = int(y.shape[0]), s.early_stopping
    if es is not None:
        es = es.resolved(method_cls.early_stopping_rule, classifier=task != "regression")
        # the sizes, not the rows drawn, decide: any generator gives the estimator's sizes
        splits = validation_splits(y, es, np.random.default_rng(0), n_classes)
        rows = min(int(train.size) for train, _ in splits)
    if s.batch_size is not None and s.batch_size > rows:
        fits = ("" if es is None else
                " (early stopping trains on the rows it does not hold out for validation)")
        raise InputError(
            f"batch_size={s.batch_size} is larger than the {rows} training rows a fit of "
            f"{s.method!r} on dataset {s.dataset!r} trains on{fits}; use batch_size <= {rows}, "
            "or leave batch_size unset for full-batch training"
        )


def _check_streaming(s: Settings, method_cls: type[Method], split: Split) -> None:
    """A dataset read out of core needs a method that trains from it in mini-batches
    (``gpinfer.out_of_core.check_out_of_core``: the ``InputError`` names those methods) and,
    in a process group, at least one shard per rank (``check_group_shards``)."""
    from gpinfer.out_of_core import check_group_shards, check_out_of_core

    check_out_of_core(method_cls, s.method, s.batch_size, split.n_train)
    check_group_shards(split.X_train, distributed.current())


def prepare(
    cfg: DictConfig | Mapping[str, Any], output_dir: str | Path | None = None
) -> Prepared:
    """Every check and every load that comes before training; nothing is logged yet."""
    conf = config_to_dict(cfg)
    s = parse_settings(conf)
    blas_threads()  # the thread policy (GPINFER_BLAS_THREADS), checked before any MLflow run
    method_cls, options, applied = _check_method(s)
    backend = resolve_backend(s.backend, s.device, s.dtype)
    check_method_backend(method_cls, s.method, backend)  # its likelihood's rule with the data
    _check_kernel_name(s.kernel)
    # under torchrun: the process group (gloo on the CPU, nccl on CUDA); ranks other than 0
    # neither create the output folder nor open the MLflow store (the one guard: they record
    # nothing)
    distributed.init_from_env(distributed.env_timeout_s(), backend.device)
    check_process_group(method_cls, s.method)  # a full-batch method in a group: before the store
    main = distributed.is_main()
    out_dir = Path(output_dir if output_dir is not None else _hydra_output_dir())
    if main:
        out_dir = res.check_output_dir(out_dir)
    logger = _open_store(s, conf) if main else None
    from gpinfer.experiment.source_data import SourceSplit, first_rows

    ds, split = _load_split(s)
    if isinstance(split, SourceSplit):  # out of core: the method streams, before any row is read
        _check_streaming(s, method_cls, split)
    t = _targets(s, split, ds.task, backend)
    X_train, X_test, y_train, st, y_shift, y_scale = _standardise(s, ds, split, t.y_train)
    n, d = X_train.shape
    _check_features_vary(s, X_train)
    M_count = _check_problem(s, method_cls, options, backend, ds.task, t.n_classes, n, d)
    _check_fit_rows(s, method_cls, ds.task, np.searchsorted(t.classes, y_train)
                    if ds.task == "classification" else np.asarray(y_train), t.n_classes)
    return Prepared(
        settings=s, out_dir=out_dir, method_cls=method_cls, X_train=X_train, y_train=y_train,
        X_test=X_test, y_test_index=t.y_test, classes=t.classes, n_classes=t.n_classes,
        task=ds.task, M_count=M_count, kernel=_build_kernel(s, d), method_options=options,
        optimizer_applied=applied, store=logger, config=conf, y_shift=y_shift,
        y_scale=y_scale, backend=backend, standardizer=st,
        X_train_raw_head=first_rows(split.X_train, _EXAMPLE_ROWS),
    )

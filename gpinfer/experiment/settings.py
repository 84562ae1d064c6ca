"""The plain settings of one run: the composed Hydra config (``conf/config.yaml``) as plain
containers (``config_to_dict``) and its values checked (``parse_settings`` -> ``Settings``):
the config groups (method, dataset, kernel, optimizer), seed, iterations, ``M``,
``batch_size``, early stopping, the array backend as asked for, the fit guard's
``baseline_failure``, progress and MLflow settings. Every problem is an ``InputError`` naming
the key, before anything is loaded (``gpinfer.experiment.prepare`` does the rest).
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gpinfer.errors import InputError
from gpinfer.experiment.config_paths import CONFIG_NAME, core_conf_dir
from gpinfer.fit_guard import check_baseline_failure
from gpinfer.training.early_stopping import EarlyStopping

#: keys of the dataset group that the runner handles (everything else is an error)
_DATASET_KEYS = {
    "name",
    "options",
    "path",
    "format",  # the file's format (dataset=file); npy and parquet are read out of core
    "labels",
    "test_path",
    "test_labels",
    "test_fraction",
    "standardize",
    "stratify",
    "features",
    "keep_classes",
    "n_max",
}


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
    return {str(key): value for key, value in data.items()}


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


def as_mapping(value: Any, key: str) -> dict[str, Any]:
    """A setting that is a mapping (null: empty) as a dict; ``InputError`` naming ``key``."""
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


def _check_plain(conf: Mapping[str, Any], method: Mapping[str, Any],
                 dataset: Mapping[str, Any]) -> None:
    """The dataset group's keys, ``M``, ``optimize``, ``method.likelihood`` and
    ``dataset.test_fraction``: ``InputError`` naming the key otherwise."""
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


#: switches that must be true or false (a string such as "maybe" was read as true)
_SWITCHES = (("kernel", "ard"), ("dataset", "standardize"), ("dataset", "stratify"),
             ("mlflow", "log_model"), ("mlflow", "log_datasets"), ("mlflow", "log_plots"))


def _check_switches(conf: Mapping[str, Any]) -> None:
    """The true/false settings (``_SWITCHES``), ``progress.bar`` (true, false or auto) and the
    MLflow buffer's ``flush_every`` (an integer >= 1) and ``flush_interval_s`` (a number >= 0):
    ``InputError`` naming the key otherwise (they were read with ``bool()`` / ``int()``, so a
    string ran as true or failed with a traceback)."""
    for group, key in _SWITCHES:
        node = conf.get(group)
        value = node.get(key) if isinstance(node, Mapping) else None
        if value is not None and not isinstance(value, bool):
            raise InputError(f"{group}.{key} must be true or false; got {value!r}")
    progress = conf.get("progress")
    bar = progress.get("bar", "auto") if isinstance(progress, Mapping) else "auto"
    if not isinstance(bar, bool) and not (isinstance(bar, str) and bar.lower() == "auto"):
        raise InputError(f"progress.bar must be true, false or auto; got {bar!r}")
    mlflow = conf.get("mlflow")
    if isinstance(mlflow, Mapping):
        _int(mlflow.get("flush_every", 100), "mlflow.flush_every", minimum=1)
        interval = mlflow.get("flush_interval_s", 2.0)
        if (isinstance(interval, bool) or not isinstance(interval, numbers.Real)
                or not float(interval) >= 0.0):
            raise InputError(f"mlflow.flush_interval_s must be a number of seconds >= 0; got "
                             f"{interval!r}")


#: top-level keys a run's config may hold besides ``conf/config.yaml``'s own: a paper
#: protocol's notice (``conf/experiment/*.yaml``, ``gpinfer.experiment.protocols``)
_EXTRA_TOP_KEYS = ("protocol",)
#: the plain nodes of ``conf/config.yaml`` whose keys are checked as the top level's are
_PLAIN_NODES = ("mlflow", "progress")


@functools.cache
def _known_keys() -> dict[str, frozenset[str]]:
    """The keys ``conf/config.yaml`` declares: its top level (its own settings, its config
    groups and ``_EXTRA_TOP_KEYS``) under ``""``, and each of ``_PLAIN_NODES``' under its
    name. Read once from the core's config (``config_paths.core_conf_dir``), so that a key
    added there is known here."""
    base = OmegaConf.to_container(OmegaConf.load(core_conf_dir() / f"{CONFIG_NAME}.yaml"))
    assert isinstance(base, dict)
    groups = {str(key) for entry in base.get("defaults", []) if isinstance(entry, dict)
              for key in entry if not str(key).startswith("override ")}
    top = {str(key) for key in base if key not in ("defaults", "hydra")}
    known = {"": frozenset(top | groups | set(_EXTRA_TOP_KEYS))}
    for node in _PLAIN_NODES:
        known[node] = frozenset(str(key) for key in base.get(node) or {})
    return known


def _check_known_keys(conf: Mapping[str, Any]) -> None:
    """``InputError`` for a key of the config's top level, or of its ``mlflow`` or
    ``progress`` node, that ``conf/config.yaml`` does not declare (a typo added with
    ``+key=value`` ran silently with the key ignored), naming the nearest known key."""
    from gpinfer.registry import nearest

    known = _known_keys()
    nodes: list[tuple[str, Mapping[str, Any]]] = [("", conf)]
    nodes += [(name, conf[name]) for name in _PLAIN_NODES if isinstance(conf.get(name), Mapping)]
    for where, node in nodes:
        unknown = sorted(str(key) for key in set(node) - known[where])
        if not unknown:
            continue
        names = sorted(known[where])
        prefix = f"{where}." if where else ""
        close = nearest(unknown[0], names, n=1)
        hint = f"; did you mean {prefix}{close[0]}?" if close else ""
        raise InputError(
            f"unknown configuration key {prefix}{unknown[0]}{hint} (gpinfer-run reads "
            f"{'the top-level keys' if not where else f'the keys of {where}'} that "
            f"conf/config.yaml declares: {', '.join(names)}"
            f"{'; method options go under method.options' if not where else ''})"
            + (f"; unknown too: {', '.join(prefix + key for key in unknown[1:])}"
               if len(unknown) > 1 else ""))


def _check_experiment_name(conf: Mapping[str, Any]) -> None:
    """``mlflow.experiment``: null (``gpinfer``) or a name that is not blank; ``InputError``
    naming the key otherwise (an empty name ran under the default experiment silently)."""
    mlflow = conf.get("mlflow")
    name = mlflow.get("experiment") if isinstance(mlflow, Mapping) else None
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InputError(f"mlflow.experiment must be the name of an MLflow experiment (null: "
                         f"gpinfer); got {name!r}")


def _early_stopping_settings(conf: Mapping[str, Any]) -> EarlyStopping | None:
    """The early-stopping keys of the config (``EarlyStopping.from_settings``)."""
    return EarlyStopping.from_settings(conf.get("validation_fraction"),
                                       conf.get("validation_interval", 1),
                                       conf.get("n_iter_no_change", 10),
                                       conf.get("refit", "auto"),
                                       conf.get("validation_folds"),
                                       conf.get("refit_rule", "iterations"),
                                       conf.get("choice_rule", "one_se"),
                                       conf.get("refine_iter"),
                                       conf.get("choice_refine_iter", 0))


def parse_settings(conf: Mapping[str, Any]) -> Settings:
    """Check the plain values of the config; ``InputError`` naming the key otherwise."""
    method = _group(conf, "method")
    dataset = _group(conf, "dataset")
    kernel = _group(conf, "kernel")
    optimizer = _group(conf, "optimizer")
    _check_known_keys(conf)
    _check_plain(conf, method, dataset)
    _check_switches(conf)
    _check_experiment_name(conf)
    return Settings(
        method=str(method["name"]),
        likelihood=method.get("likelihood"),
        method_options=as_mapping(method.get("options"), "method.options"),
        dataset=str(dataset["name"]),
        dataset_cfg=dataset,
        kernel=str(kernel["name"]),
        kernel_cfg=kernel,
        optimizer=str(optimizer["name"]),
        optimizer_options=as_mapping(optimizer.get("options"), "optimizer.options"),
        M=conf.get("M"),
        seed=_int(conf.get("seed", 0), "seed", minimum=0),
        iterations=_int(conf.get("iterations"), "iterations", minimum=1),
        optimize=conf.get("optimize"),
        batch_size=_int(conf.get("batch_size"), "batch_size", minimum=1, allow_none=True),
        eval_every=_int(conf.get("eval_every", 10), "eval_every", minimum=1),
        early_stopping=_early_stopping_settings(conf),
        backend=_optional_text(conf.get("backend"), "backend", "numpy or torch"),
        device=_optional_text(conf.get("device"), "device", "cpu, cuda or cuda:N"),
        dtype=_optional_text(conf.get("dtype"), "dtype", "float64 or float32"),
        baseline_failure=check_baseline_failure(conf.get("baseline_failure", "raise")),
        progress=as_mapping(conf.get("progress"), "progress"),
        mlflow=as_mapping(conf.get("mlflow"), "mlflow"),
    )

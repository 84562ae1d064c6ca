"""One experiment run: validate, load and split the data, fit, evaluate, log, write result.json.

``run_experiment(cfg)`` takes the composed Hydra config (``conf/config.yaml``) and does, in order
(steps 1 and 2: ``prepare``, in ``gpinfer.experiment.prepare``, on the settings that
``gpinfer.experiment.settings`` checks; steps 3 and 4 here, each a named step):

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
``result.json`` records the status, the error and the last iteration reached; its final numbers
that exist by then (``n_iter``, ``train_time_s``, ``peak_rss_mb``, the fit guard's) are MLflow
metrics too, as a finished run's are. Under ``torchrun``
a rank that fails, anywhere in its job, ends the process group (``distributed.leave_on_failure``;
a killed rank's connections close), so rank 0 raises a ``GroupError`` at once and its run ends
FAILED; a SIGTERM that comes while the failure is recorded waits until the run has ended.
A fit no better than predicting the class frequencies (``gpinfer.fit_guard``) raises, and its
run ends FAILED with the guard's ``fit_warnings``, ``train_nll`` and ``baseline_nll`` recorded;
with ``baseline_failure=warn`` the model is kept and evaluated, and the run still ends FAILED.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias, cast

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gpinfer.errors import FitFailedError, GroupError, NumericalError
from gpinfer.experiment import interrupts, tracking
from gpinfer.experiment import results as res
from gpinfer.experiment.figures import TrainingCurve
from gpinfer.experiment.prepare import Prepared, prepare
from gpinfer.experiment.redact import redact_text, redact_uri, scrub_files, store_error
from gpinfer.experiment.render import FigureJob
from gpinfer.experiment.settings import Settings, config_to_dict, parse_settings
from gpinfer.fit_guard import WORSE_THAN_BASELINE
from gpinfer.interfaces import FitResult, IterationInfo
from gpinfer.progress import ProgressBar
from gpinfer.threads import run_tags as thread_tags
from gpinfer.training import distributed
from gpinfer.training.early_stopping import EarlyStopping, validation_size

if TYPE_CHECKING:
    from gpinfer.estimator import GPClassifierCore
    from gpinfer.regressor import GPRegressorCore

    #: the run's estimator: a core, without scikit-learn
    Estimator: TypeAlias = GPClassifierCore | GPRegressorCore

#: what callers import from here (the checks and loads before training live in
#: ``gpinfer.experiment.settings`` and ``gpinfer.experiment.prepare``)
__all__ = ["FINAL_METRICS", "EVAL_PREFIX", "Prepared", "Settings", "config_to_dict",
           "evaluate_regression", "evaluate_test", "fitted_inducing_count", "parse_settings",
           "prepare", "run_experiment"]

Array = np.ndarray
_log = logging.getLogger("gpinfer.run")

#: the run's final numbers: result.json's keys and MLflow metrics of the same names, each logged
#: once (``RunLogger.log_final``), so that MLflow's value of the key is the reported number
FINAL_METRICS = ("test_error", "test_rmse", "test_nll", "log_evidence", "train_time_s", "n_iter",
                 "peak_rss_mb", "train_nll", "baseline_nll", "train_error", "baseline_error",
                 "stopped_early",
                 "best_val_iteration", "best_validation_score")
#: prefix of the test metrics computed every ``eval_every`` iterations (``eval/test_error``, ...):
#: the history of the test metrics, kept apart from the final numbers
EVAL_PREFIX = "eval/"
#: per-iteration metric names the runner owns (method extras with these names get a prefix)
_RESERVED = {"objective", "elapsed_s", *FINAL_METRICS}


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
# training
# --------------------------------------------------------------------------------------------


def _blocks(X: Any) -> Iterator[tuple[int, Array]]:
    """``(start, rows)`` of the test inputs ``X [N*, D]``: an array whole; a row source (a
    dataset read out of core) in blocks of ``CHUNK_ROWS`` rows, each read once."""
    from gpinfer.data.source import RowSource

    if isinstance(X, RowSource):
        yield from X.chunks()
    else:
        yield 0, X


def _joined(parts: list[Any]) -> Array:
    """The blocks' results ``parts`` one after the other (one block: itself)."""
    return parts[0] if len(parts) == 1 else np.concatenate([np.asarray(p) for p in parts])


def _test_pass(posterior: Any, X: Any, y_index: Array, P: Array | None = None
               ) -> tuple[Array, Array | None]:
    """One pass over the test inputs ``X [N*, D]`` (an array whole, a row source block by block,
    each block read once): ``posterior.predict_proba`` there ``[N*, C]`` (or ``[N*]``; ``P``
    itself when already computed) and the log predictive of ``y_index [N*]`` (None when the
    posterior has none)."""
    probs: list[Any] = []
    logs: list[Any] | None = []
    for start, rows in _blocks(X):
        if P is None:
            probs.append(posterior.predict_proba(rows))
        if logs is not None:
            try:
                logs.append(posterior.log_predictive(rows, y_index[start:start + rows.shape[0]]))
            except (NotImplementedError, AttributeError):
                logs = None
    return (_joined(probs) if P is None else P), (None if logs is None else _joined(logs))


def _test_metrics(posterior: Any, X: Any, y_index: Array, P: Array | None = None
                  ) -> tuple[dict[str, float], Array]:
    """``evaluate_test``'s metrics and the test probabilities they come from (``P``, or
    ``predict_proba`` at ``X``), from one pass over ``X`` (``_test_pass``)."""
    from gpinfer.metrics import error_rate, nll

    P_test, log_p = _test_pass(posterior, X, y_index, P)
    P = np.asarray(P_test, dtype=float)
    if P.ndim == 2 and P.shape[1] == 1:  # p(class 1) of a binary problem as a column
        P = P[:, 0]
    out = {"test_error": error_rate(y_index, P),
           "test_nll": nll(y_index, P) if log_p is None
           else nll(None, log_predictive=np.asarray(log_p))}
    return out, P_test


def evaluate_test(posterior: Any, X: Any, y_index: Array,
                  P: Array | None = None) -> dict[str, float]:
    """Test error and mean negative log predictive of ``posterior`` at ``X [N*, D]`` (an
    array, or a row source evaluated in blocks, each read once: ``_test_pass``) (``P``: its
    ``predict_proba`` when already computed)."""
    return _test_metrics(posterior, X, y_index, P)[0]


def evaluate_regression(posterior: Any, X: Array, y: Array, shift: float = 0.0,
                        scale: float = 1.0) -> dict[str, float]:
    """Test RMSE and mean negative log predictive density of real targets ``y [N*]`` (original
    units) for a ``posterior`` fitted to ``(y - shift) / scale``."""
    mean, var = posterior.predict_f(X)
    z = (np.asarray(y, dtype=float) - shift) / scale
    log_p = np.asarray(posterior.likelihood.log_predictive(z, mean[:, 0], var[:, 0]))
    return {"test_rmse": float(scale * np.sqrt(np.mean((mean[:, 0] - z) ** 2))),
            "test_nll": float(np.log(scale) - np.mean(log_p))}


def _evaluate(p: Prepared, posterior: Any) -> tuple[dict[str, float], Array | None]:
    """The test metrics of ``p``'s task and a classifier's test predictions ``[N*, C]`` (None
    for a regressor)."""
    if p.task == "regression":
        return evaluate_regression(posterior, cast(Array, p.X_test), p.y_test_index, p.y_shift,
                                   p.y_scale), None  # a regression is in memory (source_files)
    return _test_metrics(posterior, p.X_test, p.y_test_index)


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
            tests = _evaluate(self.p, info.posterior())[0]
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
    tags.update(thread_tags())  # the BLAS threads its fits ran on (a sweep job's own)
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
    es = _early_stopping(p)
    if es is not None:  # the rule that runs (the config's refit may be "auto")
        params.update({"early_stopping.refit": str(es.refit).lower(),
                       "early_stopping.refine_iter": str(es.refine_iter)})
    params.update(p.backend.params())  # as resolved: numpy/cpu/float64 when left unset
    if "lengthscale_init" in p.method_options:  # as resolved: "auto" is "median" (prepare)
        params["method.options.lengthscale_init"] = str(p.method_options["lengthscale_init"])
    from gpinfer.data.source import RowSource

    if isinstance(p.X_train, RowSource):  # read out of core: the dtype of the files
        from gpinfer.experiment.model_logging import stored_dtype

        params["data.stored_dtype"] = stored_dtype(p.X_train)
    if p.task == "regression":  # log_evidence is that of the standardised targets
        params.update({"data.y_shift": repr(p.y_shift), "data.y_scale": repr(p.y_scale)})
    return params


def _early_stopping(p: Prepared) -> EarlyStopping | None:
    """The run's early-stopping settings as the estimator runs them: ``refit="auto"`` resolved
    to the method's rule (``EarlyStopping.resolved``, ``Method.early_stopping_rule``)."""
    es = p.settings.early_stopping
    if es is None:
        return None
    return es.resolved(p.method_cls.early_stopping_rule, classifier=p.task != "regression")


def _n_fit(p: Prepared) -> int:
    """The training rows the fitted model was trained on: all of ``X_train``, less the
    early-stopping validation part (``validation_size``) where the model is the best iterate of
    the fit on the rest (``refit=False``; a refit trains on all of them); with
    ``refit="average"``, the rows of one of the averaged models (``n - n // K`` for K folds,
    the largest of them)."""
    n, es = int(p.X_train.shape[0]), _early_stopping(p)
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


def _record_fit_report(logger: tracking.RunLogger, result: dict[str, Any],
                       report: FitResult) -> None:
    """The fit guard's codes and numbers (``FitResult.warnings`` and ``diagnostics``) into
    ``result`` and the MLflow tag ``fit_warnings``."""
    result["fit_warnings"] = list(report.warnings)
    result.update({k: float(v) for k, v in report.diagnostics.items()})
    logger.set_tags({"fit_warnings": ",".join(report.warnings) or "none"})


def _publish(p: Prepared, estimator: Estimator, callback: _Callback, result: dict[str, Any],
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


def _make_estimator(p: Prepared) -> Estimator:
    """The run's estimator: a core (the estimator without scikit-learn, whose import a run does
    not need), ``GPRegressorCore`` for a regression dataset, else ``GPClassifierCore``."""
    from gpinfer.estimator import GPClassifierCore
    from gpinfer.regressor import GPRegressorCore

    s, es = p.settings, p.settings.early_stopping
    options: dict[str, Any] = dict(p.backend.params())  # numpy for a regression (prepare)
    if es is not None:
        options.update(validation_fraction=es.validation_fraction,
                       validation_interval=es.validation_interval,
                       n_iter_no_change=es.n_iter_no_change, refit=es.refit,
                       validation_folds=es.folds, refit_rule=es.refit_rule,
                       choice_rule=es.choice_rule, refine_iter=es.refine_iter,
                       choice_refine_iter=es.choice_refine_iter)
    return (GPRegressorCore if p.task == "regression" else GPClassifierCore)(
        method=s.method, M=p.M_count, kernel=p.kernel, likelihood=s.likelihood,
        optimize=s.optimize, max_iter=s.iterations, batch_size=s.batch_size,
        random_state=s.seed, method_options=p.method_options,
        baseline_failure=s.baseline_failure, **options,
    )


def _write_config(p: Prepared) -> tuple[Path, str]:
    """The run folder's ``config.yaml`` (Hydra's record of the overrides scrubbed of
    credentials first) and the run's unique name; returns both."""
    s = p.settings
    scrub_files(p.out_dir / ".hydra", p.logger.tracking_uri)  # Hydra's record of the overrides
    config_path = p.out_dir / "config.yaml"
    config_path.write_text(OmegaConf.to_yaml(OmegaConf.create(p.config)))
    run_name = tracking.unique_run_name(
        [s.method, s.dataset, s.kernel] + ([f"M{s.M}"] if s.M is not None else []) + [f"s{s.seed}"]
    )
    _log.info("run %s: %s/%s s%s (output folder %s)", run_name, s.method, s.dataset, s.seed,
              p.out_dir)
    return config_path, run_name


def _train(p: Prepared, estimator: Estimator, callback: _Callback, progress: ProgressBar,
           result: dict[str, Any]) -> None:
    """Fit, evaluate and publish inside the open MLflow run; on any exception (Ctrl-C and
    SIGTERM included) record it in ``result.json`` (``interrupts.hold``: a stop meanwhile
    waits until the run has ended) and re-raise."""
    figures: FigureJob | None = None
    callback.start = time.perf_counter()
    try:
        if p.settings.mlflow.get("log_plots", True):  # its matplotlib import overlaps the fit
            figures = FigureJob.spawn(p.out_dir)
            callback.start = time.perf_counter()
        with progress:
            estimator.fit(p.X_train, p.y_train, callback=callback)
        wall = time.perf_counter() - callback.start
        P_test = _record_fit(p, estimator, callback, result, wall)
        _close(p, estimator, callback, result, P_test, figures)
    except BaseException as exc:
        interrupts.hold()
        if figures is not None:  # a worker given nothing to draw exits
            figures.cancel()
        failure = _group_failure(exc)
        _record_failure(p, callback, result, failure)
        if failure is exc:
            raise
        raise failure from exc


def _group_failure(exc: BaseException) -> BaseException:
    """``exc``, or for an interruption (``torchrun``'s SIGTERM) that came after another rank of
    the process group had failed (``distributed.peer_failure``) a ``GroupError`` naming that
    failure: the run ends FAILED with it, not KILLED."""
    peer = distributed.peer_failure() if isinstance(exc, KeyboardInterrupt) else None
    if peer is None:
        return exc
    return GroupError(f"stopped ({exc or 'interrupted'}) after another rank of the process "
                      f"group failed: {peer}")


def _record_fit(p: Prepared, estimator: Estimator, callback: _Callback,
                result: dict[str, Any], wall: float) -> Array | None:
    """The fitted model's final numbers into ``result``: test metrics, evidence, times, the
    fit guard's report (a kept fit no better than the baseline makes the status FAILED);
    returns a classifier's test predictions ``[N*, C]`` (None for a regressor)."""
    # the classifier's test predictions: the final numbers and the reliability diagram
    tests, P_test = _evaluate(p, estimator.posterior_)
    result.update(
        tests,
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
    _record_fit_report(p.logger, result, fit_report)
    if estimator.best_validation_score_ is not None:
        result["best_validation_score"] = float(estimator.best_validation_score_)
    if WORSE_THAN_BASELINE in fit_report.warnings:  # kept (baseline_failure=warn)
        what = "a constant Gaussian" if p.task == "regression" else "the class frequencies"
        label, key = "NLL", "nll"
        if "baseline_error" in result:  # judged by error (Method.baseline_measure)
            what, label, key = "the majority class", "error", "error"
        result.update(status=tracking.FAILED, error=(
            f"training {label} {result['train_' + key]:.4g} is no better than predicting "
            f"{what} ({result['baseline_' + key]:.4g}); the model was kept "
            "(baseline_failure=warn)"))
    return P_test


def _close(p: Prepared, estimator: Estimator, callback: _Callback, result: dict[str, Any],
           P_test: Array | None, figures: FigureJob | None) -> None:
    """Log the final metrics and the fitted state, publish, write ``result.json``; a kept fit
    no better than the baseline ends the run FAILED with its error as a tag."""
    logger = p.logger
    logger.log_final({key: result[key] for key in FINAL_METRICS if key in result},
                     step=max(result["n_iter"], callback.last_iteration))
    state = tracking.collect_state(
        estimator.fit_result_,
        extra={"classes": p.classes, "M_count": np.asarray(p.M_count or 0)},
    )
    logger.log_artifact(tracking.save_state(p.out_dir / "state.npz", state))
    result["publish_s"] = _publish(p, estimator, callback, result, P_test, figures)
    res.write_result(p.out_dir, result)
    logger.log_artifact(p.out_dir / res.RESULT_FILE)
    if result["status"] == tracking.FAILED:
        logger.set_tags({"error": result["error"]})
        logger.end(tracking.FAILED)


def _record_failure(p: Prepared, callback: _Callback, result: dict[str, Any],
                    exc: BaseException) -> None:
    """A run that raised: KILLED (Ctrl-C, SIGTERM) or FAILED with the error, the last
    iteration reached and the fit guard's report where there is one, into ``result.json`` and,
    as a finished run's are, its final numbers that exist (``n_iter``, ``train_time_s``,
    ``peak_rss_mb``; the guard's ``train_nll`` and ``baseline_nll``) into MLflow, where those
    not logged yet go (never hiding ``exc``). A failure after the fit ended keeps the fit's
    numbers (``_record_fit``), which ``_close`` may have logged already."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    if isinstance(exc, FitFailedError) and exc.result is not None:
        _record_fit_report(p.logger, result, exc.result)
    result.update(
        status=tracking.KILLED if interrupted else tracking.FAILED,
        error=f"{type(exc).__name__}: {exc}",
        error_iteration=getattr(exc, "iteration", None),
    )
    if result["train_time_s"] is None:  # the fit did not end (else its numbers are kept)
        result.update(n_iter=callback.last_iteration,
                      train_time_s=time.perf_counter() - callback.start - callback.overhead_s,
                      peak_rss_mb=res.peak_rss_mb())
    try:
        logged = p.logger.logged_keys  # a failure after log_final (in _close) has them already
        p.logger.log_final({key: result[key] for key in FINAL_METRICS
                            if result.get(key) is not None and key not in logged},
                           step=callback.last_iteration)
    except Exception:  # never hide the original error
        pass
    try:
        res.write_result(p.out_dir, result)
        p.logger.log_artifact(p.out_dir / res.RESULT_FILE)
    except Exception:  # never hide the original error
        pass


def _run(p: Prepared, estimator: Estimator, progress_stream: TextIO | None) -> dict[str, Any]:
    """The MLflow run of a prepared experiment (``prepare``; rank 0 of a process group):
    fit, evaluate, publish; returns the ``result.json`` content. SIGTERM, as SIGINT, is a
    ``KeyboardInterrupt`` until the run's end is being recorded, and then waits until the run
    has ended (``interrupts.run_stops``)."""
    s = p.settings
    progress = ProgressBar(s.iterations, f"{s.method}/{s.dataset} s{s.seed}",
                           show=s.progress.get("bar", "auto"), stream=progress_stream)
    callback = _Callback(p, progress)
    config_path, run_name = _write_config(p)
    result = _base_result(p)
    _end_stale_runs(p.logger, progress_stream)
    with interrupts.run_stops(), p.logger.run(run_name, tags=_tags(p), params=_params(p)):
        result["mlflow_run_id"] = p.logger.run_id
        p.logger.log_artifact(config_path)
        _train(p, estimator, callback, progress, result)
    return result


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
    # in a process group an exception on this rank ends the group: the others raise at once
    # (rank 0 alone opens the store and the output folder: its checks are not the others')
    with distributed.leave_on_failure(uniform_checks=False):
        p = prepare(cfg, output_dir)
        res.reset_peak_rss()
        estimator = _make_estimator(p)
        if p.store is None:  # a rank other than 0 of a process group: its part of the fit only
            estimator.fit(p.X_train, p.y_train)
            return {"status": tracking.FINISHED, "rank": distributed.current_rank()}
        result = _run(p, estimator, progress_stream)
    line = res.summary_line(result)
    _log.info("%s", line)
    print(line, file=stream if stream is not None else sys.stdout, flush=True)
    return result

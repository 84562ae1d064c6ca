"""Hunt for composable configurations that break the experiment layer's standard (s40).

The standard: bad input is refused with a one-line error naming the problem before any
training and before any MLflow run; a run that fails ends FAILED (never left RUNNING); what a
run records in MLflow is what it printed and wrote to ``result.json``.

Each case runs ``gpinfer-run`` in a subprocess with its own SQLite store
(``MLFLOW_TRACKING_URI=sqlite:///<tmp>/<case>/mlflow.db``) and a small budget, then checks:

* exit code, and a Python traceback on stderr (the user should see one line, not a trace);
* the MLflow runs in the store and their status (FINISHED / FAILED / RUNNING / KILLED);
* for a refused case: no MLflow run exists, and the message names the offending key;
* for a finished run: the final metrics in MLflow equal ``result.json`` and the printed line.

Cases come from three families: ``grid`` (method x dataset x kernel x optimizer x M, sampled
with ``--seed`` when the product is larger than ``--n-grid``), ``hostile`` (overrides a user
might mistype, each with the key its error should name) and ``sweep`` (multirun and launcher).
The datasets are the built-in ones that need no download (``synthetic2d``, ``waveform``,
binary by ``dataset.keep_classes=[0,1]``) plus those in ``../shared/data`` when present.

Usage (one core; the default takes ~20 min at load 4-8)::

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/config_hunt.py \\
        --out /tmp/config_hunt [--seed 0] [--n-grid 40] [--only hostile] [--shared-data]

Writes ``<out>/cases.jsonl`` (one line per case, as it finishes) and prints the table of
outcomes by family at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GPINFER_RUN = Path(sys.executable).parent / "gpinfer-run"
SHARED_DATA = REPO.parent / "shared" / "data"
if not SHARED_DATA.is_dir():
    SHARED_DATA = Path("/work/shared/data")

#: every run: small data, few iterations, nothing published after training
BASE = ["iterations=3", "eval_every=2", "mlflow.log_model=false", "mlflow.log_datasets=false",
        "mlflow.log_plots=false", "progress.bar=false"]
#: small, fast versions of the built-in datasets
DATA = {
    "synthetic2d": ["dataset=synthetic2d", "dataset.options.n=150", "dataset.options.n_test=100"],
    "waveform": ["dataset=waveform", "dataset.options.n=250"],
    "synthetic2d-bin": ["dataset=synthetic2d", "dataset.options.n=150",
                        "dataset.options.n_test=100", "dataset.keep_classes=[0,1]"],
    "waveform-bin": ["dataset=waveform", "dataset.options.n=250", "dataset.keep_classes=[0,1]"],
}
BINARY = ["ep-dense", "fitc", "fv", "kl", "laplace", "lr", "mcmc-ais", "pep", "tap", "vb",
          "vfe", "vi-jj", "vi-jj-full", "vi-jj-hybrid", "vi-taylor", "svi"]
MULTI = ["ep", "gfitc", "ivm", "ivm-baseline", "sep", "svi", "vi-robustmax"]
SPARSE = {"ep", "gfitc", "ivm", "ivm-baseline", "sep", "svi", "vi-robustmax", "fitc", "pep",
          "vfe", "vi-jj", "vi-jj-full", "vi-jj-hybrid", "vi-taylor"}
KERNELS = ["rbf", "matern32", "matern52", "linear"]
OPTIMIZERS = ["lbfgs", "adam", "adadelta"]

TRACEBACK = "Traceback (most recent call last)"
FINAL_KEYS = ("test_error", "test_nll", "log_evidence", "n_iter")


@dataclass
class Case:
    """One ``gpinfer-run`` invocation and what it should do."""

    family: str
    name: str
    args: list[str]
    #: "run" (should finish), "refuse" (an error before any MLflow run) or "either"
    expect: str = "either"
    #: a word the refusal message must contain (the offending key), case-insensitive
    key: str | None = None
    multirun: bool = False


@dataclass
class Outcome:
    family: str
    name: str
    args: list[str]
    expect: str
    rc: int | None = None
    wall_s: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)
    traceback: bool = False
    error_line: str = ""
    names_key: bool | None = None
    metrics_match: bool | None = None
    mismatch: str = ""
    verdict: str = ""
    problems: list[str] = field(default_factory=list)


def grid_cases(rng: random.Random, n: int, datasets: list[str]) -> list[Case]:
    """method x dataset x kernel x optimizer x M, each method on data it supports."""
    product: list[Case] = []
    for method in sorted(set(BINARY) | set(MULTI)):
        binary_data = [d for d in datasets if d.endswith("-bin") or d in SHARED_BINARY]
        multi_data = [d for d in datasets if d not in binary_data]
        ds_choices = ((binary_data if method in BINARY else [])
                      + (multi_data if method in MULTI else []))
        for ds in ds_choices:
            for kernel in KERNELS:
                for opt in OPTIMIZERS:
                    for M in ([None, 10, 0.1] if method in SPARSE else [None]):
                        args = [f"method={method}", *data_args(ds), f"kernel={kernel}",
                                f"optimizer={opt}"] + ([] if M is None else [f"M={M}"])
                        product.append(Case("grid", f"{method}/{ds}/{kernel}/{opt}/M={M}",
                                            args, expect="either"))
    print(f"grid: {len(product)} combinations, sampling {min(n, len(product))}", flush=True)
    # every method at least once, then the rest at random
    by_method: dict[str, list[Case]] = {}
    for c in product:
        by_method.setdefault(c.name.split("/")[0], []).append(c)
    chosen = [rng.choice(v) for v in by_method.values()]
    rest = [c for c in product if c not in chosen]
    chosen += rng.sample(rest, max(0, min(n, len(product)) - len(chosen)))
    return chosen


SHARED_BINARY: set[str] = set()


def data_args(ds: str) -> list[str]:
    if ds in DATA:
        return list(DATA[ds])
    return [f"dataset={ds}"]  # a ../shared/data set (its own config)


def hostile_cases(tmp: Path) -> list[Case]:
    """Overrides a user might type; each names the key its refusal should mention."""
    sep = ["method=sep", *DATA["waveform"]]
    svi = ["method=svi", *DATA["waveform"]]
    lap = ["method=laplace", *DATA["waveform-bin"]]
    vb = ["method=vb", *DATA["synthetic2d-bin"]]
    csv = tmp / "data.csv"
    csv.write_text("a,b,y\n" + "".join(f"{i % 7},{(i * 3) % 5},{int(i % 7 > 3)}\n"
                                        for i in range(60)))
    H = [
        ("M>N", [*sep, "M=100000"], "refuse", "M"),
        ("M=0", [*sep, "M=0"], "refuse", "M"),
        ("M=-5", [*sep, "M=-5"], "refuse", "M"),
        ("M=1.5", [*sep, "M=1.5"], "refuse", "M"),
        ("M=str", [*sep, "M=fifty"], "refuse", "M"),
        ("M on laplace", [*lap, "M=10"], "refuse", "M"),
        ("M=0.0001", [*sep, "M=0.0001"], "either", "M"),  # documented: max(1, round(M N))
        ("batch>N", [*svi, "batch_size=100000"], "either", "batch_size"),
        ("batch=0", [*svi, "batch_size=0"], "refuse", "batch_size"),
        ("batch float", [*svi, "batch_size=2.5"], "refuse", "batch_size"),
        ("batch on laplace", [*lap, "batch_size=10"], "refuse", "batch"),
        ("iterations float", [*sep, "iterations=2.5"], "refuse", "iterations"),
        ("iterations=0", [*sep, "iterations=0"], "refuse", "iterations"),
        ("iterations str", [*sep, "iterations=many"], "refuse", "iterations"),
        ("eval_every=0", [*sep, "eval_every=0"], "refuse", "eval_every"),
        ("seed str", [*sep, "seed=abc"], "refuse", "seed"),
        ("seed negative", [*sep, "seed=-1"], "refuse", "seed"),
        ("seed float", [*sep, "seed=1.5"], "refuse", "seed"),
        ("seed huge", [*sep, "seed=99999999999"], "either", "seed"),
        ("unknown kernel", [*sep, "kernel=rbff"], "refuse", "kernel"),
        ("kernel.name unknown", [*sep, "kernel.name=gaussian"], "refuse", "kernel"),
        ("kernel lengthscale<0", [*sep, "kernel.lengthscale=-1"], "refuse", "lengthscale"),
        ("kernel lengthscale str", [*sep, "kernel.lengthscale=big"], "refuse", "lengthscale"),
        ("kernel variance 0", [*sep, "kernel.variance=0"], "refuse", "variance"),
        ("kernel noise<0", [*sep, "kernel.noise=-0.1"], "refuse", "noise"),
        ("kernel unknown key", [*sep, "+kernel.period=2"], "refuse", "period"),
        ("kernel ard str", [*sep, "kernel.ard=maybe"], "refuse", "ard"),
        ("unknown method", [*DATA["waveform"], "method=sepp"], "refuse", "method"),
        ("method.name unknown", [*sep, "method.name=foo"], "refuse", "foo"),
        ("unknown method option", [*sep, "+method.options.dampng=0.5"], "refuse", "dampng"),
        ("method option type", [*sep, "method.options.damping=high"], "refuse", "damping"),
        ("method option range", [*sep, "method.options.damping=1.5"], "refuse", "damping"),
        ("likelihood unsupported", [*lap, "method.likelihood=softmax"], "refuse", "likelihood"),
        ("likelihood unknown", [*lap, "method.likelihood=logitt"], "refuse", "likelihood"),
        ("likelihood int", [*lap, "method.likelihood=3"], "refuse", "likelihood"),
        ("probit on multi", ["method=svi", *DATA["waveform"], "method.likelihood=probit"],
         "refuse", "likelihood"),
        ("binary method multi", [*DATA["waveform"], "method=laplace"], "refuse", "class"),
        ("regression on classif", [*lap, "method.likelihood=gaussian"], "refuse", "likelihood"),
        ("torch numpy-only", [*lap, "backend=torch"], "refuse", "backend"),
        ("float32 numpy", [*sep, "dtype=float32"], "refuse", "dtype"),
        ("float32 numpy backend", [*sep, "backend=numpy", "dtype=float32"], "refuse", "dtype"),
        ("backend unknown", [*sep, "backend=jax"], "refuse", "backend"),
        ("device cuda no gpu", [*sep, "device=cuda"], "either", "device"),
        ("device int", [*sep, "device=0"], "refuse", "device"),
        ("dtype float16", [*sep, "dtype=float16"], "refuse", "dtype"),
        ("lr negative adam", ["method=svi", *DATA["waveform"], "optimizer=adam",
                              "method.options.optimizer=adam",
                              "method.options.optimizer_options={learning_rate:-0.1}"],
         "refuse", "learning_rate"),
        ("lr negative group", [*vb, "optimizer=adam", "optimizer.options.learning_rate=-0.1"],
         "refuse", "learning_rate"),
        ("lr zero group", [*vb, "optimizer=adam", "optimizer.options.learning_rate=0"],
         "refuse", "learning_rate"),
        ("lr str group", [*vb, "optimizer=adam", "optimizer.options.learning_rate=fast"],
         "refuse", "learning_rate"),
        ("adadelta rho>1", [*vb, "optimizer=adadelta", "optimizer.options.rho=1.5"],
         "refuse", "rho"),
        ("optimizer unknown key", [*vb, "optimizer=adam", "+optimizer.options.foo=1"],
         "refuse", "foo"),
        ("lbfgs bad option", [*vb, "+optimizer.options.maxfun=-3"], "refuse", "maxfun"),
        ("unknown optimizer", [*vb, "optimizer.name=sgd"], "refuse", "sgd"),
        ("sep ep lr negative", [*sep, "method.options.learning_rate=-0.01"], "refuse",
         "learning_rate"),
        ("svi adadelta lr neg mb", [*svi, "batch_size=50",
                                    "method.options.optimizer_options={learning_rate:-1}"],
         "refuse", "learning_rate"),
        ("unknown dataset", ["method=sep", "dataset=waveformm"], "refuse", "dataset"),
        ("unknown dataset key", [*sep, "+dataset.columns=[0,1]"], "refuse", "columns"),
        ("dataset unknown option", [*sep, "+dataset.options.nn=5"], "refuse", "nn"),
        ("dataset options.n str", ["method=sep", "dataset=waveform", "dataset.options.n=lots"],
         "refuse", "n"),
        ("dataset options.n=0", ["method=sep", "dataset=waveform", "dataset.options.n=0"],
         "refuse", "n"),
        ("features out of range", [*sep, "dataset.features=[0,99]"], "refuse", "features"),
        ("features empty", [*sep, "dataset.features=[]"], "refuse", "features"),
        ("features str", [*sep, "dataset.features=abc"], "refuse", "features"),
        ("keep_classes unknown", [*sep, "dataset.keep_classes=[0,7]"], "refuse", "keep_classes"),
        ("keep_classes one", [*sep, "dataset.keep_classes=[1]"], "refuse", "class"),
        ("n_max 0", [*sep, "dataset.n_max=0"], "refuse", "n_max"),
        ("n_max float", [*sep, "dataset.n_max=2.5"], "refuse", "n_max"),
        ("n_max 5", [*sep, "dataset.n_max=5"], "either", "n_max"),
        ("test_fraction 1", [*sep, "dataset.test_fraction=1.0"], "refuse", "test_fraction"),
        ("test_fraction str", [*sep, "dataset.test_fraction=half"], "refuse", "test_fraction"),
        ("standardize str", [*sep, "dataset.standardize=maybe"], "refuse", "standardize"),
        ("stratify str", [*sep, "dataset.stratify=maybe"], "refuse", "stratify"),
        ("file no path", ["method=vb", "dataset=file"], "refuse", "path"),
        ("file missing", ["method=vb", "dataset=file", f"dataset.path={tmp}/nope.npz"],
         "refuse", "nope.npz"),
        ("file a folder", ["method=vb", "dataset=file", f"dataset.path={tmp}"], "refuse",
         "path"),
        ("file bad format", ["method=vb", "dataset=file", f"dataset.path={csv}",
                             "dataset.format=xlsx"], "refuse", "format"),
        ("csv ok", ["method=vb", "dataset=file", f"dataset.path={csv}"], "run", None),
        ("csv unknown column", ["method=vb", "dataset=file", f"dataset.path={csv}",
                                "+dataset.options.label_column=label"], "refuse", "label"),
        ("csv features out", ["method=vb", "dataset=file", f"dataset.path={csv}",
                              "dataset.features=[5]"], "refuse", "features"),
        ("optimize str", [*sep, "optimize=maybe"], "refuse", "optimize"),
        ("validation_fraction 2", [*sep, "validation_fraction=2"], "refuse",
         "validation_fraction"),
        ("validation_fraction neg", [*sep, "validation_fraction=-0.2"], "refuse",
         "validation_fraction"),
        ("refit unknown", [*sep, "validation_fraction=0.2", "refit=sometimes"], "refuse",
         "refit"),
        ("choice_rule unknown", [*sep, "validation_fraction=0.2", "choice_rule=max"], "refuse",
         "choice_rule"),
        ("validation_folds 0", [*sep, "validation_fraction=0.2", "validation_folds=0"],
         "refuse", "validation_folds"),
        ("validation_folds>N", [*sep, "validation_fraction=0.2", "validation_folds=1000"],
         "refuse", "validation_folds"),
        ("batch>fold rows", [*svi, "validation_fraction=0.2", "batch_size=70"], "refuse",
         "batch_size"),
        ("n_iter_no_change 0", [*sep, "validation_fraction=0.2", "n_iter_no_change=0"],
         "refuse", "n_iter_no_change"),
        ("baseline_failure bad", [*sep, "baseline_failure=ignore"], "refuse",
         "baseline_failure"),
        ("progress.bar bad", [*sep, "progress.bar=sometimes"], "refuse", "bar"),
        ("flush_every 0", [*sep, "mlflow.flush_every=0"], "refuse", "flush_every"),
        ("flush_every str", [*sep, "mlflow.flush_every=often"], "refuse", "flush_every"),
        ("flush_interval neg", [*sep, "mlflow.flush_interval_s=-1"], "refuse",
         "flush_interval"),
        ("log_model str", [*sep, "mlflow.log_model=maybe"], "refuse", "log_model"),
        ("experiment empty", [*sep, "mlflow.experiment=''"], "either", "experiment"),
        ("top-level typo", [*sep, "+iteration=5"], "refuse", "iteration"),
        ("early stop svi", [*svi, "validation_fraction=0.2", "n_iter_no_change=1"], "run",
         None),
        ("svi minibatch", [*svi, "batch_size=50"], "run", None),
        ("publish on", [*sep, "mlflow.log_model=true", "mlflow.log_datasets=true",
                        "mlflow.log_plots=true"], "run", None),
        ("sep torch cpu", [*sep, "backend=torch"], "either", "backend"),
        ("sep torch f32", [*sep, "backend=torch", "dtype=float32"], "either", "dtype"),
        ("ep torch f32", ["method=ep", *DATA["waveform"], "backend=torch", "dtype=float32"],
         "either", "dtype"),
        ("M frac", [*sep, "M=0.1"], "run", None),
        ("M=1", [*sep, "M=1"], "either", "M"),
        ("M=N", [*sep, "M=75"], "either", "M"),
        ("M=1.0", [*sep, "M=1.0"], "either", "M"),
        ("kernel ard", [*sep, "kernel.ard=true"], "run", None),
        ("linear kernel lengthscale", [*sep, "kernel=linear", "+kernel.lengthscale=1"],
         "refuse", "lengthscale"),
    ]
    return [Case("hostile", name, [*args], expect, key) for name, args, expect, key in H]


def sweep_cases() -> list[Case]:
    sep = ["method=sep", *DATA["waveform"]]
    return [
        Case("sweep", "multirun seeds", [*sep, "seed=0,1"], "run", None, multirun=True),
        Case("sweep", "multirun one bad", [*sep, "M=10,0"], "either", "M", multirun=True),
        Case("sweep", "joblib", [*sep, "seed=0,1", "hydra/launcher=joblib",
                                 "hydra.launcher.n_jobs=2"], "run", None, multirun=True),
        Case("sweep", "gpinfer_local", [*sep, "seed=0", "hydra/launcher=gpinfer_local"],
             "either", None, multirun=True),
        Case("sweep", "multirun kernels", [*sep, "kernel=rbf,rbff"], "either", "kernel",
             multirun=True),
        Case("sweep", "multirun methods", [*DATA["waveform-bin"], "method=laplace,vb,kl"],
             "run", None, multirun=True),
    ]


def _store_runs(uri: str) -> list[dict[str, Any]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    out = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=1000):
            if (run.info.run_name or "").startswith("report-"):
                continue  # a sweep's report (gpinfer.experiment.report), not a job's run
            out.append({"run_id": run.info.run_id, "status": run.info.status,
                        "metrics": dict(run.data.metrics), "tags": {
                            k: v for k, v in run.data.tags.items()
                            if k in ("error", "output_dir", "fit_warnings")}})
    return out


_LINE = re.compile(r"test error (\S+)\s+test NLL (\S+)\s+log evidence (\S+) \| (\d+) iterations")


def _printed(stdout: str) -> list[dict[str, float | None]]:
    """The final numbers of every summary line printed (4-significant-digit text)."""
    out = []
    for m in _LINE.finditer(stdout):
        vals = [None if v in ("-", "None", "n/a") else float(v) for v in m.groups()[:3]]
        out.append({"test_error": vals[0], "test_nll": vals[1], "log_evidence": vals[2],
                    "n_iter": float(m.group(4))})
    return out


def _close(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def check_metrics(o: Outcome, work: Path, stdout: str) -> None:
    """MLflow's final metrics vs result.json vs the printed line, for every finished run."""
    results = {}
    for path in work.rglob("result.json"):
        r = json.loads(path.read_text())
        results[r.get("mlflow_run_id")] = r
    printed = _printed(stdout)
    bad = []
    for run in o.runs:
        r = results.get(run["run_id"])
        if r is None:
            if run["status"] == "FINISHED":
                bad.append(f"{run['run_id'][:8]}: no result.json")
            continue
        for key in FINAL_KEYS if run["status"] == "FINISHED" else ():
            got = run["metrics"].get(key)
            want = r.get(key)
            if want is None and got is None:
                continue
            if not _close(None if want is None else float(want), got, 1e-12):
                bad.append(f"{key}: mlflow {got} vs result.json {want}")
        if r.get("status") != run["status"]:
            bad.append(f"status: mlflow {run['status']} vs result.json {r.get('status')}")
    if len(o.runs) == 1 and o.runs[0]["status"] == "FINISHED" and printed:
        r = results.get(o.runs[0]["run_id"]) or {}
        for key, value in printed[-1].items():
            want = r.get(key)
            if value is None or want is None:
                if (value is None) != (want is None):
                    bad.append(f"printed {key} {value} vs result.json {want}")
                continue
            if not _close(float(want), value, 1e-3):
                bad.append(f"printed {key} {value} vs result.json {want}")
    o.metrics_match = not bad
    o.mismatch = "; ".join(bad)


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def run_case(c: Case, root: Path, timeout: float) -> Outcome:
    # no "=" nor spaces: the folder goes into a Hydra override
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{c.family}-{c.name}")[:70]
    work = root / f"{slug}-{zlib.crc32(' '.join(c.args).encode()):08x}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    uri = f"sqlite:///{work}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CI": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    if SHARED_BINARY:  # --shared-data: the loaders find the .npz files there
        env["GPINFER_DATA_DIR"] = str(SHARED_DATA)
    dirs = ([f"hydra.sweep.dir={work}/multirun"] if c.multirun
            else [f"hydra.run.dir={work}/run"])
    argv = [str(GPINFER_RUN), *(["-m"] if c.multirun else []), *BASE, *c.args, *dirs]
    o = Outcome(c.family, c.name, c.args, c.expect)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout)
        o.rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        o.rc = None
        stdout, stderr = _text(exc.stdout), _text(exc.stderr)
        o.problems.append(f"timeout after {timeout:.0f} s")
    o.wall_s = round(time.perf_counter() - t0, 1)
    (work / "stdout.txt").write_text(stdout)
    (work / "stderr.txt").write_text(stderr)
    o.traceback = TRACEBACK in stderr or TRACEBACK in stdout
    lines = [ln for ln in stderr.splitlines() if ln.strip()
             and not ln.startswith(("Set the environment variable HYDRA_FULL_ERROR", "See https"))
             and " INFO " not in ln]
    errs = [ln for ln in lines if ln.startswith("gpinfer-run:")]
    o.error_line = (errs[-1] if errs else lines[-1] if lines else "")[:400]
    if Path(f"{work}/mlflow.db").exists():
        try:
            o.runs = _store_runs(uri)
        except Exception as exc:  # noqa: BLE001 - a broken store is itself a finding
            o.problems.append(f"store unreadable: {exc}")
    statuses = Counter(r["status"] for r in o.runs)
    if statuses.get("RUNNING"):
        o.problems.append("a run left RUNNING")
    if o.traceback:
        o.problems.append("traceback shown")
    if o.runs:
        check_metrics(o, work, stdout)
        if o.metrics_match is False:
            o.problems.append("metrics differ: " + o.mismatch)
    # a fit that failed numerically (the fit guard, a NumericalError) can only be known in
    # its run: a FAILED run with the error recorded is the standard, not a late refusal
    fit_failed = o.rc not in (0, None) and bool(o.runs) and not c.multirun and any(
        f"{kind}:" in o.error_line for kind in ("FitFailedError", "NumericalError"))
    if fit_failed:
        o.verdict = "fit-failed"
        if any(r["status"] != "FAILED" for r in o.runs):
            o.problems.append("a failed fit whose run is not FAILED")
        if c.expect == "run":
            o.problems.append("expected to run")
        return o
    refused = o.rc not in (0, None) and not any(r["status"] == "FINISHED" for r in o.runs)
    if c.key is not None and o.rc not in (0, None):
        o.names_key = c.key.lower() in (stderr + stdout).lower()
    if refused:
        if o.runs and not c.multirun:
            o.problems.append("refused after its MLflow run started: "
                              + ",".join(sorted(statuses)))
        if o.names_key is False:
            o.problems.append(f"message does not name {c.key!r}")
        o.verdict = "refused"
    elif o.rc == 0:
        o.verdict = "ran"
        if c.expect == "refuse":
            o.problems.append("accepted a hostile value")
        if not c.multirun and statuses.get("FINISHED", 0) != 1:
            o.problems.append(f"rc 0 but runs {dict(statuses)}")
    elif o.rc is None:
        o.verdict = "timeout"
    else:
        o.verdict = "failed-mixed"
    if c.expect == "run" and o.verdict != "ran":
        o.problems.append("expected to run")
    return o


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/config_hunt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-grid", type=int, default=30)
    ap.add_argument("--only", choices=["grid", "hostile", "sweep"], action="append")
    ap.add_argument("--match", default=None, help="only cases whose name contains this")
    ap.add_argument("--shared-data", action="store_true",
                    help="add the ../shared/data sets to the grid when present")
    ap.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    print(f"config_hunt: seed {args.seed}, out {root}, load {os.getloadavg()[0]:.1f}",
          flush=True)
    datasets = list(DATA)
    if args.shared_data and SHARED_DATA.is_dir():
        for name in ("australian", "crabs", "ionosphere", "sonar"):
            if (SHARED_DATA / f"{name}.npz").exists():
                datasets.append(name)
                SHARED_BINARY.add(name)
    cases: list[Case] = []
    families = args.only or ["hostile", "sweep", "grid"]
    if "hostile" in families:
        cases += hostile_cases(root)
    if "sweep" in families:
        cases += sweep_cases()
    if "grid" in families:
        cases += grid_cases(rng, args.n_grid, datasets)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    log = (root / "cases.jsonl").open("a")
    outcomes = []
    for i, c in enumerate(cases):
        o = run_case(c, root, args.timeout)
        outcomes.append(o)
        log.write(json.dumps(asdict(o)) + "\n")
        log.flush()
        flag = "DEFECT? " + " | ".join(o.problems) if o.problems else "ok"
        print(f"[{i + 1}/{len(cases)}] {c.family}:{c.name} rc={o.rc} {o.verdict} "
              f"runs={[r['status'] for r in o.runs]} {o.wall_s}s :: {flag}"
              + (f"\n      {o.error_line}" if o.error_line and o.verdict != "ran" else ""),
              flush=True)
    print_table(outcomes)


def print_table(outcomes: list[Outcome]) -> None:
    table: dict[str, Counter[str]] = {}
    for o in outcomes:
        table.setdefault(o.family, Counter())[o.verdict] += 1
        table[o.family]["with problems"] += bool(o.problems)
    print("\nfamily   cases  ran  refused  fit-failed  failed-mixed  timeout  with-problems")
    for fam, cnt in table.items():
        total = sum(v for k, v in cnt.items() if k != "with problems")
        print(f"{fam:8} {total:5} {cnt['ran']:4} {cnt['refused']:8} {cnt['fit-failed']:11} "
              f"{cnt['failed-mixed']:13} {cnt['timeout']:8} {cnt['with problems']:14}")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

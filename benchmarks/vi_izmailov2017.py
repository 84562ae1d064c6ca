"""Accuracy / NLL against training time for vi-jj, vi-taylor, vi-jj-hybrid, vi-jj-full and svi
(Izmailov & Kropotov 2017 protocol, spec jj-taylor-svi §6.1) on one dataset.

    .venv/bin/python benchmarks/vi_izmailov2017.py german --budget 30
    .venv/bin/python benchmarks/vi_izmailov2017.py ijcnn1 --budget 60 --methods vi-jj [--ard]
    .venv/bin/python benchmarks/vi_izmailov2017.py german --budget 30 --select-lr 3

Same K-means inducing inputs and initial hyper-parameters (sigma_f = 1, l = sqrt(D),
sigma_n = 0.1) for every method. Time is training time only (the evaluation inside the callback
is excluded). Accuracy uses sign(m*); NLL the 20-node Gauss-Hermite logistic predictive.
Writes outputs/benchmarks/izmailov2017_<dataset>[_ard][_<tag>].csv and .png, prints a summary
(time to within 0.5% of the final accuracy, final accuracy and NLL, time to reach
--target-accuracy) and logs every iteration (elapsed_s, test_accuracy, test_nll, objective) to
MLflow, one run per method in the experiment "izmailov2017" of the project store (--no-mlflow to
skip). Also prints each method's process CPU time (the wall clock is inflated on a shared machine).

    .venv/bin/python benchmarks/vi_izmailov2017.py --summary outputs/benchmarks/izmailov2017_*.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.special import log_expit
from threadpoolctl import threadpool_limits

from gpinfer import registry
from gpinfer.data import load_dataset
from gpinfer.data.splits import standardize, train_test_split
from gpinfer.inducing import kmeans_inducing
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit
from gpinfer.numerics.quadrature import gauss_hermite

OUT = Path(__file__).resolve().parents[1] / "outputs" / "benchmarks"
METHODS = ["vi-jj", "vi-taylor", "vi-jj-hybrid", "vi-jj-full", "svi-adadelta", "svi-adam"]
# also available: "svi-ngd" (natural-gradient steps on q(u), Adam on the kernel parameters)


def evaluate(post, X_test, y_test) -> tuple[float, float]:
    mean, var = post.predict_f(X_test)
    mean, var = mean[:, 0], var[:, 0]
    acc = float(np.mean((mean > 0) == (y_test == 1)))
    x, w = gauss_hermite(20)
    s = 2.0 * y_test - 1.0
    f = mean[:, None] + np.sqrt(var)[:, None] * x
    lp = np.log(np.exp(log_expit(s[:, None] * f)) @ w)
    return acc, float(-np.mean(lp))


def run(name, split, Z, budget, batch, lr, max_iter, ard=False, evaluate_test=True):
    X, y = split.X_train, split.y_train
    d = X.shape[1]
    ell = np.full(d, np.sqrt(d)) if ard else np.sqrt(d)
    kernel = RBF(lengthscale=ell, variance=1.0) + White(0.01)
    rows = []
    if name.startswith("svi"):
        opt = name.split("-")[1]
        cls = registry.load_method("svi")
        if opt == "ngd":  # natural-gradient steps on q(u), Adam on theta
            method = cls(optimizer="adam", natural_gradient=lr["ngd"],
                         optimizer_options={"learning_rate": lr["adam"]}, time_budget_s=budget,
                         lengthscale_init="kernel")
        else:
            method = cls(optimizer=opt, optimizer_options={"learning_rate": lr[opt]},
                         time_budget_s=budget, lengthscale_init="kernel")
        bs = batch
    else:
        cls = registry.load_method(name)
        method = cls(time_budget_s=budget, tol=0.0, lengthscale_init="kernel")
        bs = None
    problem = Problem(X=X, y=y, n_classes=2, kernel=kernel, likelihood=BernoulliLogit(),
                      inducing=Z, max_iter=max_iter, batch_size=bs,
                      rng=np.random.default_rng(0))

    def callback(info):
        if evaluate_test:
            acc, nll = evaluate(info.posterior(), split.X_test, split.y_test)
        else:
            acc = nll = np.nan
        rows.append((info.elapsed, acc, nll, info.objective))

    method.fit(problem, callback)
    return rows


def summarize(curves: dict[str, np.ndarray], target: float) -> None:
    """Markdown table of each curve ``[T, 4]`` (elapsed_s, accuracy, NLL, objective)."""
    print(f"| method | iters | train s | final acc | final NLL | best acc | s to within 0.5% of "
          f"final acc | s to acc >= {target} |")
    print("|---|---|---|---|---|---|---|---|")
    for name, arr in curves.items():
        t, acc, nll = arr[:, 0], arr[:, 1], arr[:, 2]
        hit = t[np.argmax(acc >= acc[-1] - 0.005)]
        reach = f"{t[np.argmax(acc >= target)]:.1f}" if np.any(acc >= target) else "never"
        print(f"| {name} | {len(t)} | {t[-1]:.1f} | {acc[-1]:.4f} | {nll[-1]:.4f} | "
              f"{acc.max():.4f} | {hit:.2f} | {reach} |")


def read_csv(path: Path) -> dict[str, np.ndarray]:
    rows = defaultdict(list)
    with open(path) as fh:
        for r in csv.DictReader(fh):
            rows[r["method"]].append([float(r[k]) for k in
                                      ("elapsed_s", "test_accuracy", "test_nll", "objective")])
    return {k: np.array(v) for k, v in rows.items()}


def log_mlflow(dataset: str, name: str, arr: np.ndarray, params: dict) -> None:
    """One MLflow run with the curve: metrics per iteration (step = iteration)."""
    from gpinfer.experiment.tracking import RunLogger, resolve_tracking_uri

    logger = RunLogger(resolve_tracking_uri(None), "izmailov2017")
    with logger.run(f"{name}_{dataset}", tags={"benchmark": "vi_izmailov2017.py"},
                    params={"method": name, "dataset": dataset, **params}):
        for i, (t, acc, nll, obj) in enumerate(arr, start=1):
            logger.log_metrics({"elapsed_s": t, "test_accuracy": acc, "test_nll": nll,
                                "objective": obj}, step=i)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", nargs="?", default="german")
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lr-adadelta", type=float, default=1.0)
    ap.add_argument("--lr-adam", type=float, default=0.01)
    ap.add_argument("--lr-ngd", type=float, default=0.1, help="svi-ngd natural-gradient step")
    ap.add_argument("--select-lr", type=float, default=0.0,
                    help="seconds per grid value to choose the svi rates by training ELBO "
                    "(spec §6.1, P13); 0 keeps --lr-*")
    ap.add_argument("--ard", action="store_true", help="one lengthscale per feature")
    ap.add_argument("--max-iter", type=int, default=100000)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (spec P19)")
    ap.add_argument("--tag", default="", help="suffix of the output files")
    ap.add_argument("--binary-raw", action="store_true",
                    help="diagnostic: keep 0/1 feature columns unstandardised")
    ap.add_argument("--target-accuracy", type=float, default=0.96)
    ap.add_argument("--no-mlflow", action="store_true")
    ap.add_argument("--to-mlflow", action="store_true", help="with --summary: log the CSV curves")
    ap.add_argument("--summary", nargs="*", type=Path, default=None,
                    help="only print the tables of these CSV files (dataset argument ignored)")
    args = ap.parse_args()
    if args.summary is not None:
        for path in args.summary:
            print(path)
            curves = read_csv(path)
            summarize(curves, args.target_accuracy)
            if args.to_mlflow:  # log curves measured earlier, one run per method
                dataset = path.stem.removeprefix("izmailov2017_")
                for name, arr in curves.items():
                    log_mlflow(dataset, name, arr, {"source_csv": path.name})
        return
    with threadpool_limits(args.threads):
        _main(args)


def _main(args) -> None:
    ds = load_dataset(args.dataset)
    tf = None if ds.X_test is not None else 0.2
    raw = train_test_split(ds, test_fraction=tf, seed=0, stratify=True)
    split, _ = standardize(raw)
    if args.binary_raw:  # diagnostic: 0/1 columns (ijcnn1's one-hot block) left unstandardised
        binary = np.array([np.isin(c, (0.0, 1.0)).all() for c in raw.X_train.T])
        Xtr, Xte = split.X_train.copy(), split.X_test.copy()
        Xtr[:, binary], Xte[:, binary] = raw.X_train[:, binary], raw.X_test[:, binary]
        split = replace(split, X_train=Xtr, X_test=Xte)
        print(f"binary columns kept as 0/1: {np.flatnonzero(binary).tolist()}")
    n = split.X_train.shape[0]
    batch = args.batch or (50 if n < 5000 else max(1, round(n / 100)))
    Z = kmeans_inducing(split.X_train, args.M, np.random.default_rng(0))
    print(f"{args.dataset}: n={n} test={split.X_test.shape[0]} d={split.X_train.shape[1]} "
          f"m={Z.shape[0]} svi batch={batch} budget={args.budget}s BLAS threads={args.threads} "
          f"kernel={'ARD ' if args.ard else ''}RBF+White")
    OUT.mkdir(parents=True, exist_ok=True)
    tag = (f"{args.dataset}{'_ard' if args.ard else ''}{'_binraw' if args.binary_raw else ''}"
           f"{'_' + args.tag if args.tag else ''}")
    curves = {}
    lr = {"adadelta": args.lr_adadelta, "adam": args.lr_adam}
    grids = {"adadelta": [0.1, 0.3, 1.0, 3.0], "adam": [0.003, 0.01, 0.03, 0.1],
             "ngd": [0.03, 0.1, 0.3]}
    for name in args.methods.split(","):
        opt = name.split("-")[1] if name.startswith("svi") else None
        if opt and args.select_lr > 0:
            scores = {}
            for rate in grids[opt]:
                trial = dict(lr, **{opt: rate})
                try:
                    r = run(name, split, Z, args.select_lr, batch, trial, args.max_iter,
                            args.ard, evaluate_test=False)
                    scores[rate] = float(np.mean([row[3] for row in r[-3:]]))
                except Exception as err:  # a diverging rate is a losing rate
                    scores[rate] = -np.inf
                    print(f"    {name} rate {rate}: {type(err).__name__}")
            lr[opt] = max(scores, key=scores.get)
            print(f"  {name}: training-ELBO rate selection ({args.select_lr:g}s each) "
                  f"{ {k: round(v, 1) for k, v in scores.items()} } -> {lr[opt]}", flush=True)
        c0 = time.process_time()
        rows = run(name, split, Z, args.budget, batch, lr, args.max_iter, args.ard)
        cpu = time.process_time() - c0
        curves[name] = np.array(rows)
        t, acc, nll = curves[name][:, 0], curves[name][:, 1], curves[name][:, 2]
        hit = t[np.argmax(acc >= acc[-1] - 0.005)]
        print(f"  {name:13s} iters={len(t):5d} time={t[-1]:7.2f}s final acc={acc[-1]:.4f} "
              f"nll={nll[-1]:.4f} best acc={acc.max():.4f} "
              f"time to within 0.5% of final acc={hit:.2f}s (process CPU incl. evaluation "
              f"{cpu:.1f}s; load {os.getloadavg()[0]:.1f})", flush=True)
        if not args.no_mlflow:
            log_mlflow(tag, name, curves[name],
                       {"M": Z.shape[0], "ard": args.ard, "batch": batch, "budget_s": args.budget,
                        "lr": lr.get(opt, "") if opt else ""})
    summarize(curves, args.target_accuracy)
    with open(OUT / f"izmailov2017_{tag}.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "elapsed_s", "test_accuracy", "test_nll", "objective"])
        for name, arr in curves.items():
            for r in arr:
                w.writerow([name, *r])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, arr in curves.items():
        axes[0].plot(arr[:, 0], arr[:, 1], label=name)
        axes[1].plot(arr[:, 0], arr[:, 2], label=name)
    axes[0].set_ylabel("test accuracy")
    axes[1].set_ylabel("test NLL")
    for ax in axes:
        ax.set_xlabel("training time (s)")
        ax.set_xscale("symlog", linthresh=0.1)
    axes[0].legend()
    fig.suptitle(f"{args.dataset}: n={n}, d={split.X_train.shape[1]}, m={Z.shape[0]}"
                 f"{', ARD' if args.ard else ''}")
    fig.tight_layout()
    fig.savefig(OUT / f"izmailov2017_{tag}.png", dpi=100)
    print("wrote", OUT / f"izmailov2017_{tag}.png")


if __name__ == "__main__":
    main()

"""Accuracy / NLL against training time for vi-jj, vi-taylor, vi-jj-hybrid, vi-jj-full and svi
(Izmailov & Kropotov 2017 protocol, spec jj-taylor-svi §6.1) on one dataset.

    .venv/bin/python benchmarks/vi_izmailov2017.py german --budget 30
    .venv/bin/python benchmarks/vi_izmailov2017.py ijcnn1 --budget 60 --methods vi-jj [--ard]
    .venv/bin/python benchmarks/vi_izmailov2017.py german --budget 30 --select-lr 3

Same K-means inducing inputs and initial hyper-parameters (sigma_f = 1, l = sqrt(D),
sigma_n = 0.1) for every method. Time is training time only (the evaluation inside the callback
is excluded). Accuracy uses sign(m*); NLL the 20-node Gauss-Hermite logistic predictive.
Writes outputs/benchmarks/izmailov2017_<dataset>.csv and .png and prints a summary.
"""

from __future__ import annotations

import argparse
import csv
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
                         optimizer_options={"learning_rate": lr["adam"]}, time_budget_s=budget)
        else:
            method = cls(optimizer=opt, optimizer_options={"learning_rate": lr[opt]},
                         time_budget_s=budget)
        bs = batch
    else:
        cls = registry.load_method(name)
        method = cls(time_budget_s=budget, tol=0.0)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
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
    args = ap.parse_args()
    with threadpool_limits(args.threads):
        _main(args)


def _main(args) -> None:
    ds = load_dataset(args.dataset)
    tf = None if ds.X_test is not None else 0.2
    split, _ = standardize(train_test_split(ds, test_fraction=tf, seed=0, stratify=True))
    n = split.X_train.shape[0]
    batch = args.batch or (50 if n < 5000 else max(1, round(n / 100)))
    Z = kmeans_inducing(split.X_train, args.M, np.random.default_rng(0))
    print(f"{args.dataset}: n={n} test={split.X_test.shape[0]} d={split.X_train.shape[1]} "
          f"m={Z.shape[0]} svi batch={batch} budget={args.budget}s BLAS threads={args.threads} "
          f"kernel={'ARD ' if args.ard else ''}RBF+White")
    OUT.mkdir(parents=True, exist_ok=True)
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
        rows = run(name, split, Z, args.budget, batch, lr, args.max_iter, args.ard)
        curves[name] = np.array(rows)
        t, acc, nll = curves[name][:, 0], curves[name][:, 1], curves[name][:, 2]
        hit = t[np.argmax(acc >= acc[-1] - 0.005)]
        print(f"  {name:13s} iters={len(t):5d} time={t[-1]:7.2f}s final acc={acc[-1]:.4f} "
              f"nll={nll[-1]:.4f} best acc={acc.max():.4f} "
              f"time to within 0.5% of final acc={hit:.2f}s", flush=True)
    tag = f"{args.dataset}{'_ard' if args.ard else ''}"
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

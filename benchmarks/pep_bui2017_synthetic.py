"""Bui et al. (2017) synthetic regression (spec power-ep §6.1), full or reduced protocol.

Reads ``conf/experiment/bui2017_synthetic_regression.yaml`` (command-line flags override it):
data sets of ``n_points`` in ``input_dim`` dimensions drawn from an ARD squared-exponential GP,
a 50/50 split, inputs and outputs standardised with the training part, ``GPRegressor(method=
"pep")`` per (data set, M, alpha) with L-BFGS-B on the collapsed energy, and the full GP
(type-II ML, ``M = N`` with ``Z = X`` fixed) as the reference. Prints SMSE / SMLL / NLML per
alpha, the pairwise win fractions, whether NLML at alpha >= 0.8 falls below the full-GP NLML,
writes ``rows.json`` and a PNG, and logs them to MLflow.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from pep_common import (
    label,
    log_to_mlflow,
    pairwise_text,
    plot_metric_vs_alpha,
    save_rows,
    summary_table,
    win_fraction,
)
from threadpoolctl import threadpool_limits

from gpinfer import GPRegressor
from gpinfer.kernels import make_kernel

CONFIG = (Path(__file__).resolve().parent.parent
          / "conf/experiment/bui2017_synthetic_regression.yaml")


def make_dataset(seed: int, c) -> tuple:
    """``X [n, D] ~ N(0, I)``, ``y = f + noise`` with ``f`` from the ARD-SE GP prior."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(c.n_points, c.input_dim))
    kern = make_kernel("rbf", input_dim=c.input_dim, ard=True)
    ell = rng.uniform(*c.lengthscale_range, size=c.input_dim)
    kern.set_unconstrained(np.r_[np.log(ell), 0.0])
    s2 = rng.uniform(*c.noise_range)
    K = kern.K(X) + 1e-8 * np.eye(c.n_points)
    f = np.linalg.cholesky(K) @ rng.normal(size=c.n_points)
    y = f + np.sqrt(s2) * rng.normal(size=c.n_points)
    n_tr = int(round(c.train_fraction * c.n_points))
    Xtr, Xte, ytr, yte = X[:n_tr], X[n_tr:], y[:n_tr], y[n_tr:]
    mx, sx, my, sy = Xtr.mean(0), Xtr.std(0), ytr.mean(), ytr.std()
    return (Xtr - mx) / sx, (Xte - mx) / sx, (ytr - my) / sy, (yte - my) / sy


def scores(est: GPRegressor, Xte, yte, ytr) -> dict:
    mean, std = est.predict(Xte, return_std=True)
    smse = float(np.mean((mean - yte) ** 2) / np.var(yte))
    nlp = -est.log_predictive(Xte, yte)
    trivial = 0.5 * np.log(2 * np.pi * ytr.var()) + 0.5 * (yte - ytr.mean()) ** 2 / ytr.var()
    return {"smse": smse, "smll": float(np.mean(nlp - trivial)), "nlml": -est.log_evidence_}


def fit(Xtr, ytr, M, alpha, c, seed) -> GPRegressor:
    options = {"max_fun": int(c.max_fun)}
    method = "pep"
    if isinstance(M, np.ndarray):  # the full GP: Z = X fixed, any alpha is exact
        options["learn_inducing"] = False
        method = "fitc"
    else:
        options["alpha"] = alpha
    est = GPRegressor(method=method, M=M, kernel=make_kernel("rbf", input_dim=Xtr.shape[1],
                                                              ard=True),
                      max_iter=int(c.max_iter), random_state=seed, method_options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return est.fit(Xtr, ytr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--n-datasets", type=int)
    parser.add_argument("--M", type=int, nargs="+")
    parser.add_argument("--alphas", type=float, nargs="+")
    parser.add_argument("--max-iter", type=int)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent
                        / "outputs/bui2017_synthetic")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--merge", type=Path, nargs="*", default=[],
                        help="rows.json files of earlier runs to include in the summary")
    args = parser.parse_args()
    c = OmegaConf.load(args.config).synthetic_regression
    for key, flag in (("n_datasets", "n_datasets"), ("M", "M"), ("alpha", "alphas"),
                      ("max_iter", "max_iter")):
        if getattr(args, flag) is not None:
            c[key] = getattr(args, flag)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, full = [], []
    with threadpool_limits(1):
        for seed in range(args.first_seed, args.first_seed + int(c.n_datasets)):
            Xtr, Xte, ytr, yte = make_dataset(seed, c)
            t = time.perf_counter()
            ref = scores(fit(Xtr, ytr, Xtr.copy(), 1.0, c, seed), Xte, yte, ytr)
            full.append(ref)
            print(f"data set {seed}: full GP smse={ref['smse']:.3f} smll={ref['smll']:.3f} "
                  f"nlml={ref['nlml']:.1f} ({time.perf_counter() - t:.1f} s)", flush=True)
            for M in c.M:
                for alpha in c.alpha:
                    t = time.perf_counter()
                    r = scores(fit(Xtr, ytr, int(M), float(alpha), c, seed), Xte, yte, ytr)
                    r.update(dataset="synthetic", split=seed, M=int(M), alpha=float(alpha),
                             nlml_minus_full=r["nlml"] - ref["nlml"],
                             time_s=time.perf_counter() - t)
                    rows.append(r)
                    print(f"  M={M:3d} alpha={label(alpha):>4s} smse={r['smse']:.3f} "
                          f"smll={r['smll']:.3f} nlml-full={r['nlml_minus_full']:+.2f} "
                          f"({r['time_s']:.1f} s)", flush=True)
            save_rows(rows, args.out / "rows.json")
    for path in args.merge:
        rows += json.loads(path.read_text())
    metrics = ("smse", "smll", "nlml_minus_full")
    protocol = (f"n_datasets={c.n_datasets} (seeds from {args.first_seed}) n_points={c.n_points} "
                f"M={list(c.M)} max_iter={c.max_iter} max_fun={c.max_fun}"
                + (f" + merged {[str(p) for p in args.merge]}" if args.merge else ""))
    over = []
    for M in c.M:
        for a in (0.8, 1.0):
            v = [r["nlml_minus_full"] for r in rows if r["M"] == M and r["alpha"] == a]
            if v:
                over.append(f"M={M} alpha={label(a)}: NLML - full-GP NLML mean {np.mean(v):+.2f}"
                            f", below full GP in {np.mean(np.array(v) < 0) * 100:.0f}% of sets")
    fullmeans = {k: float(np.mean([f[k] for f in full])) for k in ("smse", "smll", "nlml")}
    text = "\n".join([protocol, f"full GP (type-II ML): {fullmeans}",
                      summary_table(rows, metrics), pairwise_text(rows, ("smse", "smll")),
                      *over])
    print(text)
    (args.out / "summary.txt").write_text(text + "\n")
    png = plot_metric_vs_alpha(rows, metrics, args.out / "bui2017_synthetic_regression.png",
                               f"PEP synthetic regression ({protocol})")
    summary = {f"{m}_alpha{a:g}": float(np.mean([r[m] for r in rows if r["alpha"] == a]))
               for m in metrics for a in c.alpha}
    summary.update({f"win_{m}_{label(a)}_vs_{label(b)}": win_fraction(rows, m, a, b)
                    for m in ("smse", "smll") for a, b in ((0.5, 0.0), (0.5, 1.0), (0.0, 1.0))})
    run_id = log_to_mlflow("bui2017_synthetic_regression",
                           {"protocol": protocol, "config": str(args.config)}, summary,
                           [png, args.out / "rows.json", args.out / "summary.txt"],
                           args.tracking_uri)
    print(f"MLflow run {run_id}; plot {png}")


if __name__ == "__main__":
    main()

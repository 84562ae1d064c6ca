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
import time
import warnings
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from pep_common import (
    add_run_arguments,
    alpha_metrics,
    append_row,
    label,
    load_rows,
    pairwise_text,
    plot_metric_vs_alpha,
    publish,
    resume,
    save_rows,
    summary_rows,
    summary_table,
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
    options = {"max_fun": int(c.max_fun), "stop_window": c.get("stop_window"),
               "stop_tol": float(c.get("stop_tol", 0.1))}
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
    parser.add_argument("--stop-window", type=int,
                        help="stop L-BFGS-B once the energy gained < stop_tol nats over this "
                             "many iterations")
    parser.add_argument("--first-seed", type=int, default=1)
    add_run_arguments(parser, "bui2017_synthetic")
    args = parser.parse_args()
    c = OmegaConf.load(args.config).synthetic_regression
    for key, flag in (("n_datasets", "n_datasets"), ("M", "M"), ("alpha", "alphas"),
                      ("max_iter", "max_iter"), ("stop_window", "stop_window")):
        if getattr(args, flag) is not None:
            c[key] = getattr(args, flag)
    rows_file, rows, done = resume(args.out)
    full_file = args.out / "full_gp.jsonl"
    full = load_rows(full_file, key=lambda r: r["split"])  # resume from finished fits
    full_done = {r["split"] for r in full}
    seeds = range(args.first_seed, args.first_seed + int(c.n_datasets))
    with threadpool_limits(1):
        for seed in seeds if not args.summarise else ():
            Xtr, Xte, ytr, yte = make_dataset(seed, c)
            if seed not in full_done:
                t, cpu = time.perf_counter(), time.process_time()
                ref = scores(fit(Xtr, ytr, Xtr.copy(), 1.0, c, seed), Xte, yte, ytr)
                ref.update(split=seed, time_s=time.perf_counter() - t,
                           cpu_s=time.process_time() - cpu)
                append_row(ref, full_file)
                full.append(ref)
                print(f"data set {seed}: full GP smse={ref['smse']:.3f} "
                      f"smll={ref['smll']:.3f} nlml={ref['nlml']:.1f} ({ref['time_s']:.1f} s)",
                      flush=True)
            ref = next(f for f in full if f["split"] == seed)
            for M in c.M:
                for alpha in c.alpha:
                    if ("synthetic", seed, int(M), float(alpha)) in done:
                        continue
                    t, cpu = time.perf_counter(), time.process_time()
                    est = fit(Xtr, ytr, int(M), float(alpha), c, seed)
                    r = scores(est, Xte, yte, ytr)
                    r.update(dataset="synthetic", split=seed, M=int(M), alpha=float(alpha),
                             nlml_minus_full=r["nlml"] - ref["nlml"], n_iter=len(est.history_),
                             time_s=time.perf_counter() - t, cpu_s=time.process_time() - cpu)
                    append_row(r, rows_file)
                    rows.append(r)
                    print(f"  M={M:3d} alpha={label(alpha):>4s} smse={r['smse']:.3f} "
                          f"smll={r['smll']:.3f} nlml-full={r['nlml_minus_full']:+.2f} "
                          f"({r['time_s']:.1f} s, cpu {r['cpu_s']:.1f} s, "
                          f"{r['n_iter']} it)", flush=True)
    save_rows(rows, args.out / "rows.json")
    rows = summary_rows(rows, args.merge, c.alpha)
    metrics = ("smse", "smll", "nlml_minus_full")
    n_sets = len({r["split"] for r in rows})
    protocol = (f"n_datasets={n_sets} of {c.n_datasets} (seeds from {args.first_seed}) "
                f"n_points={c.n_points} M={list(c.M)} max_iter={c.max_iter} max_fun={c.max_fun} "
                f"stop_window={c.get('stop_window')} stop_tol={c.get('stop_tol')}"
                + (f" + merged {[str(p) for p in args.merge]}" if args.merge else ""))
    # NLML - full-GP NLML per M (rows) and alpha (columns): mean, and the share of data sets
    # where it is negative, i.e. the sparse energy over-estimates log p(y) (spec §6.1, §7.15)
    alphas = sorted({r["alpha"] for r in rows})
    over = ["NLML - full-GP NLML: mean [share of data sets below the full GP]",
            "    M  " + "  ".join(f"{label(a):>13s}" for a in alphas)]
    for M in sorted({r["M"] for r in rows}):
        cells = []
        for a in alphas:
            v = np.array([r["nlml_minus_full"] for r in rows if r["M"] == M and r["alpha"] == a])
            cells.append(f"{v.mean():+8.1f} [{np.mean(v < 0) * 100:3.0f}%]")
        over.append(f"{M:5d}  " + "  ".join(cells))
    sets = {r["split"] for r in rows}
    fullmeans = {k: float(np.mean([f[k] for f in full if f["split"] in sets]))
                 for k in ("smse", "smll", "nlml")}
    def mean_at(m: str, M: int, a: float) -> float:
        return float(np.mean([r[m] for r in rows if r["M"] == M and r["alpha"] == a]))

    per_M = [f"M={M}: " + "  ".join(f"{label(a)} smse={mean_at('smse', M, a):.3f}"
                                    f"/smll={mean_at('smll', M, a):+.3f}" for a in alphas)
             for M in sorted({r["M"] for r in rows})]
    cpu = sum(r.get("cpu_s", 0.0) for r in rows) + sum(f.get("cpu_s", 0.0) for f in full)
    text = "\n".join([protocol, f"{len(rows)} fits, {cpu / 60:.1f} CPU-min",
                      f"full GP (type-II ML): {fullmeans}",
                      summary_table(rows, metrics), pairwise_text(rows, ("smse", "smll")),
                      *over, "per M (mean over data sets):", *per_M])
    png = plot_metric_vs_alpha(rows, metrics, args.out / "bui2017_synthetic_regression.png",
                               f"PEP synthetic regression ({protocol})")
    publish(text, args.out, "bui2017_synthetic_regression",
            {"protocol": protocol, "config": str(args.config)},
            alpha_metrics(rows, metrics, c.alpha, ("smse", "smll")), [png], args.tracking_uri)


if __name__ == "__main__":
    main()

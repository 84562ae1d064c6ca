"""Speed targets of issue 6: one EP fit on n = 200 (< 0.5 s), a 16 x 16 grid for one
dataset / likelihood / method (< 2 min), and mcmc-ais on n = 200 (SE <= 0.5 in < 5 min).

    .venv/bin/python benchmarks/binary_speed.py [--skip-grid] [--skip-ais] [--method ep-dense]
Data: ionosphere, stratified 200 / 151 split (seed 0), z-scored; SE kernel. Every timing is
given as wall-clock and CPU seconds (``time.process_time``; the machine may be shared), EP fits
as the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # n <= 200: threaded BLAS only adds contention

import numpy as np  # noqa: E402
from binary_grid import load  # noqa: E402  (same folder)

from gpinfer import registry  # noqa: E402
from gpinfer.interfaces import Problem  # noqa: E402
from gpinfer.kernels import RBF  # noqa: E402
from gpinfer.likelihoods.bernoulli import BernoulliLogit, BernoulliProbit  # noqa: E402


def fit(name, opts, lik, X, y, le, ls):
    problem = Problem(X=X, y=y, n_classes=2, likelihood=lik, optimize=False,
                      kernel=RBF(lengthscale=np.exp(le), variance=np.exp(2 * ls)),
                      rng=np.random.default_rng(0))
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = registry.load_method(name)(**opts).fit(problem)
    return res, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-ais", action="store_true")
    ap.add_argument("--methods", nargs="*", default=["ep-dense"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    X, y, _, _ = load("ionosphere", 151 / 351, 0)
    out: dict = {"n": int(len(y))}
    for lname, lik in (("probit", BernoulliProbit()), ("logit", BernoulliLogit())):
        for le, ls in ((1.0, 1.0), (2.0, 3.0), (0.5, 4.0)):
            runs = [fit("ep-dense", {}, lik, X, y, le, ls) for _ in range(args.repeat)]
            out[f"ep_fit_{lname}_({le},{ls})"] = {
                "wall_s": round(min(r[1] for r in runs), 3),
                "cpu_s": round(min(r[2] for r in runs), 3),
                "sweeps": runs[0][0].history[-1]["sweeps"]}
            print(lname, (le, ls), out[f"ep_fit_{lname}_({le},{ls})"], flush=True)
    if not args.skip_grid:
        grid = np.linspace(0, 5, 16)
        for m in args.methods:
            t0, c0 = time.perf_counter(), time.process_time()
            for le in grid:
                for ls in grid:
                    fit(m, {}, BernoulliProbit(), X, y, le, ls)
            out[f"grid16_{m}_probit"] = {"wall_s": round(time.perf_counter() - t0, 1),
                                         "cpu_s": round(time.process_time() - c0, 1)}
            print(m, "16x16 grid (probit):", out[f"grid16_{m}_probit"], flush=True)
    if not args.skip_ais:
        for budget, le, ls in (("fast", 1.0, 1.0), ("fast", 1.0, 3.0)):
            res, dt, dc = fit("mcmc-ais", {"budget": budget}, BernoulliLogit(), X, y, le, ls)
            ep, _, _ = fit("ep-dense", {}, BernoulliLogit(), X, y, le, ls)
            keys = ("min_acceptance", "max_acceptance", "rhat", "ess", "sd_log_z_runs", "gold")
            out[f"ais_{budget}_logit_({le},{ls})"] = {
                "log_z": res.log_evidence, "se": float(res.state["log_evidence_se"]),
                "wall_s": round(dt, 1), "cpu_s": round(dc, 1), "ep_log_z": ep.log_evidence,
                **{k: float(res.state[k]) for k in keys}}
            print("AIS", out[f"ais_{budget}_logit_({le},{ls})"], flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

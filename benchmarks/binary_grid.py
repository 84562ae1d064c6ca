"""Nickisch & Rasmussen (2008) grid experiment (conf/experiment/nickisch2008_grid.yaml).

Every method at every node of the (ln ell, ln sigma_f) grid, SE kernel, fixed hyper-parameters,
cold start; per node: own evidence, Jensen bound (where reported), test information score
(bits), errors, NLL, ECE, time. Writes under --out: ``grid_<data>_<lik>.npz``, contour PNGs
(evidence / information / errors per method, like the paper's Figs. 9 and 11), a reliability
diagram at each method's best-information node, and ``summary.json`` with the §12.3 counts.

    .venv/bin/python benchmarks/binary_grid.py --reduced --out outputs/nickisch2008_grid
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # n <= 200: threaded BLAS only adds contention

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

from gpinfer import registry  # noqa: E402
from gpinfer.interfaces import Problem  # noqa: E402
from gpinfer.kernels import RBF  # noqa: E402
from gpinfer.likelihoods.bernoulli import BernoulliLogit, BernoulliProbit  # noqa: E402
from gpinfer.metrics import error_rate, expected_calibration_error, information_score_bits, nll  # noqa: E402
from gpinfer.plots import contour_grid_png, reliability_diagram_png  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIKS = {"logit": BernoulliLogit, "probit": BernoulliProbit}


def load(name: str, test_fraction: float, seed: int):
    d = np.load(ROOT.parent / "shared" / "data" / f"{name}.npz")
    X, y = d["X"].astype(float), d["y"].astype(np.int64)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_fraction, stratify=y,
                                          random_state=seed)
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0
    return (Xtr - mu) / sd, ytr, (Xte - mu) / sd, yte


def run_node(method_name, options, lik, Xtr, ytr, Xte, yte, le, ls, prior):
    cls = registry.load_method(method_name)
    problem = Problem(X=Xtr, y=ytr, n_classes=2, likelihood=lik, optimize=False, max_iter=200,
                      kernel=RBF(lengthscale=np.exp(le), variance=np.exp(2 * ls)),
                      rng=np.random.default_rng(0))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = cls(**options).fit(problem)
    dt = time.perf_counter() - t0
    P = res.posterior.predict_proba(Xte)
    logp = res.posterior.log_predictive(Xte, yte)
    extra = res.history[-1] if res.history else {}
    return {
        "evidence": res.log_evidence,
        "jensen": extra.get("jensen_bound", res.log_evidence if method_name in ("kl", "lr")
                            else np.nan),
        "info": information_score_bits(yte, None, np.bincount(ytr, minlength=2),
                                       log_predictive=logp),
        "errors": error_rate(yte, P) * len(yte), "nll": nll(yte, log_predictive=logp),
        "ece": expected_calibration_error(yte, P), "time": dt,
        "se": float(res.state.get("log_evidence_se", np.nan)),
    }, P


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "conf/experiment/nickisch2008_grid.yaml"))
    ap.add_argument("--out", default=str(ROOT / "outputs/nickisch2008_grid"))
    ap.add_argument("--reduced", action="store_true")
    ap.add_argument("--datasets", nargs="*")
    ap.add_argument("--likelihoods", nargs="*")
    ap.add_argument("--methods", nargs="*", help="run only these methods (then --summarize)")
    ap.add_argument("--summarize", action="store_true", help="only merge saved per-method grids")
    args = ap.parse_args()
    cfg = yaml.safe_load(open(args.config))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = cfg["grid"]
    num = cfg["reduced"]["grid_num"] if args.reduced else g["ln_lengthscale"]["num"]
    ells = np.linspace(g["ln_lengthscale"]["start"], g["ln_lengthscale"]["stop"], num)
    sfs = np.linspace(g["ln_sigma_f"]["start"], g["ln_sigma_f"]["stop"], num)
    methods = cfg["methods"]
    if args.reduced:
        methods = {m: methods[m] for m in cfg["reduced"]["methods"]}
    if args.methods:
        methods = {m: methods[m] for m in args.methods}
    every = cfg["reduced"]["mcmc_every"] if args.reduced else cfg["mcmc"]["every"]
    summary: dict = {"protocol": {"grid_num": int(num), "ln_ell": ells.tolist(),
                                  "ln_sf": sfs.tolist(), "methods": list(methods),
                                  "reduced": bool(args.reduced), "mcmc_every": every},
                     "trials": {}}
    for dname in args.datasets or list(cfg["datasets"]):
        dcfg = cfg["datasets"][dname]
        Xtr, ytr, Xte, yte = load(dname, dcfg["test_fraction"], dcfg["seed"])
        prior = np.bincount(ytr, minlength=2)
        for lname in args.likelihoods or cfg["likelihoods"]:
            lik = LIKS[lname]()
            tag = f"{dname}_{lname}"
            res = {m: {k: np.full((num, num), np.nan) for k in
                       ("evidence", "jensen", "info", "errors", "nll", "ece", "time")}
                   for m in methods}
            bestP = {}
            for m, opts in methods.items():
                saved = out / f"grid_{tag}__{m}.npz"
                if args.summarize:
                    if saved.exists():
                        z = np.load(saved)
                        res[m] = {k: z[k] for k in res[m]}
                        bestP[m] = z["bestP"]
                    continue
                t0, best = time.perf_counter(), -np.inf
                for i, le in enumerate(ells):
                    for j, ls in enumerate(sfs):
                        try:
                            r, P = run_node(m, opts, lik, Xtr, ytr, Xte, yte, le, ls, prior)
                        except Exception as exc:  # record and go on: a failed node is data
                            print(f"  {tag} {m} ({le:.2f},{ls:.2f}) failed: {exc}", flush=True)
                            continue
                        for k in res[m]:
                            res[m][k][i, j] = r[k]
                        if r["info"] > best:
                            best, bestP[m] = r["info"], P
                print(f"{tag} {m}: {time.perf_counter() - t0:.1f} s for {num}x{num}, "
                      f"max info {np.nanmax(res[m]['info']):.3f} bits", flush=True)
                np.savez(saved, bestP=bestP.get(m, np.full((len(yte), 2), np.nan)), **res[m])
            if args.methods and not args.summarize:
                continue
            res = {m: r for m, r in res.items() if m in bestP}
            if len(res) < len(methods):  # an incomplete trial is reported, not summarised
                print(f"{tag}: only {sorted(res)} finished; left out of the summary")
                continue
            if every and not args.summarize:
                idx = np.arange(0, num, every)
                aisz = np.full((len(idx), len(idx)), np.nan)
                aisse = np.full_like(aisz, np.nan)
                for a, i in enumerate(idx):
                    for b, j in enumerate(idx):
                        r, _ = run_node(cfg["mcmc"]["method"], cfg["mcmc"]["options"], lik,
                                        Xtr, ytr, Xte, yte, ells[i], sfs[j], prior)
                        aisz[a, b], aisse[a, b] = r["evidence"], r["se"]
                        print(f"  AIS ({ells[i]:.2f},{sfs[j]:.2f}): {r['evidence']:.3f} "
                              f"+- {r['se']:.3f} ({r['time']:.0f} s)", flush=True)
                np.savez(out / f"ais_{tag}.npz", idx=idx, log_z=aisz, se=aisse)
            np.savez(out / f"grid_{tag}.npz", ln_ell=ells, ln_sf=sfs,
                     **{f"{m}__{k}": v for m in res for k, v in res[m].items()})
            for key, shared in (("evidence", True), ("jensen", True), ("info", False),
                                ("errors", False)):
                panels = {m: res[m][key] for m in res if np.isfinite(res[m][key]).any()}
                if not panels:
                    continue
                contour_grid_png(out / f"{tag}_{key}.png", ells, sfs, panels,
                                 title=f"{dname} {lname}: {key}", shared_levels=shared)
            reliability_diagram_png(out / f"{tag}_reliability.png", yte, bestP,
                                    title=f"{dname} {lname} at each method's best-I node")
            imax = {m: float(np.nanmax(res[m]["info"])) for m in res}
            summary["trials"][tag] = {
                "n_train": int(len(ytr)), "n_test": int(len(yte)), "I_max": imax,
                "max_evidence": {m: float(np.nanmax(res[m]["evidence"])) for m in res},
                "mean_time_per_node_s": {m: float(np.nanmean(res[m]["time"])) for m in res},
                "grid_time_s": {m: float(np.nansum(res[m]["time"])) for m in res},
            }
    counts = {m: {"below_mean": 0, "below_median": 0} for m in methods}
    for trial in summary["trials"].values():
        vals = np.array(list(trial["I_max"].values()))
        for m, v in trial["I_max"].items():
            counts[m]["below_mean"] += int(v < vals.mean())
            counts[m]["below_median"] += int(v < np.median(vals))
    summary["summary_12_3"] = counts
    json.dump(summary, open(out / "summary.json", "w"), indent=1)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()

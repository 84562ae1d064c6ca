"""Nickisch & Rasmussen (2008) grid experiment (conf/experiment/nickisch2008_grid.yaml).

Every method at every node of the (ln ell, ln sigma_f) grid, SE kernel, fixed hyper-parameters,
cold start; per node: own evidence, Jensen bound (where reported), test information score
(bits), errors, NLL, ECE, time. Writes under --out: ``grid_<data>_<lik>.npz``, contour PNGs
(evidence / information / errors per method, like the paper's Figs. 9 and 11), a reliability
diagram at each method's best-information node, and ``summary.json`` with the §12.3 counts.
``mcmc-ais`` (reduced budget) runs on a coarse sub-grid: ``ais_<data>_<lik>.npz`` and an AIS
vs EP evidence figure. Resumable: a finished ``grid_<data>_<lik>__<method>.npz`` is loaded, not
recomputed (``--force`` recomputes), and AIS nodes are saved one by one and skipped when done.
Several processes may share the work (e.g. one per ``--datasets``/``--likelihoods``): a method
being computed is marked by ``grid_<data>_<lik>__<method>.running`` and skipped by the others
(a killed run leaves its marker: delete it, or pass ``--force``).
Per node both wall-clock and CPU (``time.process_time``) seconds are stored. ``--workers 2``
shares each method grid's rows between two processes (both cores of the reference machine).

    .venv/bin/python benchmarks/binary_grid.py --out outputs/nickisch2008_grid
    .venv/bin/python benchmarks/binary_grid.py --reduced --out outputs/nickisch2008_grid_reduced
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
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


KEYS = ("evidence", "jensen", "info", "errors", "nll", "ece", "time", "cpu")


def run_node(method_name, options, lik, Xtr, ytr, Xte, yte, le, ls):
    """Fit one method at ``(ln ell, ln sigma_f)``; metrics dict and test probabilities."""
    cls = registry.load_method(method_name)
    problem = Problem(X=Xtr, y=ytr, n_classes=2, likelihood=lik, optimize=False, max_iter=200,
                      kernel=RBF(lengthscale=np.exp(le), variance=np.exp(2 * ls)),
                      rng=np.random.default_rng(0))
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = cls(**options).fit(problem)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
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
        "ece": expected_calibration_error(yte, P), "time": dt, "cpu": dc,
        "se": float(res.state.get("log_evidence_se", np.nan)), "state": res.state,
    }, P


def _grid_row(m, opts, lik, data, le, sfs):
    """One row (fixed ln ell) of a method grid: ``(metrics, P)`` or the error text per node."""
    row = []
    for ls in sfs:
        try:
            row.append(run_node(m, opts, lik, *data, le, ls))
        except Exception as exc:  # record and go on: a failed node is data
            row.append(f"{type(exc).__name__}: {exc}")
    return row


def run_method_grid(tag, m, opts, lik, data, ells, sfs, workers=1):
    """Every node of the grid for one method; dict of ``[num, num]`` arrays and best-I probs.

    ``workers > 1`` shares the rows among that many processes (wall time falls, CPU does not).
    """
    num = len(ells)
    res = {k: np.full((num, num), np.nan) for k in KEYS}
    best, bestP = -np.inf, np.full((len(data[3]), 2), np.nan)
    c0, t0 = time.process_time(), time.perf_counter()
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(_grid_row, *zip(*[(m, opts, lik, data, le, sfs)
                                                   for le in ells])))
    else:
        rows = [_grid_row(m, opts, lik, data, le, sfs) for le in ells]
    for i, row in enumerate(rows):
        for j, node in enumerate(row):
            if isinstance(node, str):
                print(f"  {tag} {m} ({ells[i]:.2f},{sfs[j]:.2f}) failed: {node}", flush=True)
                continue
            r, P = node
            for k in KEYS:
                res[k][i, j] = r[k]
            if r["info"] > best:
                best, bestP = r["info"], P
    wall = time.perf_counter() - t0
    cpu = float(np.nansum(res["cpu"])) if workers > 1 else time.process_time() - c0
    print(f"{tag} {m}: {cpu:.1f} CPU s, {wall:.1f} wall s ({workers} process(es)) for "
          f"{num}x{num}, max info {np.nanmax(res['info']):.3f} bits", flush=True)
    return res, bestP


AIS_KEYS = ("log_z", "se", "sd_runs", "cpu", "min_acceptance", "max_acceptance",
            "posterior_acceptance", "rhat", "ess", "weight_ess", "ep_log_z")


def run_ais_subgrid(path, mcfg, lik, data, ells, sfs, idx, ep_grid):
    """mcmc-ais at the sub-grid nodes ``idx``; saved after every node, finished nodes skipped."""
    k = len(idx)
    if path.exists():
        z = np.load(path)
        ais = {key: z[key] for key in AIS_KEYS}
    else:
        ais = {key: np.full((k, k), np.nan) for key in AIS_KEYS}
    for a, i in enumerate(idx):
        for b, j in enumerate(idx):
            if np.isfinite(ais["log_z"][a, b]):
                continue
            r, _ = run_node(mcfg["method"], mcfg["options"], lik, *data, ells[i], sfs[j])
            st = r["state"]
            ais["log_z"][a, b], ais["se"][a, b], ais["cpu"][a, b] = r["evidence"], r["se"], r["cpu"]
            ais["sd_runs"][a, b] = float(np.std(st["log_z_runs"], ddof=1))
            for key in ("min_acceptance", "max_acceptance", "posterior_acceptance", "rhat",
                        "ess", "weight_ess"):
                ais[key][a, b] = float(st[key]) if key in st else np.nan
            ais["ep_log_z"][a, b] = ep_grid[i, j]
            print(f"  AIS ({ells[i]:.2f},{sfs[j]:.2f}): {r['evidence']:.3f} +- {r['se']:.3f} "
                  f"(EP {ep_grid[i, j]:.3f}; {r['cpu']:.0f} CPU s, acc "
                  f"{ais['min_acceptance'][a, b]:.2f}, R-hat {ais['rhat'][a, b]:.3f}, "
                  f"ESS {ais['ess'][a, b]:.0f})", flush=True)
            np.savez(path, idx=idx, **ais)
    return ais


def best_node(grid, ells, sfs):
    i, j = np.unravel_index(np.nanargmax(grid), grid.shape)
    return [float(ells[i]), float(sfs[j])]


def trial_summary(res, ytr, yte, ells, sfs, ais):
    out = {
        "n_train": int(len(ytr)), "n_test": int(len(yte)),
        "I_max": {m: float(np.nanmax(r["info"])) for m, r in res.items()},
        "I_max_at": {m: best_node(r["info"], ells, sfs) for m, r in res.items()},
        "max_evidence": {m: float(np.nanmax(r["evidence"])) for m, r in res.items()},
        "max_evidence_at": {m: best_node(r["evidence"], ells, sfs) for m, r in res.items()},
        "info_at_max_evidence": {
            m: float(r["info"].flat[np.nanargmax(r["evidence"])]) for m, r in res.items()},
        "min_errors": {m: float(np.nanmin(r["errors"])) for m, r in res.items()},
        "failed_nodes": {m: int(np.sum(~np.isfinite(r["info"]))) for m, r in res.items()},
        "mean_cpu_per_node_s": {m: float(np.nanmean(r["cpu"])) for m, r in res.items()},
        "grid_cpu_s": {m: float(np.nansum(r["cpu"])) for m, r in res.items()},
        "grid_wall_s": {m: float(np.nansum(r["time"])) for m, r in res.items()},
    }
    if ais is not None and np.isfinite(ais["log_z"]).any():
        d = ais["ep_log_z"] - ais["log_z"]
        ok = np.isfinite(d)
        out["ais"] = {
            "nodes": int(ok.sum()), "cpu_s": float(np.nansum(ais["cpu"])),
            "mean_cpu_per_node_s": float(np.nanmean(ais["cpu"])),
            "se_median": float(np.nanmedian(ais["se"])), "se_max": float(np.nanmax(ais["se"])),
            "ep_minus_ais_mean": float(np.mean(d[ok])),
            "ep_minus_ais_max_abs": float(np.max(np.abs(d[ok]))),
            "ep_within_3se": int(np.sum(np.abs(d[ok]) <= 3 * ais["se"][ok])),
            "min_acceptance": float(np.nanmin(ais["min_acceptance"])),
            "max_rhat": float(np.nanmax(ais["rhat"])), "min_ess": float(np.nanmin(ais["ess"])),
        }
    return out


def figures(out, tag, title, res, ells, sfs, yte, bestP, ais, idx, n_train):
    for key, shared in (("evidence", True), ("jensen", True), ("info", False),
                        ("errors", False)):
        panels = {m: res[m][key] for m in res if np.isfinite(res[m][key]).any()}
        if panels:
            contour_grid_png(out / f"{tag}_{key}.png", ells, sfs, panels,
                             title=f"{title}: {key}", shared_levels=shared)
    paper_figure(out / f"{tag}_fig9_11.png", f"{title}: like Nickisch & Rasmussen Figs. 9/11",
                 res, ells, sfs, -n_train * np.log(2.0))
    reliability_diagram_png(out / f"{tag}_reliability.png", yte, bestP,
                            title=f"{title} at each method's best-I node")
    if ais is not None and np.isfinite(ais["log_z"]).sum() >= 4:
        contour_grid_png(out / f"{tag}_ais_vs_ep.png", ells[idx], sfs[idx],
                         {"AIS log Z": ais["log_z"], "EP log Z": ais["ep_log_z"],
                          "EP - AIS": ais["ep_log_z"] - ais["log_z"]},
                         title=f"{title}: AIS (coarse sub-grid) vs EP evidence")


def paper_figure(path, title, res, ells, sfs, baseline):
    """Figs. 9/11 layout: rows (a) own evidence, (b) Jensen bound J(q) at each method's Gaussian
    (same levels per row; the ignorance baseline -n ln 2 marked bold), (c) information (bits),
    (d) errors; one column per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (("evidence", "log evidence"), ("jensen", "Jensen bound"), ("info", "information"),
            ("errors", "test errors"))
    names = list(res)
    fig, axes = plt.subplots(4, len(names), figsize=(2.6 * len(names), 9.6), squeeze=False)
    for r, (key, label) in enumerate(rows):
        vals = np.concatenate([np.ravel(res[m][key]) for m in names])
        vals = vals[np.isfinite(vals)]
        if key in ("evidence", "jensen") and vals.size:
            levels = np.linspace(max(np.percentile(vals, 5), 2 * baseline), vals.max(), 12)
        elif vals.size:
            levels = np.linspace(vals.min(), vals.max(), 12)
        for c, m in enumerate(names):
            ax = axes[r][c]
            Z = np.asarray(res[m][key], float).T
            if np.isfinite(Z).sum() >= 4 and vals.size and np.nanmax(Z) > np.nanmin(Z):
                cs = ax.contour(ells, sfs, Z, levels=levels, linewidths=0.8)
                ax.clabel(cs, fontsize=5, fmt="%.3g")
                if key in ("evidence", "jensen") and np.nanmin(Z) < baseline < np.nanmax(Z):
                    ax.contour(ells, sfs, Z, levels=[baseline], colors="k", linewidths=2,
                               linestyles="solid")
                i, j = np.unravel_index(np.nanargmax(Z) if key != "errors" else np.nanargmin(Z),
                                        Z.shape)
                ax.plot(ells[j], sfs[i], "r+", ms=9)
            else:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", transform=ax.transAxes)
            if r == 0:
                ax.set_title(m, fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{label}\nln sigma_f", fontsize=8)
            if r == 3:
                ax.set_xlabel("ln ell", fontsize=8)
            ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def count_below(trials, methods):
    """§12.3: trials in which a method's best information is strictly below the mean/median."""
    counts = {m: {"below_mean": 0, "below_median": 0} for m in methods}
    for trial in trials.values():
        vals = np.array(list(trial["I_max"].values()))
        for m, v in trial["I_max"].items():
            counts[m]["below_mean"] += int(v < vals.mean())
            counts[m]["below_median"] += int(v < np.median(vals))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "conf/experiment/nickisch2008_grid.yaml"))
    ap.add_argument("--out", default=str(ROOT / "outputs/nickisch2008_grid"))
    ap.add_argument("--reduced", action="store_true")
    ap.add_argument("--datasets", nargs="*")
    ap.add_argument("--likelihoods", nargs="*")
    ap.add_argument("--methods", nargs="*", help="run only these methods")
    ap.add_argument("--force", action="store_true", help="recompute finished method grids")
    ap.add_argument("--summarize", action="store_true", help="only merge saved results")
    ap.add_argument("--no-mcmc", action="store_true", help="skip the AIS sub-grid")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes sharing the rows of each method grid")
    ap.add_argument("--mcmc-only", action="store_true",
                    help="only the AIS sub-grid of trials whose ep-dense grid is saved")
    args = ap.parse_args()
    cfg = yaml.safe_load(open(args.config))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = cfg["grid"]
    num = cfg["reduced"]["grid_num"] if args.reduced else g["ln_lengthscale"]["num"]
    ells = np.linspace(g["ln_lengthscale"]["start"], g["ln_lengthscale"]["stop"], num)
    sfs = np.linspace(g["ln_sigma_f"]["start"], g["ln_sigma_f"]["stop"], num)
    all_methods = cfg["methods"]
    if args.reduced:
        all_methods = {m: all_methods[m] for m in cfg["reduced"]["methods"]}
    run_methods = args.methods or list(all_methods)
    every = cfg["reduced"]["mcmc_every"] if args.reduced else cfg["mcmc"]["every"]
    idx = np.arange(0, num, every) if every else np.arange(0)
    summary: dict = {"protocol": {"grid_num": int(num), "ln_ell": ells.tolist(),
                                  "ln_sf": sfs.tolist(), "methods": list(all_methods),
                                  "reduced": bool(args.reduced), "mcmc": cfg["mcmc"],
                                  "mcmc_nodes": idx.tolist(), "kernel": cfg["kernel"]},
                     "trials": {}}
    for dname in args.datasets or list(cfg["datasets"]):
        dcfg = cfg["datasets"][dname]
        Xtr, ytr, Xte, yte = load(dname, dcfg["test_fraction"], dcfg["seed"])
        data = (Xtr, ytr, Xte, yte)
        for lname in args.likelihoods or cfg["likelihoods"]:
            lik = LIKS[lname]()
            tag = f"{dname}_{lname}"
            res, bestP = {}, {}
            for m, opts in all_methods.items():
                saved = out / f"grid_{tag}__{m}.npz"
                todo = m in run_methods and not (args.summarize or args.mcmc_only)
                if saved.exists() and not (args.force and todo):
                    z = np.load(saved)
                    res[m] = {k: z[k] if k in z else np.full((num, num), np.nan) for k in KEYS}
                    bestP[m] = z["bestP"]
                elif todo:
                    marker = saved.with_suffix(".running")  # another process is on it
                    if marker.exists() and not args.force:
                        print(f"{tag} {m}: {marker.name} exists, skipped", flush=True)
                        continue
                    marker.touch()
                    res[m], bestP[m] = run_method_grid(tag, m, opts, lik, data, ells, sfs,
                                                       args.workers)
                    np.savez(saved, bestP=bestP[m], **res[m])
                    marker.unlink()
            ais, ais_path = None, out / f"ais_{tag}.npz"
            if idx.size and "ep-dense" in res:
                if not (args.summarize or args.no_mcmc or args.methods):
                    ais = run_ais_subgrid(ais_path, cfg["mcmc"], lik, data, ells, sfs, idx,
                                          res["ep-dense"]["evidence"])
                elif ais_path.exists():
                    z = np.load(ais_path)
                    ais = {key: z[key] for key in AIS_KEYS}
            if not res:
                continue
            if len(res) < len(all_methods):  # an incomplete trial is reported, not counted
                print(f"{tag}: only {sorted(res)} finished; left out of the §12.3 counts")
                summary.setdefault("incomplete_trials", {})[tag] = trial_summary(
                    res, ytr, yte, ells, sfs, ais)
                continue
            np.savez(out / f"grid_{tag}.npz", ln_ell=ells, ln_sf=sfs,
                     **{f"{m}__{k}": v for m in res for k, v in res[m].items()})
            figures(out, tag, f"{dname} {lname}", res, ells, sfs, yte, bestP, ais, idx,
                    len(ytr))
            summary["trials"][tag] = trial_summary(res, ytr, yte, ells, sfs, ais)
    summary["summary_12_3"] = count_below(summary["trials"], all_methods)
    summary["total_cpu_s"] = {
        "grid": float(sum(sum(t["grid_cpu_s"].values()) for t in summary["trials"].values())),
        "ais": float(sum(t.get("ais", {}).get("cpu_s", 0.0)
                         for t in summary["trials"].values()))}
    if (args.methods or args.mcmc_only) and not args.summarize:
        print("partial run (--methods / --mcmc-only): summary.json left alone; merge with "
              "--summarize")
        return
    json.dump(summary, open(out / "summary.json", "w"), indent=1)
    print(json.dumps({"summary_12_3": summary["summary_12_3"],
                      "total_cpu_s": summary["total_cpu_s"]}))


if __name__ == "__main__":
    main()

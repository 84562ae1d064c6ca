"""Seeger & Jordan (2004) MNIST protocol for the multi-class IVM (spec ivm-multiclass §6).

Even digits of the MNIST training set, 200 random images per class (1000), of which 200 random
images are the test set and 800 the training set (pixels / 255). Shared RBF
``v exp(-w/(2p) |x - x'|^2)``, d_final = 150, L = 25, 3 EP sweeps, GH-3, simple score, beta = 0.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ivm_mnist.py --grid 5:50 --splits 0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ivm_mnist.py --grid paper --splits 0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ivm_mnist.py --learn --splits 0 \
        --jsonl outputs/ivm_learn/learned.jsonl   # learned (v, w, beta) from (5, 50), 4 rounds
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ivm_mnist.py --grid 5:50 --splits 0-9 --curves \
        --jsonl outputs/ivm_mnist/runs.jsonl        # append one JSON line per run
    .venv/bin/python benchmarks/ivm_mnist.py --summary outputs/ivm_mnist/runs.jsonl
        # Table 1 as mean +- sd over the splits found, beside the paper; mean learning curves

Prints err / lh / minent / maxent per (v, w) beside the paper's Table 1 and writes learning
curves (test error and mean test likelihood against |I|, every 10 inclusions) as PNGs to
``outputs/ivm_mnist/``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from gpinfer_ivm.gaussian_cubature import softmax_predictive
from gpinfer_ivm.inference import IVMSettings, run_inference

from gpinfer.data import load_dataset
from gpinfer.kernels.stationary import RBF

#: paper Table 1: (v, w) -> (err, lh, minent, maxent)
PAPER = {
    (0.5, 40): (0.03, 0.250980, 1.577508, 1.608262),
    (2, 40): (0.03, 0.329869, 1.465741, 1.603344),
    (3, 50): (0.03, 0.318090, 1.475719, 1.605220),
    (5, 40): (0.03, 0.378992, 1.362901, 1.598936),
    (5, 50): (0.03, 0.334296, 1.439076, 1.603916),
    (0.5, 50): (0.035, 0.234370, 1.596795, 1.608964),
    (0.5, 75): (0.035, 0.214800, 1.604509, 1.609399),
    (1, 50): (0.035, 0.259384, 1.572066, 1.608069),
    (1, 75): (0.035, 0.225446, 1.594087, 1.609345),
    (2, 30): (0.035, 0.366623, 1.403297, 1.597981),
    (2, 50): (0.035, 0.297387, 1.493768, 1.606813),
    (3, 30): (0.035, 0.402858, 1.227390, 1.595801),
    (3, 75): (0.035, 0.248621, 1.573701, 1.609153),
    (5, 25): (0.035, 0.458838, 1.013761, 1.586853),
    (5, 30): (0.035, 0.434059, 1.194334, 1.591372),
    (5, 75): (0.035, 0.254237, 1.555642, 1.608953),
    (1, 30): (0.04, 0.312231, 1.497278, 1.603975),
    (1, 40): (0.04, 0.284071, 1.541226, 1.607647),
    (2, 75): (0.04, 0.237900, 1.574186, 1.609215),
    (3, 25): (0.04, 0.427809, 1.252592, 1.589746),
    (5, 20): (0.04, 0.477860, 1.069909, 1.591897),
}
EVEN = (0, 2, 4, 6, 8)


def mnist_even_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """200 random training images per even digit; 200 of the 1000 for testing (pixels / 255)."""
    ds = load_dataset("mnist")
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.choice(np.flatnonzero(ds.y == c), 200, replace=False) for c in EVEN])
    X = ds.X[rows] / 255.0
    y = np.searchsorted(EVEN, ds.y[rows])
    test = np.zeros(rows.size, dtype=bool)
    test[rng.choice(rows.size, 200, replace=False)] = True
    return X[~test], y[~test], X[test], y[test]


def metrics(P: np.ndarray, y: np.ndarray) -> dict[str, float]:
    ent = -np.sum(P * np.log(np.clip(P, 1e-300, None)), axis=1)
    return {
        "err": float(np.mean(P.argmax(axis=1) != y)),
        "lh": float(np.mean(P[np.arange(y.size), y])),
        "minent": float(ent.min()),
        "maxent": float(ent.max()),
    }


def kernel_vw(v: float, w: float, p: int = 784) -> RBF:
    """``v exp(-w/(2p) r^2)`` as an RBF: lengthscale ``sqrt(p / w)``."""
    return RBF(lengthscale=np.sqrt(p / w), variance=v)


def run_point(v, w, split, seed, curves=False, d_final=150, L=25, sweeps=3, pool=32, gh=3):
    X, y, Xt, yt = split
    kern = kernel_vw(v, w)
    s = IVMSettings(d_final=d_final, L=L, ep_sweeps=sweeps, ep_tol=0.0, pool_size=pool,
                    gh_order=gh)  # ep_tol=0: the paper's fixed sweep count
    curve: list[tuple[int, float, float]] = []

    def cb(size, runner):
        if curves and size % 10 == 0:
            h, A = runner.snapshot().predict(Xt)
            m = metrics(softmax_predictive(h, A, None, gh), yt)
            curve.append((size, m["err"], m["lh"]))

    t0, c0 = time.perf_counter(), time.process_time()
    res = run_inference([kern] * 5, X, y, np.zeros(5), s, np.random.default_rng(seed), cb)
    h, A = res.solid.predict(Xt)
    m = metrics(softmax_predictive(h, A, None, gh), yt)
    m.update(time=time.perf_counter() - t0, cpu=time.process_time() - c0,
             min_score=res.min_score, improper=res.n_improper)  # fmt: skip
    return m, curve


def plot_curves(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    for label, c in curves.items():
        c = np.array(c)
        ax[0].plot(c[:, 0], c[:, 1], label=label)
        ax[1].plot(c[:, 0], c[:, 2], label=label)
    ax[0].set(xlabel="active-set size |I|", ylabel="test error")
    ax[1].set(xlabel="active-set size |I|", ylabel="mean test likelihood (lh)")
    ax[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="5:50", help="'paper' or comma list v:w")
    ap.add_argument("--splits", default="0")
    ap.add_argument("--curves", action="store_true")
    ap.add_argument("--learn", action="store_true", help="learned hyper-parameters instead")
    ap.add_argument("--rounds", type=int, default=4, help="--learn: major/minor rounds")
    ap.add_argument("--minor-iter", type=int, default=8, help="--learn: L-BFGS-B its per round")
    ap.add_argument("--fixed-beta", action="store_true", help="--learn: keep beta = 0")
    ap.add_argument("--baseline", action="store_true", help="ivm-baseline, d_max = 150 per class")
    ap.add_argument("--out", default="outputs/ivm_mnist")
    ap.add_argument("--gh", type=int, default=3, help="Gauss-Hermite nodes per axis")
    ap.add_argument("--pool", type=int, default=32, help="candidate pool size |J|")
    ap.add_argument("--jsonl", default=None, help="append one JSON line per run to this file")
    ap.add_argument("--summary", default=None, help="summarise a --jsonl file and exit")
    a = ap.parse_args()
    if a.summary:
        summary(Path(a.summary), Path(a.out))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    splits = parse_splits(a.splits)
    if a.learn:
        learn(splits, a.rounds, a.minor_iter, not a.fixed_beta, a.jsonl)
        return
    if a.baseline:
        baseline(splits, a.grid)
        return
    grid = (
        list(PAPER)
        if a.grid == "paper"
        else [tuple(float(t) for t in g.split(":")) for g in a.grid.split(",")]
    )
    print(f"GH-{a.gh}, |J|={a.pool}")
    print("  v     w  split |   err     lh   minent  maxent |  paper: err     lh   minent  maxent")
    for split_seed in splits:
        split = mnist_even_split(split_seed)
        curves = {}
        for v, w in grid:
            m, curve = run_point(v, w, split, split_seed, a.curves, pool=a.pool, gh=a.gh)
            pv = PAPER.get((v if v % 1 else int(v), int(w)), (np.nan,) * 4)
            print(
                f"{v:4g} {w:5g} {split_seed:5d} | {m['err']:.3f} {m['lh']:.4f} {m['minent']:.4f} "
                f"{m['maxent']:.4f} |        {pv[0]:.3f} {pv[1]:.4f} {pv[2]:.4f} {pv[3]:.4f}"
                f"  ({m['time']:.0f}s, min score {m['min_score']:.2g}, improper {m['improper']})",
                flush=True,
            )
            if curve:
                curves[f"(v,w)=({v:g},{w:g})"] = curve
            if a.jsonl:
                rec = {"v": v, "w": w, "split": split_seed, "gh": a.gh, "pool": a.pool, **m,
                       "curve": curve}  # fmt: skip
                with open(a.jsonl, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
        if curves:
            plot_curves(curves, out / f"curves_split{split_seed}.png")


def parse_splits(text: str) -> list[int]:
    """``"0,3"`` or ``"0-9"``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def summary(path: Path, out: Path) -> None:
    """Table 1 (mean +- sd over splits) beside the paper, and the mean learning curves PNG."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = sorted({(r["v"], r["w"]) for r in recs}, key=lambda k: list(PAPER).index(
        (k[0] if k[0] % 1 else int(k[0]), int(k[1]))) if (k[0] if k[0] % 1 else int(k[0]),
        int(k[1])) in PAPER else 99)  # fmt: skip
    print("  v     w  #splits |  err (mean+-sd)     lh      minent  maxent |"
          "  paper: err     lh   minent  maxent")  # fmt: skip
    curves = {}
    for v, w in keys:
        rs = [r for r in recs if (r["v"], r["w"]) == (v, w)]
        col = {k: np.array([r[k] for r in rs]) for k in ("err", "lh", "minent", "maxent", "cpu")}
        pv = PAPER.get((v if v % 1 else int(v), int(w)), (np.nan,) * 4)
        sd = col["err"].std(ddof=1) if len(rs) > 1 else 0.0
        ids = sorted(r["split"] for r in rs)
        print(
            f"{v:4g} {w:5g} {len(rs):7d} | {col['err'].mean():.4f}+-{sd:.4f} "
            f"{col['lh'].mean():.4f} {col['minent'].mean():.4f} {col['maxent'].mean():.4f} |"
            f"        {pv[0]:.3f} {pv[1]:.4f} {pv[2]:.4f} {pv[3]:.4f}"
            f"  (cpu {col['cpu'].mean():.0f}s/run, splits {ids})"
        )
        with_curve = [np.array(r["curve"]) for r in rs if r.get("curve")]
        if with_curve:
            curves[f"(v,w)=({v:g},{w:g}), mean of {len(with_curve)} splits"] = np.mean(
                with_curve, axis=0
            )
    if curves:
        plot_curves(curves, out / "curves_mean.png")
        print(f"learning curves: {out / 'curves_mean.png'}")


def baseline(splits: list[int], grid: str) -> None:
    """The independent-process baseline (spec §4) at the given (v, w), d_max = 150 per class."""
    from gpinfer_ivm.baseline import run_baseline

    for split_seed in splits:
        X, y, Xt, yt = mnist_even_split(split_seed)
        for g in grid.split(","):
            v, w = (float(t) for t in g.split(":"))
            t0 = time.perf_counter()
            rep = run_baseline([kernel_vw(v, w)] * 5, X, y, np.zeros(5), 150,
                               np.random.default_rng(split_seed), order=3)  # fmt: skip
            h, A = rep.predict(Xt)
            m = metrics(softmax_predictive(h, A, None, 3), yt)
            sizes = [rep.size(c) for c in range(5)]
            print(f"baseline ({v:g},{w:g}) split {split_seed}: err {m['err']:.3f} lh {m['lh']:.4f}"
                  f" minent {m['minent']:.4f} maxent {m['maxent']:.4f} sizes {sizes} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)  # fmt: skip


def learn(
    splits: list[int], rounds: int, minor_iter: int, learn_beta: bool, jsonl: str | None
) -> None:
    """Learned hyper-parameters (spec §3.5) from the grid point (v, w) = (5, 50), beta = 0.

    Prints every major step (G, v, w, lengthscale, beta) and the final test metrics; one JSON
    line per split (with the trajectory) is appended to ``jsonl``.
    """
    from gpinfer.estimator import GPClassifier

    p = 784
    for split_seed in splits:
        X, y, Xt, yt = mnist_even_split(split_seed)
        opts = {"L": 25, "ep_sweeps": 3, "ep_tol": 0.0, "gh_order": 3, "rule": "product",
                "pool_size": 32,
                "rounds": rounds,
                "minor_iter": minor_iter, "learn_intercepts": learn_beta}  # fmt: skip
        t0, c0 = time.perf_counter(), time.process_time()
        est = GPClassifier(method="ivm", M=150, kernel=kernel_vw(5.0, 50.0), optimize=True,
                           random_state=split_seed, method_options=opts)  # fmt: skip
        path: list[dict[str, float]] = []

        def show(info, t0=t0, path=path, split_seed=split_seed):
            e = info.extra
            if "G_major" not in e:
                return
            ell = float(np.exp(e["hyper.kernel.lengthscale"]))
            v = float(np.exp(e["hyper.kernel.variance"]))
            beta = [round(e[f"beta.{c}"], 3) for c in range(5)]
            path.append({"G": e["G_major"], "v": v, "w": p / ell**2, "ell": ell, "beta": beta})
            print(f"  split {split_seed} major {e['round']:.0f}: G {e['G_major']:.2f}  v {v:.3g}"
                  f" w {p / ell**2:.3g} (ell {ell:.3g}) beta {beta}"
                  f"  ({time.perf_counter() - t0:.0f}s)", flush=True)  # fmt: skip

        est.fit(X, y, callback=show)
        m = metrics(est.predict_proba(Xt), yt)
        k = est.fit_result_.kernel
        v, ell = float(k.variance), float(k.lengthscale)
        beta = est.fit_result_.state["beta"].round(3).tolist()
        cpu = time.process_time() - c0
        print(
            f"learned split {split_seed}: err {m['err']:.3f} lh {m['lh']:.4f} minent "
            f"{m['minent']:.4f} maxent {m['maxent']:.4f}  v {v:.3g} w {p / ell**2:.3g} "
            f"(ell {ell:.3g}) beta {beta} G {-est.log_evidence_:.2f} "
            f"({time.perf_counter() - t0:.0f}s wall, {cpu:.0f}s cpu)",
            flush=True,
        )
        if jsonl:
            rec = {"split": split_seed, "rounds": rounds, "minor_iter": minor_iter,
                   "learn_beta": learn_beta, **m, "v": v, "w": p / ell**2, "ell": ell,
                   "beta": beta, "G": -est.log_evidence_, "cpu": cpu, "path": path}  # fmt: skip
            with open(jsonl, "a") as fh:
                fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()

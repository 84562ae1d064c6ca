"""SEP vs EP: peak memory and time per mini-batch as N grows (streamed synthetic data).

A 2-D, 3-class problem is generated batch by batch (never held in memory): ``x ~ N(0, I)``,
``y = argmax_c f_c(x) + noise`` with fixed random Fourier features ``f_c``. For each ``N`` the
method's state is sized for ``N`` points (SEP: tied sites, ``O(C M^2)``; EP: one rank-one site
per factor and role with its direction, ``O(N M C)``) and ``--batches`` mini-batches of size
``S`` are processed exactly as in training (site update, ``N/S``-scaled gradient, kernel VJP,
Adam step). Peak memory is the tracemalloc peak of the state plus the loop (numpy allocations
are traced); the data stream itself holds one batch.

    nice .venv/bin/python benchmarks/sep_memory_scaling.py --sizes 1e4,1e5,1e6
Writes outputs/sep_memory_scaling.png and .json.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
from gpinfer_ep.model import all_terms
from gpinfer_ep.state import RankOneSites, TiedSites
from threadpoolctl import threadpool_limits

from gpinfer.hyper import HyperParameters
from gpinfer.kernels import RBF, White
from gpinfer.kernels.combination import Sum
from gpinfer.optim.adam import Adam

ROOT = Path(__file__).resolve().parent.parent
C, D = 3, 2
W = np.random.default_rng(123).standard_normal((C, 20, D))
B = np.random.default_rng(124).uniform(0, 2 * np.pi, (C, 20))


def batch(b: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``b`` of the stream: ``X [S, 2]``, ``y [S]`` (deterministic in ``b``)."""
    rng = np.random.default_rng(10_000 + b)
    X = rng.standard_normal((S, D))
    f = np.cos(np.einsum("nd,cfd->ncf", X, W) + B[None]).sum(axis=2)
    return X, np.argmax(f + 0.3 * rng.standard_normal(f.shape), axis=1)


def labels(N: int, S: int) -> np.ndarray:
    return np.concatenate([batch(b, S)[1] for b in range(-(-N // S))])[:N]


def measure(method: str, N: int, M: int, S: int, n_batches: int) -> dict:
    kernels = [Sum([RBF(lengthscale=[1.0, 1.0]), White(1.0)]) for _ in range(C)]
    Zs = [batch(-1 - c, M)[0] for c in range(C)]
    hp = HyperParameters(kernels, Z=Zs)
    opt = Adam(learning_rate=1e-3)
    theta = hp.pack()
    # class counts of the whole stream are needed by SEP's tied update (n_c); estimated from
    # the first batches for N beyond what we label here (only the counts enter the state)
    tracemalloc.start()
    t_setup = time.perf_counter()
    if method == "sep":
        frac = np.bincount(labels(min(N, 20 * S), S), minlength=C) / min(N, 20 * S)
        counts = frac * N
        n_fac = (N - counts) + (C - 1) * counts
        state = TiedSites(np.zeros(S, dtype=np.int64), C, M, n_factors=n_fac)
    else:
        state = RankOneSites(labels(N, S), C, M)
    setup_s = time.perf_counter() - t_setup
    times = []
    for b in range(n_batches):
        X, y = batch(b, S)
        t0 = time.perf_counter()
        idx = np.arange(b * S, (b + 1) * S) if method == "ep" else np.arange(S)
        if method == "sep":
            state.y = y
        terms = all_terms(kernels, hp.Z, X)
        state.update(terms, idx, 1.0)
        _, grads = state.evaluate(terms, idx, N / S)
        theta = opt.step(theta, hp.gradient(X, grads))
        hp.unpack(theta)
        times.append(time.perf_counter() - t0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"method": method, "N": N, "M": M, "S": S, "batches": n_batches,
            "time_per_batch_s": float(np.median(times)), "peak_mb": peak / 2**20,
            "setup_s": setup_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e4,1e5,1e6")
    ap.add_argument("--M", type=int, default=20)
    ap.add_argument("--S", type=int, default=200)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--plot-only", action="store_true", help="re-plot the saved JSON")
    args = ap.parse_args()
    sizes = [] if args.plot_only else [int(float(s)) for s in args.sizes.split(",")]
    out = ROOT / "outputs"
    rows = json.loads((out / "sep_memory_scaling.json").read_text()) if args.plot_only else []
    with threadpool_limits(limits=1):
        for N in sizes:
            for method in ("sep", "ep"):
                row = measure(method, N, args.M, args.S, args.batches)
                rows.append(row)
                print(f"{method:>3} N={N:>8}: {row['time_per_batch_s'] * 1e3:7.1f} ms/batch, "
                      f"peak {row['peak_mb']:8.1f} MB (setup {row['setup_s']:.1f} s)", flush=True)
    out.mkdir(exist_ok=True)
    if not args.plot_only:
        (out / "sep_memory_scaling.json").write_text(json.dumps(rows, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for method, style in (("sep", "o-"), ("ep", "s--")):
        r = [x for x in rows if x["method"] == method]
        axes[0].loglog([x["N"] for x in r], [x["peak_mb"] for x in r], style, label=method)
        axes[1].semilogx([x["N"] for x in r], [1e3 * x["time_per_batch_s"] for x in r], style,
                         label=method)
    axes[0].set(xlabel="N (training points)", ylabel="peak memory [MB]",
                title=f"memory (M={rows[0]['M']}, C={C}, S={rows[0]['S']})")
    axes[1].set(xlabel="N (training points)", ylabel="time per mini-batch [ms]",
                title="time per mini-batch", ylim=(0, None))
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sep_memory_scaling.png", dpi=120)
    print(f"wrote {out / 'sep_memory_scaling.png'}")


if __name__ == "__main__":
    main()

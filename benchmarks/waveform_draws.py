"""How much of the Table 2 waveform result is the data draw? (spec ep-sep §5.1, P19)

The paper's waveform set is one unpublished draw of 1000 points from Breiman's generator; ours
is the draw with generator seed 0. This runs one method of the Table 2 protocol (unstratified
splits, standardisation, and ``sep_table2.fit_and_score`` for the kernel, M rounding, 250 batch
iterations and scoring) on several draws and prints, per draw, the mean test NLL and error over
the splits, then the spread of those means across draws next to the split-to-split standard
error the table reports.

    nice .venv/bin/python benchmarks/waveform_draws.py --draws 0-9 --seeds 1-5 --method ep
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sep_table2 import fit_and_score, seed_range
from threadpoolctl import threadpool_limits

from gpinfer.data import Standardizer, load_dataset, train_test_split

ROOT = Path(__file__).resolve().parent.parent


def run(draw: int, seed: int, method: str, frac: float, iterations: int) -> dict:
    ds = load_dataset("waveform", n=1000, seed=draw)
    sp = train_test_split(ds, test_fraction=0.7, seed=seed, stratify=False)
    st = Standardizer().fit(sp.X_train)
    row = fit_and_score(method, st.transform(sp.X_train), sp.y_train, st.transform(sp.X_test),
                        sp.y_test, frac, seed, iterations)
    return {"draw": draw, "seed": seed, "method": method, "M_frac": frac, **row}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", default="0-9")
    ap.add_argument("--seeds", default="1-5")
    ap.add_argument("--method", default="ep")
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--iterations", type=int, default=250)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "waveform_draws.jsonl")
    args = ap.parse_args()
    rows = []
    with threadpool_limits(limits=1):
        for draw in seed_range(args.draws):
            for seed in seed_range(args.seeds):
                row = run(draw, seed, args.method, args.fraction, args.iterations)
                rows.append(row)
                with args.out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
    draws = sorted({r["draw"] for r in rows})
    nll = np.array([[r["test_nll"] for r in rows if r["draw"] == d] for d in draws])
    err = np.array([[r["test_error"] for r in rows if r["draw"] == d] for d in draws])
    for d, n, e in zip(draws, nll, err):
        print(f"draw {d}: test NLL {n.mean():.3f} ± {n.std(ddof=1) / np.sqrt(n.size):.3f}, "
              f"error {e.mean():.3f}")
    means = nll.mean(axis=1)
    split_se = np.mean(nll.std(axis=1, ddof=1)) / np.sqrt(nll.shape[1])
    print(f"{args.method}, M = {args.fraction:.0%}: across {len(draws)} draws the mean test NLL "
          f"is {means.mean():.3f}, ranging {means.min():.3f}-{means.max():.3f} (sd "
          f"{means.std(ddof=1):.3f}); the split-to-split s.e. within a draw is {split_se:.3f}")


if __name__ == "__main__":
    main()

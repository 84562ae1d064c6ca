"""Bui et al. (2017) binary classification (spec power-ep §6.3), full or reduced protocol.

For every data set, split, M and alpha: a stratified random 90/10 split (seed = split), inputs
standardised with the training part, ARD squared exponential with the median-heuristic
lengthscales, Z by k-means++, the stochastic PEP variant (``batch`` points per mini-batch,
``n_sweeps`` damped parallel sweeps with the power step, one Adam step), ``epochs`` passes.
Prints test error / NLL per alpha, pairwise win fractions (alpha 0.5 vs VFE vs EP), writes
``rows.json`` and a PNG of each metric against alpha per M, and logs them to MLflow.

The full protocol is ``--splits 20 --M 10 20 50 100 --epochs 200 --n-sweeps 10 --lr 1e-3``
(the Hydra experiment ``conf/experiment/bui2017_classification.yaml`` runs the same grid run by
run); the defaults below are a reduced version.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from pep_common import (
    ALPHAS,
    add_run_arguments,
    alpha_metrics,
    append_row,
    label,
    pairwise_text,
    per_dataset_text,
    plot_metric_vs_alpha,
    publish,
    resume,
    save_rows,
    summary_rows,
    summary_table,
)
from threadpoolctl import threadpool_limits

from gpinfer import GPClassifier
from gpinfer.data import Standardizer, load_dataset, train_test_split
from gpinfer.kernels import make_kernel
from gpinfer.metrics import error_rate, nll

DATASETS = {"australian": {}, "crabs": {"features": [0, 2, 3, 4, 5, 6]}, "ionosphere": {},
            "sonar": {}}


def run_one(name: str, split: int, M: int, alpha: float, args) -> dict:
    ds = load_dataset(name, **DATASETS[name])
    sp = train_test_split(ds, test_fraction=0.1, seed=split, stratify=True)
    scaler = Standardizer().fit(sp.X_train)
    Xtr, Xte = scaler.transform(sp.X_train), scaler.transform(sp.X_test)
    M = min(M, Xtr.shape[0])
    est = GPClassifier(
        method="pep", M=M, kernel=make_kernel("rbf", input_dim=Xtr.shape[1], ard=True),
        likelihood="probit", batch_size=min(args.batch, Xtr.shape[0]), random_state=split,
        method_options={"alpha": alpha, "n_sweeps": args.n_sweeps, "epochs": args.epochs,
                        "learning_rate": args.lr, "init_lengthscale": "median",
                        "quadrature": args.quadrature, "tol": 1e-6},
    )
    t, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        est.fit(Xtr, sp.y_train)
    P = est.predict_proba(Xte)
    y_index = np.searchsorted(est.classes_, sp.y_test)
    return {"dataset": name, "split": split, "M": M, "alpha": alpha,
            "error": float(error_rate(y_index, P)), "nll": float(nll(y_index, P)),
            "nlml": -float(est.log_evidence_), "time_s": time.perf_counter() - t,
            "cpu_s": time.process_time() - cpu,
            "n_pos_train": int(np.sum(sp.y_train == est.classes_[1])),
            "n_train": int(Xtr.shape[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--splits", type=int, default=3)
    parser.add_argument("--first-split", type=int, default=1,
                        help="start at this split (a second worker can take the upper half)")
    parser.add_argument("--M", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS))
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--n-sweeps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--quadrature", default="trapezoid")
    add_run_arguments(parser, "bui2017_classification")
    args = parser.parse_args()
    rows_file, rows, done = resume(args.out)
    with threadpool_limits(1):
        for split in range(args.first_split, args.splits + 1) if not args.summarise else ():
            for name in args.datasets:
                for M in args.M:
                    for alpha in args.alphas:
                        if (name, split, M, float(alpha)) in done:
                            continue
                        r = run_one(name, split, M, alpha, args)
                        append_row(r, rows_file)
                        rows.append(r)
                        print(f"{name:10s} split={split} M={r['M']:3d} alpha={label(alpha):>4s} "
                              f"error={r['error']:.3f} nll={r['nll']:.3f} "
                              f"({r['time_s']:.1f} s, cpu {r['cpu_s']:.1f} s)", flush=True)
    rows = summary_rows(rows, args.merge, args.alphas)
    metrics = ("error", "nll")
    splits = sorted({r["split"] for r in rows})
    protocol = (f"datasets={args.datasets} splits={len(splits)} (of {args.splits}) M={args.M} "
                f"epochs={args.epochs} n_sweeps={args.n_sweeps} batch={args.batch} lr={args.lr}"
                + (f" + merged {[str(p) for p in args.merge]}" if args.merge else ""))
    cpu = sum(r.get("cpu_s", 0.0) for r in rows)
    text = "\n".join([protocol, f"{len(rows)} fits, {cpu / 60:.1f} CPU-min",
                      summary_table(rows, metrics), pairwise_text(rows, metrics),
                      per_dataset_text(rows, metrics)])
    save_rows(rows, args.out / "rows.json")
    png = plot_metric_vs_alpha(rows, metrics, args.out / "bui2017_classification.png",
                               f"PEP classification, mean over data sets ({protocol})")
    png_sets = plot_metric_vs_alpha(rows, metrics,
                                    args.out / "bui2017_classification_per_dataset.png",
                                    f"PEP classification per data set ({protocol})",
                                    per_dataset=True)
    publish(text, args.out, "bui2017_classification", vars(args) | {"protocol": protocol},
            alpha_metrics(rows, metrics, args.alphas, metrics), [png, png_sets],
            args.tracking_uri)


if __name__ == "__main__":
    main()

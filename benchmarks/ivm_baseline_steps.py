"""CPU seconds of ``ivm-baseline`` per major step (one greedy selection, spec ivm §4.4) on
scikit-learn's data sets at the defaults (issue 27).

    OMP_NUM_THREADS=1 python benchmarks/ivm_baseline_steps.py [--sets digits] [--M 35]

One line per major step (``run_baseline`` call): its CPU seconds (``time.process_time``, less
affected by other processes than the wall clock), the number of inclusions, the kernel's
hyper-parameters it ran at and the quadrature grid size ``T`` of its tilted-moment cache; then
one line per fit: held-out accuracy and NLL, wall and CPU seconds and the 1-minute load
average. The data: ``gpinfer.testing.default_battery.sklearn_case`` (digits: the 500-point,
10-class subset), unscaled, multi-class. ``--M``: the budget ``d_max`` per class (default: the
method's).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gpinfer_ivm.baseline as baseline  # noqa: E402
import gpinfer_ivm.method as method  # noqa: E402
import numpy as np  # noqa: E402
from gpinfer_ivm.diagonal_softmax import DiagonalTiltedCache  # noqa: E402

from gpinfer.estimator import GPClassifier  # noqa: E402
from gpinfer.testing.default_battery import SKLEARN_SETS, sklearn_case  # noqa: E402


def _timed_selection() -> None:
    """Wrap ``run_baseline`` (as ``method`` calls it) to print each major step's cost."""
    run = baseline.run_baseline
    grids: list[int] = []
    rebuild = DiagonalTiltedCache._rebuild

    def counting_rebuild(self: DiagonalTiltedCache, m: np.ndarray, sd: np.ndarray) -> None:
        rebuild(self, m, sd)
        grids.append(self.T)

    DiagonalTiltedCache._rebuild = counting_rebuild  # type: ignore[method-assign]
    step = [0]

    def timed(kernels, X, *args, **kwargs):  # type: ignore[no-untyped-def]
        grids.clear()
        cpu = time.process_time()
        rep = run(kernels, X, *args, **kwargs)
        cpu = time.process_time() - cpu
        size = sum(rep.size(c) for c in range(rep.C))
        hyper = ", ".join(f"{k} {v:.4g}" for k, v in kernels[0].describe().items()
                          if isinstance(v, float))
        print(f"  major step {step[0]}: {cpu:6.2f} s CPU, {size} inclusions, {hyper}, "
              f"T {grids}", flush=True)
        step[0] += 1
        return rep

    method.run_baseline = timed  # type: ignore[assignment]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="digits", help=f"comma-separated, of {SKLEARN_SETS}")
    ap.add_argument("--M", type=int, default=None, help="budget d_max per class")
    args = ap.parse_args()
    _timed_selection()
    for name in args.sets.split(","):
        X, y, Xt, yt = sklearn_case(name, True)
        print(f"{name}: n {len(y)}, C {int(y.max()) + 1}", flush=True)
        params = {} if args.M is None else {"M": args.M}
        wall, cpu = time.perf_counter(), time.process_time()
        est = GPClassifier(method="ivm-baseline", random_state=0, **params).fit(X, y)
        P = est.predict_proba(Xt)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        p = np.clip(P[np.arange(len(yt)), np.searchsorted(est.classes_, yt)], 1e-300, None)
        acc = float(np.mean(est.classes_[np.argmax(P, axis=1)] == yt))
        print(f"{name}: accuracy {acc:.4f}, NLL {float(-np.mean(np.log(p))):.4f}, "
              f"{wall:.1f} s wall, {cpu:.1f} s CPU, load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()

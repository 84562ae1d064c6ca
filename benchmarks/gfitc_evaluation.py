"""gfitc's cost per L-BFGS-B evaluation, and the same fits before and after a change (issue 27).

Fits gfitc at its defaults on scikit-learn's iris, wine, breast_cancer, digits (500 points) and
make_moons(1000) as shipped (``gpinfer.testing.default_battery.sklearn_case``, multi-class),
one after the other in this process, and prints per set the CPU seconds of the fit, the number
of objective evaluations, the EP sweeps per evaluation, the CPU seconds of ``predict_proba`` on
the held-out points and the 1-min load average. ``save``
stores the held-out probabilities; ``compare`` prints their max relative difference from the
stored ones (issue 27 asks for ~1e-10).

    # on the commit before the change (a `git archive` of it on PYTHONPATH):
    PYTHONPATH=OLD:OLD/plugins/gpinfer-ep OPENBLAS_NUM_THREADS=1 \
        .venv/bin/python benchmarks/gfitc_evaluation.py save /tmp/gfitc_ref.npz
    # on the change:
    .venv/bin/python benchmarks/gfitc_evaluation.py compare /tmp/gfitc_ref.npz
    # options: --sets iris,wine (default: all five)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gpinfer_ep.gfitc import FITCSites  # noqa: E402

from gpinfer.estimator import GPClassifier  # noqa: E402
from gpinfer.testing.default_battery import SKLEARN_SETS, sklearn_case  # noqa: E402


def _counting_run() -> dict[str, int]:
    """Wrap ``FITCSites.run`` to count evaluations and sweeps; returns the live counters."""
    counts = {"evaluations": 0, "sweeps": 0}
    run = FITCSites.run

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        sweeps = run(self, *args, **kwargs)
        counts["evaluations"] += 1
        counts["sweeps"] += sweeps
        return sweeps

    FITCSites.run = counted  # type: ignore[method-assign]
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("save", "compare", "time"))
    ap.add_argument("path", nargs="?")
    ap.add_argument("--sets", default=",".join(SKLEARN_SETS))
    args = ap.parse_args(argv)
    counts = _counting_run()
    probs: dict[str, np.ndarray] = {}
    for name in args.sets.split(","):
        X, y, Xt, _ = sklearn_case(name, True)
        counts.update(evaluations=0, sweeps=0)
        cpu = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = GPClassifier(method="gfitc", random_state=0).fit(X, y)
        cpu = time.process_time() - cpu
        predict = time.process_time()
        probs[name] = est.predict_proba(Xt)
        predict = time.process_time() - predict
        ev = max(counts["evaluations"], 1)
        print(f"{name:14s} fit cpu {cpu:7.2f} s  predict cpu {predict:6.2f} s  "
              f"iterations {est.n_iter_:4d}  evaluations "
              f"{counts['evaluations']:4d}  sweeps/evaluation {counts['sweeps'] / ev:6.1f}  "
              f"cpu/evaluation {cpu / ev:.3f} s  load {os.getloadavg()[0]:.2f}", flush=True)
    if args.mode == "save":
        np.savez(args.path, **probs)
    elif args.mode == "compare":
        ref = np.load(args.path)
        worst = 0.0
        for name, P in probs.items():
            rel = float(np.max(np.abs(P - ref[name]) / np.abs(ref[name])))
            worst = max(worst, rel)
            print(f"{name:14s} max rel diff of the probabilities {rel:.3e}")
        print(f"WORST {worst:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

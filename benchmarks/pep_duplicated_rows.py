"""Power EP on duplicated rows (issue 27A): prints CPU seconds and site sweeps, no assertions.

30 distinct 2-D rows, each given twice, ``M = 50`` (so every distinct row is an inducing
input), probit, every other default, for vfe, fitc and pep (alpha 0.5) and data seeds
``--seeds``. One line per fit: CPU seconds (``time.process_time``, less affected by other
load than wall time), L-BFGS-B iterations, site sweeps in all and in the worst iteration, the
evaluations that stopped at ``max_sweeps`` unconverged, the training accuracy.

Usage: ``python benchmarks/pep_duplicated_rows.py [--seeds 0 8] [--methods vfe fitc pep]``.
Seed 8 is the case of the issue: vfe's sites oscillated at the kernel variances L-BFGS-B tried.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from gpinfer.estimator import GPClassifier  # noqa: E402


def duplicated_rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``X [60, 2]``, ``y [60]``: 30 distinct rows, each twice."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(30, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=30) > 0).astype(int)
    return np.vstack([X, X]), np.tile(y, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 8])
    ap.add_argument("--methods", nargs="*", default=["vfe", "fitc", "pep"])
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for seed in args.seeds:
        X, y = duplicated_rows(seed)
        for method in args.methods:
            start = time.process_time()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                est = GPClassifier(method=method, M=50, random_state=0).fit(X, y)
            cpu = time.process_time() - start
            sweeps = [h["sweeps"] for h in est.history_]
            stuck = sum("did not converge" in str(w.message) for w in caught)
            print(f"seed {seed} {method:5s} cpu {cpu:6.2f} s  iterations {len(sweeps):3d}  "
                  f"sweeps {int(sum(sweeps)):6d} (worst iteration {int(max(sweeps)):5d})  "
                  f"unconverged evaluations {stuck:3d}  "
                  f"training accuracy {np.mean(est.predict(X) == y):.3f}", flush=True)


if __name__ == "__main__":
    main()

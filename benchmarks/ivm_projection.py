"""The restricted ADF projection of ivm (issue 27): Newton (default) against scipy's L-BFGS-B.

Two measurements, both in process-CPU seconds (less affected by a busy machine than wall time),
interleaved so that the load falls on both alike:

* ``sites``: the cold projections of ``--cases`` generated marginals (C = 2..6, scales 0.1-20,
  from ``initial_t``): CPU per projection, the largest difference of the site precision ``Pi``
  where neither method runs a component past 1e4, and how often Newton's ``f`` is not above
  L-BFGS-B's;
* ``fit``: one conditional inference of ``ivm`` (fixed hyper-parameters) on iris as shipped
  (70 % split, as in ``default_battery.py sklearn``), per algorithm: CPU seconds, held-out
  accuracy and NLL.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/ivm_projection.py [--cases 300] [--no-fit]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gpinfer_ivm.gaussian_cubature import softmax_tilted  # noqa: E402
from gpinfer_ivm.projection import (  # noqa: E402
    initial_t,
    objective,
    project_direct,
    project_newton,
    site_precision,
)


def _case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    C = int(rng.integers(2, 7))
    y = int(rng.integers(C))
    Z = rng.standard_normal((C, C))
    A = (Z @ Z.T / C + 0.3 * np.eye(C)) * rng.uniform(0.1, 20)
    h = rng.standard_normal(C) * rng.uniform(0, 3)
    T = softmax_tilted(np.array([y]), h[None], A[None], order=5 if C < 6 else 3)
    return A, T.A_hat[0], y


def sites(n: int) -> None:
    rng = np.random.default_rng(0)
    cpu = {"newton": 0.0, "direct": 0.0}
    worst, not_above, compared = 0.0, 0, 0
    for _ in range(n):
        A, Ah, y = _case(rng)
        t0 = initial_t(y, np.full(A.shape[0], 1.0 / A.shape[0]))
        out = {}
        for name, fn in (("direct", project_direct), ("newton", project_newton)):
            start = time.process_time()
            out[name] = fn(A, Ah, t0)
            cpu[name] += time.process_time() - start
        fd, fn_ = objective(out["direct"], A, Ah)[0], objective(out["newton"], A, Ah)[0]
        not_above += fn_ <= fd + 1e-11 * (1 + abs(fd))
        if max(np.exp(out["direct"]).max(), np.exp(out["newton"]).max()) <= 1e4:
            compared += 1
            Pd, Pn = site_precision(np.exp(out["direct"])), site_precision(np.exp(out["newton"]))
            worst = max(worst, float(np.max(np.abs(Pn - Pd)) / np.max(np.abs(Pd))))
    print(f"sites: {n} cold projections; CPU per projection: L-BFGS-B "
          f"{1e3 * cpu['direct'] / n:.3f} ms, Newton {1e3 * cpu['newton'] / n:.3f} ms "
          f"(ratio {cpu['direct'] / cpu['newton']:.1f}); "
          f"Newton f <= L-BFGS-B f in {not_above}/{n}; "
          f"largest relative |Pi difference| over {compared} interior cases {worst:.2e}")


def fit() -> None:
    from gpinfer.estimator import GPClassifier
    from gpinfer.testing.default_battery import sklearn_case

    X, y, Xt, yt = sklearn_case("iris", True)
    for name in ("direct", "newton"):
        start = time.process_time()
        est = GPClassifier(method="ivm", optimize=False, random_state=0,
                           method_options={"projection": name}).fit(X, y)  # fmt: skip
        P = est.predict_proba(Xt)
        sec = time.process_time() - start
        nll = float(-np.mean(np.log(P[np.arange(len(yt)), yt])))
        acc = float(np.mean(P.argmax(1) == yt))
        print(f"fit: ivm iris, fixed hyper-parameters, projection={name}: CPU {sec:.1f} s, "
              f"accuracy {acc:.3f}, NLL {nll:.4f}; load {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--no-fit", action="store_true")
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}")
    sites(args.cases)
    if not args.no_fit:
        fit()


if __name__ == "__main__":
    main()

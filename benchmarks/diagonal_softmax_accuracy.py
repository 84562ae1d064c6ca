"""Accuracy and cost of ``gpinfer_ivm.diagonal_softmax`` over marginal variances (issue 27).

    OPENBLAS_NUM_THREADS=1 python benchmarks/diagonal_softmax_accuracy.py [--old]

Accuracy: ``diagonal_softmax_tilted`` at the defaults against the independent reference of
``plugins/gpinfer-ivm/tests/test_ivm_diagonal_softmax.py`` (Gauss-Legendre panels in the Gumbel
variable), 3 points per
variance scale ``v`` and ``C`` in 2, 5, 20 (means uniform on [-50, 50], ``C = 20``: N(0, 25);
variances within a factor 2 of ``v``): the largest error in ``log Z``, in the tilted means in
standard deviations and in the variances relative, and both absolute. Cost: CPU seconds of a
fresh call and of one ``DiagonalTiltedCache`` column update at ``B = 200``, ``C = 10``.
``--old``: Gauss-Hermite in ``x`` at every variance (``WIDE_SD = inf``, the former rule).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
from gpinfer_ivm import diagonal_softmax as ds
from timing import best_of

VARIANCES = (1e-4, 1e-2, 1.0, 2.0, 2.5, 5.0, 10.0, 50.0, 200.0, 1e3, 1e4)


def _reference():
    path = (Path(__file__).resolve().parents[1] / "plugins" / "gpinfer-ivm" / "tests"
            / "test_ivm_diagonal_softmax.py")
    spec = importlib.util.spec_from_file_location("_diag_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._reference_tilted


def accuracy() -> None:
    reference = _reference()
    rng = np.random.default_rng(0)
    for v in VARIANCES:
        for C in (2, 5, 20):
            h = rng.uniform(-50, 50, (3, C)) if C < 20 else rng.normal(scale=5, size=(3, C))
            a = v * rng.uniform(0.5, 1.0, (3, C))
            y = rng.integers(C, size=3)
            ref = reference(y, h, a)
            got = ds.diagonal_softmax_tilted(y, h, a)
            print(f"v={v:g} C={C}: log_z {np.max(np.abs(got.log_z - ref[0])):.1e}"
                  f"  h_hat/sd {np.max(np.abs(got.h_hat - ref[1]) / np.sqrt(a)):.1e}"
                  f"  a_hat/a {np.max(np.abs(got.a_hat - ref[2]) / a):.1e}"
                  f"  (abs {np.max(np.abs(got.h_hat - ref[1])):.1e},"
                  f" {np.max(np.abs(got.a_hat - ref[2])):.1e})", flush=True)


def _cpu(f, repeats: int = 3) -> float:
    return best_of(f, repeats)


def cost() -> None:
    rng = np.random.default_rng(0)
    B, C = 200, 10
    for v in (0.5, 2.0, 10.0, 50.0, 300.0, 1e4):
        h, a = rng.normal(size=(B, C)), v * rng.uniform(0.5, 1.0, (B, C))
        y = rng.integers(C, size=B)
        fresh = _cpu(lambda: ds.diagonal_softmax_tilted(y, h, a))  # noqa: B023
        cache = ds.DiagonalTiltedCache(y)
        cache(h, a)

        def update() -> None:
            for c in range(C):
                a[:, c] *= 0.999  # noqa: B023
                cache(h, a)  # noqa: B023

        print(f"v={v:g} B={B} C={C}: fresh {1e3 * fresh:.1f} ms CPU, cache column update "
              f"{1e3 * _cpu(update) / C:.1f} ms CPU", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", action="store_true", help="Gauss-Hermite at every variance")
    if parser.parse_args().old:
        ds.WIDE_SD = np.inf
    accuracy()
    cost()

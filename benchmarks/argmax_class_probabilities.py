"""CPU milliseconds of ``argmax_class_probabilities`` (sep/ep ``predict_proba``), one thread.

Cases (synthetic, seeded):

* ``waveform``: ``B = 700, C = 3``, means ``N(0, 1.5^2)``, variances log-uniform in
  ``[0.18, 1.3]`` (the spread of what a default ``gpinfer-run``, sep on waveform, passes it at
  its evaluations: 700 test points, variances 0.18..1.26);
* ``C10``: ``B = 500, C = 10``, the same spread;
* ``wide``: ``B = 300, C = 5``, variances log-uniform over six decades (refined levels).

Process-CPU milliseconds, best of ``--repeats``; the load average is printed with them.

Measured (s33, load 1.3-1.4, best of 10): main at d3e4512 -> this branch: waveform 75 -> 38 ms,
C10 473 -> 227 ms, wide 495 -> 444 ms. In a default run (``benchmarks/run_phases.py``, load
1.6-1.7, two runs each): "fit: its evaluations" 0.41-0.44 -> 0.23-0.24 CPU s.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/argmax_class_probabilities.py
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from threadpoolctl import threadpool_limits
from timing import best_of

from gpinfer.likelihoods.multiclass import argmax_class_probabilities


def _case(seed: int, B: int, C: int, log_var_range: tuple[float, float]
          ) -> tuple[np.ndarray, np.ndarray]:
    """Means ``[B, C]`` ``N(0, 1.5^2)``, variances ``[B, C]`` log-uniform over the range."""
    rng = np.random.default_rng(seed)
    mean = 1.5 * rng.normal(size=(B, C))
    var = np.exp(rng.uniform(*log_var_range, size=(B, C)))
    return mean, var


CASES = {
    "waveform": (700, 3, (np.log(0.18), np.log(1.3))),
    "C10": (500, 10, (np.log(0.18), np.log(1.3))),
    "wide": (300, 5, (-3.0 * np.log(10.0), 3.0 * np.log(10.0))),
}


def best_cpu_ms(mean: np.ndarray, var: np.ndarray, repeats: int) -> float:
    """Best process-CPU milliseconds of one call over ``repeats`` calls."""
    return 1e3 * best_of(lambda: argmax_class_probabilities(mean, var), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    out: dict[str, object] = {}
    with threadpool_limits(1):
        for seed, (name, (B, C, log_var_range)) in enumerate(CASES.items()):
            mean, var = _case(seed, B, C, log_var_range)
            out[name] = round(best_cpu_ms(mean, var, args.repeats), 2)
    out["load"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()

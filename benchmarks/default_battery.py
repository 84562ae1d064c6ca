"""The default-fit battery of issue 27, as a table: every registered method at its defaults.

    python benchmarks/default_battery.py battery [--max-iter 20] [--timeout 120] [METHOD ...]
    python benchmarks/default_battery.py sklearn [--timeout 60] [--sets iris,wine] [METHOD ...]
    python benchmarks/default_battery.py sklearn kl --sets moons --timeout 300  # kl, moons-1000

``battery``: the ill-scaled transforms of ``gpinfer.testing.default_battery`` (what
``tests/test_default_battery.py`` asserts in CI). ``sklearn``: scikit-learn's iris, wine,
breast_cancer, digits (500 points) and make_moons(1000) as shipped, unscaled, every default
(no ``max_iter``), multi-class where the method is, else two classes. Each fit runs in its own
process, stopped after ``--timeout`` seconds (reported as ``TIMEOUT``). One line per fit:
held-out accuracy against the majority rate, NLL against the class frequencies', seconds, the
verdict and the first warning or error.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from gpinfer import registry  # noqa: E402
from gpinfer.testing.default_battery import (  # noqa: E402
    SKLEARN_SETS,
    TRANSFORMS,
    CaseResult,
    battery_data,
    class_frequency_nll,
    run_case,
    sklearn_case,
)


def _methods(names: list[str]) -> list[str]:
    own = [e.name for e in registry.entries(registry.METHODS)
           if e.dist in registry.OWN_DISTRIBUTIONS]
    return names or own


def _work(queue: mp.Queue, kind: str, method: str, data: str, max_iter: int | None) -> None:
    if kind == "battery":
        X, y, Xt, yt = battery_data(data)
    else:
        multiclass = bool(registry.load_method(method).multiclass)
        X, y, Xt, yt = sklearn_case(data, multiclass)
    params = {} if max_iter is None else {"max_iter": max_iter}
    queue.put(run_case(method, data, X, y, Xt, yt, **params))


def _run(kind: str, method: str, data: str, max_iter: int | None, timeout: float) -> CaseResult:
    queue: mp.Queue = mp.Queue()
    proc = mp.Process(target=_work, args=(queue, kind, method, data, max_iter))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join()
        out = CaseResult(method, data, seconds=timeout, error=f"crash TIMEOUT after {timeout:g} s")
        return out
    if queue.empty():
        return CaseResult(method, data, error=f"crash: process exited {proc.exitcode}")
    return queue.get()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=("battery", "sklearn"))
    ap.add_argument("methods", nargs="*")
    ap.add_argument("--max-iter", type=int, default=None,
                    help="battery: 20 (default); sklearn: the estimator's default")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per fit")
    ap.add_argument("--sets", default=None, help="comma-separated transforms or data sets")
    args = ap.parse_intermixed_args(argv)
    if args.kind == "battery":
        sets = list(TRANSFORMS)
        max_iter = 20 if args.max_iter is None else args.max_iter
        timeout = 120.0 if args.timeout is None else args.timeout
    else:
        sets = list(SKLEARN_SETS)
        max_iter = args.max_iter
        timeout = 60.0 if args.timeout is None else args.timeout
    if args.sets:
        sets = args.sets.split(",")
    failures = 0
    for method in _methods(args.methods):
        for data in sets:
            res = _run(args.kind, method, data, max_iter, timeout)
            if res.error and res.error.startswith("crash") and args.kind == "sklearn":
                # the baseline columns still tell the reader what chance is
                multiclass = bool(registry.load_method(method).multiclass)
                X, y, Xt, yt = sklearn_case(data, multiclass)
                res.baseline_nll = class_frequency_nll(y, yt, int(max(y.max(), yt.max())) + 1)
            failures += res.verdict not in ("beats",)
            print(res.row(), flush=True)
    print(f"{failures} fit(s) did not beat the class frequencies by the margin", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

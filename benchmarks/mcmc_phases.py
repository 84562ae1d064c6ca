"""CPU time per phase of an ``mcmc-ais`` fit at its defaults on scikit-learn data (issue 27).

    .venv/bin/python benchmarks/mcmc_phases.py [--sets moons,breast_cancer,digits]
        [--json out.json] [--profile moons.prof] [key=value method options ...]

Each set is ``gpinfer.testing.default_battery.sklearn_case`` (70/30 split, two classes), fitted
by ``GPClassifier(method="mcmc-ais", random_state=0)`` as the ``sklearn`` battery does. Per
phase (``time.process_time``, one BLAS thread): the EP start, the pilot AIS run, the production
AIS run, the posterior sampling and the test predictions; with wall seconds, the 1-minute load
average, ``log Z`` with its standard error, the per-run ``log Z_r`` and the test NLL, so that
two versions of the code can be compared on the same random stream.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from gpinfer_mcmc import method as mcmc_method  # noqa: E402

from gpinfer.estimator import GPClassifier  # noqa: E402
from gpinfer.sites.ep import EPSites  # noqa: E402
from gpinfer.testing.default_battery import sklearn_case  # noqa: E402


class PhaseClock:
    """Accumulates CPU seconds per named phase around wrapped callables."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def wrap(self, fn, name_of):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            name = name_of(*args, **kwargs)
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0
        return timed


def _parse(value: str) -> object:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def run(name: str, options: dict[str, object]) -> dict[str, object]:
    X, y, Xt, yt = sklearn_case(name, multiclass=False)
    clock = PhaseClock()
    run_ais, sample, ep_run = (mcmc_method.run_ais, mcmc_method.sample_posterior,
                               EPSites.run)
    mcmc_method.run_ais = clock.wrap(  # type: ignore[assignment]
        run_ais, lambda *a, **k: "pilot_ais" if k.get("adapt") else "production_ais")
    mcmc_method.sample_posterior = clock.wrap(  # type: ignore[assignment]
        sample, lambda *a, **k: "posterior_hmc")
    EPSites.run = clock.wrap(ep_run, lambda *a, **k: "ep_start")  # type: ignore[method-assign]
    try:
        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = GPClassifier(method="mcmc-ais", random_state=0,
                               method_options=options or None).fit(X, y)
            fit_cpu = time.process_time() - c0
            c1 = time.process_time()
            P = est.predict_proba(Xt)
            clock.cpu["predict"] = time.process_time() - c1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        mcmc_method.run_ais, mcmc_method.sample_posterior = run_ais, sample
        EPSites.run = ep_run  # type: ignore[method-assign]
    cols = np.searchsorted(est.classes_, yt)
    state = est.fit_result_.state
    return {
        "set": name, "n_train": int(len(y)), "cpu_s": round(cpu, 2),
        "fit_cpu_s": round(fit_cpu, 2), "wall_s": round(wall, 2), "load1": round(load0, 2),
        "load1_end": round(os.getloadavg()[0], 2),
        "phases_cpu_s": {k: round(v, 2) for k, v in clock.cpu.items()},
        "log_z": float(est.log_evidence_), "se": float(est.log_evidence_se_),
        "log_z_runs": [float(v) for v in np.ravel(state.get("log_z_runs", []))],
        "test_nll": float(-np.mean(np.log(np.clip(P[np.arange(len(yt)), cols], 1e-300, None)))),
        "accuracy": float(np.mean(est.classes_[np.argmax(P, axis=1)] == yt)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("options", nargs="*", help="method options key=value")
    ap.add_argument("--sets", default="moons,breast_cancer,digits")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", default=None, help="cProfile output of the first set")
    args = ap.parse_args()
    options = {k: _parse(v) for k, v in (o.split("=", 1) for o in args.options)}
    out = []
    for i, name in enumerate(args.sets.split(",")):
        if args.profile and i == 0:
            import cProfile
            prof = cProfile.Profile()
            row = prof.runcall(run, name, options)
            prof.dump_stats(args.profile)
        else:
            row = run(name, options)
        print(json.dumps(row), flush=True)
        out.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

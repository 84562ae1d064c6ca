"""Fits of every method on the outer optimiser schedule, before and after a change of it.

The methods ``same_fits.py`` does not cover: the dense binary driver (ep-dense, kl, vb, tap,
lr, fv; ep-dense on the grid too), laplace, gfitc, pep / fitc / vfe (classification and
regression), svi (L-BFGS-B, numpy and torch-CPU float64), the vi-jj family (alternating,
full, hybrid, taylor) and ivm (hyper-parameter rounds), each at its defaults on a small digits
subset. ``save`` stores every fit's test probabilities (or predictions), ``n_iter_``, the
objectives of its history and the number and a checksum of the hyper-parameter vectors
installed (the iterates and the evaluations); ``compare`` prints the largest difference of
each (the outer schedule's moves ask for 0.0: the same iterates, the same bits).

    .venv/bin/python benchmarks/same_outer_fits.py save /tmp/outer_ref.npz
    .venv/bin/python benchmarks/same_outer_fits.py compare /tmp/outer_ref.npz [name ...]
"""

import sys
import warnings
import zlib

import numpy as np
from sklearn.datasets import load_digits

from gpinfer.backend import ops
from gpinfer.estimator import GPClassifier
from gpinfer.hyper import HyperParameters
from gpinfer.likelihoods.multiclass import Softmax
from gpinfer.regressor import GPRegressor

# every hyper-parameter vector installed (each evaluation, re-solve and snapshot unpacks one):
# their number and a checksum of their bytes, so a change of the iterates or of the number of
# evaluations shows even where the fit itself does not move
unpacked = {"n": 0, "crc": 0}
_unpack = HyperParameters.unpack


def _counted_unpack(self, theta, *args, **kwargs):
    host = np.ascontiguousarray(ops.to_host(theta), dtype=float)
    unpacked["n"] += 1
    unpacked["crc"] = zlib.crc32(host.tobytes(), unpacked["crc"])
    return _unpack(self, theta, *args, **kwargs)


HyperParameters.unpack = _counted_unpack

mode, path, only = sys.argv[1], sys.argv[2], set(sys.argv[3:])
X, y = load_digits(return_X_y=True)
idx = np.random.default_rng(0).permutation(X.shape[0])
X, y = X[idx] / 16.0, y[idx]
Xb, yb = X[y < 2][:70], y[y < 2][:70]  # binary: 0 vs 1
Xm, ym = X[y < 3][:60], y[y < 3][:60]  # three classes
Xte = X[300:340]
binary = {m: dict(method=m, max_iter=6) for m in ("ep-dense", "kl", "vb", "tap", "lr", "fv")}
cases = {
    **binary,
    "ep-dense_grid": dict(method="ep-dense", max_iter=6, method_options={
        "optimizer": "grid", "optimizer_options": {"axes": [[0.0, 1.0], [-0.5, 0.5]]}}),
    "laplace": dict(method="laplace", max_iter=6, optimize=True),
    "gfitc": dict(method="gfitc", M=8, max_iter=4, data="multi"),
    "pep": dict(method="pep", M=10, max_iter=5),
    "fitc": dict(method="fitc", M=10, max_iter=5),
    "vfe": dict(method="vfe", M=10, max_iter=5),
    "pep_reg": dict(method="pep", M=10, max_iter=6, data="reg"),
    "svi": dict(method="svi", M=10, max_iter=6, data="multi"),
    "svi_torch": dict(method="svi", M=10, max_iter=6, data="multi", backend="torch",
                      device="cpu", dtype="float64"),
    # the mini-batch schedule: pep's stochastic path, svi's with Adam + natural gradients
    # (numpy and torch-CPU float64), svi's default AdaDelta with a Monte-Carlo expectation
    "pep_mb": dict(method="pep", M=10, max_iter=12, batch_size=25),
    "pep_mb_epochs": dict(method="fitc", M=10, batch_size=30, method_options={"epochs": 2}),
    "svi_ngd": dict(method="svi", M=10, max_iter=4, batch_size=20, data="multi",
                    method_options={"optimizer": "adam", "natural_gradient": 0.1,
                                    "report_every": 2}),
    "svi_ngd_torch": dict(method="svi", M=10, max_iter=4, batch_size=20, data="multi",
                          backend="torch", device="cpu", dtype="float64",
                          method_options={"optimizer": "adam", "natural_gradient": 0.1,
                                          "report_every": 2}),
    "svi_mc": dict(method="svi", M=10, max_iter=3, batch_size=25, data="multi",
                   likelihood=Softmax(expectation="monte_carlo", mc_samples=8)),
    "vi-jj": dict(method="vi-jj", M=10, max_iter=3),
    "vi-jj-full": dict(method="vi-jj-full", M=10, max_iter=6),
    "vi-jj-hybrid": dict(method="vi-jj-hybrid", M=10, max_iter=3),
    "vi-taylor": dict(method="vi-taylor", M=10, max_iter=3),
    "ivm": dict(method="ivm", M=15, max_iter=6, data="multi", optimize=True,
                method_options={"rounds": 2, "minor_iter": 3}),
}
out = {}
for name, kw in cases.items():
    if only and name not in only:
        continue
    kw = dict(kw)
    unpacked.update(n=0, crc=0)
    data = kw.pop("data", "binary")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if data == "reg":
                est = GPRegressor(random_state=0, **kw).fit(Xb, Xb[:, 20] + 0.1 * yb)
                pred = est.predict(Xte)
            else:
                Xf, yf = (Xb, yb) if data == "binary" else (Xm, ym)
                est = GPClassifier(random_state=0, **kw).fit(Xf, yf)
                pred = est.predict_proba(Xte)
    except Exception as e:  # noqa: BLE001 - report and go on
        print("FAILED", name, type(e).__name__, e)
        continue
    out[f"{name}/pred"] = np.asarray(pred)
    out[f"{name}/n_iter"] = np.array(est.n_iter_)
    out[f"{name}/unpacks"] = np.array([unpacked["n"], unpacked["crc"]])
    out[f"{name}/objective"] = np.array([h.get("objective", np.nan) for h in est.history_])
if mode == "save":
    np.savez(path, **out)
    print("saved", sorted({k.split("/")[0] for k in out}))
else:
    ref = np.load(path)
    worst = 0.0
    for k in ref.files:
        if only and k.split("/")[0] not in only:
            continue
        if k not in out:
            print(f"{k:28s} MISSING")
            worst = np.inf
            continue
        a, b = ref[k], out[k]
        d = np.inf if a.shape != b.shape else float(np.max(np.abs(a - b), initial=0.0))
        if np.isnan(d):
            d = 0.0 if np.array_equal(a, b, equal_nan=True) else np.inf
        worst = max(worst, d)
        print(f"{k:28s} {d:.3g}")
    print("WORST", worst)

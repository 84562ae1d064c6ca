"""Fits before and after a change of the kernel path: the same model to round-off (issue 25).

Fits sep (mini-batch, isotropic and ARD; full batch; both with ``shared_inducing``), ep, svi
(robust-max, mini-batch: Adam, and the default optimisers, AdaDelta for mini-batches and L-BFGS-B
for a full batch) on numpy and torch-CPU float64, and gfitc on numpy, on a 4-class
digits subset, and saves their test probabilities (``save``) or compares them with saved ones
(``compare``: the max relative difference per fit and overall; issue 25 asks for <= 1e-10).
An optional third argument runs only the fits whose name starts with it (e.g. ``svi``).

    # on the commit before the change (e.g. a `git archive` of it on PYTHONPATH):
    PYTHONPATH=OLD:OLD/plugins/gpinfer-ep:OLD/plugins/gpinfer-svi \
        .venv/bin/python benchmarks/same_fits.py save /tmp/ref.npz
    # on the change:
    .venv/bin/python benchmarks/same_fits.py compare /tmp/ref.npz
"""

import sys

import numpy as np
from sklearn.datasets import load_digits

from gpinfer.estimator import GPClassifier
from gpinfer.kernels import make_kernel

mode, path = sys.argv[1], sys.argv[2]
only = sys.argv[3] if len(sys.argv) > 3 else ""
X, y = load_digits(return_X_y=True)
rng = np.random.default_rng(0)
idx = rng.permutation(X.shape[0])[:400]
X, y = X[idx] / 16.0, y[idx]
mask = y < 4
X, y = X[mask], y[mask]
Xte = X[:60]
cases = {
    "sep_mb": dict(method="sep", M=15, max_iter=3, batch_size=50,
                   method_options={"adam_learning_rate": 0.01}),
    "sep_ard": dict(method="sep", M=15, max_iter=3, batch_size=50,
                    kernel=make_kernel("rbf", X.shape[1], ard=True),
                    method_options={"adam_learning_rate": 0.01}),
    "sep_full": dict(method="sep", M=15, max_iter=4),
    # one kernel and one Z for every class (``shared_inducing``), mini-batch and full batch
    "sep_shared_mb": dict(method="sep", M=15, max_iter=6, batch_size=50,
                          method_options={"adam_learning_rate": 0.01, "shared_inducing": True}),
    "sep_shared_full": dict(method="sep", M=15, max_iter=4,
                            method_options={"shared_inducing": True}),
    "ep": dict(method="ep", M=15, max_iter=4),
    "svi": dict(method="svi", M=15, max_iter=3, batch_size=50, likelihood="robustmax",
                method_options={"optimizer": "adam", "optimizer_options": {"learning_rate": 0.01}}),
    # optimizer None: the method's choice for the problem's shape (SVI.optimizer_for)
    "svi_adadelta": dict(method="svi", M=15, max_iter=3, batch_size=50, likelihood="robustmax"),
    "svi_lbfgs": dict(method="svi", M=15, max_iter=4, likelihood="robustmax"),
    "gfitc": dict(method="gfitc", M=15, max_iter=4),
}
out = {}
for name, kw in ((k, v) for k, v in cases.items() if k.startswith(only)):
    for be in ("numpy", "torch"):
        settings = {} if be == "numpy" else dict(backend="torch", device="cpu", dtype="float64")
        if name == "gfitc" and be == "torch":
            continue
        try:
            est = GPClassifier(random_state=0, **kw, **settings).fit(X, y)
            out[f"{name}/{be}"] = est.predict_proba(Xte)
        except Exception as e:  # noqa: BLE001 - report and go on
            print("FAILED", name, be, type(e).__name__, e)
if mode == "save":
    np.savez(path, **out)
    print("saved", list(out))
else:
    ref = np.load(path)
    worst = 0.0
    for k in ref.files:
        if k not in out:
            print(k, "MISSING")
            continue
        rel = float(np.max(np.abs(out[k] - ref[k]) / np.abs(ref[k])))
        worst = max(worst, rel)
        print(f"{k:16s} max rel diff {rel:.3e}")
    print("WORST", worst)

"""What a run's process imports: the runner's fit path needs neither scikit-learn nor
scipy.stats nor pandas (about 1.3 CPU s of imports; ``gpinfer.sklearn_estimators``)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("sklearn", "scipy.stats", "pandas")

FIT_PATH = """
import json, sys
import numpy as np
from gpinfer.experiment import runner  # noqa: F401  (the run's module and its imports)
from gpinfer.estimator import GPClassifierCore
from gpinfer.regressor import GPRegressorCore

rng = np.random.default_rng(0)
X = rng.normal(size=(40, 2))
y = (X[:, 0] + 0.3 * rng.normal(size=40) > 0).astype(int)
core = GPClassifierCore(method="laplace", max_iter=5, random_state=0).fit(X, y)
P = core.posterior_.predict_proba(X)
reg = GPRegressorCore(method="pep", M=10, max_iter=5, random_state=0).fit(X, X[:, 0] + X[:, 1])
print(json.dumps({"heavy": sorted(m for m in sys.argv[1:] if m in sys.modules),
                  "finite": bool(np.isfinite(P).all()), "n_iter": int(core.n_iter_)}))
"""


def _imported(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *HEAVY], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fit_path_imports_no_sklearn_scipy_stats_or_pandas():
    found = _imported(FIT_PATH)
    assert found["finite"] and found["n_iter"] >= 1  # it did fit
    assert found["heavy"] == []


def test_the_check_sees_sklearn_when_it_is_imported():
    """The check itself can fail: the scikit-learn estimator's import is seen."""
    found = _imported(FIT_PATH.replace("from gpinfer.regressor import GPRegressorCore",
                                       "from gpinfer.regressor import GPRegressorCore, GPRegressor"))
    assert "sklearn" in found["heavy"]

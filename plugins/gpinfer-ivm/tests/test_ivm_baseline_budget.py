"""Issue 27: ivm-baseline's default budget ``d_max`` per class (``baseline.default_budget``):
the paper's ``min(n, 150)`` while the ``C`` active sets hold at most ``max(n, 450)`` sites,
else that cap spread over the classes; an explicit ``M`` is the budget as given."""

import numpy as np
import pytest
from gpinfer_ivm.baseline import SITES_PER_D_FINAL, default_budget
from gpinfer_ivm.method import DEFAULT_D_FINAL

from gpinfer.estimator import GPClassifier


@pytest.mark.parametrize(("n", "C", "expected"), [
    (105, 3, 105),   # iris: every point, every class (the paper's d = min(n, 150))
    (124, 3, 124),   # wine
    (398, 2, 150),   # breast_cancer
    (800, 5, 150),   # the paper's MNIST protocol (C = 5, 200 per class, 800 training points)
    (350, 10, 45),   # digits of issue 27: 450 sites in all instead of 1500
    (2000, 10, 150), # one site per point allows the paper's budget again
    (5, 10, 5),      # fewer points than the budget
])
def test_default_budget(n, C, expected):
    d = default_budget(n, C, DEFAULT_D_FINAL)
    assert d == expected
    assert 1 <= d <= min(n, DEFAULT_D_FINAL)
    # the paper's budget exactly when it fits under the cap, else the cap is (nearly) filled
    cap = max(n, SITES_PER_D_FINAL * DEFAULT_D_FINAL)
    if d < min(n, DEFAULT_D_FINAL):
        assert cap - C < C * d <= cap


def _ten_blobs(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    y = np.arange(n) % 10
    X = 4.0 * rng.normal(size=(10, 2))[y] + rng.normal(size=(n, 2))
    return X, y


def test_fit_uses_the_default_budget_and_an_explicit_m():
    """The fitted active sets: ``default_budget`` per class without ``M`` (200 points, 10
    classes: 45 instead of 150), the given ``M`` otherwise (not capped)."""
    X, y = _ten_blobs(200)
    est = GPClassifier(method="ivm-baseline", optimize=False, random_state=0).fit(X, y)
    sizes = [len(I) for I in est.fit_result_.posterior.rep.frozen_sites().I]
    assert max(sizes) == default_budget(200, 10, DEFAULT_D_FINAL) == 45
    est = GPClassifier(method="ivm-baseline", M=60, optimize=False, random_state=0).fit(X, y)
    sizes = [len(I) for I in est.fit_result_.posterior.rep.frozen_sites().I]
    assert max(sizes) == 60

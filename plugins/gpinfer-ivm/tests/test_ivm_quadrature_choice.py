"""Issue 27: the quadrature rule chosen by ``rule="auto"`` (product while it is small, then a
rule whose cost does not grow like ``3^C``), and the baseline's exact diagonal rule against a
converged product rule inside the baseline's selection and learning criterion."""

import numpy as np
import pytest
from gpinfer_ivm.baseline import resolve_baseline_rule, run_baseline
from gpinfer_ivm.criterion import criterion
from gpinfer_ivm.gaussian_cubature import AUTO_PRODUCT_NODES, resolve_rule

from gpinfer.estimator import GPClassifier
from gpinfer.kernels import RBF

KEEP = "warn"


@pytest.mark.parametrize(("C", "expected"), [(3, ("product", None)), (5, ("product", None)),
                                              (8, ("product", None)), (9, ("sobol", None)),
                                              (10, ("sobol", None))])
def test_auto_rule_switches_where_the_product_rule_grows_past_the_limit(C, expected):
    assert resolve_rule(C, None, None, "auto") == expected
    assert resolve_rule(C, 3, None, "product") == ("product", 3)
    # an explicit order is the caller's choice of the product rule's size
    assert resolve_rule(C, 4, None, "auto") == ("product", 4)
    # the seeger2004 protocol's pinned GH-3 at C = 5 stays the product rule either way
    assert resolve_rule(5, 3, None, "auto") == ("product", 3)
    assert 3**8 > AUTO_PRODUCT_NODES >= 3**7


def test_baseline_auto_rule():
    assert resolve_baseline_rule(3, None, "auto") == "product"
    assert resolve_baseline_rule(7, None, "auto") == "product"
    assert resolve_baseline_rule(8, None, "auto") == "diagonal"
    assert resolve_baseline_rule(8, 3, "auto") == "product"  # gh_order given
    assert resolve_baseline_rule(10, None, "product") == "product"


def _blobs(C: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = 3.0 * rng.standard_normal((C, 2))
    y = np.arange(n) % C
    X = centres[y] + rng.standard_normal((n, 2))
    return X, y


def test_baseline_diagonal_rule_matches_a_converged_product_rule():
    """Same active sets, and sites to 1e-6, as with a 40-point-per-axis product rule (C = 3);
    the learning criterion and its gradient agree to 1e-7."""
    C, n = 3, 24
    X, y = _blobs(C, n)
    kernels = [RBF(lengthscale=1.5, variance=1.5)] * C
    beta = np.array([0.3, -0.2, 0.0])
    reps = {rule: run_baseline(kernels, X, y, beta, 5, np.random.default_rng(0), order, None,
                               rule)
            for rule, order in (("diagonal", None), ("product", 40))}  # fmt: skip
    a, b = reps["diagonal"].frozen_sites(), reps["product"].frozen_sites()
    for c in range(C):
        np.testing.assert_array_equal(a.I[c], b.I[c])
        np.testing.assert_allclose(a.pi[c], b.pi[c], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(a.b[c], b.b[c], rtol=1e-6, atol=1e-9)
    got = criterion(kernels, X, y, a, beta, None, False, True, "diagonal")
    ref = criterion(kernels, X, y, a, beta, 40, False, True, "product")
    assert abs(got.value - ref.value) < 1e-7
    np.testing.assert_allclose(got.dkernel[0], ref.dkernel[0], rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(got.dbeta, ref.dbeta, atol=1e-8)


@pytest.mark.parametrize(("method", "rule", "M"), [("ivm", "sobol", 12),
                                                   ("ivm-baseline", "diagonal", 4)])
def test_nine_classes_fit_with_the_c_independent_rule(method, rule, M):
    """At C = 9 the defaults pick the C-independent rule and the fitted model names it; the fit
    beats the class frequencies (overlapping blobs; ivm: 12 sites in all, the baseline: 4 per
    class)."""
    X, y = _blobs(9, 90, seed=1)
    est = GPClassifier(method=method, M=M, optimize=False, random_state=0,
                       baseline_failure=KEEP).fit(X, y)
    assert est.fit_result_.posterior.quadrature[0] == rule
    P = est.predict_proba(X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-8)
    assert np.mean(P.argmax(axis=1) == y) > 3 / 9  # balanced classes: majority rate 1/9
    assert np.mean(np.log(P[np.arange(90), y])) > np.log(1 / 9)  # the class frequencies


def test_ivm_sobol_fit_agrees_with_the_former_default_product_rule():
    """C = 9: the Sobol default and the reduced GH-3 product rule (the former default, 6561
    nodes) give the same fit up to a small fraction of its NLL (measured 0.0016 nats)."""
    X, y = _blobs(9, 90, seed=1)
    nll = {}
    for rule in ("sobol", "product"):
        opts = {"rule": rule, "gh_order": 3 if rule == "product" else None}
        est = GPClassifier(method="ivm", M=12, optimize=False, random_state=0,
                           baseline_failure=KEEP, method_options=opts).fit(X, y)
        P = est.predict_proba(X)
        nll[rule] = -np.mean(np.log(P[np.arange(90), y]))
    assert abs(nll["sobol"] - nll["product"]) < 0.02

"""The same call gives the same model on every backend (issue 27, item 3).

Every method with a torch backend (``Method.backends``, found through the registry, so a new one
is tested without editing this file), called with its default options, fitted on numpy and on
torch's CPU build in float64 from the same seed: predicted probabilities agree to 1e-6. The
optimisers are the same on both backends (svi's full-batch default is L-BFGS-B on both: its state
on the host, the ELBO and its gradient on the device; ep/sep step by sign-adaptive ascent on the
device), so only round-off separates the two fits. float32 (where the method allows it) follows
the float64 fit to a documented 1e-4 over these 20 iterations (docs/backends.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer import GPClassifier, registry

torch = pytest.importorskip("torch", reason="the torch backend's tests need PyTorch (make test "
                            "installs its CPU build)")

#: every registered method that runs on torch (sep, ep, svi, vi-robustmax at the time of writing)
TORCH_METHODS = registry.methods_supporting(lambda m: "torch" in getattr(m, "backends", ()))
#: float64 agreement of the two backends' probabilities (round-off only)
FLOAT64_ATOL = 1e-6
#: float32 on torch against float64 on numpy, 20 iterations (round-off accumulates along the path)
FLOAT32_ATOL = 1e-4


@pytest.fixture(scope="module")
def three_classes() -> tuple[np.ndarray, np.ndarray]:
    """The issue's problem: 90 points, 3 classes."""
    rng = np.random.default_rng(0)
    y = np.arange(90) % 3
    X = rng.normal(size=(90, 2)) + 2.5 * np.stack([np.cos(2.1 * y), np.sin(2.1 * y)], axis=1)
    return X, y


def _fit(method: str, data, **kwargs) -> GPClassifier:
    return GPClassifier(method=method, M=10, max_iter=20, random_state=0, **kwargs).fit(*data)


def test_the_torch_methods_are_found():
    assert {"sep", "ep", "svi", "vi-robustmax"} <= set(TORCH_METHODS)


@pytest.mark.parametrize("method", TORCH_METHODS)
def test_default_options_give_the_same_model_on_numpy_and_torch(method, three_classes):
    X, _ = three_classes
    ref = _fit(method, three_classes, backend="numpy")
    got = _fit(method, three_classes, backend="torch")
    assert got.backend_.name == "torch" and got.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(got.predict_proba(X), ref.predict_proba(X), rtol=0,
                               atol=FLOAT64_ATOL)
    assert got.log_evidence_ == pytest.approx(ref.log_evidence_, rel=1e-8)


def test_the_issues_svi_call_is_the_same_model(three_classes):
    """``GPClassifier(method="svi", likelihood="robustmax", M=10, max_iter=20, random_state=0)``
    differed by 0.54 between the backends (numpy: L-BFGS-B, torch: a stochastic optimiser)."""
    X, _ = three_classes
    fits = [_fit("svi", three_classes, likelihood="robustmax", backend=b)
            for b in ("numpy", "torch")]
    assert all("lbfgs_success" in f.fit_result_.state for f in fits)
    np.testing.assert_allclose(fits[1].predict_proba(X), fits[0].predict_proba(X), rtol=0,
                               atol=FLOAT64_ATOL)


@pytest.mark.parametrize("method", [m for m in TORCH_METHODS
                                    if registry.load_method(m).float32])
def test_float32_follows_the_float64_model(method, three_classes):
    X, _ = three_classes
    ref = _fit(method, three_classes)
    got = _fit(method, three_classes, backend="torch", dtype="float32")
    np.testing.assert_allclose(got.predict_proba(X), ref.predict_proba(X), rtol=0,
                               atol=FLOAT32_ATOL)

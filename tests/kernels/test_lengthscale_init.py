"""``lengthscale_init="auto"`` (``gpinfer.kernels.initialisation``): a ``Kernel`` object held fixed
(``optimize=False``) is fitted as given, as scikit-learn's ``optimizer=None`` keeps its kernel,
by each of the 9 methods with a median heuristic; a named kernel, or one whose
hyper-parameters are optimised, still starts from the median (the paper protocols' start).
On the commit before ``"auto"``, the kernel-object cases fail (the median replaced 2.0)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.interfaces import Problem
from gpinfer.kernels.initialisation import (
    leaf_kernels,
    median_distance,
    resolve_lengthscale_init,
    start_kernel,
)
from gpinfer.kernels.stationary import RBF, Stationary
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.testing.method_suite import make_suite_data

#: the methods whose ``lengthscale_init`` defaults to ``"auto"``, and whether they are binary
METHODS = {"ep": False, "sep": False, "gfitc": False, "svi": False, "vi-robustmax": False,
           "vi-jj": True, "vi-jj-full": True, "vi-jj-hybrid": True, "vi-taylor": True}
#: the user's length-scale and variance: far from the median heuristic's on the data below
GIVEN_LENGTHSCALE, GIVEN_VARIANCE = 2.0, 1.3


def _data(binary: bool) -> tuple[np.ndarray, np.ndarray]:
    X, y = make_suite_data(2 if binary else 3, n=40, seed=1)
    return X, y


def _stationary_parts(est: GPClassifier) -> list[Stationary]:
    """The stationary parts of every latent's fitted kernel (one kernel for the vi-jj family)."""
    kernels = getattr(est.posterior_, "kernels", None) or [est.kernel_]
    parts = [p for k in kernels for p in leaf_kernels(k) if isinstance(p, Stationary)]
    assert parts, "no stationary kernel in the fit"
    return parts


def _lengthscale(kernel) -> float:
    return float(np.exp(kernel.get_unconstrained()[0]))


def _fit(method: str, kernel, optimize: bool, max_iter: int = 2) -> GPClassifier:
    X, y = _data(METHODS[method])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two iterations: convergence warnings are expected
        return GPClassifier(method=method, kernel=kernel, optimize=optimize, max_iter=max_iter,
                            random_state=0, standardize=False,
                            baseline_failure="warn").fit(X, y)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_fixed_kernel_object_is_fitted_as_given(method):
    est = _fit(method, RBF(lengthscale=GIVEN_LENGTHSCALE, variance=GIVEN_VARIANCE), False)
    for part in _stationary_parts(est):
        assert isinstance(part, RBF)
        np.testing.assert_allclose(np.exp(part.get_unconstrained()),
                                   [GIVEN_LENGTHSCALE, GIVEN_VARIANCE], rtol=1e-12)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_named_kernel_still_starts_from_the_median(method):
    X, _ = _data(METHODS[method])
    median = np.sqrt(median_distance(X, np.random.default_rng(0)))
    assert abs(median - GIVEN_LENGTHSCALE) > 0.2  # the two cases are told apart
    est = _fit(method, "rbf", False)
    for part in _stationary_parts(est):
        np.testing.assert_allclose(np.exp(part.get_unconstrained()[0]), median, rtol=1e-12)


@pytest.mark.parametrize("method", ["ep", "vi-jj"])
def test_an_optimised_kernel_object_starts_from_the_median(method):
    """With ``optimize=True`` the given length-scale does not matter: the fit starts at the
    median whatever it is (as before ``"auto"``), so two length-scales give one fit."""
    fits = [_fit(method, RBF(lengthscale=ell, variance=GIVEN_VARIANCE), True)
            for ell in (GIVEN_LENGTHSCALE, 0.3)]
    X, _ = _data(METHODS[method])
    np.testing.assert_array_equal(fits[0].predict_proba(X), fits[1].predict_proba(X))


def test_explicit_rules_override_auto():
    """``"median"`` and ``"kernel"`` are kept whatever the problem; ``"auto"`` keeps only a
    given kernel held fixed."""
    for given in (False, True):
        for optimize in (False, True):
            assert resolve_lengthscale_init("median", given, optimize) == "median"
            assert resolve_lengthscale_init("kernel", given, optimize) == "kernel"
            expected = "kernel" if given and not optimize else "median"
            assert resolve_lengthscale_init("auto", given, optimize) == expected
    est = _fit("vi-jj", RBF(lengthscale=GIVEN_LENGTHSCALE), False)
    X, _ = _data(True)
    forced = GPClassifier(method="vi-jj", kernel=RBF(lengthscale=GIVEN_LENGTHSCALE),
                          optimize=False, max_iter=2, random_state=0, standardize=False,
                          baseline_failure="warn",
                          method_options={"lengthscale_init": "median"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forced.fit(*_data(True))
    median = np.sqrt(median_distance(X, np.random.default_rng(0)))
    assert np.exp(_stationary_parts(forced)[0].get_unconstrained()[0]) == pytest.approx(median)
    assert np.exp(_stationary_parts(est)[0].get_unconstrained()[0]) == GIVEN_LENGTHSCALE


def test_start_kernel_reads_the_problem_and_refuses_an_unknown_rule():
    X, y = _data(False)
    problem = Problem(X=X, y=y, n_classes=3, kernel=RBF(lengthscale=GIVEN_LENGTHSCALE),
                      likelihood=ArgmaxNoise(), optimize=False)
    median = np.sqrt(median_distance(X, np.random.default_rng(0)))
    # a Problem built directly (the oracles, the benchmarks) is not marked given: the median
    assert _lengthscale(start_kernel(problem, X, None, "auto", "t")) == pytest.approx(median)
    problem.kernel_given = True
    assert _lengthscale(start_kernel(problem, X, None, "auto", "t")) == GIVEN_LENGTHSCALE
    problem.optimize = True
    assert _lengthscale(start_kernel(problem, X, None, "auto", "t")) == pytest.approx(median)
    assert _lengthscale(problem.kernel) == GIVEN_LENGTHSCALE  # a copy: the problem's untouched
    with pytest.raises(InputError, match=r"t: lengthscale_init must be one of \('auto', "
                                         r"'median', 'kernel'\), got 'mean'"):
        start_kernel(problem, X, None, "mean", "t")


def test_the_old_module_path_works_one_more_release():
    """``gpinfer.kernel_start`` (its home for one release) hands out the moved names with a
    ``DeprecationWarning`` naming ``gpinfer.kernels.initialisation``."""
    import gpinfer.kernel_start as old
    from gpinfer.kernels import initialisation

    with pytest.warns(DeprecationWarning, match="gpinfer.kernels.initialisation.start_kernel"):
        assert old.start_kernel is initialisation.start_kernel
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018

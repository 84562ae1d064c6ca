"""The battery every likelihood passes: subclass ``LikelihoodTestSuite`` and set ``likelihood``.

Example (a third party's likelihood, ``tests/likelihoods/test_third_party_likelihood.py``)::

    from gpinfer.testing import LikelihoodTestSuite

    class TestCauchit(LikelihoodTestSuite):
        likelihood = Cauchit()

Checks, on small fixed-seed marginals (``N`` points; single-latent ``mean, var [N]``,
multi-class ``[N, C]`` with ``C = 3``):

* the expected log-likelihood (``expected_log_prob``) against brute-force quadrature of
  ``log_prob`` (single latent) and against Monte Carlo (every likelihood);
* the tilted normaliser (``tilted``, powers 1 and 1/2) against quadrature / Monte Carlo;
* ``variational_expectations`` (the likelihood's ELBO rule) against ``expected_log_prob``;
* finite differences of every derivative: ``tilted``, ``expected_log_prob``,
  ``variational_expectations`` (deterministic rules) and ``log_prob_derivatives``;
* class probabilities that sum to one and agree with ``log_predictive``, which is the tilted
  normaliser at power one;
* tails without NaN (means up to +-30, variances 1e-8..1e4); pickling.

Subclasses are recorded in ``LIKELIHOOD_SUITES`` (by likelihood class name) so that a
completeness test can fail when a registered likelihood has none.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import pytest

from gpinfer.errors import InputError
from gpinfer.interfaces import ExpectedLogProb, Likelihood
from gpinfer.likelihoods.base import ScalarLikelihood
from gpinfer.testing.gradcheck import numerical_gradient

Array = np.ndarray

__all__ = ["LIKELIHOOD_SUITES", "LikelihoodTestSuite"]

#: class names of the likelihoods that have a ``LikelihoodTestSuite`` subclass
LIKELIHOOD_SUITES: set[str] = set()


class LikelihoodTestSuite:
    """Reusable tests for one likelihood object; set ``likelihood`` in a subclass.

    * ``likelihood``: the object under test (required).
    * ``n_classes``: ``C`` for multi-class likelihoods (3).
    * ``rtol``: relative tolerance of the deterministic comparisons (quadrature, FD).
    * ``fd_rtol``: relative tolerance of the finite-difference checks.
    * ``mc_sigmas``: how many Monte-Carlo standard errors a reference may be off.
    * ``mc_draws``: Monte-Carlo draws of the references (in all); ``fd_points``: points in the
      finite-difference checks (lower both for an expensive likelihood).
    """

    likelihood: ClassVar[Likelihood | None] = None
    n_classes: ClassVar[int] = 3
    rtol: ClassVar[float] = 1e-6
    fd_rtol: ClassVar[float] = 1e-5
    mc_sigmas: ClassVar[float] = 5.0
    mc_draws: ClassVar[int] = 200_000
    fd_points: ClassVar[int] = 3

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.likelihood is not None:
            LIKELIHOOD_SUITES.add(type(cls.likelihood).__name__)

    # -- data ------------------------------------------------------------------------------------
    def _lik(self) -> Likelihood:
        if self.likelihood is None:
            pytest.skip("LikelihoodTestSuite without a likelihood")
        return self.likelihood

    def _width(self) -> int | None:
        """``C`` for multi-class likelihoods, ``None`` for single-latent ones."""
        return self.n_classes if self._lik().multiclass else None

    def _shape(self, n: int) -> tuple[int, ...]:
        C = self._width()
        return (n,) if C is None else (n, C)

    def _targets(self, n: int, rng: np.random.Generator) -> Array:
        lik = self._lik()
        if lik.task == "regression":
            return rng.normal(size=n)
        C = self._width() or 2
        return np.arange(n) % C

    def _marginals(self, n: int = 5, seed: int = 0) -> tuple[Array, Array, Array]:
        """``y [n]``, ``mean`` and ``var`` (``[n]`` or ``[n, C]``), moderate values."""
        rng = np.random.default_rng(seed)
        shape = self._shape(n)
        mean = rng.normal(size=shape) * 1.2
        var = rng.uniform(0.3, 1.5, size=shape)
        return self._targets(n, rng), mean, var

    def _draws(self, y: Array, mean: Array, var: Array, seed: int = 1) -> tuple[Array, Array]:
        """``log p(y | f)`` at ``_MC_DRAWS`` draws of ``f`` per point: ``[n, S]``; and ``y``."""
        rng = np.random.default_rng(seed)
        lik = self._lik()
        n, S = y.shape[0], self.mc_draws // max(1, y.shape[0])
        eps = rng.standard_normal((n, S) + mean.shape[1:])
        F = mean[:, None] + np.sqrt(var)[:, None] * eps
        Y = np.repeat(y, S)
        lp = lik.log_prob(Y, F.reshape((n * S,) + mean.shape[1:])).reshape(n, S)
        return lp, Y

    def _expected(self, y: Array, mean: Array, var: Array) -> ExpectedLogProb:
        try:
            return self._lik().expected_log_prob(y, mean, var)
        except InputError as exc:  # e.g. a noise-free argmax: E[log p] = -inf
            pytest.skip(f"no expected log-likelihood: {exc}")

    # -- expectations ------------------------------------------------------------------------------
    def test_expected_log_prob_against_quadrature(self):
        lik = self._lik()
        if lik.multiclass:
            pytest.skip("brute-force quadrature for single-latent likelihoods only")
        y, mean, var = self._marginals()
        got = self._expected(y, mean, var).value
        x, w = np.polynomial.hermite_e.hermegauss(200)
        w = w / w.sum()
        F = mean[:, None] + np.sqrt(var)[:, None] * x
        lp = lik.log_prob(np.repeat(y, x.size), F.reshape(-1)).reshape(F.shape)
        np.testing.assert_allclose(got, lp @ w, rtol=self.rtol, atol=self.rtol)

    def test_expected_log_prob_against_monte_carlo(self):
        y, mean, var = self._marginals(n=4)
        got = self._expected(y, mean, var).value
        lp, _ = self._draws(y, mean, var)
        se = lp.std(axis=1) / np.sqrt(lp.shape[1])
        assert np.all(np.abs(got - lp.mean(axis=1)) <= self.mc_sigmas * se + 1e-12), (
            got, lp.mean(axis=1), se)

    def test_variational_expectations_agree_with_expected_log_prob(self):
        lik = self._lik()
        y, mean, var = self._marginals()
        ref = self._expected(y, mean, var)
        rng = np.random.default_rng(0)
        out = lik.variational_expectations(y, mean, var, rng=rng)
        for name in ("value", "dmean", "dvar"):
            assert getattr(out, name).shape == getattr(ref, name).shape
        tol = max(1e-5, 10 * self.rtol)
        if lik.expectation == "monte_carlo":  # unbiased: the mean of many calls
            calls = [lik.variational_expectations(y, mean, var, rng=rng) for _ in range(400)]
            out = type(out)(*(np.mean([getattr(c, f) for c in calls], axis=0)
                              for f in out._fields))
            tol = 0.03
        np.testing.assert_allclose(out.value, ref.value, atol=tol)
        np.testing.assert_allclose(out.dmean, ref.dmean, atol=tol)
        np.testing.assert_allclose(out.dvar, ref.dvar, atol=tol)

    # -- tilted moments ----------------------------------------------------------------------------
    @pytest.mark.parametrize("power", [1.0, 0.5])
    def test_tilted_normaliser_against_monte_carlo(self, power: float) -> None:
        lik = self._lik()
        y, mean, var = self._marginals(n=4)
        got = lik.tilted(y, mean, var, power).log_z
        lp, _ = self._draws(y, mean, var)
        p = np.exp(power * lp)
        se = p.std(axis=1) / np.sqrt(p.shape[1])
        Z = np.exp(got)
        assert np.all(np.abs(Z - p.mean(axis=1)) <= self.mc_sigmas * se + 1e-12), (
            Z, p.mean(axis=1), se)

    def test_tilted_normaliser_against_quadrature(self):
        lik = self._lik()
        if lik.multiclass:
            pytest.skip("brute-force quadrature for single-latent likelihoods only")
        y, mean, var = self._marginals()
        x, w = np.polynomial.hermite_e.hermegauss(200)
        w = w / w.sum()
        F = mean[:, None] + np.sqrt(var)[:, None] * x
        lp = lik.log_prob(np.repeat(y, x.size), F.reshape(-1)).reshape(F.shape)
        for power in (1.0, 0.5):
            got = lik.tilted(y, mean, var, power).log_z
            np.testing.assert_allclose(got, np.log(np.exp(power * lp) @ w), rtol=self.rtol,
                                       atol=self.rtol)

    # -- derivatives by finite differences --------------------------------------------------------
    def _check_fd(self, fn: Callable[[Array, Array, Array], Array], y: Array, mean: Array,
                  var: Array, dmean: Array, dvar: Array, what: str) -> None:
        """``fn(y, mean, var) -> [N]`` is separable per point: FD of its sum, entry by entry."""
        num_m = numerical_gradient(lambda m: float(np.sum(fn(y, m, var))), mean)
        num_v = numerical_gradient(lambda v: float(np.sum(fn(y, mean, v))), var)
        atol = 1e-6
        np.testing.assert_allclose(dmean, num_m, rtol=self.fd_rtol, atol=atol,
                                   err_msg=f"{what}: d/dmean")
        np.testing.assert_allclose(dvar, num_v, rtol=self.fd_rtol, atol=atol,
                                   err_msg=f"{what}: d/dvar")

    @pytest.mark.parametrize("power", [1.0, 0.5])
    def test_tilted_derivatives_by_finite_differences(self, power: float) -> None:
        lik = self._lik()
        y, mean, var = self._marginals(n=self.fd_points)
        out = lik.tilted(y, mean, var, power)
        self._check_fd(lambda y_, m, v: lik.tilted(y_, m, v, power).log_z, y, mean, var,
                       out.dlogz_dmean, out.dlogz_dvar, f"tilted(power={power})")

    def test_expected_log_prob_derivatives_by_finite_differences(self):
        lik = self._lik()
        y, mean, var = self._marginals(n=self.fd_points)
        out = self._expected(y, mean, var)
        self._check_fd(lambda y_, m, v: lik.expected_log_prob(y_, m, v).value, y, mean, var,
                       out.dmean, out.dvar, "expected_log_prob")

    def test_variational_expectation_derivatives_by_finite_differences(self):
        lik = self._lik()
        if lik.expectation == "monte_carlo":
            pytest.skip("a Monte-Carlo rule: unbiased gradients, no finite differences")
        y, mean, var = self._marginals(n=self.fd_points)
        self._expected(y, mean, var)  # skips where the expectation does not exist
        out = lik.variational_expectations(y, mean, var)
        self._check_fd(lambda y_, m, v: lik.variational_expectations(y_, m, v).value, y, mean,
                       var, out.dmean, out.dvar, "variational_expectations")

    def test_log_prob_derivatives_by_finite_differences(self):
        lik = self._lik()
        if not lik.supports({"log_prob_derivatives"}):
            pytest.skip("no pointwise derivatives")
        y, F, _ = self._marginals()
        assert isinstance(lik, ScalarLikelihood)
        derivs = lik.log_prob_derivatives(y, F, order=3)
        lower = [lik.log_prob(y, F)] + list(derivs[:2])
        h = 1e-6 * np.maximum(1.0, np.abs(F))
        plus = [lik.log_prob(y, F + h)] + list(lik.log_prob_derivatives(y, F + h, order=2))
        minus = [lik.log_prob(y, F - h)] + list(lik.log_prob_derivatives(y, F - h, order=2))
        for k, d in enumerate(derivs, start=1):
            num = (plus[k - 1] - minus[k - 1]) / (2.0 * h)
            assert lower[k - 1].shape == d.shape
            np.testing.assert_allclose(d, num, rtol=self.fd_rtol, atol=1e-6,
                                       err_msg=f"d^{k}/dF^{k} log p")

    # -- predictions and tails ---------------------------------------------------------------------
    def test_class_probabilities_sum_to_one_and_match_log_predictive(self):
        lik = self._lik()
        if lik.task != "classification":
            pytest.skip("a regression likelihood has no class probabilities")
        _, mean, var = self._marginals(n=6)
        P = lik.predict_proba(mean, var)
        C = self._width() or 2
        assert P.shape == (6, C)
        assert np.all(P >= 0)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-9)
        for c in range(C):
            lp = lik.log_predictive(np.full(6, c), mean, var)
            np.testing.assert_allclose(np.exp(lp), P[:, c], rtol=1e-6, atol=1e-9)

    def test_log_predictive_is_the_tilted_normaliser(self):
        """``log p(y | data) = log int p(y|f) N(f|mean, var) df``: ``tilted`` at power one."""
        lik = self._lik()
        y, mean, var = self._marginals()
        np.testing.assert_allclose(lik.log_predictive(y, mean, var),
                                   lik.tilted(y, mean, var, 1.0).log_z, rtol=1e-6, atol=1e-9)

    def test_tails_without_nan(self):
        lik = self._lik()
        rng = np.random.default_rng(3)
        n = 8
        shape = self._shape(n)
        mean = rng.choice([-30.0, -8.0, 0.0, 8.0, 30.0], size=shape)
        var = rng.choice([1e-8, 1e-2, 1.0, 1e2, 1e4], size=shape)
        y = self._targets(n, rng)
        out = lik.tilted(y, mean, var)
        for arr in out:
            assert not np.any(np.isnan(arr)), out
        assert np.all(np.isfinite(out.log_z)) or lik.multiclass  # Heaviside argmax may be -inf
        lp = lik.log_predictive(y, mean, var)
        assert not np.any(np.isnan(lp))
        if lik.task == "classification":
            P = lik.predict_proba(mean, var)
            assert np.all(np.isfinite(P))
            # loose: the argmax trapezoid is documented to degrade (~6e-5 here) beyond standard-
            # deviation ratios of 2^8; moderate marginals are held to 1e-9 above
            np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-3)

    def test_pickles(self):
        lik = self._lik()
        y, mean, var = self._marginals()
        back = pickle.loads(pickle.dumps(lik))
        assert type(back) is type(lik)
        np.testing.assert_array_equal(back.tilted(y, mean, var).log_z,
                                      lik.tilted(y, mean, var).log_z)

    def test_bad_inputs_are_input_errors(self):
        lik = self._lik()
        y, mean, var = self._marginals()
        with pytest.raises(InputError):
            lik.tilted(y, mean, -var)
        bad = mean.copy()
        bad[0] = np.nan
        with pytest.raises(InputError):
            lik.tilted(y, bad, var)

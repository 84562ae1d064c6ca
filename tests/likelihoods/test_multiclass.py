"""Multi-class likelihoods: values against direct definitions, seeded Monte Carlo (tolerance from
the Monte Carlo standard error), scipy quadrature and closed forms; derivatives against finite
differences; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.special import log_ndtr, logsumexp
from scipy.stats import norm

from gpinfer.errors import InputError
from gpinfer.likelihoods import (
    ArgmaxNoise,
    BernoulliLogit,
    BernoulliProbit,
    MultinomialProbit,
    RobustMax,
    Softmax,
    argmax_factor_tilted,
    argmax_probability,
)
from gpinfer.testing import assert_gradient_close

pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")

#: Monte Carlo agreement within this many standard errors
MC_Z = 4.5

MEAN3 = np.array([[0.5, -0.3, 0.1], [-1.0, 0.8, 0.2], [2.0, 0.0, -1.5]])
VAR3 = np.array([[0.8, 1.5, 0.3], [0.4, 0.9, 2.0], [1.2, 0.2, 0.7]])
Y3 = np.array([0, 2, 1])


def mc_mean(values: np.ndarray) -> tuple[float, float]:
    """Sample mean and its standard error."""
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def assert_mc(estimate: float, values: np.ndarray, name: str = "") -> None:
    mean, se = mc_mean(values)
    assert abs(estimate - mean) <= MC_Z * se + 1e-12, (name, estimate, mean, se)


def sample_latents(rng, mean_row: np.ndarray, var_row: np.ndarray, n: int) -> np.ndarray:
    return mean_row + np.sqrt(var_row) * rng.standard_normal((n, mean_row.size))


def quad_argmax(mean_row, var_row, y) -> float:
    """``P(f_y > f_k for all k != y)`` by scipy quad over ``f_y`` (independent of the trapezoid)."""
    sd = np.sqrt(var_row)
    others = [k for k in range(mean_row.size) if k != y]

    def integrand(f):
        return norm.pdf(f, mean_row[y], sd[y]) * math.prod(norm.cdf((f - mean_row[k]) / sd[k]) for k in others)

    lo, hi = mean_row[y] - 14 * sd[y], mean_row[y] + 14 * sd[y]
    points = [mean_row[k] for k in others if lo < mean_row[k] < hi]
    return integrate.quad(integrand, lo, hi, points=points or None, epsabs=0, epsrel=1e-12, limit=400)[0]


# --------------------------------------------------------------------------------------------
# Pairwise probit factor (spec ep-sep §2.4)
# --------------------------------------------------------------------------------------------


def test_argmax_factor_tilted_vs_quadrature_and_fd():
    a_y, a_k = np.array([0.3, -2.0, 5.0]), np.array([-0.1, 1.0, 0.0])
    b_y, b_k = np.array([0.5, 2.0, 0.1]), np.array([1.0, 0.3, 4.0])
    out = argmax_factor_tilted(a_y, a_k, b_y, b_k)
    s = 0.4  # FITC/noise part of the variances, the rest is cavity variance of d = t_y - t_k
    for i in range(3):
        cav = b_y[i] + b_k[i] - s
        want = integrate.quad(
            lambda d, i=i, cav=cav: norm.cdf(d / math.sqrt(s)) * norm.pdf(d, a_y[i] - a_k[i], math.sqrt(cav)),
            -60, 60, points=[0.0, a_y[i] - a_k[i]], epsabs=0, epsrel=1e-12,
        )[0]
        assert out.log_z[i] == pytest.approx(math.log(want), rel=1e-10)
    assert_gradient_close(lambda a: argmax_factor_tilted(a, a_k, b_y, b_k).log_z.sum(), out.dlogz_da, a_y)
    assert_gradient_close(lambda a: argmax_factor_tilted(a_y, a, b_y, b_k).log_z.sum(), -out.dlogz_da, a_k)
    assert_gradient_close(lambda b: argmax_factor_tilted(a_y, a_k, b, b_k).log_z.sum(), out.dlogz_db, b_y)
    assert_gradient_close(lambda b: argmax_factor_tilted(a_y, a_k, b_y, b).log_z.sum(), out.dlogz_db, b_k)
    assert_gradient_close(lambda a: -argmax_factor_tilted(a, a_k, b_y, b_k).dlogz_da.sum(), out.gamma, a_y)
    np.testing.assert_allclose(out.gamma, out.dlogz_da**2 - 2 * out.dlogz_db, rtol=1e-9)
    z = b_y + b_k
    assert np.all((out.gamma > 0) & (out.gamma < 1 / z))


def test_argmax_factor_tilted_is_binary_probit():
    """Spec ep-sep O14(c): the factor is a binary probit of t_y - t_k with noise s."""
    a_y, a_k, v_y, v_k, s = 0.7, -0.2, 0.5, 1.3, 0.8
    out = argmax_factor_tilted(a_y, a_k, v_y + 0.5 * s, v_k + 0.5 * s)
    binary = BernoulliProbit().tilted(np.array([1]), np.array([(a_y - a_k) / math.sqrt(s)]), np.array([(v_y + v_k) / s]))
    assert float(out.log_z) == pytest.approx(binary.log_z[0], rel=1e-14)
    assert float(out.dlogz_da) == pytest.approx(binary.dlogz_dmean[0] / math.sqrt(s), rel=1e-13)


def test_argmax_factor_tilted_extreme_arguments():
    """Spec ep-sep O19: alpha = -40, +40, -1e4 give finite values and gamma z to ~1e-12."""
    for alpha in [-40.0, 40.0, -1e4]:
        out = argmax_factor_tilted(alpha, 0.0, 0.5, 0.5)
        assert all(np.isfinite(v) for v in out)
        if alpha < 0:
            u = alpha**-2
            expected = 1 - u + 6 * u**2 - 50 * u**3 + 518 * u**4 - 6354 * u**5
            assert float(out.gamma) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(InputError):
        argmax_factor_tilted(0.0, 0.0, -1.0, 0.5)


# --------------------------------------------------------------------------------------------
# Argmax probability (spec ep-sep §2.10, §3.2)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [1e-4, 1e-2, 1.0, 1e2])
def test_argmax_probability_two_classes_closed_form(ratio):
    """Spec ep-sep O14(a), including very unequal variances and far tails."""
    dm = np.array([-40.0, -5.0, 0.0, 0.7, 3.0, 30.0])
    mean = np.stack([dm, np.zeros_like(dm)], axis=1)
    var = np.tile([1.0, ratio], (dm.size, 1))
    for y, sign in ((0, 1.0), (1, -1.0)):
        out = argmax_probability(mean, var, np.full(dm.size, y))
        np.testing.assert_allclose(out.log_p, log_ndtr(sign * dm / math.sqrt(1 + ratio)), rtol=1e-10, atol=1e-13)


def test_argmax_probability_vs_quad_and_monte_carlo():
    rng = np.random.default_rng(0)
    mean = np.vstack([MEAN3, [[-3.0, 2.0, 2.5]]])
    var = np.vstack([VAR3, [[0.01, 4.0, 0.5]]])
    y = np.array([0, 2, 1, 0])
    out = argmax_probability(mean, var, y)
    for i in range(4):
        assert math.exp(out.log_p[i]) == pytest.approx(quad_argmax(mean[i], var[i], y[i]), rel=1e-9)
        F = sample_latents(rng, mean[i], var[i], 200_000)
        assert_mc(math.exp(out.log_p[i]), (F.argmax(axis=1) == y[i]).astype(float), f"row {i}")


def test_argmax_probability_derivatives_vs_fd():
    mean = np.array([[0.5, -0.3, 0.1, 1.0], [-1.0, 0.8, 0.2, -0.4]])
    var = np.array([[0.8, 1.7, 0.3, 0.45], [0.4, 0.9, 2.3, 0.6]])
    y = np.array([3, 0])
    out = argmax_probability(mean, var, y)
    assert_gradient_close(lambda m: argmax_probability(m, var, y).log_p.sum(), out.dmean, mean)
    assert_gradient_close(lambda v: argmax_probability(mean, v, y).log_p.sum(), out.dvar, var)


def test_argmax_probability_tail_is_accurate():
    """A hopeless class keeps an accurate log P (mode-centred window): compare with C = 2."""
    mean = np.array([[-30.0, 0.0, -60.0]])
    var = np.array([[1.0, 2.0, 0.5]])
    out = argmax_probability(mean, var, np.array([0]))
    two = log_ndtr(-30.0 / math.sqrt(3.0))
    assert out.log_p[0] == pytest.approx(two, rel=1e-10)


# --------------------------------------------------------------------------------------------
# ArgmaxNoise and MultinomialProbit
# --------------------------------------------------------------------------------------------


def test_noise_free_argmax():
    lik = ArgmaxNoise()
    F = np.array([[1.0, 0.0, -1.0], [0.0, 2.0, 1.0]])
    np.testing.assert_array_equal(lik.log_prob(np.array([0, 0]), F), [0.0, -np.inf])
    t1 = lik.tilted(Y3, MEAN3, VAR3)
    t_half = lik.tilted(Y3, MEAN3, VAR3, power=0.5)  # p in {0, 1}: p^a = p
    for a, b in zip(t1, t_half):
        np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(t1.log_z, argmax_probability(MEAN3, VAR3, Y3).log_p)
    with pytest.raises(InputError, match="RobustMax"):
        lik.expected_log_prob(Y3, MEAN3, VAR3)
    P = lik.predict_proba(MEAN3, VAR3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)


def test_predict_proba_rows_sum_to_one_unequal_variances():
    """Spec ep-sep O15: rows sum to one within 1e-8 for variance ratios up to 1e6."""
    rng = np.random.default_rng(5)
    mean = rng.normal(size=(30, 4)) * 3
    var = np.exp(rng.uniform(np.log(1e-3), np.log(1e3), size=(30, 4)))
    for lik in (ArgmaxNoise(), RobustMax(), MultinomialProbit()):
        P = lik.predict_proba(mean, var)
        assert P.shape == (30, 4)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-8)
        assert np.all((P >= 0) & (P <= 1))  # may underflow to 0 where log p < -745
        for c in range(4):
            log_p = lik.log_predictive(np.full(30, c), mean, var)
            assert np.all(np.isfinite(log_p))
            ok = P[:, c] > 1e-300
            np.testing.assert_allclose(log_p[ok], np.log(P[ok, c]), rtol=1e-9, atol=1e-12)


def test_multinomial_probit_log_prob_vs_definition():
    """log p(y|f) = log P(argmax(f + eps) = y) against quad and a seeded Monte Carlo over eps."""
    rng = np.random.default_rng(1)
    lik = MultinomialProbit(noise_variance=np.array([1.0, 0.5, 2.0]))
    F = np.array([[0.3, -0.2, 0.5], [2.0, -1.0, 0.0]])
    y = np.array([1, 0])
    logp = lik.log_prob(y, F)
    noise = np.array([1.0, 0.5, 2.0])
    for i in range(2):
        assert math.exp(logp[i]) == pytest.approx(quad_argmax(F[i], noise, y[i]), rel=1e-9)
        eps = rng.standard_normal((200_000, 3)) * np.sqrt(noise)
        assert_mc(math.exp(logp[i]), ((F[i] + eps).argmax(axis=1) == y[i]).astype(float))


def test_multinomial_probit_tilted_and_expected_vs_monte_carlo():
    rng = np.random.default_rng(2)
    lik = MultinomialProbit()
    t1, t_half = lik.tilted(Y3, MEAN3, VAR3), lik.tilted(Y3, MEAN3, VAR3, power=0.5)
    expected = lik.expected_log_prob(Y3, MEAN3, VAR3)
    for i in range(3):
        # power one: p(y) = P(argmax(f + eps) = y), f ~ N(mean, var), eps ~ N(0, I)
        F = sample_latents(rng, MEAN3[i], VAR3[i] + 1.0, 200_000)
        assert_mc(math.exp(t1.log_z[i]), (F.argmax(axis=1) == Y3[i]).astype(float), "Z")
        G = sample_latents(rng, MEAN3[i], VAR3[i], 20_000)
        logp = lik.log_prob(np.full(G.shape[0], Y3[i]), G)
        assert_mc(math.exp(t_half.log_z[i]), np.exp(0.5 * logp), "Z^0.5")
        assert_mc(expected.value[i], logp, "E log p")


def test_multinomial_probit_derivatives_vs_fd():
    lik = MultinomialProbit()
    y, mean, var = Y3[:2], MEAN3[:2], VAR3[:2]
    t = lik.tilted(y, mean, var, power=0.5)
    assert_gradient_close(lambda m: lik.tilted(y, m, var, 0.5).log_z.sum(), t.dlogz_dmean, mean, rtol=1e-5)
    assert_gradient_close(lambda v: lik.tilted(y, mean, v, 0.5).log_z.sum(), t.dlogz_dvar, var, rtol=1e-5)
    e = lik.expected_log_prob(y, mean, var)
    assert_gradient_close(lambda m: lik.expected_log_prob(y, m, var).value.sum(), e.dmean, mean, rtol=1e-5)
    assert_gradient_close(lambda v: lik.expected_log_prob(y, mean, v).value.sum(), e.dvar, var, rtol=1e-5)
    t1 = lik.tilted(y, mean, var)
    assert_gradient_close(lambda v: lik.tilted(y, mean, v).log_z.sum(), t1.dlogz_dvar, var)


def test_argmax_noise_parameter_checks():
    with pytest.raises(InputError):
        ArgmaxNoise(noise_variance=-1.0)
    with pytest.raises(InputError, match="all classes"):
        ArgmaxNoise(noise_variance=np.array([0.0, 1.0, 1.0]))
    with pytest.raises(InputError):
        MultinomialProbit(noise_variance=0.0)
    with pytest.raises(InputError, match="classes"):
        ArgmaxNoise(noise_variance=np.ones(4)).tilted(Y3, MEAN3, VAR3)


# --------------------------------------------------------------------------------------------
# RobustMax (spec ep-sep §3.2)
# --------------------------------------------------------------------------------------------


def test_robustmax_values():
    rng = np.random.default_rng(3)
    eps, C = 1e-3, 3
    lik = RobustMax(epsilon=eps)
    a, b = math.log(1 - eps + eps / C), math.log(eps / C)
    F = np.array([[1.0, 0.0, -1.0], [0.0, 2.0, 1.0]])
    np.testing.assert_allclose(lik.log_prob(np.array([0, 0]), F), [a, b])
    expected = lik.expected_log_prob(Y3, MEAN3, VAR3)
    t1, t_half = lik.tilted(Y3, MEAN3, VAR3), lik.tilted(Y3, MEAN3, VAR3, power=0.5)
    P = np.exp(argmax_probability(MEAN3, VAR3, Y3).log_p)
    np.testing.assert_allclose(expected.value, b + P * (a - b), rtol=1e-13)
    np.testing.assert_allclose(np.exp(t1.log_z), (1 - eps) * P + eps / C, rtol=1e-13)
    np.testing.assert_allclose(lik.log_predictive(Y3, MEAN3, VAR3), t1.log_z)
    for i in range(3):
        G = sample_latents(rng, MEAN3[i], VAR3[i], 200_000)
        logp = np.where(G.argmax(axis=1) == Y3[i], a, b)
        assert_mc(expected.value[i], logp, "E log p")
        assert_mc(math.exp(t_half.log_z[i]), np.exp(0.5 * logp), "Z^0.5")
    Pp = lik.predict_proba(MEAN3, VAR3)
    np.testing.assert_allclose(Pp.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(Pp >= eps / C)


@pytest.mark.parametrize("make", [RobustMax, Softmax])
def test_derivatives_vs_fd(make):
    lik = make()
    for power in (1.0, 0.5):
        t = lik.tilted(Y3, MEAN3, VAR3, power)
        assert_gradient_close(lambda m, p=power: lik.tilted(Y3, m, VAR3, p).log_z.sum(), t.dlogz_dmean, MEAN3)
        assert_gradient_close(lambda v, p=power: lik.tilted(Y3, MEAN3, v, p).log_z.sum(), t.dlogz_dvar, VAR3)
    e = lik.expected_log_prob(Y3, MEAN3, VAR3)
    assert_gradient_close(lambda m: lik.expected_log_prob(Y3, m, VAR3).value.sum(), e.dmean, MEAN3)
    assert_gradient_close(lambda v: lik.expected_log_prob(Y3, MEAN3, v).value.sum(), e.dvar, VAR3)


def test_robustmax_epsilon_out_of_range():
    with pytest.raises(InputError):
        RobustMax(epsilon=1.5)


# --------------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------------


def test_softmax_log_prob_vs_direct():
    F = np.array([[1.0, 0.0, -1.0], [500.0, 2.0, 1.0], [-800.0, 0.0, 3.0]])
    y = np.array([0, 2, 0])
    want = [F[i, y[i]] - logsumexp(F[i]) for i in range(3)]
    np.testing.assert_allclose(Softmax().log_prob(y, F), want, rtol=1e-14)


def test_softmax_three_classes_vs_monte_carlo():
    rng = np.random.default_rng(4)
    lik = Softmax()
    t1, t_half = lik.tilted(Y3, MEAN3, VAR3), lik.tilted(Y3, MEAN3, VAR3, power=0.5)
    expected = lik.expected_log_prob(Y3, MEAN3, VAR3)
    P = lik.predict_proba(MEAN3, VAR3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-13)
    for i in range(3):
        G = sample_latents(rng, MEAN3[i], VAR3[i], 200_000)
        logp = G[:, Y3[i]] - logsumexp(G, axis=1)
        assert_mc(math.exp(t1.log_z[i]), np.exp(logp), "Z")
        assert_mc(math.exp(t_half.log_z[i]), np.exp(0.5 * logp), "Z^0.5")
        assert_mc(expected.value[i], logp, "E log p")
        # Stein/Price derivatives: d log Z / d mean_c = E~[delta_yc - p_c]
        probs = np.exp(G - logsumexp(G, axis=1, keepdims=True))
        weights = np.exp(logp)
        grad = ((np.eye(3)[Y3[i]] - probs) * weights[:, None]).mean(axis=0) / weights.mean()
        np.testing.assert_allclose(t1.dlogz_dmean[i], grad, atol=MC_Z * 0.01)
        np.testing.assert_allclose(P[i], probs.mean(axis=0), atol=MC_Z * probs.std(axis=0).max() / math.sqrt(2e5))


def test_softmax_three_classes_vs_dense_quadrature():
    """Two-dimensional reference: an independent high-order rule (order 200) on the same subspace."""
    lik, ref = Softmax(), Softmax(gh_order=200)
    for a, b in zip(lik.tilted(Y3, MEAN3, VAR3), ref.tilted(Y3, MEAN3, VAR3)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(lik.expected_log_prob(Y3, MEAN3, VAR3), ref.expected_log_prob(Y3, MEAN3, VAR3)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_softmax_two_classes_is_the_logistic():
    mean = np.array([[0.5, -0.3], [-4.0, 2.0], [1.0, 1.5]])
    var = np.array([[0.8, 1.5], [30.0, 5.0], [0.1, 0.2]])
    y = np.array([0, 1, 0])
    lik = Softmax()
    t, e = lik.tilted(y, mean, var, power=0.5), lik.expected_log_prob(y, mean, var)
    rows = np.arange(3)
    d_mean, d_var = mean[rows, y] - mean[rows, 1 - y], var.sum(axis=1)
    logit = BernoulliLogit()
    tb = logit.tilted(np.ones(3, int), d_mean, d_var, power=0.5)
    np.testing.assert_allclose(t.log_z, tb.log_z, rtol=1e-14)
    np.testing.assert_allclose(t.dlogz_dmean[rows, y], tb.dlogz_dmean, rtol=1e-14)
    np.testing.assert_allclose(t.dlogz_dmean[rows, 1 - y], -tb.dlogz_dmean, rtol=1e-14)
    np.testing.assert_allclose(t.dlogz_dvar, np.repeat(tb.dlogz_dvar[:, None], 2, axis=1), rtol=1e-14)
    eb = logit.expected_log_prob(np.ones(3, int), d_mean, d_var)
    np.testing.assert_allclose(e.value, eb.value, rtol=1e-14)
    # the generic Gauss-Hermite path agrees where Gauss-Hermite is accurate (moderate variance)
    gh = Softmax(gh_order=120)._gh_tilted(y[[0, 2]], mean[[0, 2]], var[[0, 2]], 0.5)
    np.testing.assert_allclose(gh.log_z, t.log_z[[0, 2]], rtol=1e-9)
    np.testing.assert_allclose(gh.dlogz_dvar, t.dlogz_dvar[[0, 2]], rtol=1e-7)
    P = lik.predict_proba(mean, var)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-14)
    np.testing.assert_allclose(P[rows, y], np.exp(lik.log_predictive(y, mean, var)), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lik", [ArgmaxNoise(), MultinomialProbit(), RobustMax(), Softmax()])
def test_bad_input(lik):
    with pytest.raises(InputError, match="0..2"):
        lik.tilted(np.array([0, 3, 1]), MEAN3, VAR3)
    with pytest.raises(InputError, match="shape"):
        lik.tilted(Y3[:2], MEAN3, VAR3)
    with pytest.raises(InputError, match="same shape"):
        lik.expected_log_prob(Y3, MEAN3, VAR3[:, :2])
    with pytest.raises(InputError, match="shape"):
        lik.predict_proba(MEAN3[:, 0], VAR3[:, 0])
    with pytest.raises(InputError, match="at least 2"):
        lik.log_prob(np.zeros(3, int), MEAN3[:, :1])
    with pytest.raises(InputError, match="non-negative"):
        lik.tilted(Y3, MEAN3, -VAR3)
    with pytest.raises(InputError, match="power"):
        lik.tilted(Y3, MEAN3, VAR3, power=-0.5)
    assert lik.multiclass and lik.n_latent(5) == 5


def test_argmax_log_probability_is_argmax_probability_without_derivatives():
    """Prediction's derivative-free rule gives the same log P, bit for bit, over refinement
    levels from 0 to the maximum (standard-deviation ratios up to e^4)."""
    from gpinfer.likelihoods.multiclass import argmax_log_probability

    rng = np.random.default_rng(0)
    mean = 3.0 * rng.normal(size=(400, 6))
    var = np.exp(2.0 * rng.normal(size=(400, 6)))
    y = rng.integers(0, 6, 400)
    np.testing.assert_array_equal(argmax_log_probability(mean, var, y),
                                  argmax_probability(mean, var, y).log_p)


def _unequal_variance_rows(seed: int, n: int = 300, C: int = 6) -> tuple:
    """Rows over every refinement level (standard-deviation ratios up to ~e^5), some with a
    very probable and some with a very improbable label."""
    rng = np.random.default_rng(seed)
    mean = 3.0 * rng.normal(size=(n, C))
    var = np.exp(2.5 * rng.normal(size=(n, C)))
    return mean, var, rng.integers(0, C, n)


def test_pruned_nodes_give_the_full_rule_to_round_off():
    """``prune=True`` (predictions) sums only the nodes ``_kept_nodes`` keeps: the same log P
    as the full trapezoid rule to round-off, on rows at every refinement level, while it
    drops most of the fine nodes of the refined rows."""
    from gpinfer.likelihoods.multiclass import (
        _argmax_plan,
        _kept_nodes,
        argmax_log_probability,
    )

    mean, var, y = _unequal_variance_rows(3)
    full = argmax_log_probability(mean, var, y)
    pruned = argmax_log_probability(mean, var, y, prune=True)
    np.testing.assert_allclose(pruned, full, rtol=1e-14, atol=1e-15)
    assert np.mean(pruned < -1e-3) > 0.5  # mostly rows with a non-trivial log P
    _, c, _, levels = _argmax_plan(mean, var, y)
    fine = [(idx, step, center) for idx, _, step, center in levels if step < 0.25]
    assert fine  # the data reach the refined levels
    kept = total = 0
    for idx, step, center in fine:
        first, last = _kept_nodes(c.d[idx], c.rho[idx], center, step)
        kept += int(np.sum(last - first + 1))
        total += idx.size * (2 * int(round(12.0 / step)) + 1)
    assert kept < 0.6 * total


def test_kept_nodes_hold_the_peak_of_every_row():
    """The kept range contains every node within ``ARGMAX_NEGLIGIBLE_NATS`` of the row's
    largest log integrand (the full grid evaluated as the oracle)."""
    from gpinfer.likelihoods.multiclass import _argmax_nodes, _argmax_plan, _kept_nodes
    from gpinfer.numerics import settings

    mean, var, y = _unequal_variance_rows(4, n=120)
    _, c, _, levels = _argmax_plan(mean, var, y)
    for idx, _, step, center in levels:
        if step >= settings.ARGMAX_BASE_STEP:
            continue
        _, _, lam, _ = _argmax_nodes(c.d[idx], c.rho[idx], center, step)
        first, last = _kept_nodes(c.d[idx], c.rho[idx], center, step)
        heavy = lam >= lam.max(axis=1, keepdims=True) - settings.ARGMAX_NEGLIGIBLE_NATS + 1.0
        nodes = np.arange(lam.shape[1])[None, :]
        assert np.all(~heavy | ((nodes >= first[:, None]) & (nodes <= last[:, None])))


def test_class_probabilities_in_one_call_equal_the_per_class_rule():
    """``predict_proba`` (every class's rows in one pruned call) equals the per-class full
    rule to round-off, and ``log_predictive`` equals the tilted ``log Z`` to round-off."""
    from gpinfer.likelihoods.multiclass import argmax_log_probability

    mean, var, y = _unequal_variance_rows(5, n=100, C=5)
    per_class = np.stack([np.exp(argmax_log_probability(mean, var, np.full(100, c)))
                          for c in range(5)], axis=1)
    lik = ArgmaxNoise()
    np.testing.assert_allclose(lik.predict_proba(mean, var), per_class, rtol=1e-13,
                               atol=1e-300)
    np.testing.assert_allclose(lik.log_predictive(y, mean, var),
                               lik.tilted(y, mean, var).log_z, rtol=1e-14, atol=1e-15)
    robust = RobustMax()
    np.testing.assert_allclose(robust.predict_proba(mean, var),
                               (1 - robust.epsilon) * per_class + robust.epsilon / 5,
                               rtol=1e-13)


def _class_probability_suite():
    """Generated (name, mean, var) ``[B, C]`` cases: sizes ``B`` 1..5000, ``C`` 2..20, variance
    ratios up to 1e6, means far apart and nearly tied."""
    rng = np.random.default_rng(11)
    for B, C, kind in [(1, 2, "plain"), (5000, 2, "plain"), (700, 3, "plain"), (60, 20, "plain"),
                       (40, 4, "ratio"), (200, 6, "far"), (200, 5, "tied"), (30, 20, "tied"),
                       (100, 3, "far ratio")]:
        mean = 1.5 * rng.normal(size=(B, C))
        var = np.exp(rng.uniform(np.log(0.18), np.log(1.3), size=(B, C)))
        if "ratio" in kind:  # standard deviations over three decades: variance ratios to 1e6
            var = np.exp(rng.uniform(-3.0, 3.0, size=(B, C)) * np.log(10.0))
        if "far" in kind:
            mean = 30.0 * rng.normal(size=(B, C))
        if kind == "tied":
            mean = mean[:, :1] + 1e-9 * rng.normal(size=(B, C))
        yield f"{B}x{C} {kind}", mean, var


def test_class_probabilities_match_the_per_class_rule_on_a_generated_suite():
    """``argmax_class_probabilities`` (pruned, every class in one call) equals the full
    per-class rule to 1e-12 on every generated case, and each row sums to one to 1e-12 (the
    rule against the truth: the classes' probabilities partition the outcome)."""
    from gpinfer.likelihoods.multiclass import argmax_class_probabilities, argmax_log_probability

    for name, mean, var in _class_probability_suite():
        B, C = mean.shape
        P = argmax_class_probabilities(mean, var)
        assert P.shape == (B, C), name
        per_class = np.stack([np.exp(argmax_log_probability(mean, var, np.full(B, c)))
                              for c in range(C)], axis=1)
        np.testing.assert_allclose(P, per_class, rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12, err_msg=name)


def test_reach_holds_the_peak_of_every_row_at_every_level():
    """``_reach`` (the nodes within ``sqrt(2 ARGMAX_NEGLIGIBLE_NATS)`` of the mode) contains
    every node within ``ARGMAX_NEGLIGIBLE_NATS`` of the row's largest log integrand, on every
    refinement level (the full grid evaluated as the oracle), and drops some nodes."""
    from gpinfer.likelihoods.multiclass import _argmax_nodes, _argmax_plan, _reach
    from gpinfer.numerics import settings

    mean, var, y = _unequal_variance_rows(6, n=120)
    _, c, _, levels = _argmax_plan(mean, var, y)
    assert len(levels) > 2
    for idx, _, step, center in levels:
        _, _, lam, _ = _argmax_nodes(c.d[idx], c.rho[idx], center, step)
        lo, hi = _reach(step)
        heavy = lam >= lam.max(axis=1, keepdims=True) - settings.ARGMAX_NEGLIGIBLE_NATS
        nodes = np.arange(lam.shape[1])
        assert not np.any(heavy[:, (nodes < lo) | (nodes > hi)])
        assert 0 < lo and hi < lam.shape[1] - 1


def test_argmax_mode_is_stationary_when_rows_stop_on_their_own():
    """The mode (numpy: each row stops iterating at its own convergence) is a zero of
    ``h'(t) = -t + sum_k rho_k r(d_k + rho_k t)`` to the Newton tolerance, on rows at every
    refinement level including those that converge last."""
    from gpinfer.likelihoods.multiclass import _argmax_mode, label_contrasts
    from gpinfer.numerics.normal import inv_mills, probit_curvature

    mean, var, y = _unequal_variance_rows(8, n=400)
    c = label_contrasts(mean, var, y)
    t = _argmax_mode(c.d, c.rho)
    z = c.d + c.rho * t[:, None]
    grad = -t + np.sum(c.rho * inv_mills(z), axis=1)
    curv = 1.0 + np.sum(c.rho ** 2 * probit_curvature(z), axis=1)
    assert np.all(np.abs(grad / curv) <= 1e-7 * (1.0 + np.abs(t)))


def test_argmax_factor_tilted_without_the_variance_slope():
    """``slope_b=False`` (a site update's call): no ``dlogz_db``, every other field the same
    bits."""
    rng = np.random.default_rng(3)
    a_y, a_k = rng.normal(size=(2, 6, 4))
    b_y, b_k = rng.uniform(0.1, 2.0, size=(2, 6, 4))
    full = argmax_factor_tilted(a_y, a_k, b_y, b_k)
    cut = argmax_factor_tilted(a_y, a_k, b_y, b_k, slope_b=False)
    assert cut.dlogz_db is None and full.dlogz_db is not None
    for name in ("log_z", "dlogz_da", "gamma"):
        np.testing.assert_array_equal(getattr(cut, name), getattr(full, name))

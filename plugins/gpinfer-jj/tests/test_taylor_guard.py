"""vi-taylor's Stage 2 cannot run away (issue 27, item 1).

On imbalanced, nearly separable data vi-taylor's objective climbed to +1e14 and the kernel ran to
its bounds while the model fell back to the class frequencies. The mechanism, reproduced here on
1000-2000 generated points: whenever Stage 1 lags behind its Newton fixed point, some expansion
points ``xi`` sit on the wrong side of their labels; each such Taylor site has a maximum of
about ``e^{|xi|} / 2`` nats, so the collapsed surrogate at fixed ``xi`` is positive and Stage 2
climbs it without limit (its L-BFGS-B leaps the kernel into a region where the next Stage 1
lags further). The guard keeps only those Stage-2 steps, inside a trust region, whose ``q(u)``
has an ELBO (a true lower bound on ``log p(y)``) that does not fall.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
from gpinfer_jj.bound import CollapsedObjective
from gpinfer_jj.method import ViJJHybrid, ViTaylor
from gpinfer_jj.quadratic import (
    CollapsedBound,
    inducing_factors,
    jj_coefficients,
    site_elbo,
    taylor_coefficients,
)
from gpinfer_jj.taylor import (
    GUARD_HALVINGS,
    GuardedStep,
    MapObjective,
    closed_form_elbo,
    guarded_step,
    newton_rounds,
)

from gpinfer.data.generators import stress_binary
from gpinfer.errors import NumericalError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF
from gpinfer.likelihoods import BernoulliLogit
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.optim import LBFGSB

LOG_BOUNDS = (float(np.log(1e-4)), float(np.log(1e6)))


def _standardised(n: int, ratio: float, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """``X [n, 3]`` (standardised) and ``y [n]`` of a generated skin-like stress set."""
    ds = stress_binary(n, ratio, layout, seed=0)
    return (ds.X - ds.X.mean(0)) / ds.X.std(0), ds.y


@pytest.fixture(scope="module")
def taylor_objective():
    """The Taylor objective on 2000 points (1:5, a curved tube of positives), its DTC-Laplace
    mode ``xi`` at length-scale 1, variance 100."""
    X, y = _standardised(2000, 5.0, "tube")
    s = 2.0 * y - 1.0
    Z = X[np.random.default_rng(0).choice(X.shape[0], 30, replace=False)]
    kernel = RBF(lengthscale=1.0, variance=100.0)
    hp = HyperParameters(kernel, Z=Z, optimize_inducing=False)
    obj = CollapsedObjective("taylor", X, s, kernel, Z, BernoulliLogit(), hp)
    fac = obj.factors()
    taylor = MapObjective(s, LOGISTIC)
    start = taylor.point(np.zeros(Z.shape[0]), np.zeros(X.shape[0]))
    mode = newton_rounds(taylor, fac, lambda x: obj.bound(x, fac), start, 15)
    return obj, hp.pack(), mode.xi


def test_elbo_of_q_is_a_true_bound_above_the_jj_elbo(taylor_objective):
    """The guard's quantity is the ELBO of the closed-form q(u): never above 0, and above the
    JJ site ELBO of the same q(u) for any xi (the JJ sites bound log sig pointwise)."""
    obj, _, xi = taylor_objective
    b = obj.bound(xi)
    elbo = closed_form_elbo(b, obj.likelihood, obj.labels)
    assert elbo < 0.0
    for xi_jj in (np.sqrt(b.m_hat**2 + b.S2_hat), np.ones_like(xi)):
        jj = site_elbo(b.factors, jj_coefficients(xi_jj, obj.s), b.mu_hat, b.Sigma_hat)
        assert elbo >= jj - 1e-8 * abs(jj)


def test_elbo_of_q_matches_the_uncollapsed_elbo(taylor_objective):
    """``closed_form_elbo`` against the shared uncollapsed ELBO (dense ``Sigma_hat``, its own
    quadrature) of the same ``q(u)``, on 300 of the points."""
    svi = pytest.importorskip("gpinfer_svi.variational",
                              reason="the svi plugin's uncollapsed ELBO is the oracle")
    obj, _, xi = taylor_objective
    rows = slice(0, 300)
    fac = inducing_factors(obj.factors().Kuu, obj.factors().Kuf[:, rows],
                          obj.factors().Kff_diag[rows])
    b = CollapsedBound(fac, taylor_coefficients(xi[rows], obj.s[rows], LOGISTIC))
    labels = (obj.s[rows] > 0).astype(np.int64)
    oracle = svi.uncollapsed_elbo([fac.Kuu], [fac.Kuf], fac.Kff_diag[None], b.mu_hat[None],
                                  np.linalg.cholesky(b.Sigma_hat)[None],
                                  svi.likelihood_expectation(BernoulliLogit(), labels)).value
    assert closed_form_elbo(b, obj.likelihood, labels) == pytest.approx(oracle, rel=1e-6)


def test_lagging_sites_let_the_surrogate_climb_and_the_guard_refuses(taylor_objective):
    """The mechanism: 5 % of the expansion points on the wrong side of their labels (as Stage 1
    leaves them when it lags) make the surrogate positive, and Stage 2 as before climbs it;
    the guard refuses every fraction of that step."""
    obj, theta0, mode_xi = taylor_objective
    hp, s = obj.hp, obj.s
    xi = mode_xi.copy()
    wrong = np.random.default_rng(1).choice(xi.size, xi.size // 20, replace=False)
    xi[wrong] = -8.0 * s[wrong]
    hp.unpack(theta0)
    start = obj.bound(xi)
    start_value, start_elbo = start.value, closed_form_elbo(start, obj.likelihood, obj.labels)
    old = LBFGSB(bounds=hp.bounds(kernel=LOG_BOUNDS), maxfun=5).maximize(
        lambda t: obj.value_and_grad(t, xi), theta0, max_iter=50)
    assert start_value > 0.0 and old.value > start_value  # the surrogate of a log-lik climbs

    def bound_at(theta):
        hp.unpack(theta)
        return obj.bound(xi)

    step = guarded_step(bound_at, lambda b: closed_form_elbo(b, obj.likelihood, obj.labels),
                        theta0, old.x, start_elbo, 1e-4 * abs(start_elbo), 1e-5)
    assert step.refused and np.array_equal(step.theta, theta0)
    hp.unpack(theta0)


class _Toy(NamedTuple):
    """A stand-in bound at the one parameter ``t``: ``value = surrogate(t)``."""

    t: float
    surrogate: Callable[[float], float]

    @property
    def value(self) -> float:
        return float(self.surrogate(self.t))


def _toy_guard(theta0: float, proposal: float, surrogate: Callable[[float], float],
               elbo: Callable[[float], float], start_elbo: float = -10.0) -> GuardedStep:
    """``guarded_step`` on a one-parameter toy with the given surrogate and ELBO."""
    return guarded_step(lambda t: _Toy(float(t[0]), surrogate),  # type: ignore[arg-type,return-value]
                        lambda b: elbo(b.t),  # type: ignore[attr-defined]
                        np.array([theta0]), np.array([proposal]), start_elbo, 1e-3, 1e-6)


def test_guard_keeps_a_sound_step_whole_and_halves_a_bad_one():
    """A step that keeps the surrogate <= 0 and raises the ELBO is kept as proposed; one whose
    ELBO falls beyond the slack at full length but not at half is halved once; a step whose
    surrogate stays above 0 (or whose ELBO falls however short) is refused."""
    step = _toy_guard(0.0, 1.0, lambda t: -5.0 + t, lambda t: -10.0 + t)
    assert not step.refused and step.halvings == 0 and step.theta[0] == 1.0
    assert step.value == -4.0 and step.elbo == -9.0
    step = _toy_guard(0.0, 1.0, lambda t: -5.0 + t, lambda t: -10.0 + t - 2.0 * t**2)
    assert not step.refused and step.halvings == 1 and step.theta[0] == 0.5
    step = _toy_guard(0.0, 1.0, lambda t: 1.0 + t, lambda t: -10.0 + t)
    assert step.refused and step.theta[0] == 0.0 and np.isnan(step.value)
    step = _toy_guard(0.0, 1.0, lambda t: -5.0 + t, lambda t: -10.0 - t)
    assert step.refused and step.halvings == GUARD_HALVINGS + 1


def _fit(cls, X, y, guard: bool | None = None, max_iter: int = 15):
    """A fit from a poor start (length-scale 0.3, variance 1e4, as a far Stage-2 step leaves
    the kernel): ``(objectives, accuracy, NLL)`` on the training points."""
    options = {} if guard is None else {"guard": guard}
    problem = Problem(X=X, y=y, n_classes=2, kernel=RBF(lengthscale=0.3, variance=1e4),
                      likelihood=BernoulliLogit(), inducing=20, max_iter=max_iter,
                      rng=np.random.default_rng(0))
    seen: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = cls(lengthscale_init="kernel", **options).fit(problem, callback=seen.append)
    P = result.posterior.predict_proba(X)
    nll = -np.mean(np.log(np.clip(P[np.arange(y.size), y], 1e-300, 1.0)))
    return [i.objective for i in seen], np.mean(P.argmax(axis=1) == y), nll


@pytest.fixture(scope="module")
def runaway_data():
    return _standardised(1000, 5.0, "tube")


def test_unguarded_vi_taylor_runs_away(runaway_data):
    """The failure (so that the next test can fail): without the guard the surrogate passes
    +1e6 and the model falls back to the class frequencies (1:5)."""
    objectives, accuracy, _ = _fit(ViTaylor, *runaway_data, guard=False)
    assert max(objectives) > 1e6
    assert accuracy < 0.85


def test_vi_taylor_matches_vi_jj_hybrid_or_names_it(runaway_data):
    """Same start, with the guard: the surrogate never leaves (-inf, 0] and vi-taylor matches
    vi-jj-hybrid (accuracy within 0.005, NLL within 20 %), or refuses naming it."""
    X, y = runaway_data
    try:
        objectives, accuracy, nll = _fit(ViTaylor, X, y)
    except NumericalError as exc:
        assert "vi-jj-hybrid" in str(exc)
        return
    assert max(objectives) <= 0.0
    _, hybrid_accuracy, hybrid_nll = _fit(ViJJHybrid, X, y)
    assert accuracy >= hybrid_accuracy - 0.005
    assert nll <= 1.2 * hybrid_nll


def test_a_surrogate_left_above_zero_is_refused_naming_vi_jj_hybrid():
    with pytest.raises(NumericalError, match="vi-jj-hybrid") as info:
        ViTaylor()._refuse_runaway(12.5, 1000, 7)
    assert info.value.quantity == "taylor surrogate" and info.value.iteration == 7
    ViTaylor()._refuse_runaway(-3.0, 1000, 7)  # a negative surrogate passes


def test_trust_region_limits_each_stage2_step(runaway_data):
    """Each outer iteration moves every log kernel parameter by at most ``trust_radius``."""
    X, y = runaway_data
    problem = Problem(X=X, y=y, n_classes=2, kernel=RBF(lengthscale=0.3, variance=1e4),
                      likelihood=BernoulliLogit(), inducing=20, max_iter=4,
                      rng=np.random.default_rng(0))
    thetas: list = []
    method = ViTaylor(lengthscale_init="kernel", trust_radius=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        method.fit(problem, callback=lambda info: thetas.append(
            info.posterior().kernels[0].get_unconstrained().copy()))
    steps = np.abs(np.diff(np.array([np.log([0.3, 1e4])] + thetas), axis=0))
    assert steps.max() <= 0.5 + 1e-9

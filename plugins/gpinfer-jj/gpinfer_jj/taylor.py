"""Stage 1 of vi-taylor as a safeguarded Newton ascent on the projected-process MAP objective.

The Taylor rule ``xi <- m`` followed by ``q(u) <- (mu_hat, Sigma_hat)(xi)`` is exactly one Newton
step for the mode of ``Psi(mu) = sum_i log sig(s_i a_i^T mu) - 1/2 mu^T Kuu^-1 mu`` (spec
jj-taylor-svi §2.5). Undamped, Newton's method for a logistic mode can overshoot: once the
kernel amplitude is large (hundreds, which near-separable data with many points drives the
optimiser to), the steps stop converging, marginal means of wrongly classified points run to
-40 ... -100, and the Taylor sites expanded there reward ``theta`` without limit (each site's
maximum is about ``e^{|t|} / 2``). Stage 2 then climbs a surrogate that reaches ``+1e16``.

``newton_rounds`` keeps every step of the paper's rule but backtracks it (``1, 1/2, 1/4, ...``
of the step) until ``Psi`` rises by an Armijo fraction of its directional derivative, so the
means move monotonically uphill on ``Psi``. A full step is taken wherever it ascends, so the
fixed point (the DTC-Laplace mode, oracle T8) and every well-behaved path are unchanged.
Work per trial step: ``O(N)`` (``Psi`` is evaluated on the segment between two mean vectors).

Stage 2 (``guarded_step``). Backtracking keeps Stage 1 monotone but cannot stop Stage 2: on
nearly separable data the DTC-Laplace evidence keeps rising with the kernel amplitude, L-BFGS-B
moves the kernel further than the next ``n_upd`` Newton rounds can follow, the expansion points
left behind on the wrong side of their labels make the surrogate at fixed ``xi`` positive, and
Stage 2 climbs it without limit. The guard keeps a Stage-2 step (inside a trust region of
``TRUST_RADIUS`` on each log hyper-parameter) only where the surrogate is not above 0 and the
ELBO of its closed-form ``q(u)`` (``closed_form_elbo``, a true lower bound on ``log p(y)``,
never above 0) does not fall; else halves it, and after ``GUARD_HALVINGS`` refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gpinfer.interfaces import Array, Likelihood
from gpinfer.numerics.quadrature import LogSigmoid
from gpinfer.sites.stacked import StackedTerms
from gpinfer_jj.quadratic import CollapsedBound

#: sufficient-ascent fraction of the Armijo test
ARMIJO_FRACTION = 1e-4
#: most halvings of one Newton step before the round keeps its point
MAX_HALVINGS = 30
#: relative round-off allowance of the ascent test (``Psi`` sums ``N`` terms)
ROUND_OFF = 1e-12


class MapPoint(NamedTuple):
    """A point ``mu = L_K nu`` with whitened mean ``nu [M]``, marginal means ``m [N]``, ``Psi``."""

    nu: Array
    mean: Array
    value: float


class Stage1Result(NamedTuple):
    """``q(u) = (mu [M], Sigma [M, M])``, the last expansion point ``xi [N]`` and ``F(theta, xi)``;
    ``halvings``: the step halvings over all rounds (0 when every step was the paper's);
    ``point``: where the means ended (the start of a further round)."""

    mu: Array
    Sigma: Array
    xi: Array
    value: float
    halvings: int
    point: MapPoint | None = None


class MapObjective:
    """``Psi(nu) = sum_i log sig(s_i m_i) - 1/2 |nu|^2`` with ``m = R^T nu`` (whitened, §2.10)."""

    def __init__(self, s: Array, link: LogSigmoid):
        self.s = s
        self.link = link

    def point(self, nu: Array, mean: Array) -> MapPoint:
        (log_lik,) = self.link.derivatives(self.s * mean, 0)
        return MapPoint(nu, mean, float(np.sum(log_lik) - 0.5 * nu @ nu))

    def slope(self, at: MapPoint, d_nu: Array, d_mean: Array) -> float:
        """Directional derivative of ``Psi`` at ``at`` along ``(d_nu [M], d_mean [N])``."""
        _, d1 = self.link.derivatives(self.s * at.mean, 1)
        return float(np.sum(self.s * d1 * d_mean) - at.nu @ d_nu)


def newton_rounds(
    map_objective: MapObjective,
    factors: StackedTerms,
    bound: Callable[[Array], CollapsedBound],
    start: MapPoint,
    n_rounds: int,
    first_step: float = 1.0,
) -> Stage1Result:
    """``n_rounds`` backtracked Taylor-Newton steps from ``start`` at fixed kernel matrices.

    ``bound(xi)`` gives the Taylor ``CollapsedBound`` at ``factors``. Each round expands at the
    current means (``xi = m``), takes the closed-form ``(mu_hat, m_hat)`` as the Newton target
    and steps ``first_step``, ``first_step / 2``, ... of the way there until ``Psi`` rises
    (Armijo); after
    ``MAX_HALVINGS`` the round keeps its point. With full steps the result is the paper's
    Alg. 1 Stage 1 exactly: ``q(u) = (mu_hat, Sigma_hat)`` of the last ``xi``.
    """
    point, halvings = start, 0
    for _ in range(int(n_rounds)):
        xi = point.mean
        b = bound(xi)
        target_nu = b.whitened_mean
        d_nu, d_mean = target_nu - point.nu, b.m_hat - point.mean
        slope = map_objective.slope(point, d_nu, d_mean)
        allowance = ROUND_OFF * (1.0 + abs(point.value))
        step, accepted = float(first_step), None
        for _ in range(MAX_HALVINGS + 1):
            if step == 1.0:
                trial = map_objective.point(target_nu, b.m_hat)
            else:
                trial = map_objective.point(point.nu + step * d_nu, point.mean + step * d_mean)
            if trial.value >= point.value + ARMIJO_FRACTION * step * slope - allowance:
                accepted = trial
                break
            step *= 0.5
            halvings += 1
        full = accepted is not None and step == 1.0
        point = accepted if accepted is not None else point
    mu = b.mu_hat if full else factors.L @ point.nu
    return Stage1Result(mu, b.Sigma_hat, xi, b.value, halvings, point)


# -- Stage 2 guard ---------------------------------------------------------------------------------
#: halvings of a refused Stage-2 step (towards the hyper-parameters it started from) before
#: the step is dropped
GUARD_HALVINGS = 4
#: a Stage-2 step may lower the guard ELBO by at most this fraction of ``|ELBO|`` (plus
#: ``objective_slack``): the surrogate and the true bound need not peak at the same ``theta``
GUARD_SLACK = 1e-4
#: trust region of Stage 2 (with the guard): each log hyper-parameter moves at most this much
#: per outer iteration (a factor of 10), so that one Stage 2 cannot leap from a start whose
#: Taylor sites lag (Stage 1 far from its fixed point) to a flat region such as a length-scale
#: at its bound, where the model predicts the class frequencies and no gradient leads back
TRUST_RADIUS = float(np.log(10.0))


def closed_form_elbo(bound: CollapsedBound, likelihood: Likelihood, labels: Array) -> float:
    """The ELBO (spec eq. 11) of the closed-form ``q(u)`` of ``bound`` with the true likelihood:
    ``sum_i E_q[log p(y_i | f_i)] - KL(q(u) || p(u))`` for class labels ``labels [N]``.

    A genuine lower bound on ``log p(y | theta)`` (so never above 0) for every ``xi``, unlike the
    Taylor surrogate ``bound.value``. The expectations by the likelihood's own rule
    (``variational_expectations``, as every ELBO in gpinfer); one ``O(N M^2)`` pass for
    ``S2_hat``."""
    S2_hat = bound.S2_hat  # first: its pass also gives m_hat
    data = likelihood.variational_expectations(labels, bound.m_hat, S2_hat).value
    return float(np.sum(data)) - bound.kl()


class GuardedStep(NamedTuple):
    """The Stage-2 step kept: kernel parameters ``theta [P]``, the surrogate ``value`` and the
    guard ``elbo`` there, the ``halvings`` it took and whether it was ``refused`` (``theta`` is
    then the start)."""

    theta: Array
    value: float
    elbo: float
    halvings: int
    refused: bool


def guarded_step(
    bound_at: Callable[[Array], CollapsedBound],
    elbo: Callable[[CollapsedBound], float],
    start: Array,
    proposal: Array,
    start_elbo: float,
    slack: float,
    round_off: float,
) -> GuardedStep:
    """Keep as much of the Stage-2 step ``start -> proposal`` (``[P]`` each) as a true bound allows.

    ``bound_at(theta)``: the Taylor ``CollapsedBound`` at kernel parameters ``theta`` (and the
    ``xi`` Stage 2 optimised at); ``elbo(bound)``: ``closed_form_elbo`` of it. A trial point
    ``start + t (proposal - start)`` (``t = 1, 1/2, ...``, ``GUARD_HALVINGS`` halvings) is kept
    when its surrogate is not above ``round_off`` (no log-likelihood of discrete labels is above
    0) and its ELBO is not below ``start_elbo - slack``. The ELBO is at most
    ``log p(y | theta) <= 0``: the surrogate can rise without limit, the hyper-parameters kept
    cannot follow it. When no trial
    passes, the step is refused and ``start`` returned (``value``/``elbo`` then NaN: the caller
    has them).
    """
    step = 1.0
    for halvings in range(GUARD_HALVINGS + 1):
        theta = proposal if step == 1.0 else start + step * (proposal - start)
        b = bound_at(theta)
        if np.isfinite(b.value) and b.value <= round_off:
            g = elbo(b)
            if np.isfinite(g) and g >= start_elbo - slack:
                return GuardedStep(theta, b.value, g, halvings, False)
        step *= 0.5
    return GuardedStep(start, float("nan"), float("nan"), GUARD_HALVINGS + 1, True)

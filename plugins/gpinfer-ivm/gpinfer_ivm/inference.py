"""Conditional inference (fixed hyper-parameters): greedy selection with a liquid set.

Spec ivm §2.7-2.9. One inclusion = selection phase (score a candidate pool ``J`` by the simple
information score ``KL[N(h_hat, A_hat) || N(h, A)]`` under the full posterior), inclusion phase
(take the winner's marginal, freeze the oldest liquid point if the liquid set is full, restricted
ADF projection, append to the liquid set) and EP phase (at most ``ep_sweeps`` sweeps over the
liquid set in random order, if it holds two points or more; it stops after a sweep that moved no
liquid marginal by ``ep_tol``). ``L = 1`` is the myopic scheme (Algorithm 1).
At the end every liquid point is frozen into the solid representation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import SiteState
from gpinfer.kernels.base import Kernel
from gpinfer.training.inner import InnerSchedule
from gpinfer_ivm.gaussian_cubature import (
    RULES,
    SoftmaxTilted,
    gaussian_kl,
    softmax_predictive,
    softmax_tilted,
)
from gpinfer_ivm.liquid import EPRepresentation
from gpinfer_ivm.projection import (
    PROJECTION_ALGORITHMS,
    ProjectionAlgorithm,
    initial_t,
    restricted_projection,
)
from gpinfer_ivm.solid import STUB_UPDATES, SolidRepresentation, StubUpdate

Array = np.ndarray

#: EP phase: relative change of ``Pi`` below which a site update is rejected (spec §2.9.5)
EP_REJECT_RTOL = 1e-6
#: smallest candidate pool when the default size applies (spec §2.8, "ours")
POOL_FLOOR = 32
#: default ``ep_tol``: the EP phase stops after a sweep in which no liquid marginal moved by
#: this much (``liquid.marginal_change``; measured in docs/methods/ivm.md, issue 27)
EP_TOL = 0.03


@dataclass
class IVMSettings:
    """Options of the conditional inference (spec §2.8-2.9 names).

    ``d_final``: final active-set size; ``L``: liquid-set size (1 = myopic); ``ep_sweeps``;
    ``pool_size``: ``|J|`` (``None``: the spec default); ``retain``: fraction ``rho`` of the
    best-scored candidates kept in the next pool; ``n_init``: random initial picks from
    distinct classes (``None``: ``min(3, C)``); ``gh_order``/``reduced``/``rule``: quadrature
    (``rule="product"``: Gauss-Hermite product, ``gh_order`` nodes per axis; ``rule="sobol"``:
    the symmetric Sobol rule, ``gh_order`` total nodes, cost linear in the number of nodes for
    any ``C``; ``None``: ``gaussian_cubature`` defaults); ``projection``: ``"newton"``
    (default), ``"direct"`` (scipy L-BFGS-B) or ``"double_loop"``; ``ep_tol``: the EP phase stops
    after the first sweep whose largest site-marginal change (``liquid.marginal_change``) is
    below it (``0``: always ``ep_sweeps`` sweeps); ``stub_update``: ``"lazy"``
    (default), ``"drag"`` or ``"resolve"`` (``SolidRepresentation``); ``order``: a fixed
    inclusion order (tests; disables selection).
    """

    d_final: int
    L: int = 25
    ep_sweeps: int = 3
    ep_tol: float = EP_TOL
    pool_size: int | None = None
    retain: float = 0.5
    n_init: int | None = None
    gh_order: int | None = None
    reduced: bool | None = None
    rule: str = "product"
    projection: str = "newton"
    stub_update: str = "lazy"
    order: Sequence[int] | None = None


@dataclass
class InferenceResult:
    """The frozen solid representation, diagnostics and per-inclusion history."""

    solid: SolidRepresentation
    min_score: float = math.inf
    n_improper: int = 0
    n_rejected: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


def check_settings(s: IVMSettings, n: int, y: Array, C: int) -> None:
    """Clear errors for impossible settings (spec "bad input")."""
    if not 1 <= s.d_final <= n:
        raise InputError(f"d_final (M) must be in 1..n={n}, got {s.d_final}")
    if not 1 <= s.L <= s.d_final:
        raise InputError(f"liquid size L must be in 1..d_final={s.d_final}, got {s.L}")
    counts = np.bincount(y, minlength=C)
    if np.any(counts == 0):
        empty = np.flatnonzero(counts == 0).tolist()
        raise InputError(f"class(es) {empty} have no training points; IVM needs every class")
    if s.ep_sweeps < 0 or not 0.0 <= s.retain < 1.0:
        raise InputError("ep_sweeps must be >= 0 and retain in [0, 1)")
    if not (math.isfinite(s.ep_tol) and s.ep_tol >= 0.0):
        raise InputError(f"ep_tol must be a finite number >= 0, got {s.ep_tol}")
    if s.projection not in PROJECTION_ALGORITHMS:
        raise InputError(
            f"projection must be one of {PROJECTION_ALGORITHMS}, got {s.projection!r}")
    if s.rule not in RULES:
        raise InputError(f"quadrature rule must be one of {RULES}, got {s.rule!r}")
    if s.stub_update not in STUB_UPDATES:
        raise InputError(f"stub_update must be one of {STUB_UPDATES}, got {s.stub_update!r}")


class _LiquidSites(SiteState):
    """The liquid sites of ``runner``'s EP phase as the inner schedule's state: one update is
    one sweep in a fresh random order (``_Runner.ep_sweep``, undamped: ``damping`` is 1); its
    change is the largest marginal change of an updated site, ``-inf`` when the sweep touched
    no site (every later sweep would repeat it: the phase stops). ``touched`` and ``before``
    (the improper and rejected counts before the last sweep) are the last sweep's."""

    def __init__(self, runner: _Runner):
        self.runner = runner
        self.touched = True
        self.before = (0, 0)

    def update(self, damping: float, iteration: int) -> float:
        r = self.runner
        self.before = (r.result.n_improper, r.result.n_rejected)
        self.touched, change = r.ep_sweep(r.rng.permutation(r.ep.k))
        return change if self.touched else -math.inf


class _Runner:
    """State of one conditional-inference run."""

    def __init__(self, kernels: Sequence[Kernel], X: Array, y: Array, beta: Array,
                 s: IVMSettings, rng: np.random.Generator):
        self.X, self.y, self.beta, self.s, self.rng = X, y, beta, s, rng
        self.n, self.C = X.shape[0], len(kernels)
        self.solid = SolidRepresentation(kernels, X, s.d_final,
                                         cast(StubUpdate, s.stub_update))  # checked there
        self.liquid: list[int] = []
        self.pi: list[Array] = []
        self.b: list[Array] = []
        self.ep = EPRepresentation(self.solid, [], np.zeros((0, self.C)), np.zeros((0, self.C)))
        self.active = np.zeros(self.n, dtype=bool)
        self.result = InferenceResult(self.solid)

    @property
    def size(self) -> int:
        return self.solid.d + len(self.liquid)

    def tilted(self, idx: Array, h: Array, A: Array) -> SoftmaxTilted:
        s = self.s
        return softmax_tilted(self.y[idx], h, A, self.beta, s.gh_order, s.reduced, s.rule)

    def project(self, i: int, h: Array, A: Array, t0: Array | None = None) -> tuple[Array, Array]:
        T = self.tilted(np.array([i]), h[None], A[None])
        if t0 is None:
            s = self.s
            p_bar = softmax_predictive(h[None], A[None], self.beta, s.gh_order, s.reduced, s.rule)
            t0 = initial_t(int(self.y[i]), p_bar[0])
        args = (A, T.g[0], T.h_hat[0], T.A_hat[0], t0)
        try:
            return restricted_projection(*args, cast(ProjectionAlgorithm, self.s.projection))
        except NumericalError:
            if self.s.projection == "double_loop":
                raise
            return restricted_projection(*args, "double_loop")  # documented fallback

    def include(self, i: int, h: Array, A: Array) -> None:
        """Inclusion phase (the marginal was taken before any freeze) and EP phase."""
        if len(self.liquid) == self.s.L:
            self.solid.include(self.liquid.pop(0), self.pi.pop(0), self.b.pop(0))
        pi, b = self.project(i, h, A)
        self.liquid.append(i)
        self.pi.append(pi)
        self.b.append(b)
        self.active[i] = True
        self.ep = EPRepresentation(self.solid, self.liquid, np.array(self.pi), np.array(self.b))
        if len(self.liquid) >= 2:
            self.ep_phase()

    def ep_phase(self) -> None:
        """At most ``ep_sweeps`` sweeps over the liquid sites in random order (spec §2.9.5), on
        the engine's inner site schedule (``_LiquidSites``; the strict test ``change < ep_tol``).

        A sweep that changes no site leaves the state as it found it, so every later sweep
        would repeat it exactly: those are skipped (their counts still added, so the result is
        unchanged). After a sweep whose largest marginal change is below ``ep_tol`` the phase
        stops (``ep_tol = 0`` never stops early). The permutations of the skipped sweeps are
        still drawn, so the random stream (the later pools) does not depend on the stop.
        """
        ep, sites = self.ep, _LiquidSites(self)
        run = InnerSchedule(tol=self.s.ep_tol, max_updates=self.s.ep_sweeps, strict=True
                            ).run(sites)
        if run.converged:
            rest = self.s.ep_sweeps - run.updates
            for _ in range(rest):
                self.rng.permutation(ep.k)
            if not sites.touched:  # the skipped sweeps would repeat this one exactly
                before = sites.before
                self.result.n_improper += rest * (self.result.n_improper - before[0])
                self.result.n_rejected += rest * (self.result.n_rejected - before[1])
        self.pi = list(ep.pi.copy())
        self.b = list(ep.b.copy())

    def ep_sweep(self, order: Array) -> tuple[bool, float]:
        """One EP sweep over the liquid sites in ``order``: whether any site was touched, and
        the largest ``liquid.marginal_change`` of an updated site's marginal (0 if none)."""
        ep = self.ep
        touched, change = False, 0.0
        for a in order:
            cav = ep.cavity(a)
            if cav is None:
                self.result.n_improper += 1
                continue
            i = int(ep.liquid[a])
            try:
                pi, b = self.project(i, cav[0], cav[1], np.log(ep.pi[a]))
            except NumericalError:
                self.result.n_rejected += 1
                continue
            step, norm = ep.site_change(a, pi)
            if step < EP_REJECT_RTOL * (1.0 + norm):
                continue
            touched = True
            try:
                change = max(change, ep.set_site(a, pi, b))
            except np.linalg.LinAlgError:
                self.result.n_rejected += 1
        return touched, change

    def pool_size(self) -> int:
        if self.s.pool_size is not None:
            return int(self.s.pool_size)
        return max(POOL_FLOOR, math.ceil(min(self.n / self.C, self.n / self.s.L)))

    def initial_picks(self) -> list[int]:
        n_init = self.s.n_init if self.s.n_init is not None else min(3, self.C)
        picks: list[int] = []
        seen: set[int] = set()
        for j in self.rng.permutation(self.n):
            if int(self.y[j]) not in seen:
                picks.append(int(j))
                seen.add(int(self.y[j]))
            if len(picks) == min(n_init, self.s.d_final):
                break
        return picks

    def refill(self, keep: Array) -> Array:
        free = np.flatnonzero(~self.active)
        free = np.setdiff1d(free, keep, assume_unique=True)
        want = min(self.pool_size() - keep.size, free.size)
        fill = self.rng.choice(free, size=want, replace=False) if want > 0 else np.zeros(0)
        return np.concatenate([keep, np.asarray(fill, dtype=np.int64)]).astype(np.int64)

    def run(self, callback: Callable[[int, _Runner], None] | None) -> InferenceResult:
        s = self.s
        if s.order is not None:
            for i in s.order[: s.d_final]:
                h, A = self.ep.marginals(np.array([i]))
                self.include(int(i), h[0], A[0])
                if callback is not None:
                    callback(self.size, self)
        else:
            for i in self.initial_picks():
                h, A = self.ep.marginals(np.array([i]))
                self.include(i, h[0], A[0])
                if callback is not None:
                    callback(self.size, self)
            J = self.refill(np.zeros(0, dtype=np.int64))
            while self.size < s.d_final and J.size:
                h, A = self.ep.marginals(J)
                T = self.tilted(J, h, A)
                scores = gaussian_kl(T.h_hat, T.A_hat, h, A)
                if not np.all(np.isfinite(scores)):
                    raise NumericalError("non-finite selection score", quantity="score")
                self.result.min_score = min(self.result.min_score, float(scores.min()))
                w = int(np.argmax(scores))
                i = int(J[w])
                self.include(i, h[w], A[w])
                order = np.argsort(-scores, kind="stable")
                keep = J[order[: math.ceil(s.retain * J.size)]]
                J = self.refill(keep[keep != i])
                self.result.history.append({"size": self.size, "score": float(scores[w])})
                if callback is not None:
                    callback(self.size, self)
        for i, pi, b in zip(self.liquid, self.pi, self.b):
            self.solid.include(i, pi, b)
        self.liquid, self.pi, self.b = [], [], []
        return self.result

    def snapshot(self) -> SolidRepresentation:
        """A solid representation with the liquid points frozen in (for learning curves)."""
        import copy

        rep = copy.deepcopy(self.solid)
        for i, pi, b in zip(self.liquid, self.pi, self.b):
            rep.include(i, pi, b)
        return rep


def run_inference(
    kernels: Sequence[Kernel],
    X: Array,
    y: Array,
    beta: Array,
    settings: IVMSettings,
    rng: np.random.Generator,
    callback: Callable[[int, _Runner], None] | None = None,
) -> InferenceResult:
    """Greedy selection of ``d_final`` points and their sites; returns the frozen result."""
    y = np.asarray(y, dtype=np.int64)
    check_settings(settings, X.shape[0], y, len(kernels))
    return _Runner(list(kernels), X, y, np.asarray(beta, float), settings, rng).run(callback)

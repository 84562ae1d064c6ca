"""The independent-process baseline (spec ivm §4; paper Section 6 / Appendix B).

``C`` binary-IVM representations with diagonal site precisions, one active set ``I_c`` per class.
Per class: ``E = I + Pi^1/2 K_I Pi^1/2 = L L^T``, ``M = K(X, x_I) Pi^1/2 L^-T`` ``[n, d_c]``,
``h = M eta``, ``a = diag K - rowsum(M o M)`` kept for all ``n`` points. The classes couple only
through the ``C``-dimensional tilted moments of the ADF projection (closed form for diagonal
sites: ``pi_c = (1/a_hat_c - 1/a_c)_+``, ``b_c = (h_hat_c - h_c)/a_c + pi_c h_hat_c``).

Selection: every pair ``(j, c)`` with ``j`` not in ``I_c`` is scored by the positive KL of §4.4;
the global argmax among classes whose budget ``d_c < d_max`` is not exhausted wins (spec P21: a
point may enter several ``I_c``; its other components are removed exactly to form the cavity).
First picks: one random point of each class, included into its own class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpinfer.errors import InputError
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.cholesky import tri_solve
from gpinfer_ivm.criterion import FrozenSites
from gpinfer_ivm.diagonal_softmax import DiagonalTiltedCache
from gpinfer_ivm.gaussian_cubature import AUTO_PRODUCT_NODES, RULES, softmax_tilted

Array = np.ndarray

#: the baseline's quadrature rules: ``gaussian_cubature``'s and ``diagonal`` (the exact 1-D
#: reduction of ``gpinfer_ivm.diagonal_softmax``, valid because every marginal is diagonal)
BASELINE_RULES = (*RULES, "diagonal")


#: the baseline's Gauss-Hermite nodes per axis when ``gh_order`` is not given (the paper's GH-3)
BASELINE_GH_ORDER = 3


def resolve_baseline_rule(C: int, order: int | None, rule: str) -> str:
    """The concrete rule: ``auto`` is the product rule when ``order`` is given, else while
    ``BASELINE_GH_ORDER ** C`` is at most ``AUTO_PRODUCT_NODES``, and ``diagonal`` above; the
    others as given."""
    if rule not in BASELINE_RULES:
        raise InputError(f"quadrature rule must be one of {BASELINE_RULES}, got {rule!r}")
    if rule != "auto":
        return rule
    if order is not None or BASELINE_GH_ORDER**C <= AUTO_PRODUCT_NODES:
        return "product"
    return "diagonal"

#: the default budgets' cap on the sites of all ``C`` active sets together, in units of the
#: coupled ivm's ``d_final`` (``default_budget``)
SITES_PER_D_FINAL = 3


def default_budget(n: int, C: int, d_final: int) -> int:
    """The default budget ``d_max`` per class for ``n`` points, ``C`` classes and the coupled
    ivm's default ``d_final``: the paper's ``d = min(n, d_final)`` per class (spec §4.1) while
    the ``C`` active sets together hold at most ``max(n, SITES_PER_D_FINAL * d_final)`` sites
    (one site per training point, or three times the ivm's active set), else that cap spread
    over the classes.

    The selection rescores all ``n`` points after each of its ``sum_c d_c`` inclusions. On the
    10-class digits set of issue 27 (``n = 350``) the paper's ``d = 150`` means 1500 inclusions
    (43 % of all (point, class) pairs), and its learned signal variance reaches 300 after four
    rounds (quadrature grids of 6x the nodes): over 400 s of CPU, against 39 s for the capped
    45 per class (``benchmarks/ivm_baseline_steps.py``, docs/methods/ivm.md). Up to ``C = 3``,
    two-class sets and the paper's MNIST protocol (``C = 5``, ``n = 800``) keep the paper's
    budget."""
    d = min(n, d_final)
    cap = max(n, SITES_PER_D_FINAL * d_final)
    return d if C * d <= cap else max(1, cap // C)


#: smallest marginal variance kept, relative to the prior variance (round-off guard)
VAR_FLOOR = 1e-12


@dataclass
class _ClassState:
    """One class's binary-IVM representation."""

    I: list[int] = field(default_factory=list)
    pi: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    eta: list[float] = field(default_factory=list)
    #: ``M^T`` ``[capacity, n]``: its first ``len(I)`` rows are the columns of ``M``
    Mt: Array = field(default_factory=lambda: np.zeros((0, 0)))
    L_rows: list[Array] = field(default_factory=list)

    def add_column(self, nu: Array) -> None:
        """Append ``nu [n]`` to ``M`` (the buffer doubles when full)."""
        d = len(self.I)
        if d == self.Mt.shape[0]:
            grown = np.empty((max(8, 2 * d), nu.size))
            grown[:d] = self.Mt[:d]
            self.Mt = grown
        self.Mt[d] = nu


class BaselineRepresentation:
    """``C`` independent binary-IVM representations over the same ``n`` training points."""

    def __init__(self, kernels: Sequence[Kernel], X: Array, capacity: int = 0):
        """``capacity``: sites per class to allocate ``M`` for (more double the buffer)."""
        self.kernels = list(kernels)
        self.X = X
        self.C, self.n = len(self.kernels), X.shape[0]
        self.h = np.zeros((self.n, self.C))
        self.a = np.stack([k.K_diag(X) for k in self.kernels], axis=1)  # [n, C]
        #: prior variances [n, C]: every marginal and cavity variance lies in (0, prior]
        self.prior_var = self.a.copy()
        self.site_pi = np.zeros((self.n, self.C))
        self.site_b = np.zeros((self.n, self.C))
        self.classes = [_ClassState(Mt=np.empty((capacity, self.n))) for _ in range(self.C)]

    def size(self, c: int) -> int:
        return len(self.classes[c].I)

    def cavity(self) -> tuple[Array, Array]:
        """Marginals with each point's own sites removed (exact, everything is diagonal).

        A cavity variance is at most the prior variance, so its precision is floored at
        ``1 / prior``: at large amplitudes ``1/a - pi`` is a difference of two large numbers
        whose round-off could otherwise leave it at or below zero (a negative variance)."""
        a_cav = 1.0 / np.maximum(1.0 / self.a - self.site_pi, 1.0 / self.prior_var)
        return a_cav * (self.h / self.a - self.site_b), a_cav

    def include(self, j: int, c: int, pi: float, h_hat: float) -> None:
        """Add site ``(j, c)``; afterwards ``h[j, c] = h_hat`` exactly (spec §4.2)."""
        st = self.classes[c]
        a_j, h_j = self.a[j, c], self.h[j, c]
        sq = np.sqrt(pi)
        M = st.Mt[: len(st.I)]  # [d, n]
        Mj = M[:, j]
        lam = np.sqrt(1.0 + pi * a_j)
        kcol = self.kernels[c].K(self.X, self.X[j : j + 1])[:, 0]
        nu = (sq * kcol - (sq * Mj) @ M) / lam
        eta = lam * (h_hat - h_j) / (sq * a_j)
        b = (h_hat - h_j) / a_j + pi * h_hat
        st.L_rows.append(np.concatenate([sq * Mj, [lam]]))
        st.add_column(nu)
        st.eta.append(eta)
        st.I.append(j)
        st.pi.append(pi)
        st.b.append(b)
        # a = diag K - rowsum(M o M) cancels at large amplitudes: keep it in (0, prior]
        self.a[:, c] = np.clip(self.a[:, c] - nu * nu, VAR_FLOOR * self.prior_var[:, c],
                               self.prior_var[:, c])
        self.h[:, c] += eta * nu
        self.site_pi[j, c], self.site_b[j, c] = pi, b

    def predict(self, Xs: Array) -> tuple[Array, Array]:
        """``h_* [N*, C]`` and diagonal ``A_* [N*, C, C]`` (spec §4.5)."""
        Xs = np.asarray(Xs, dtype=float)
        h = np.zeros((Xs.shape[0], self.C))
        A = np.zeros((Xs.shape[0], self.C, self.C))
        for c, st in enumerate(self.classes):
            var = prior = self.kernels[c].K_diag(Xs)
            if st.I:
                d = len(st.I)
                L = np.zeros((d, d))
                for k, row in enumerate(st.L_rows):
                    L[k, : k + 1] = row
                Ks = self.kernels[c].K(self.X[st.I], Xs)
                m = tri_solve(L, np.sqrt(np.array(st.pi))[:, None] * Ks)
                h[:, c] = m.T @ np.array(st.eta)
                var = var - np.sum(m * m, axis=0)
            A[:, c, c] = np.clip(var, VAR_FLOOR * prior, prior)  # round-off: see include()
        return h, A

    def frozen_sites(self) -> FrozenSites:
        """Active sets and sites for the learning criterion (``coupled=False``)."""
        return FrozenSites(
            [np.array(st.I, dtype=np.int64) for st in self.classes],
            [np.array(st.pi) for st in self.classes],
            [np.array(st.b) for st in self.classes],
            False,
        )


def baseline_scores(
    rep: BaselineRepresentation, y: Array, beta: Array, order: int | None, rule: str = "product",
    cache: DiagonalTiltedCache | None = None,
) -> tuple[Array, Array, Array]:
    """Scores ``[n, C]`` (0 where ``pi_c = 0``), site precisions ``[n, C]``, tilted means;
    ``cache``: the ``diagonal`` rule's factors kept between calls (one inclusion changes one
    class column of the cavities, so only that column is recomputed)."""
    h_cav, a_cav = rep.cavity()
    rule = resolve_baseline_rule(rep.C, order, rule)
    if rule == "diagonal":
        D = (cache or DiagonalTiltedCache(y, beta))(h_cav, a_cav)
        h_hat, a_hat = D.h_hat, D.a_hat
    else:
        A = np.zeros((rep.n, rep.C, rep.C))
        A[:, np.arange(rep.C), np.arange(rep.C)] = a_cav
        T = softmax_tilted(y, h_cav, A, beta, BASELINE_GH_ORDER if order is None else order,
                           False, rule)
        h_hat, a_hat = T.h_hat, np.diagonal(T.A_hat, axis1=1, axis2=2)
    # a few nodes on a wide cavity (GH-3 at a cavity std of tens) can put all the tilted weight
    # on one node: a tilted variance of 0 is round-off of the rule, kept in (0, prior] like
    # the representation's own variances (an infinite site precision otherwise)
    a_hat = np.maximum(a_hat, VAR_FLOOR * rep.prior_var)
    pi = np.maximum(1.0 / a_hat - 1.0 / rep.a, 0.0)
    m = np.maximum(rep.a / a_hat, 1.0)
    dh = h_hat - rep.h
    score = 0.5 * (np.log(m) + 1.0 / m - 1.0 + dh * dh / rep.a)
    score[pi <= 0] = 0.0
    return score, pi, h_hat


def run_baseline(
    kernels: Sequence[Kernel],
    X: Array,
    y: Array,
    beta: Array,
    d_max: int,
    rng: np.random.Generator,
    order: int | None = 3,
    callback: Callable[[int, BaselineRepresentation], None] | None = None,
    rule: str = "product",
) -> BaselineRepresentation:
    """Greedy selection of up to ``d_max`` sites per class (spec §4.4); ``order``, ``rule``:
    the quadrature of the tilted moments (``gaussian_cubature.resolve_rule``)."""
    C, n = len(kernels), X.shape[0]
    if not 1 <= d_max <= n:
        raise InputError(f"d_max (M) must be in 1..n={n}, got {d_max}")
    counts = np.bincount(y, minlength=C)
    if np.any(counts == 0):
        raise InputError(f"class(es) {np.flatnonzero(counts == 0).tolist()} have no points")
    rep = BaselineRepresentation(kernels, X, d_max)
    cache = DiagonalTiltedCache(y, beta)
    perm = rng.permutation(n)
    # each class's first point in the random order, included in that order (not in the order
    # of the class indices): renaming the classes then renames the representation exactly
    _, first = np.unique(y[perm], return_index=True)  # each class's first position in perm
    for j in perm[np.sort(first)]:
        j, c = int(j), int(y[j])
        score, pi, h_hat = baseline_scores(rep, y, beta, order, rule, cache)
        if pi[j, c] > 0:
            rep.include(j, c, float(pi[j, c]), float(h_hat[j, c]))
    step = 0
    while True:
        score, pi, h_hat = baseline_scores(rep, y, beta, order, rule, cache)
        for c in range(C):
            if rep.size(c) >= d_max:
                score[:, c] = -np.inf
            score[rep.classes[c].I, c] = -np.inf
        flat = int(np.argmax(score))
        j, c = divmod(flat, C)
        if not np.isfinite(score[j, c]) or score[j, c] <= 0.0:
            break
        rep.include(j, c, float(pi[j, c]), float(h_hat[j, c]))
        step += 1
        if callback is not None:
            callback(step, rep)
    return rep

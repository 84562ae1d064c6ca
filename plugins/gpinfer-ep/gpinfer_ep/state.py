"""Site states of sparse multi-class EP (rank-one sites) and SEP (tied sites); spec ep-sep §2.

Both expose the same operations on a set of points ``idx`` (all of them in batch mode), given
per-class ``ClassTerms`` at ``X[idx]``:

* ``update(terms, idx, y, rho)``: parallel damped moment matching of the points' factors;
* ``evaluate(terms, idx, y, scale)``: ``log Z_q`` (data terms times ``scale = N / |batch|``)
  and per-class ``MatrixGradients`` (§2.7);
* ``gaussians(terms)``: ``q`` per class; ``snapshot()`` / ``restore()`` for the failure policy.

The algebra lives in ``gpinfer.sites.inducing``; what differs is only how cavities are formed
and how new role sites are folded back (per site for EP, tied per class for SEP).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, MatrixGradients
from gpinfer.numerics.gram import weighted_gram
from gpinfer.parallel import map_latents
from gpinfer.sites.inducing import (
    ClassTerms,
    WhitenedGaussian,
    aggregate,
    at_label,
    factor_counts,
    factor_mask,
    inducing_matrix_gradients,
    new_role_site,
    pair_tilted,
    remove_site,
    role_delta,
)

R = TypeVar("R")


def _stack(values: Sequence[Array]) -> Array:
    """Per-class vectors ``[n]`` stacked as columns ``[n, C]``."""
    return np.stack(values, axis=1)


def _finite(name: str, *arrays: Array) -> None:
    for a in arrays:
        if not np.all(np.isfinite(a)):
            raise NumericalError(f"non-finite {name}", quantity=name)


class _SiteSums:
    """Per-class site sums in ``u``-space: ``Lam [C, M, M]``, ``h [C, M]`` (start at zero).

    ``n_jobs``: threads for the per-class algebra (``gpinfer.parallel``; results identical).
    """

    def __init__(self, C: int, M: int, n_jobs: int = 1):
        self.Lam = np.zeros((C, M, M))
        self.h = np.zeros((C, M))
        self.n_jobs = n_jobs

    def per_class(self, fn: Callable[..., R], *columns: Sequence) -> list[R]:
        """``[fn(c, columns[0][c], columns[1][c], ...) for each class c]`` on ``n_jobs``
        threads (``fn`` may write only to class ``c``'s slices of the state)."""
        rows = [(c, *items) for c, items in enumerate(zip(*columns))]
        return map_latents(lambda row: fn(*row), rows, self.n_jobs)

    def gaussians(self, terms: Sequence[ClassTerms], factor: Array | None = None,
                  iteration: int | None = None) -> list[WhitenedGaussian]:
        """``q_c`` (or, with ``factor [C]``, the Gaussians with scaled site sums)."""
        return [g[0] for g in self.scaled_gaussians(terms, [factor], iteration)]

    def scaled_gaussians(self, terms: Sequence[ClassTerms], factors: Sequence[Array | None],
                         iteration: int | None = None) -> list[list[WhitenedGaussian]]:
        """Per class, one Gaussian for each entry of ``factors`` (``None``: the site sums as
        they are; ``[C]``: scaled per class), whitening the site sums once per class."""
        def one_class(c: int, t: ClassTerms) -> list[WhitenedGaussian]:
            P_w, h_w = t.to_whitened(self.Lam[c], self.h[c])
            scales = [1.0 if f is None else float(f[c]) for f in factors]
            return [WhitenedGaussian(a * P_w, a * h_w, iteration=iteration) for a in scales]

        return self.per_class(one_class, terms)

    def snapshot(self) -> object:
        return copy.deepcopy(self.__dict__)

    def restore(self, snap: object) -> None:
        self.__dict__.update(copy.deepcopy(snap))


class RankOneSites(_SiteSums):
    """EP: one rank-one role site per (factor, role) with its stored direction (spec §2.2, §2.8.3).

    ``W1, W2 [N, C]`` winner-role scalars (column = loser class), ``L1, L2 [N, C]`` loser-role
    scalars, ``U [C, M, N]`` the ``u``-space direction each point's sites were refined with.
    Memory ``O(N M C)``.
    """

    def __init__(self, y: Array, C: int, M: int, n_jobs: int = 1):
        super().__init__(C, M, n_jobs)
        N = y.shape[0]
        self.y = y
        self.W1, self.W2, self.L1, self.L2 = (np.zeros((N, C)) for _ in range(4))
        self.U = np.zeros((C, M, N))

    def update(self, terms: Sequence[ClassTerms], idx: Array, rho: float,
               iteration: int | None = None) -> float:
        """Damped parallel update of the factors of points ``idx``; returns max |site change|."""
        y = self.y[idx]
        C = len(terms)
        mask = factor_mask(y, C)
        qs = self.gaussians(terms, iteration=iteration)
        cur, old = zip(*self.per_class(
            lambda c, t, q: (q.project(t.A), q.project(t.L.T @ self.U[c][:, idx])), terms, qs))
        mu, v = _stack([p.mu for p in cur]), _stack([p.v for p in cur])
        mu_o, v_o = _stack([p.mu for p in old]), _stack([p.v for p in old])
        cross = _stack([np.sum(p.R * o.R, axis=0) for p, o in zip(cur, old)])
        s = _stack([t.s for t in terms])
        W1, W2, L1, L2 = (a[idx] for a in (self.W1, self.W2, self.L1, self.L2))
        mu_y, v_y, mu_oy, v_oy, cross_y = (at_label(a, y) for a in (mu, v, mu_o, v_o, cross))
        cav_w = remove_site(mu_y, v_y, W1, W2, mu_oy, v_oy, cross_y)
        cav_l = remove_site(mu, v, L1, L2, mu_o, v_o, cross)
        t = pair_tilted(cav_w.a, cav_w.v + at_label(s, y), cav_l.a, cav_l.v + s, mask)
        new = (*new_role_site(t.g_win, t.gamma, cav_w.a, cav_w.v),
               *new_role_site(-t.g_win, t.gamma, cav_l.a, cav_l.v))
        new = [np.where(mask, rho * n + (1.0 - rho) * o, 0.0)
               for n, o in zip(new, (W1, W2, L1, L2))]
        _finite("EP sites", *new)
        change = max(float(np.max(np.abs(n - o), initial=0.0))
                     for n, o in zip(new, (W1, W2, L1, L2)))
        tau_old, nu_old = aggregate(W1, L1, y, mask), aggregate(W2, L2, y, mask)
        tau, nu = aggregate(new[0], new[2], y, mask), aggregate(new[1], new[3], y, mask)
        full = idx.shape[0] == self.y.shape[0]

        def fold_in(c: int, term: ClassTerms) -> None:
            Ups = term.directions()
            if full:
                P_w = weighted_gram(term.A, tau[:, c])
                self.Lam[c], self.h[c] = term.to_u_space(P_w, term.A @ nu[:, c])
            else:
                U_old = self.U[c][:, idx]
                self.Lam[c] += weighted_gram(Ups, tau[:, c]) - weighted_gram(U_old, tau_old[:, c])
                self.h[c] += Ups @ nu[:, c] - U_old @ nu_old[:, c]
                self.Lam[c] = 0.5 * (self.Lam[c] + self.Lam[c].T)
            self.U[c][:, idx] = Ups

        self.per_class(fold_in, terms)
        self.W1[idx], self.W2[idx], self.L1[idx], self.L2[idx] = new
        return change

    def refresh(self) -> None:
        """Recompute the site sums from the stored sites (removes floating-point drift)."""
        mask = factor_mask(self.y, self.Lam.shape[0])
        tau = aggregate(self.W1, self.L1, self.y, mask)
        nu = aggregate(self.W2, self.L2, self.y, mask)
        for c in range(self.Lam.shape[0]):
            U = self.U[c]
            self.Lam[c] = weighted_gram(U, tau[:, c])
            self.h[c] = U @ nu[:, c]

    def evaluate(self, terms: Sequence[ClassTerms], idx: Array, scale: float = 1.0,
                 iteration: int | None = None) -> tuple[float, list[MatrixGradients]]:
        """EP ``log Z_q`` (§2.6) and its gradient (§2.7.2); directions of ``idx`` are current."""
        y = self.y[idx]
        C = len(terms)
        mask = factor_mask(y, C)
        qs = self.gaussians(terms, iteration=iteration)
        proj = self.per_class(lambda c, t, q: q.project(t.A), terms, qs)
        mu, v = _stack([p.mu for p in proj]), _stack([p.v for p in proj])
        s = _stack([t.s for t in terms])
        W1, W2, L1, L2 = (a[idx] for a in (self.W1, self.W2, self.L1, self.L2))
        mu_y, v_y = at_label(mu, y), at_label(v, y)
        cav_w = remove_site(mu_y, v_y, W1, W2)
        cav_l = remove_site(mu, v, L1, L2)
        t = pair_tilted(cav_w.a, cav_w.v + at_label(s, y), cav_l.a, cav_l.v + s, mask)
        deltas = role_delta(mu_y, v_y, W1, W2, cav_w.d) + role_delta(mu, v, L1, L2, cav_l.d)
        data = float(np.sum(np.where(mask, t.log_z + deltas, 0.0)))
        value = sum(q.log_norm_ratio() for q in qs) + scale * data
        e_w = (t.g_win * (W1 * mu_y - W2) + 2.0 * t.g_b) / cav_w.d
        e_l = (-t.g_win * (L1 * mu - L2) + 2.0 * t.g_b) / cav_l.d
        a_sum = scale * aggregate(t.g_win, -t.g_win, y, mask)
        b_sum = scale * aggregate(t.g_b, t.g_b, y, mask)
        e_sum = scale * aggregate(e_w, e_l, y, mask)
        grads = self.per_class(
            lambda c, term, q, p: inducing_matrix_gradients(term, q, q, p.R, a_sum[:, c],
                                                            b_sum[:, c], e_sum[:, c]),
            terms, qs, proj)
        return value, grads


class TiedSites(_SiteSums):
    """SEP: one tied site per class, ``(Lam_c, h_c)`` only; memory ``O(C M^2)`` (spec §2.3.1).

    ``y [N]``: training labels (indexed by ``idx``); ``n_factors [C]``: ``n_c`` of the full data
    set (spec §1.4, P11; default from ``y``). For streamed data pass ``y`` of the current batch
    positions and ``n_factors`` explicitly.
    """

    def __init__(self, y: Array, C: int, M: int, n_factors: Array | None = None,
                 n_jobs: int = 1):
        super().__init__(C, M, n_jobs)
        self.y = y
        self.n_factors = factor_counts(y, C) if n_factors is None else np.asarray(n_factors, float)

    def _cavity_projections(self, terms: Sequence[ClassTerms], iteration: int | None,
                            with_q: bool = True):
        """``(qs, cavs, proj, a, v, s)``: the posteriors (``None`` unless ``with_q``), the
        shared cavities, their projections on ``A`` and the stacked means, variances and FITC
        variances ``[n, C]``."""
        cavity = 1.0 - 1.0 / self.n_factors
        pairs = self.scaled_gaussians(terms, [None, cavity] if with_q else [cavity], iteration)
        qs = [p[0] for p in pairs] if with_q else None
        cavs = [p[-1] for p in pairs]
        proj = self.per_class(lambda c, t, cav: cav.project(t.A), terms, cavs)
        a, v = _stack([p.mu for p in proj]), _stack([p.v for p in proj])
        return qs, cavs, proj, a, v, _stack([t.s for t in terms])

    def update(self, terms: Sequence[ClassTerms], idx: Array, rho: float,
               iteration: int | None = None) -> float:
        """Tied damped update from the points ``idx`` (spec §2.5.3); returns the max change of
        the whitened site shift."""
        y = self.y[idx]
        C = len(terms)
        mask = factor_mask(y, C)
        _, _, _, a, v, s = self._cavity_projections(terms, iteration, with_q=False)
        a_y, v_y = at_label(a, y), at_label(v, y)
        t = pair_tilted(a_y, v_y + at_label(s, y), a, v + s, mask)
        W1, W2 = new_role_site(t.g_win, t.gamma, a_y, v_y)
        L1, L2 = new_role_site(-t.g_win, t.gamma, a, v)
        tau, nu = aggregate(W1, L1, y, mask), aggregate(W2, L2, y, mask)
        _finite("SEP sites", tau, nu)
        keep = 1.0 - rho * factor_counts(y, C) / self.n_factors

        def fold_in(c: int, term: ClassTerms) -> float:
            Lam_new, h_new = term.to_u_space(weighted_gram(term.A, tau[:, c]), term.A @ nu[:, c])
            Lam = keep[c] * self.Lam[c] + rho * Lam_new
            h = keep[c] * self.h[c] + rho * h_new
            change = float(np.max(np.abs(term.L.T @ (h - self.h[c]))))
            self.Lam[c], self.h[c] = 0.5 * (Lam + Lam.T), h
            return change

        return max(self.per_class(fold_in, terms), default=0.0)

    def evaluate(self, terms: Sequence[ClassTerms], idx: Array, scale: float = 1.0,
                 iteration: int | None = None) -> tuple[float, list[MatrixGradients]]:
        """SEP ``log Z_q`` (§2.6) and the paper's gradient with the shared cavity (§2.7.3)."""
        y = self.y[idx]
        C = len(terms)
        mask = factor_mask(y, C)
        qs, cavs, proj, a, v, s = self._cavity_projections(terms, iteration)
        t = pair_tilted(at_label(a, y), at_label(v + s, y), a, v + s, mask)
        n_b = factor_counts(y, C)
        cav_terms = sum(n_b[c] * (cav.log_norm_ratio() - q.log_norm_ratio())
                        for c, (q, cav) in enumerate(zip(qs, cavs)))
        value = sum(q.log_norm_ratio() for q in qs) + scale * (float(np.sum(t.log_z)) + cav_terms)
        a_sum = scale * aggregate(t.g_win, -t.g_win, y, mask)
        b_sum = scale * aggregate(t.g_b, t.g_b, y, mask)
        grads = self.per_class(
            lambda c, term, q, cav, p: inducing_matrix_gradients(term, q, cav, p.R, a_sum[:, c],
                                                                 b_sum[:, c]),
            terms, qs, cavs, proj)
        return value, grads

"""Site states of sparse multi-class EP (rank-one sites) and SEP (tied sites); spec ep-sep §2.

Both expose the same operations on a set of points ``idx`` (all of them in batch mode), given
the classes' kernel quantities at ``X[idx]`` (``terms_at``: ``StackedTerms``, the inducing
geometry stacked over the classes):

* ``update(terms, idx, rho)``: parallel damped moment matching of the points' factors;
* ``evaluate(terms, idx, scale)``: ``log Z_q`` (data terms times ``scale = N / |batch|``)
  and the classes' ``MatrixGradients`` as stacks (``StackedMatrixGradients``, §2.7);
* ``gaussians(terms)``: ``q`` per class (prediction); ``snapshot()`` / ``restore()`` for the
  failure policy; ``refresh()`` after an epoch.

Device values: ``update``'s site change and ``evaluate``'s ``log Z_q`` are returned as 0-d
arrays where the state lives, unread, and their checks (non-finite sites, invalid cavities,
``B`` not positive definite) go to the caller's ``ops.deferred_checks`` context: the training
loop reads them all in one transfer at the step's end, before the hyper-parameters move and
before the state is snapshot (a failed check restores the last good state). Outside such a
context, and on numpy, each check is immediate (``NumericalError`` before the state moves).

The algebra is class-batched (``gpinfer.sites.stacked``: stacked ``[C, M, M]`` / ``[C, M, n]``
arrays, one BLAS call per operation across classes) on the site formulas of
``gpinfer.sites.inducing``; what differs is only how cavities are formed and how new role sites
are folded back (per site for EP, tied per class for SEP).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.choice import NUMPY, Backend
from gpinfer.backend.compile import compilable
from gpinfer.errors import NumericalError
from gpinfer.interfaces import Array, Scalar
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.stacked import StackedCovariances, StackedMatrixGradients
from gpinfer.sites.inducing import (
    WhitenedGaussian,
    aggregate,
    at_label,
    factor_counts,
    factor_mask,
    new_role_site,
    pair_log_z,
    pair_slopes,
    remove_site,
    role_delta,
)
from gpinfer.sites.stacked import (
    FRAME_DRIFT,
    Basis,
    Frame,
    Scales,
    SharedTerms,
    StackedGaussians,
    StackedTerms,
    basis,
    cavity_moments,
    kept_frame,
    paired_by_inverse,
    rebased,
    scales,
    shared_matrix_gradients,
    shared_paired,
    shared_site_products,
    shared_terms,
    stacked_matrix_gradients,
    stacked_terms,
    symmetrize,
    transpose,
)
from gpinfer.training.distributed import Group, attempt


class _BatchLabels(NamedTuple):
    """A batch's labels ``y [n]``, factor ``mask [n, C]`` and factor counts ``[C]``, the
    data set's factor counts ``n_factors [C]``, and the labels as a column ``y_col [n, 1]``
    (for ``at_label``), on the state's backend."""

    y: Array
    mask: Array
    counts: Array
    n_factors: Array
    y_col: Array


def _finite(name: str, *arrays: Array) -> None:
    ops.require_finite(lambda: NumericalError(f"non-finite {name}", quantity=name), *arrays)


def _max_change(new: Sequence[Array], old: Sequence[Array]) -> Scalar:
    """``max |new - old|`` over pairs of arrays (0 for empty ones), a 0-d array where they
    live (not read: see the module doc)."""
    xp = ops.namespace(*new)
    parts = [xp.max(xp.abs(n - o)) for n, o in zip(new, old) if n.shape[0]]
    return xp.max(xp.stack(parts)) if parts else 0.0


class _SiteSums:
    """Per-class site sums in ``u``-space: ``Lam [C, M, M]``, ``h [C, M]`` (start at zero).

    ``backend``: where the state lives (``gpinfer.backend``; labels stay on the host and each
    batch's are moved with it).
    """

    def __init__(self, C: int, M: int, backend: Backend = NUMPY):
        self.backend = backend
        self.Lam = backend.asarray(np.zeros((C, M, M)))
        self.h = backend.asarray(np.zeros((C, M)))
        #: ``(terms, L^T Lam L, L^T h)``: the whitened sums on the terms they were formed on
        self._whitened: tuple[StackedTerms, Array, Array] | None = None

    def terms_at(self, kernels: Sequence[Kernel], Zs: Sequence[Array] | Array, X: Array,
                 iteration: int | None = None,
                 covariances: StackedCovariances | None = None) -> StackedTerms:
        """The kernel quantities ``update`` and ``evaluate`` take, at ``X [n, D]`` (stacked
        over the classes; ``covariances``: the kernels' batched covariances there, shared with
        the gradient's VJPs)."""
        return stacked_terms(kernels, Zs, X, iteration=iteration, covariances=covariances)

    def gaussians(self, terms: StackedTerms, factor: Array | None = None,
                  iteration: int | None = None) -> list[WhitenedGaussian]:
        """``q_c`` per class from host terms, read one class at a time (``latent(c)``; or,
        with ``factor [C]``, the Gaussians with scaled site sums): for inspection and tests on
        numpy states; training and the posterior use the stacked algebra."""
        out = []
        for c, t in enumerate(terms.latents()):
            P_w, h_w = t.to_whitened(self.Lam[c], self.h[c])
            a = 1.0 if factor is None else float(factor[c])
            out.append(WhitenedGaussian(a * P_w, a * h_w, iteration=iteration))
        return out

    def refresh(self) -> None:
        """Recompute the site sums from stored sites (after an epoch); tied sites store none."""

    def snapshot(self) -> object:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "_whitened"})

    def restore(self, snap: object) -> None:
        if not isinstance(snap, dict):
            raise TypeError(f"not a snapshot of {type(self).__name__}: {type(snap).__name__}")
        self.__dict__.update(copy.deepcopy(snap))
        self._whitened = None

    def _whitened_sums(self, terms: StackedTerms) -> tuple[Array, Array]:
        """``(P_w [C, M, M], h_w [C, M])`` of the current sites on ``terms``, formed once per
        set of terms (an update leaves its new sums for the ``evaluate`` that follows)."""
        if self._whitened is not None and self._whitened[0] is terms:
            return self._whitened[1], self._whitened[2]
        P_w, h_w = terms.to_whitened(self.Lam, self.h)
        self._whitened = (terms, P_w, h_w)
        return P_w, h_w


class RankOneSites(_SiteSums):
    """EP: one rank-one role site per (factor, role) with its stored direction (spec §2.2, §2.8.3).

    ``W1, W2 [N, C]`` winner-role scalars (column = loser class), ``L1, L2 [N, C]`` loser-role
    scalars, ``U [C, M, N]`` the ``u``-space direction each point's sites were refined with.
    Memory ``O(N M C)``. The algebra is class-batched (``gpinfer.sites.stacked``: ``terms``
    is ``StackedTerms``).
    """

    def __init__(self, y: Array, C: int, M: int, backend: Backend = NUMPY):
        super().__init__(C, M, backend)
        N = y.shape[0]
        self.y = y
        self.W1, self.W2, self.L1, self.L2 = (backend.asarray(np.zeros((N, C)))
                                              for _ in range(4))
        self.U = backend.asarray(np.zeros((C, M, N)))

    def _posterior(self, terms: StackedTerms, iteration: int | None) -> StackedGaussians:
        P_w, h_w = self._whitened_sums(terms)
        return StackedGaussians(P_w, h_w, iteration=iteration)

    def _batch_view(self, terms: StackedTerms, idx: Array,
                    iteration: int | None
                    ) -> tuple[StackedTerms, Array, Array, Array, StackedGaussians]:
        """What a step on the points ``idx [n]`` reads: the stacked terms, ``idx`` and its labels
        ``y [n]`` on the backend, the label mask ``[n, C]`` (``factor_mask``) and the posterior."""
        ii = ops.index_like(terms.A, idx)
        y = ops.index_like(terms.A, self.y[idx])
        mask = factor_mask(y, terms.A.shape[0])
        return terms, ii, y, mask, self._posterior(terms, iteration)

    def update(self, terms: StackedTerms, idx: Array, rho: float,
               iteration: int | None = None) -> Scalar:
        """Damped parallel update of the factors of points ``idx``; returns max |site change|
        (a 0-d array, unread)."""
        terms, ii, y, mask, q = self._batch_view(terms, idx, iteration)
        U_old = self.U[:, :, ii]
        mu, v, R = q.project(terms.A)  # [C, n], [C, n], [C, M, n]
        mu_o, v_o, R_o = q.project(transpose(terms.L) @ U_old)  # along the stored directions
        cross = ops.einsum("cmn,cmn->cn", R, R_o).T  # [n, C], as the site arrays
        mu, v, mu_o, v_o = mu.T, v.T, mu_o.T, v_o.T
        s = terms.s.T
        W1, W2, L1, L2 = (a[ii] for a in (self.W1, self.W2, self.L1, self.L2))
        mu_y, v_y, mu_oy, v_oy, cross_y = (at_label(a, y) for a in (mu, v, mu_o, v_o, cross))
        cav_w = remove_site(mu_y, v_y, W1, W2, mu_oy, v_oy, cross_y)
        cav_l = remove_site(mu, v, L1, L2, mu_o, v_o, cross)
        t = pair_slopes(cav_w.a, cav_w.v + at_label(s, y), cav_l.a, cav_l.v + s, mask)
        matched = (*new_role_site(t.g_win, t.gamma, cav_w.a, cav_w.v),
                   *new_role_site(-t.g_win, t.gamma, cav_l.a, cav_l.v))
        xp = ops.namespace(mu)
        new = [xp.where(mask, rho * n + (1.0 - rho) * o, 0.0)
               for n, o in zip(matched, (W1, W2, L1, L2))]
        _finite("EP sites", *new)
        change = _max_change(new, (W1, W2, L1, L2))
        tau_old, nu_old = aggregate(W1, L1, mask).T, aggregate(W2, L2, mask).T
        tau = aggregate(new[0], new[2], mask, win_masked=True).T  # new: masked above
        nu = aggregate(new[1], new[3], mask, win_masked=True).T
        A = terms.A
        Ups = terms.unwhiten(A)  # u-space directions L^-T A
        if idx.shape[0] == self.y.shape[0]:  # the sums are those of the new sites alone
            P_w = symmetrize((A * tau[:, None, :]) @ transpose(A))
            h_w = ops.einsum("cmn,cn->cm", A, nu)
            self.Lam, self.h = terms.to_u_space(P_w, h_w)
            self._whitened = (terms, P_w, h_w)
        else:
            self._whitened = None
            self.Lam = symmetrize(self.Lam + (Ups * tau[:, None, :]) @ transpose(Ups)
                                  - (U_old * tau_old[:, None, :]) @ transpose(U_old))
            self.h = (self.h + ops.einsum("cmn,cn->cm", Ups, nu)
                      - ops.einsum("cmn,cn->cm", U_old, nu_old))
        self.U[:, :, ii] = Ups
        self.W1[ii], self.W2[ii], self.L1[ii], self.L2[ii] = new
        return change

    def refresh(self) -> None:
        """Recompute the site sums from the stored sites (removes floating-point drift)."""
        y = ops.index_like(self.U, self.y)
        mask = factor_mask(y, self.Lam.shape[0])
        tau = aggregate(self.W1, self.L1, mask).T
        nu = aggregate(self.W2, self.L2, mask).T
        self.Lam = symmetrize((self.U * tau[:, None, :]) @ transpose(self.U))
        self.h = ops.einsum("cmn,cn->cm", self.U, nu)
        self._whitened = None

    def evaluate(self, terms: StackedTerms, idx: Array,
                 scale: float = 1.0,
                 iteration: int | None = None) -> tuple[Scalar, StackedMatrixGradients]:
        """EP ``log Z_q`` (§2.6, a 0-d array, unread) and its gradient (§2.7.2); directions of
        ``idx`` are current."""
        terms, ii, y, mask, q = self._batch_view(terms, idx, iteration)
        mu, v, R = q.project(terms.A)
        mu, v, s = mu.T, v.T, terms.s.T
        W1, W2, L1, L2 = (a[ii] for a in (self.W1, self.W2, self.L1, self.L2))
        mu_y, v_y = at_label(mu, y), at_label(v, y)
        cav_w = remove_site(mu_y, v_y, W1, W2)
        cav_l = remove_site(mu, v, L1, L2)
        t = pair_log_z(cav_w.a, cav_w.v + at_label(s, y), cav_l.a, cav_l.v + s, mask)
        deltas = role_delta(mu_y, v_y, W1, W2, cav_w.d) + role_delta(mu, v, L1, L2, cav_l.d)
        xp = ops.namespace(mu)
        data = xp.sum(xp.where(mask, t.log_z + deltas, 0.0))
        value = xp.sum(q.log_norm_ratio()) + scale * data
        e_w = (t.g_win * (W1 * mu_y - W2) + 2.0 * t.g_b) / cav_w.d
        e_l = (-t.g_win * (L1 * mu - L2) + 2.0 * t.g_b) / cav_l.d
        a_sum = scale * aggregate(t.g_win, -t.g_win, mask, win_masked=True)
        b_sum = scale * aggregate(t.g_b, t.g_b, mask, win_masked=True)
        e_sum = scale * aggregate(e_w, e_l, mask)
        grads = stacked_matrix_gradients(terms, q, q, R, a_sum.T, b_sum.T, e_sum.T)
        return value, grads


class _USpaceSum:
    """A ``TiedSites`` attribute in ``u``-space (``Lam`` or ``h``), stored as ``_Lam``/``_h``:
    read, it is first formed from the whitened sums an update left (``_to_u_space``); set,
    those sums are dropped (the other attribute formed from them first: it stays current)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.stored = "_" + name

    def __get__(self, sites: TiedSites | None, owner: type | None = None) -> Array:
        if sites is None:  # the class attribute (documentation, introspection)
            return self  # type: ignore[return-value]
        sites._to_u_space()
        return getattr(sites, self.stored)

    def __set__(self, sites: TiedSites, value: Array) -> None:
        sites._to_u_space()  # the other of Lam, h: its whitened sums go
        setattr(sites, self.stored, value)
        sites._based, sites._u_stale = None, False
        sites._whitened = sites._frame = None  # the sums on the last terms are the old ones


class TiedSites(_SiteSums):
    """SEP: one tied site per class, ``(Lam_c, h_c)`` only; memory ``O(C M^2)`` (spec §2.3.1).

    ``y [N]``: training labels (indexed by ``idx``); ``n_factors [C]``: ``n_c`` of the full data
    set (spec §1.4, P11; default from ``y``). For streamed data pass ``y`` of the current batch
    positions and ``n_factors`` explicitly.

    The algebra is class-batched (``gpinfer.sites.stacked``: ``terms`` is ``StackedTerms``).
    The sums are kept
    whitened: an update leaves its new ``L^T Lam L``, ``L^T h`` for the ``evaluate`` (or
    further sweeps) that follow on the same terms, and with the factor they are whitened on
    (``_based``: a ``Basis``, no data-sized arrays) for the next step, which moves them to its
    own factor ``L'`` by ``T = L^-1 L'`` (``rebased``: three triangular products per class,
    where ``Lam = L^-T P_w L^-1`` and back take four), or, shared by the classes on numpy,
    reads them where they are (``gpinfer.sites.stacked.Frame``: the older factor's prior term
    and directions, no products per class) until that frame drifts by ``frame_drift``
    (``kept_frame``); ``Lam``, ``h`` are formed only when read
    (the posterior, ``refine``'s state) and set by ``restore``; a snapshot holds the kept sums.
    Formed on numpy, ``Lam`` and ``h`` are read-only (a write in place would be lost: set the
    attribute instead); torch tensors cannot be marked so.
    """

    def __init__(self, y: Array, C: int, M: int, n_factors: Array | None = None,
                 backend: Backend = NUMPY):
        super().__init__(C, M, backend)
        self.y = y
        self.n_factors = factor_counts(y, C) if n_factors is None else np.asarray(n_factors, float)
        #: one kernel and one ``Z`` for every class (sep's ``shared_inducing``): ``terms_at``
        #: takes them (``kernels``, ``Zs`` of one latent) and returns ``SharedTerms``
        self.shared = False
        #: ``(idx, y, labels)``: the last batch's labels on the backend (``_labels``)
        self._batch: tuple[Array, Array, _BatchLabels] | None = None
        #: the data-parallel process group (``None``: one process): ``update`` is given this
        #: rank's points of the global batch and sums the ranks' site contributions
        #: (``_group_sums``)
        self.group: Group | None = None
        #: shared sums are read on the factor they were made on while its prior precision
        #: ``Q`` stays this close to ``I`` (``kept_frame``; 0: moved every step)
        self.frame_drift = FRAME_DRIFT
        #: the ``Frame`` of the sums ``_whitened`` holds (``None``: on its terms' factor)
        self._frame: Frame | None = None

    # -- the u-space sums, formed on first read after an update -----------------------------
    #: ``(basis, P_w [C, M, M], h_w [C, M])``: an update's whitened sums and the factor they
    #: are whitened on (``Basis``: no data-sized arrays; never written in place: a snapshot may
    #: hold them)
    _based: tuple[Basis, Array, Array] | None = None
    _Lam: Array
    _h: Array
    _u_stale: bool = False

    #: ``Lam [C, M, M]``: the site precisions in ``u``-space
    Lam = _USpaceSum()
    #: ``h [C, M]``: the site shifts in ``u``-space
    h = _USpaceSum()

    def _to_u_space(self) -> None:
        """``Lam``, ``h`` from the whitened sums an update left (kept: the next step still
        moves those). On numpy the formed arrays are read-only: the state is the kept sums,
        so a write in place such as ``sites.Lam[...] = x`` would be lost at the next step;
        it raises instead (``ValueError``); set the attribute (``sites.Lam = x``) to replace
        the sums. torch tensors have no such flag: there the write is lost silently."""
        if self._u_stale and self._based is not None:
            based, P_w, h_w = self._based
            self._Lam, self._h = based.to_u_space(P_w, h_w)
            for formed in (self._Lam, self._h):
                if ops.is_numpy(formed):
                    formed.flags.writeable = False
            self._u_stale = False

    def _kept_sums(self, terms: StackedTerms) -> tuple[Array, Array, Frame | None]:
        """``(P [C, M, M], h [C, M], frame)``: the sums a step on ``terms`` reads, formed once
        per set of terms (an update leaves its new sums for the ``evaluate`` that follows).
        After an update, its whitened sums where they are (``frame``: ``kept_frame``, shared
        sums on numpy) or moved from its factor ``L`` to ``terms``' ``L'`` by ``T = L^-1 L'``
        (``rebased``; ``frame`` ``None``)."""
        if self._whitened is not None and self._whitened[0] is terms:
            return self._whitened[1], self._whitened[2], self._frame
        self._frame = None
        if self._based is not None and (isinstance(terms, SharedTerms)
                                        == (self._based[0].classes is not None)):
            based, P_w, h_w = self._based
            self._frame = kept_frame(based, terms, self.frame_drift)
            if self._frame is None:
                # not symmetrised: the update's Cholesky reads one triangle (and on a device
                # its new sums are symmetrised: ``_tied_sums``)
                P_w, h_w = rebased(based, terms).to_whitened(P_w, h_w, symmetric=False)
            self._whitened = (terms, P_w, h_w)
            return P_w, h_w, self._frame
        return (*super()._whitened_sums(terms), None)

    def _whitened_sums(self, terms: StackedTerms) -> tuple[Array, Array]:
        """As ``_SiteSums._whitened_sums``: the sums on ``terms``' own factor (``_kept_sums``'
        kept in a ``Frame`` moved there, not kept: for inspection and tests)."""
        P, h, frame = self._kept_sums(terms)
        if frame is None:
            return P, h
        return rebased(frame.basis, terms).to_whitened(P, h)

    def terms_at(self, kernels: Sequence[Kernel], Zs: Sequence[Array] | Array, X: Array,
                 iteration: int | None = None,
                 covariances: StackedCovariances | None = None) -> StackedTerms:
        """As ``_SiteSums.terms_at``; ``shared``: the one latent's terms (one ``Kuu``, one
        Cholesky, one ``L^-1 Kuf``) broadcast over the classes (``SharedTerms``)."""
        terms = super().terms_at(kernels, Zs, X, iteration, covariances)
        return shared_terms(terms, self.n_factors.shape[0]) if self.shared else terms

    def snapshot(self) -> object:
        """The sites' state: after an update, ``{"whitened": (basis, P_w, h_w)}``, the kept
        whitened sums themselves (never written in place: held without a copy, and no
        ``u``-space round trip, where the training loop on a device snapshots every step);
        else copies ``{"Lam", "h"}``."""
        if self._based is not None:
            return {"whitened": self._based}
        return {"Lam": ops.copy(self.Lam), "h": ops.copy(self.h)}

    def restore(self, snap: object) -> None:
        """The state of ``snapshot`` (or of ``{"Lam", "h"}`` ``u``-space sums given, e.g.
        ``refine``'s start)."""
        if not isinstance(snap, dict):
            raise TypeError(f"not a snapshot of TiedSites: {type(snap).__name__}")
        if "whitened" in snap:
            self._based, self._u_stale = snap["whitened"], True
        else:  # both replaced: nothing to form from the kept sums first
            self._based = None
            self.Lam, self.h = ops.copy(snap["Lam"]), ops.copy(snap["h"])
        self._whitened = self._frame = None

    def _cavity_scales(self, ref: Array, paired: bool = False) -> Scales:
        """The cavity fractions ``1 - 1 / n_c`` ``[C]`` as ``Scales`` on ``ref``'s backend
        (moved once and kept); ``paired``: preceded by ``C`` ones, with leading axes
        ``[2, C]`` (``StackedGaussians.paired``: ``q`` and the cavity in one stack)."""
        fraction = tuple(float(f) for f in 1.0 - 1.0 / self.n_factors)
        if paired:
            return scales(ref, (1.0,) * len(fraction) + fraction, (2, len(fraction)))
        return scales(ref, fraction, (len(fraction),))

    def _labels(self, idx: Array, ref: Array) -> _BatchLabels:
        """The labels of the points ``idx`` on ``ref``'s backend, their factor mask and
        factor counts: moved once per batch (an ``update`` and the ``evaluate`` after it on the
        same points share them)."""
        last = self._batch
        if (last is not None and last[1] is self.y and last[0].shape == idx.shape
                and np.array_equal(last[0], idx)):
            return last[2]
        C = self.n_factors.shape[0]
        y = ops.index_like(ref, self.y[idx])
        mask = factor_mask(y, C)
        if ops.is_numpy(ref):
            counts = factor_counts(self.y[idx], C)
        else:  # on the device, in the arrays' dtype: no second move
            # with m_c = n - n_c^y the batch's factors per class (mask entries):
            # (n - n_c^y) + (C - 1) n_c^y = (C - 1) n - (C - 2) m_c, exact small integers
            # (two operators: a typed sum and one rsub)
            m = ops.namespace(ref).sum(mask, axis=0, dtype=ref.dtype)
            counts = ops.rsub(m, float((C - 1) * y.shape[0]), C - 2)
        labels = _BatchLabels(y, mask, counts,
                              ops.constant(ref, tuple(float(n) for n in self.n_factors)),
                              y[:, None])
        self._batch = (np.array(idx, copy=True), self.y, labels)
        return labels

    def update(self, terms: StackedTerms, idx: Array, rho: float,
               iteration: int | None = None) -> Scalar:
        """Tied damped update from the points ``idx`` (spec §2.5.3); returns the max change of
        the whitened site shift (a 0-d array, unread: see the module doc)."""
        labels = self._labels(idx, terms.A)
        P_w, h_w, frame = self._kept_sums(terms)
        if self.group is not None:
            P_w, h_next, change = _group_sums(self.group, terms, P_w, h_w,
                                              self._cavity_scales(P_w), labels, rho, iteration,
                                              frame)
        else:
            P_w, h_next, change = _tied_sums(
                terms, P_w, h_w, self._cavity_scales(P_w), labels, rho, iteration, frame)
        base = basis(terms) if frame is None else frame.basis  # where the new sums are
        self._based, self._u_stale = (base, P_w, h_next), True  # Lam, h when read
        self._whitened = (terms, P_w, h_next)
        return change

    def evaluate(self, terms: StackedTerms, idx: Array,
                 scale: float = 1.0,
                 iteration: int | None = None) -> tuple[Scalar, StackedMatrixGradients]:
        """SEP ``log Z_q`` (§2.6, a 0-d array, unread: see the module doc) and the paper's
        gradient with the shared cavity (§2.7.3)."""
        labels = self._labels(idx, terms.A)
        P_w, h_w, frame = self._kept_sums(terms)
        return _tied_evaluate(terms, P_w, h_w, self._cavity_scales(P_w, paired=True), labels,
                              scale, iteration, frame)


def _directions(terms: StackedTerms, frame: Frame | None) -> Array | None:
    """The shared directions ``A [M, n]`` of ``terms`` (a ``frame``'s, ``Frame.A``), or
    ``None`` for per-class terms."""
    if frame is not None:
        return frame.A
    return terms.one.A[0] if isinstance(terms, SharedTerms) and terms.one is not None else None


def _site_change(h_next: Array, h_w: Array, frame: Frame | None) -> Array:
    """``max |h_next - h_w|`` ``[]``, the update's change on the step's factor (sums kept in a
    ``frame``: their change moved there, ``Frame.to_step``)."""
    d = h_next - h_w
    return ops.max_abs(d if frame is None else frame.to_step(d))


def _batch_sites(terms: StackedTerms, P_w: Array, h_w: Array, fraction: Scales,
                 labels: _BatchLabels, iteration: int | None, frame: Frame | None = None
                 ) -> tuple[Array, Array]:
    """The tied update's new sites of the batch's points from the cavity of the whitened sums
    ``P_w [C, M, M]``, ``h_w [C, M]`` (kept in ``frame``: ``Frame``): ``(tau, nu)``, each
    ``[n, C]`` (checked finite: deferred in the caller's context)."""
    _, mask, _, _, y_col = labels
    shared = _directions(terms, frame)
    # R = L_B^-1 A and z = L_B^-1 a h_w: no means w = B^-1 a h_w (the shared A: broadcast)
    a, v = cavity_moments(P_w, h_w, fraction, terms.A if shared is None else shared,
                          iteration, prior=None if frame is None else frame.Q)  # [n, C]
    vs = v + terms.s.T  # b = v + s for every role; the winners' is its gather (the same sums)
    a_y, v_y = at_label(a, y_col), at_label(v, y_col)
    t = pair_slopes(a_y, at_label(vs, y_col), a, vs, mask)
    W1, W2 = new_role_site(t.g_win, t.gamma, a_y, v_y)
    L1, L2 = new_role_site(-t.g_win, t.gamma, a, v)
    # the sites of non-factors are 0 / 1 (pair_slopes' zeros, finite cavities; else the check
    # below fails either way)
    tau = aggregate(W1, L1, mask, win_masked=True)
    nu = aggregate(W2, L2, mask, win_masked=True)
    _finite("SEP sites", tau, nu)  # deferred in the caller's context
    return tau, nu


@compilable
def _tied_sums(terms: StackedTerms, P_w: Array, h_w: Array, fraction: Scales,
               labels: _BatchLabels, rho: float, iteration: int | None,
               frame: Frame | None = None) -> tuple[Array, Array, Array]:
    """``TiedSites.update`` on device arrays (a compiled region of the step): from the
    whitened sums ``P_w [C, M, M]``, ``h_w [C, M]`` (kept in ``frame``: ``Frame``, whose
    directions the new sites then take) and the cavity fractions (``Scales`` of ``[C]``), the
    new whitened sums and the change on the step's factor: ``(P_w, h_w, change [])``."""
    tau, nu = _batch_sites(terms, P_w, h_w, fraction, labels, iteration, frame)
    counts, n_factors = labels.counts, labels.n_factors
    shared = _directions(terms, frame)
    keep = 1.0 - rho * counts / n_factors
    A = terms.A
    kept = ops.namespace(keep).reshape(keep, (-1, 1, 1)) * P_w  # P_w stays (kept, snapshots)
    rho_tau = tau if rho == 1.0 else rho * tau  # rho in the sites ([n, C]; 1: exact as it is)
    if shared is not None:  # one product each for all, added in place
        kept += shared_site_products(shared, rho_tau)
        h_new = ops.mT(shared @ nu)
    else:  # kept += A diag(rho tau) A^T in place (numpy: one gemm per class with beta = 1)
        ops.matmul_add_(kept, ops.scale_columns(A, ops.mT(rho_tau)), terms.A_T, 1.0)
        h_new = ops.einsum("cmn,nc->cm", A, nu)
    # numpy: not symmetrised (a [C, M, M] pass less): the factorisations of B = I + a P (or
    # Q + a P) read one triangle; a rebase's products and Lam's sandwich read both, which
    # differ by round-off (scaled by ``keep`` each step). A device symmetrises (kept is this
    # step's own array)
    P_w = kept if ops.is_numpy(kept) else ops.symmetrize_(kept)
    h_next = keep[:, None] * h_w + rho * h_new
    return P_w, h_next, _site_change(h_next, h_w, frame)


def _group_sums(group: Group, terms: StackedTerms, P_w: Array, h_w: Array, fraction: Scales,
                labels: _BatchLabels, rho: float, iteration: int | None,
                frame: Frame | None = None) -> tuple[Array, Array, Array]:
    """``_tied_sums`` in a process ``group``: ``terms`` and ``labels`` are this rank's points
    of the global batch. Each rank forms its points' contributions ``A diag(tau) A^T``
    ``[C, M, M]``, ``A nu`` ``[C, M]`` and class counts ``[C]``; their sums over the ranks (one
    ``all_reduce``, with a failure flag: a failed check on any rank raises on every rank) are
    the union batch's, and every rank applies ``keep`` and ``rho`` to them alike, so the sums
    stay equal on every rank (the ranks' factors are one, and so is their ``frame``).
    Returns ``(P_w, h_w, change [])``."""
    def part() -> tuple[Array, Array, Array]:
        tau, nu = _batch_sites(terms, P_w, h_w, fraction, labels, iteration, frame)
        shared = _directions(terms, frame)
        if shared is not None:
            return shared_site_products(shared, tau), ops.mT(shared @ nu), labels.counts
        return (ops.scale_columns(terms.A, tau.T) @ terms.A_T,
                ops.einsum("cmn,nc->cm", terms.A, nu), labels.counts)

    done, failure = attempt(part)
    P_new, h_new, counts = (done if done is not None
                            else (P_w * 0.0, h_w * 0.0, labels.n_factors * 0.0))
    P_new, h_new, counts = group.agreed_sums([P_new, h_new, counts], failure)
    keep = 1.0 - rho * counts / labels.n_factors
    P_next = symmetrize(ops.namespace(keep).reshape(keep, (-1, 1, 1)) * P_w + rho * P_new)
    h_next = keep[:, None] * h_w + rho * h_new
    return P_next, h_next, _site_change(h_next, h_w, frame)


@compilable
def _tied_evaluate(terms: StackedTerms, P_w: Array, h_w: Array, pair: Scales,
                   labels: _BatchLabels, scale: float, iteration: int | None,
                   frame: Frame | None = None) -> tuple[Scalar, StackedMatrixGradients]:
    """``TiedSites.evaluate`` on device arrays (a compiled region of the step); ``pair``:
    the scales of ``q`` and of the cavity (``StackedGaussians.paired``); ``frame``: the
    ``Frame`` the shared sums are kept in."""
    _, mask, n_b, _, y_col = labels
    # one kernel and Z for every class: B^-1 A of the shared A, which the summed gradients read
    # (``shared_paired``: on numpy from one pass over the classes, no stack of B^-1 kept); per
    # class on numpy: B_cav^-1 A one product with the cavity's B^-1 (cheaper than
    # two trsm), q's B^-1 read by the gradient anyway, both in place of their factors
    # (``paired_by_inverse``: nothing below reads L_B)
    one = terms.one if isinstance(terms, SharedTerms) else None
    host = ops.is_numpy(P_w)
    if one is None and host:
        q, cav, lnr, (a, v, R) = paired_by_inverse(P_w, h_w, pair, terms.A, iteration)
    elif one is None:
        q, cav, lnr = StackedGaussians.paired(P_w, h_w, pair, iteration=iteration)
        a, v, R = cav.project(terms.A, means_by_point=True)
    else:  # B_cav^-1 A in place of R
        q, cav, lnr, (a, v, BiA) = shared_paired(
            P_w, h_w, pair, one.A[0] if frame is None else frame.A, iteration, frame=frame)
    vs = (v + terms.s).T
    t = pair_log_z(at_label(a, y_col), at_label(vs, y_col), a, vs, mask)
    xp = ops.namespace(lnr)
    cav_terms = xp.sum(n_b * xp.diff(lnr, axis=0))  # lnr_cav - lnr_q, [1, C]: one operator
    value = _first_row_sum(lnr) + scale * (xp.sum(t.log_z) + cav_terms)
    a_sum = _slope_sums(t.g_win, mask, scale)
    b_sum = scale * aggregate(t.g_b, t.g_b, mask, win_masked=True)
    if one is not None:  # the classes' sums, [1, ...]
        return value, shared_matrix_gradients(one, q, cav, BiA, a_sum.T, b_sum.T, frame=frame)
    return value, stacked_matrix_gradients(terms, q, cav, R, a_sum.T, b_sum.T,
                                           inverse_applied=host)


def _slope_sums(g_win: Array, mask: Array, scale: float) -> Array:
    """``scale * aggregate(g_win, -g_win, mask)`` ``[n, C]`` (``g_win`` zero off ``mask``, as
    ``pair_log_z``'s): on a device ``(-scale) where(mask, g_win, -sum_c g_win)``, the
    negated row sums one product with kept ``-1``s (3 operators where negating ``g_win``
    takes 4; the row sums to round-off); numpy as before."""
    if ops.is_numpy(g_win):
        return scale * aggregate(g_win, -g_win, mask, win_masked=True)
    minus_ones = ops.constant(g_win, (-1.0,) * g_win.shape[1], (g_win.shape[1], 1))
    return (-scale) * ops.namespace(g_win).where(mask, g_win, g_win @ minus_ones)


def _first_row_sum(lnr: Array) -> Array:
    """``sum(lnr[0])`` (a 0-d array) of ``lnr [2, C]``: on a device one einsum with kept
    ``(1, 0)`` (a select and a sum are two operators; the same terms, summed to round-off);
    numpy as before."""
    if ops.is_numpy(lnr):
        return np.sum(lnr[0])
    return ops.einsum("ac,a->", lnr, ops.constant(lnr, (1.0, 0.0)))

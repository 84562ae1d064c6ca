"""The compact ("solid") representation of the multi-class IVM posterior (spec ivm §2.2-2.4).

For the ordered active set ``I`` (size ``d``) with restricted sites ``(pi_i [C], b_i [C])``, per
class ``c`` (``D_c = diag(pi^(c)_I)``, ``K_c = K^(c)_I``):

* ``E_c = I + D_c^1/2 K_c D_c^1/2 = L_c L_c^T``, ``B_c = L_c^-1 D_c^1/2``, ``P_c = B_c^T B_c``;
* ``H = sum_c P_c = L_H L_H^T``;
* stubs of every training point ``j``: ``m^(c)_j = B_c k^(c)_j`` (buffer ``M [C, d, n]``) and
  ``q^(c)_j = L_H^-1 B_c^T m^(c)_j`` (buffer ``Q [C, d, n]``);
* ``Cov(u^c_j, u^c'_k) = delta_cc' (K^c(x_j, x_k) - m^c_j . m^c_k) + q^c_j . q^c'_k``;
* means by the gamma form ``h^(c)_j = k^(c)_j . gamma_c``,
  ``gamma_c = b_c - P_c K_c b_c + P_c H^-1 sum_c' P_c' K_c' b_c'`` (any ``b``, no sum-to-zero
  assumption).

``include`` appends one point in ``O(C d^2 + n C d)`` core/``M``-stub cost. The ``Q`` stubs are
kept by one of three equivalent schemes (``stub_update``):

* ``"lazy"`` (default): no ``Q`` buffer; ``q`` stubs are computed on demand for the points asked
  for (candidates, liquid points), ``O(C d^2)`` each. Per inclusion this is
  ``O(n C d + |J| C d^2)``, linear in ``n`` and ``C`` (the "delayed stub" scheme the paper
  mentions, spec §2.2);
* ``"drag"``: the spec §2.4 rank-one updates with dragging of all ``n`` stubs, ``O(n C^2 d)``
  (``C`` rank-one updates each drag ``C n`` columns);
* ``"resolve"``: one BLAS-3 triangular solve for all ``n`` stubs, ``O(n C d^2)``.
``from_sites`` rebuilds everything in block mode (used for learning and as a test oracle).
Buffers are preallocated to ``capacity`` so an inclusion never copies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from gpinfer.errors import NumericalError
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve
from gpinfer_ivm.cholupdate import cholext, chollrup

Array = np.ndarray

StubUpdate = Literal["lazy", "drag", "resolve"]
STUB_UPDATES = ("lazy", "drag", "resolve")


class SolidRepresentation:
    """Active set, sites and buffers of the compact representation (see the module docstring).

    * ``kernels``: one kernel per class (``C`` entries; the same object for a shared kernel,
      whose kernel columns are then computed and stored once).
    * ``X [n, D]``: training inputs; ``capacity``: the largest active-set size.
    """

    def __init__(
        self,
        kernels: Sequence[Kernel],
        X: Array,
        capacity: int,
        stub_update: StubUpdate = "lazy",
    ):
        if stub_update not in STUB_UPDATES:
            raise ValueError(f"stub_update must be one of {STUB_UPDATES}, got {stub_update!r}")
        self.kernels = list(kernels)
        self.X = X
        self.C = len(self.kernels)
        self.n = X.shape[0]
        self.cap = int(capacity)
        self.stub_update = stub_update
        ids: list[int] = []
        self.distinct: list[Kernel] = []
        self.kern_of = np.empty(self.C, dtype=int)
        for c, k in enumerate(self.kernels):
            if id(k) not in ids:
                ids.append(id(k))
                self.distinct.append(k)
            self.kern_of[c] = ids.index(id(k))
        C, n, cap = self.C, self.n, self.cap
        self.d = 0
        self.I = np.zeros(cap, dtype=np.int64)
        self.pi = np.zeros((cap, C))
        self.b = np.zeros((cap, C))
        self.Kdiag = np.stack([self.kernels[c].K_diag(X) for c in range(C)])  # [C, n]
        self.KI = np.zeros((len(self.distinct), n, cap))  # K(X, x_I) per distinct kernel
        self.L = np.zeros((C, cap, cap))
        self.Bm = np.zeros((C, cap, cap))
        self.LH = np.zeros((cap, cap))
        self.M = np.zeros((C, cap, n))
        self.Q = np.zeros((C, cap, n)) if stub_update != "lazy" else None

    # -- views of the current size -------------------------------------------------------------
    @property
    def active(self) -> Array:
        """The ordered active set ``I [d]``."""
        return self.I[: self.d]

    def K_active(self, c: int) -> Array:
        """``K^(c)(X, x_I)``, ``[n, d]``."""
        return self.KI[self.kern_of[c], :, : self.d]

    def P(self, c: int) -> Array:
        """``P_c = B_c^T B_c`` ``[d, d]``."""
        B = self.Bm[c, : self.d, : self.d]
        return B.T @ B

    # -- inclusion (spec §2.4) ------------------------------------------------------------------
    def _kernel_columns(self, i: int) -> Array:
        """``K(X, x_i)`` for each distinct kernel, ``[n_kernels, n]``."""
        xi = self.X[i : i + 1]
        return np.stack([k.K(self.X, xi)[:, 0] for k in self.distinct])

    def include(self, i: int, pi_i: Array, b_i: Array) -> None:
        """Append point ``i`` with site ``(pi_i [C], b_i [C])`` and update every buffer."""
        d, C = self.d, self.C
        if d >= self.cap:
            raise ValueError(f"active set is full (capacity {self.cap})")
        pi_i = np.asarray(pi_i, dtype=float)
        if np.any(~np.isfinite(pi_i)) or np.any(pi_i <= 0) or np.any(~np.isfinite(b_i)):
            raise NumericalError(f"invalid site for point {i}", quantity="site")
        kc = self._kernel_columns(i)
        l_c = np.zeros((C, d))
        lam_c, rho = np.zeros(C), np.zeros(C)
        r_c = np.zeros((C, d))
        mu = np.zeros((C, self.n))
        for c in range(C):
            kcol = kc[self.kern_of[c]]
            sq = np.sqrt(pi_i[c])
            sD = np.sqrt(self.pi[:d, c])
            s = sq * sD * kcol[self.I[:d]]
            l_c[c], lam_c[c] = cholext(self.L[c, :d, :d], s, 1.0 + pi_i[c] * self.Kdiag[c, i])
            r_c[c] = -(self.Bm[c, :d, :d].T @ l_c[c]) / lam_c[c]
            rho[c] = sq / lam_c[c]
            mu[c] = -(self.M[c, :d].T @ l_c[c]) / lam_c[c] + rho[c] * kcol
        LH = self.LH[:d, :d]
        Xd: Array | None
        if self.stub_update == "drag" and d:
            p = tri_solve(LH, r_c.T)  # [d, C], old factor
            X0 = (self._stubs()[:, :d] + p.T[:, :, None] * mu[:, None, :]).transpose(1, 0, 2)
            Xd = X0.reshape(d, C * self.n)
            for c in range(C):
                LH, Xd = chollrup(LH, r_c[c], 1.0, Xd)
            assert Xd is not None
            Xd = Xd.reshape(d, C, self.n).transpose(1, 0, 2)
        else:
            for c in range(C):
                LH, _ = chollrup(LH, r_c[c], 1.0)
            Xd = None
            if self.stub_update == "drag":  # d == 0: the new q row needs an empty X
                Xd = np.zeros((C, 0, self.n))
        ell, lam = cholext(LH, rho @ r_c, float(rho @ rho))
        # append rows
        for c in range(C):
            self.L[c, d, :d], self.L[c, d, d] = l_c[c], lam_c[c]
            self.Bm[c, d, :d], self.Bm[c, d, d] = r_c[c], rho[c]
            self.M[c, d] = mu[c]
        self.LH[:d, :d] = LH
        self.LH[d, :d], self.LH[d, d] = ell, lam
        self.KI[:, :, d] = kc
        self.I[d], self.pi[d], self.b[d] = i, pi_i, b_i
        self.d = d + 1
        if self.stub_update == "drag":
            assert Xd is not None
            Q = self._stubs()
            Q[:, :d] = Xd
            Q[:, d] = (rho[:, None] * mu - np.einsum("cdn,d->cn", Xd, ell)) / lam
        elif self.stub_update == "resolve":
            self._resolve_Q()

    def _stubs(self) -> Array:
        """The ``q``-stub buffer ``Q [C, cap, n]`` (kept for ``drag`` and ``resolve`` only)."""
        if self.Q is None:
            raise ValueError(f"stub_update={self.stub_update!r} keeps no q-stub buffer")
        return self.Q

    def q_stubs(self, idx: Array) -> Array:
        """``q`` stubs ``[C, d, len(idx)]`` of training points ``idx`` (buffer or on demand)."""
        idx = np.asarray(idx, dtype=np.int64)
        d = self.d
        if self.Q is not None:
            return self.Q[:, :d, idx]
        if d == 0 or idx.size == 0:
            return np.zeros((self.C, d, idx.size))
        BtM = np.concatenate(
            [self.Bm[c, :d, :d].T @ self.M[c, :d][:, idx] for c in range(self.C)], axis=1
        )  # [d, C len]
        return tri_solve(self.LH[:d, :d], BtM).reshape(d, self.C, idx.size).transpose(1, 0, 2)

    def _resolve_Q(self) -> None:
        """``Q_c = L_H^-1 B_c^T M_c`` by one BLAS-3 triangular solve (all classes at once)."""
        d, C = self.d, self.C
        BtM = np.concatenate(
            [self.Bm[c, :d, :d].T @ self.M[c, :d] for c in range(C)], axis=1
        )  # [d, C n]
        stubs = tri_solve(self.LH[:d, :d], BtM)  # [d, C n]
        self._stubs()[:, :d] = stubs.reshape(d, C, self.n).transpose(1, 0, 2)

    # -- block mode (spec §2.4 last paragraph) --------------------------------------------------
    @classmethod
    def from_sites(
        cls, kernels: Sequence[Kernel], X: Array, I: Array, pi: Array, b: Array
    ) -> SolidRepresentation:
        """Rebuild from ``(I [d], pi [d, C], b [d, C])`` with BLAS-3 operations."""
        I = np.asarray(I, dtype=np.int64)
        d = I.size
        rep = cls(kernels, X, max(d, 1), "resolve")
        rep.d = d
        rep.I[:d], rep.pi[:d], rep.b[:d] = I, pi, b
        for j, k in enumerate(rep.distinct):
            rep.KI[j, :, :d] = k.K(X, X[I])
        H = np.zeros((d, d))
        for c in range(rep.C):
            sD = np.sqrt(pi[:, c])
            Kc = rep.K_active(c)[I]
            E = np.eye(d) + sD[:, None] * Kc * sD[None, :]
            Lc = jittered_cholesky(E, name=f"E (class {c})").L
            Bc = tri_solve(Lc, np.diag(sD))
            rep.L[c, :d, :d], rep.Bm[c, :d, :d] = Lc, Bc
            rep.M[c, :d] = Bc @ rep.K_active(c).T
            H += Bc.T @ Bc
        rep.LH[:d, :d] = jittered_cholesky(H, name="H").L
        rep._resolve_Q()
        return rep

    # -- posterior moments ----------------------------------------------------------------------
    def gamma(self) -> Array:
        """``gamma [C, d]`` with ``h^(c)_j = k^(c)_j . gamma_c`` (spec §2.2 (b))."""
        d, C = self.d, self.C
        if d == 0:
            return np.zeros((C, 0))
        Pc = [self.P(c) for c in range(C)]
        bI = self.b[:d].T  # [C, d]
        PKb = np.stack([Pc[c] @ (self.K_active(c)[self.active] @ bI[c]) for c in range(C)])
        LH = self.LH[:d, :d]
        z = tri_solve(LH, tri_solve(LH, PKb.sum(axis=0)), transpose=True)  # H^-1 sum_c P_c K_c b_c
        return np.stack([bI[c] - PKb[c] + Pc[c] @ z for c in range(C)])

    def means(self, idx: Array | None = None, gamma: Array | None = None) -> Array:
        """Marginal means ``[len(idx), C]`` of training points (``None``: all ``n``)."""
        gam = self.gamma() if gamma is None else gamma
        idx = np.arange(self.n) if idx is None else np.asarray(idx)
        return np.stack([self.K_active(c)[idx] @ gam[c] for c in range(self.C)], axis=1)

    def means_eta(self, idx: Array | None = None) -> Array:
        """Marginal means by the paper's (corrected) eta form, spec §2.2 (a); ``[len, C]``.

        ``v_bar_k = mean_c b^(c)_k`` (class average, spec P3), ``w^(c) = b^(c)_I - v_bar``,
        ``eta1_c = L_c^-1 D_c^-1/2 w^(c)``, ``eta2 = L_H^-1 sum_c B_c^T eta1_c``,
        ``eta3_c = M_c[:, I] v_bar``, ``eta4 = sum_c Q_c[:, I] v_bar``;
        ``h^(c)_j = m^(c)_j . (eta1_c - eta3_c) - q^(c)_j . (eta2 - eta4) + k^(c)_j . v_bar``.
        Computed from the buffers in ``O(C d^2)`` (a cross-check of the gamma form).
        """
        d, C = self.d, self.C
        idx = np.arange(self.n) if idx is None else np.asarray(idx)
        I = self.active
        vbar = self.b[:d].mean(axis=1)
        eta1 = [tri_solve(self.L[c, :d, :d], (self.b[:d, c] - vbar) / np.sqrt(self.pi[:d, c]))
                for c in range(C)]  # fmt: skip
        eta2 = tri_solve(self.LH[:d, :d], sum(self.Bm[c, :d, :d].T @ eta1[c] for c in range(C)))
        QI, Qj = self.q_stubs(I), self.q_stubs(idx)
        eta4 = sum(QI[c] @ vbar for c in range(C))
        h = np.empty((idx.size, C))
        for c in range(C):
            Mc = self.M[c, :d]
            eta3 = Mc[:, I] @ vbar
            h[:, c] = (Mc[:, idx].T @ (eta1[c] - eta3) - Qj[c].T @ (eta2 - eta4)
                       + self.K_active(c)[idx] @ vbar)  # fmt: skip
        return h

    def covariances(self, idx: Array) -> Array:
        """Marginal covariances ``A_j [len(idx), C, C]`` (spec eq. 6), ``O(C^2 d)`` each."""
        idx = np.asarray(idx)
        d = self.d
        m2 = np.einsum("cdj,cdj->jc", self.M[:, :d, idx], self.M[:, :d, idx])
        Qj = self.q_stubs(idx)
        A = np.einsum("cdj,edj->jce", Qj, Qj)
        A[:, np.arange(self.C), np.arange(self.C)] += self.Kdiag[:, idx].T - m2
        return A

    def cross_covariances(self, idx1: Array, idx2: Array) -> Array:
        """``Cov(u^c_j, u^c'_k)`` for ``j in idx1``, ``k in idx2``: ``[n1, C, n2, C]``."""
        idx1, idx2 = np.asarray(idx1, dtype=np.int64), np.asarray(idx2, dtype=np.int64)
        d = self.d
        if idx1.size == 0 or idx2.size == 0:
            return np.zeros((idx1.size, self.C, idx2.size, self.C))
        C, n1, n2 = self.C, idx1.size, idx2.size
        # sum_d Q1[c, d, j] Q2[e, d, k] as one GEMM [(j c), d] @ [d, (k e)] (einsum's own loop
        # is several times slower at these sizes); each distinct kernel evaluated once
        Q1 = self.q_stubs(idx1).transpose(2, 0, 1).reshape(n1 * C, d)
        Q2 = self.q_stubs(idx2).transpose(1, 2, 0).reshape(d, n2 * C)
        out = (Q1 @ Q2).reshape(n1, C, n2, C)
        X1, X2 = self.X[idx1], self.X[idx2]
        Ks = [k.K(X1, X2) for k in self.distinct]
        for c in range(C):
            Kc = Ks[self.kern_of[c]]
            Mc = self.M[c, :d]
            out[:, c, :, c] += Kc - Mc[:, idx1].T @ Mc[:, idx2]
        return out

    def predict(self, Xs: Array) -> tuple[Array, Array]:
        """Predictive ``h_* [N*, C]`` and ``A_* [N*, C, C]`` at new inputs (spec §2.10)."""
        d, C = self.d, self.C
        Xs = np.asarray(Xs, dtype=float)
        XI = self.X[self.active]
        gam = self.gamma()
        h = np.empty((Xs.shape[0], C))
        A = np.zeros((Xs.shape[0], C, C))
        Qs = np.zeros((C, d, Xs.shape[0]))
        Ks = [k.K(XI, Xs) for k in self.distinct]
        LH = self.LH[:d, :d]
        for c in range(C):
            k = Ks[self.kern_of[c]]
            B = self.Bm[c, :d, :d]
            m = B @ k
            Qs[c] = tri_solve(LH, B.T @ m) if d else m
            h[:, c] = k.T @ gam[c]
            A[:, c, c] = self.kernels[c].K_diag(Xs) - np.sum(m * m, axis=0)
        A += np.einsum("cdj,edj->jce", Qs, Qs)
        return h, A

    def phi_active(self) -> Array:
        """``Phi_I = (I + Pi_I K_I)^-1 Pi_I`` in class-major order, ``[C d, C d]`` (tests)."""
        d, C = self.d, self.C
        Pc = [self.P(c) for c in range(C)]
        LH = self.LH[:d, :d]
        out = np.zeros((C * d, C * d))
        for c in range(C):
            for e in range(C):
                blk = -Pc[c] @ tri_solve(LH, tri_solve(LH, Pc[e]), transpose=True)
                if c == e:
                    blk = blk + Pc[c]
                out[c * d : (c + 1) * d, e * d : (e + 1) * d] = blk
        return out

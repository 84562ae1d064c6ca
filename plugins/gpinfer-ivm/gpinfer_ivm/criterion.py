"""The learning criterion ``G = G1 + G2`` and its matrix-level gradient (spec ivm §3, §4.6).

For frozen active sets and sites, ``G`` upper-bounds ``-log P(y | theta)`` (exact expectations):
``G1 = -sum_i E_Q[log softmax(u_i + beta)_{y_i}]`` over **all** ``n`` points, ``G2 = KL[Q || P]``
on the active latents. The representation is rebuilt in block mode for the current kernels.

One code path serves both methods:

* ``coupled=True`` (``ivm``): one active set ``I`` for all classes, restricted sites
  (``pi_i [C]``), ``H = sum_c P_c`` couples the classes;
* ``coupled=False`` (``ivm-baseline``): one active set ``I_c`` per class with scalar sites; every
  ``H``, ``U``, ``R``, ``S``, ``e5`` term is dropped (``Phi = blockdiag(P_c)``).

Gradient pieces per class (spec §3.3): ``E1 [n, d] = dG/dK(X, x_I)``, ``E2 [d, d] = dG/dK_I``,
``g [n] = dG/d diag K``, turned into kernel-parameter gradients by the kernels' VJPs
(``K_I`` and ``K(X, x_I)`` contributions both count), and ``dG/dbeta = sum_i (E[p_i] - delta)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cholesky, solve_triangular

from gpinfer.kernels.base import Kernel
from gpinfer.numerics.gaussian_cubature import SoftmaxExpectation, softmax_expected_log_prob

Array = np.ndarray


def _tri(L: Array, B: Array, trans: bool = False) -> Array:
    return solve_triangular(L, B, lower=True, trans=1 if trans else 0, check_finite=False)


def _sym(X: Array) -> Array:
    return 0.5 * (X + X.T)


@dataclass
class FrozenSites:
    """Active sets and sites held fixed in minor mode.

    ``I``: one index array ``[d_c]`` per class; ``pi``, ``b``: per class ``[d_c]`` (the class
    components of the sites). ``coupled``: restricted sites with a common ``I`` (then
    ``alpha [d] = sum_c pi_c``).
    """

    I: list[Array]
    pi: list[Array]
    b: list[Array]
    coupled: bool

    @classmethod
    def from_restricted(cls, I: Array, pi: Array, b: Array) -> FrozenSites:
        """From the multi-class IVM: ``I [d]``, ``pi [d, C]``, ``b [d, C]``."""
        C = pi.shape[1]
        return cls([np.asarray(I)] * C, [pi[:, c] for c in range(C)], [b[:, c] for c in range(C)],
                   True)  # fmt: skip


@dataclass
class CriterionResult:
    """``value = G``; ``dkernel``: one gradient per distinct kernel (first-appearance order);
    ``dbeta [C]``; ``g1``, ``g2``: the two parts."""

    value: float
    dkernel: list[Array]
    dbeta: Array
    g1: float
    g2: float


def criterion(
    kernels: Sequence[Kernel],
    X: Array,
    y: Array,
    sites: FrozenSites,
    beta: Array,
    order: int | None = None,
    reduced: bool | None = None,
    gradient: bool = True,
    rule: str = "product",
    expected_log_lik: Callable[[Array, Array, Array], SoftmaxExpectation] | None = None,
) -> CriterionResult:
    """``G`` and its gradient wrt kernel parameters and intercepts (spec §3.2-3.3, §4.6).

    ``expected_log_lik(y, h [n, C], A [n, C, C])`` replaces the softmax expectations (value,
    ``dmean``, ``dcov``) by another likelihood's, e.g. the exact quadratic surrogate of spec §7
    oracle 12a; ``dbeta`` is then the softmax formula's and meaningless.
    """
    C, n = len(kernels), X.shape[0]
    coupled = sites.coupled
    Kdiag = np.stack([kernels[c].K_diag(X) for c in range(C)])  # [C, n]
    KI, Kc, Lc, Bc, Pc, Mt, Mm = [], [], [], [], [], [], []
    logdetE = 0.0
    trEinv = 0.0
    for c in range(C):
        I = sites.I[c]
        d = I.size
        K_nI = kernels[c].K(X, X[I])  # [n, d]
        sD = np.sqrt(sites.pi[c])
        E = np.eye(d) + sD[:, None] * K_nI[I] * sD[None, :]
        L = cholesky(E, lower=True, check_finite=False)
        B = _tri(L, np.diag(sD))
        P = B.T @ B
        KI.append(K_nI)
        Kc.append(K_nI[I])
        Lc.append(L)
        Bc.append(B)
        Pc.append(P)
        Mm.append(B @ K_nI.T)  # M_c [d, n]
        Mt.append(K_nI @ P)  # M~_c [n, d]
        logdetE += 2.0 * np.sum(np.log(np.diag(L)))
        Linv = _tri(L, np.eye(d))
        trEinv += float(np.sum(Linv * Linv))
    bI = sites.b
    PKb = [Pc[c] @ (Kc[c] @ bI[c]) for c in range(C)]
    if coupled:
        d = sites.I[0].size
        H = sum(Pc)
        LH = cholesky(H, lower=True, check_finite=False)
        z = _tri(LH, _tri(LH, sum(PKb)), trans=True)
        gam = [bI[c] - PKb[c] + Pc[c] @ z for c in range(C)]
        Qr = [_tri(LH, Bc[c].T @ Mm[c]).T for c in range(C)]  # Q_c^T [n, d]
    else:
        gam = [bI[c] - PKb[c] for c in range(C)]
    h = np.stack([KI[c] @ gam[c] for c in range(C)], axis=1)  # [n, C]
    A = np.zeros((n, C, C))
    if coupled:
        A = np.einsum("jdc,jde->jce", np.stack(Qr, 2), np.stack(Qr, 2))
    A[:, np.arange(C), np.arange(C)] += (Kdiag - np.stack([np.sum(M * M, 0) for M in Mm])).T
    if expected_log_lik is None:
        ex = softmax_expected_log_prob(y, h, A, beta, order, reduced, rule)
    else:
        ex = expected_log_lik(y, h, A)
    g1 = -float(np.sum(ex.value))
    hI = [Kc[c] @ gam[c] for c in range(C)]
    quad = sum(float(gam[c] @ hI[c]) for c in range(C))
    Pt = [(_tri(Lc[c], Bc[c], trans=True)).T @ _tri(Lc[c], Bc[c], trans=True) for c in range(C)]
    if coupled:
        alpha = sum(sites.pi)
        Ht = sum(Pt)
        HiHt = _tri(LH, _tri(LH, Ht), trans=True)
        g2 = 0.5 * (
            logdetE - np.sum(np.log(alpha)) + 2.0 * np.sum(np.log(np.diag(LH))) + trEinv
            + d - np.trace(HiHt) - C * d + quad
        )  # fmt: skip
    else:
        dsum = sum(I.size for I in sites.I)
        g2 = 0.5 * (logdetE + trEinv - dsum + quad)
    value = g1 + float(g2)
    cvec = -ex.dmean  # c_i = E[p] - delta, [n, C]
    Gt = -ex.dcov  # G~_i, [n, C, C]
    dbeta = cvec.sum(axis=0)
    if not gradient:
        return CriterionResult(value, [], dbeta, g1, float(g2))

    dk: dict[int, Array] = {}
    if coupled:
        Hinv = lambda M: _tri(LH, _tri(LH, M), trans=True)  # noqa: E731
        U = [_tri(LH, Pc[c]) for c in range(C)]
        R = [sum(Gt[:, c, e][:, None] * Qr[e] for e in range(C)) for c in range(C)]
        S = sum(Qr[c].T @ R[c] for c in range(C))
        e5 = sum(Qr[c].T @ cvec[:, c] for c in range(C))
        sum_PhI = Hinv(sum(Pc[c] @ hI[c] for c in range(C)))
    for c in range(C):
        gc, P, Dcc = gam[c], Pc[c], Gt[:, c, c]
        E1 = np.outer(cvec[:, c], gc) - 2.0 * Dcc[:, None] * Mt[c]
        xi = Mt[c].T @ cvec[:, c]
        zeta = P @ hI[c]
        PhiKPhi = P - Pt[c]
        if coupled:
            E1 = E1 + 2.0 * R[c] @ U[c]
            xi = xi - U[c].T @ e5
            zeta = zeta - P @ sum_PhI
            PHi = Hinv(P).T  # P H^-1
            PhiKPhi = PhiKPhi - PHi @ P + 2.0 * _sym(PHi @ Pt[c]) - PHi @ Ht @ PHi.T
        E2 = (
            0.5 * PhiKPhi + 0.5 * np.outer(gc, gc) - _sym(np.outer(gc, zeta))
            - _sym(np.outer(xi, gc)) + Mt[c].T @ (Dcc[:, None] * Mt[c])
        )  # fmt: skip
        if coupled:
            E2 = E2 - 2.0 * _sym(Mt[c].T @ R[c] @ U[c]) + U[c].T @ S @ U[c]
        kern = kernels[c]
        XI = X[sites.I[c]]
        grad = (
            kern.grad_params(XI, X, E1.T)
            + kern.grad_params(XI, None, _sym(E2))
            + kern.grad_params_diag(X, Dcc)
        )
        dk[id(kern)] = dk.get(id(kern), 0.0) + grad
    order_ids: list[int] = []
    for k in kernels:
        if id(k) not in order_ids:
            order_ids.append(id(k))
    return CriterionResult(value, [dk[i] for i in order_ids], dbeta, g1, float(g2))

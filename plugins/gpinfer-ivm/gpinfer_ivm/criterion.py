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
``g [n] = dG/d diag K``: one ``MatrixGradients`` per class with the active inputs ``x_I`` as the
inducing inputs (``Kuf = E1^T``, ``Kuu = E2``, ``Kff_diag = g``), turned into kernel-parameter
gradients by the core's ``hyper.parameter_gradient`` (kernel VJPs; classes sharing a kernel add
up), and ``dG/dbeta = sum_i (E[p_i] - delta)``.

The steps, in order: ``class_factors`` (per-class Cholesky factors of ``I + D^1/2 K_I D^1/2``),
``couple`` (the coupled ``H`` and the site coefficients ``gamma``), ``marginals`` (``h [n, C]``,
``A [n, C, C]``), the expectations, ``kl_term`` (``G2``), ``matrix_gradients``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve
from gpinfer_ivm.diagonal_softmax import diagonal_softmax_expected_log_prob
from gpinfer_ivm.gaussian_cubature import SoftmaxExpectation, softmax_expected_log_prob

Array = np.ndarray


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
    ``dbeta [C]``; ``g1``, ``g2``: the two parts; ``matrix``: one ``MatrixGradients`` per class
    (empty without gradients) with ``inputs``, the active inputs ``x_I [d_c, D]`` they refer to."""

    value: float
    dkernel: list[Array]
    dbeta: Array
    g1: float
    g2: float
    matrix: list[MatrixGradients] = field(default_factory=list)
    inputs: list[Array] = field(default_factory=list)


@dataclass
class ClassFactors:
    """Per class ``c`` with ``d`` active points: ``K_nI [n, d]``, ``K_I [d, d]``, ``L`` the
    Cholesky factor of ``E = I + D^1/2 K_I D^1/2``, ``B = L^-1 D^1/2``, ``P = B^T B [d, d]``,
    ``M = B K_nI^T [d, n]``, ``Mt = K_nI P [n, d]``; ``logdet_E``, ``tr_Einv`` summed over
    classes; ``Kdiag [C, n]``."""

    K_nI: list[Array]
    K_I: list[Array]
    L: list[Array]
    B: list[Array]
    P: list[Array]
    M: list[Array]
    Mt: list[Array]
    logdet_E: float
    tr_Einv: float
    Kdiag: Array


def class_factors(kernels: Sequence[Kernel], X: Array, sites: FrozenSites) -> ClassFactors:
    """The factors of every class at the current kernels (spec §3.2)."""
    C = len(kernels)
    out = ClassFactors([], [], [], [], [], [], [], 0.0, 0.0,
                       np.stack([kernels[c].K_diag(X) for c in range(C)]))
    for c in range(C):
        I = sites.I[c]
        d = I.size
        K_nI = kernels[c].K(X, X[I])  # [n, d]
        sD = np.sqrt(sites.pi[c])
        E = np.eye(d) + sD[:, None] * K_nI[I] * sD[None, :]
        L = jittered_cholesky(E, name=f"E (class {c})").L
        B = tri_solve(L, np.diag(sD))
        P = B.T @ B
        out.K_nI.append(K_nI)
        out.K_I.append(K_nI[I])
        out.L.append(L)
        out.B.append(B)
        out.P.append(P)
        out.M.append(B @ K_nI.T)
        out.Mt.append(K_nI @ P)
        out.logdet_E += 2.0 * float(np.sum(np.log(np.diag(L))))
        Linv = tri_solve(L, np.eye(d))
        out.tr_Einv += float(np.sum(Linv * Linv))
    return out


@dataclass
class Coupling:
    """``gamma``: per class ``[d_c]`` site coefficients (``h = K_nI gamma``); coupled only:
    ``LH`` the Cholesky factor of ``H = sum_c P_c [d, d]`` and ``Qr`` per class ``[n, d]``."""

    gamma: list[Array]
    LH: Array | None = None
    Qr: list[Array] | None = None


def couple(f: ClassFactors, sites: FrozenSites) -> Coupling:
    """Site coefficients ``gamma`` (and, for coupled sites, ``H`` and ``Q``)."""
    C = len(f.P)
    PKb = [f.P[c] @ (f.K_I[c] @ sites.b[c]) for c in range(C)]
    if not sites.coupled:
        return Coupling([sites.b[c] - PKb[c] for c in range(C)])
    H: Array = sum(f.P[1:], f.P[0])  # left to right, as sum(f.P)
    LH = jittered_cholesky(H, name="H").L
    z = tri_solve(LH, tri_solve(LH, sum(PKb)), transpose=True)
    gamma = [sites.b[c] - PKb[c] + f.P[c] @ z for c in range(C)]
    Qr = [tri_solve(LH, f.B[c].T @ f.M[c]).T for c in range(C)]  # Q_c^T [n, d]
    return Coupling(gamma, LH, Qr)


def marginals(f: ClassFactors, cp: Coupling) -> tuple[Array, Array]:
    """``h [n, C]`` and ``A [n, C, C]``: the means and covariances of ``u_i`` under ``Q``."""
    C = len(f.P)
    n = f.Kdiag.shape[1]
    h = np.stack([f.K_nI[c] @ cp.gamma[c] for c in range(C)], axis=1)
    A = np.zeros((n, C, C))
    if cp.Qr is not None:
        Qs = np.stack(cp.Qr, 2)
        A = np.einsum("jdc,jde->jce", Qs, Qs)
    # diag K - rowsum(M o M) cancels at large amplitudes: floored at 1e-12 diag K (round-off)
    own = np.maximum(f.Kdiag - np.stack([np.sum(M * M, 0) for M in f.M]), 1e-12 * f.Kdiag)
    A[:, np.arange(C), np.arange(C)] += own.T
    return h, A


def kl_term(f: ClassFactors, cp: Coupling, sites: FrozenSites) -> tuple[float, list[Array],
                                                                      list[Array]]:
    """``G2 = KL[Q || P]``, ``h_I = K_I gamma`` and ``Pt = (L^-T B)^T (L^-T B)`` per class."""
    C = len(f.P)
    hI = [f.K_I[c] @ cp.gamma[c] for c in range(C)]
    quad = sum(float(cp.gamma[c] @ hI[c]) for c in range(C))
    Pt = [(tri_solve(f.L[c], f.B[c], transpose=True)).T @ tri_solve(f.L[c], f.B[c], transpose=True)
          for c in range(C)]
    if cp.LH is not None:
        LH = cp.LH
        d = sites.I[0].size
        alpha = sum(sites.pi)
        HiHt = tri_solve(LH, tri_solve(LH, sum(Pt)), transpose=True)
        g2 = 0.5 * (
            f.logdet_E - np.sum(np.log(alpha)) + 2.0 * np.sum(np.log(np.diag(LH))) + f.tr_Einv
            + d - np.trace(HiHt) - C * d + quad
        )  # fmt: skip
    else:
        dsum = sum(I.size for I in sites.I)
        g2 = 0.5 * (f.logdet_E + f.tr_Einv - dsum + quad)
    return float(g2), hI, Pt


def matrix_gradients(f: ClassFactors, cp: Coupling, hI: list[Array], Pt: list[Array],
                     cvec: Array, Gt: Array) -> list[MatrixGradients]:
    """``dG/dK`` per class (spec §3.3): ``Kuf = E1^T [d, n]``, ``Kuu = E2 [d, d]`` (symmetric),
    ``Kff_diag = g [n]``, from ``c_i = E[p_i] - delta [n, C]`` and ``G~_i [n, C, C]``."""
    C = len(f.P)
    if cp.LH is not None:
        LH, Qr = cp.LH, cp.Qr
        assert Qr is not None
        Hinv = lambda M: tri_solve(LH, tri_solve(LH, M), transpose=True)  # noqa: E731
        Ht = sum(Pt)
        U = [tri_solve(LH, f.P[c]) for c in range(C)]
        R = [sum(Gt[:, c, e][:, None] * Qr[e] for e in range(C)) for c in range(C)]
        S = sum(Qr[c].T @ R[c] for c in range(C))
        e5 = sum(Qr[c].T @ cvec[:, c] for c in range(C))
        sum_PhI = Hinv(sum(f.P[c] @ hI[c] for c in range(C)))
    out = []
    for c in range(C):
        gc, P, Dcc, Mt = cp.gamma[c], f.P[c], Gt[:, c, c], f.Mt[c]
        E1 = np.outer(cvec[:, c], gc) - 2.0 * Dcc[:, None] * Mt
        xi = Mt.T @ cvec[:, c]
        zeta = P @ hI[c]
        PhiKPhi = P - Pt[c]
        if cp.LH is not None:
            E1 = E1 + 2.0 * R[c] @ U[c]
            xi = xi - U[c].T @ e5
            zeta = zeta - P @ sum_PhI
            PHi = Hinv(P).T  # P H^-1
            PhiKPhi = PhiKPhi - PHi @ P + 2.0 * _sym(PHi @ Pt[c]) - PHi @ Ht @ PHi.T
        E2 = (
            0.5 * PhiKPhi + 0.5 * np.outer(gc, gc) - _sym(np.outer(gc, zeta))
            - _sym(np.outer(xi, gc)) + Mt.T @ (Dcc[:, None] * Mt)
        )  # fmt: skip
        if cp.LH is not None:
            E2 = E2 - 2.0 * _sym(Mt.T @ R[c] @ U[c]) + U[c].T @ S @ U[c]
        out.append(MatrixGradients(Kff_diag=Dcc.copy(), Kuu=_sym(E2), Kuf=E1.T))
    return out


def _diagonal_expectation(y: Array, h: Array, A: Array, beta: Array) -> SoftmaxExpectation:
    """The softmax expectations for diagonal marginals ``A [n, C, C]`` (uncoupled sites) by the
    exact 1-D reduction; ``dcov`` is diagonal (the only part the uncoupled gradient reads)."""
    C = h.shape[1]
    ex = diagonal_softmax_expected_log_prob(y, h, np.diagonal(A, axis1=1, axis2=2), beta)
    dcov = np.zeros(A.shape)
    dcov[:, np.arange(C), np.arange(C)] = ex.dvar
    return SoftmaxExpectation(ex.value, ex.dmean, dcov)


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

    ``rule``: a ``gaussian_cubature`` rule, or ``diagonal`` (uncoupled sites, whose marginals
    are diagonal: the exact 1-D reduction of ``gpinfer_ivm.diagonal_softmax``).
    ``expected_log_lik(y, h [n, C], A [n, C, C])`` replaces the softmax expectations (value,
    ``dmean``, ``dcov``) by another likelihood's, e.g. the exact quadratic surrogate of spec §7
    oracle 12a; ``dbeta`` is then the softmax formula's and meaningless.
    """
    f = class_factors(kernels, X, sites)
    cp = couple(f, sites)
    h, A = marginals(f, cp)
    if expected_log_lik is None and rule == "diagonal":
        ex = _diagonal_expectation(y, h, A, beta)
    elif expected_log_lik is None:
        ex = softmax_expected_log_prob(y, h, A, beta, order, reduced, rule)
    else:
        ex = expected_log_lik(y, h, A)
    g1 = -float(np.sum(ex.value))
    g2, hI, Pt = kl_term(f, cp, sites)
    value = g1 + g2
    cvec = -ex.dmean  # c_i = E[p] - delta, [n, C]
    dbeta = cvec.sum(axis=0)
    if not gradient:
        return CriterionResult(value, [], dbeta, g1, g2)
    matrix = matrix_gradients(f, cp, hI, Pt, cvec, -ex.dcov)
    inputs = [X[I] for I in sites.I]
    # the core's VJPs and tying: classes sharing a kernel object add up in one block
    hp = HyperParameters(list(kernels), Z=inputs, optimize_inducing=False)
    flat = parameter_gradient(hp, X, matrix)
    distinct = list({id(k): k for k in kernels}.values())  # first-appearance order, as hp's
    sizes = np.cumsum([k.n_params for k in distinct])[:-1]
    return CriterionResult(value, np.split(flat, sizes), dbeta, g1, g2, matrix, inputs)

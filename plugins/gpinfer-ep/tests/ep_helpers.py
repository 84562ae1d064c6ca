"""Small problems and dense brute-force references for the EP / SEP / GFITC tests."""

from __future__ import annotations

import numpy as np
from gpinfer_ep.model import all_terms
from gpinfer_ep.state import RankOneSites, TiedSites
from scipy.special import log_ndtr

from gpinfer.hyper import HyperParameters
from gpinfer.kernels import RBF, White
from gpinfer.kernels.combination import Sum
from gpinfer.sites.inducing import INDUCING_JITTER, factor_mask
from gpinfer.testing import MethodTestSuite


def problem(N=12, C=3, M=4, D=2, seed=0, shared=False):
    """Random inputs/labels, per-class random kernels (ARD RBF + white) and ``Z``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    y = np.arange(N) % C
    rng.shuffle(y)
    kernels, Zs = [], []
    for _ in range(C):
        if shared and kernels:
            kernels.append(kernels[0].copy())
            Zs.append(Zs[0].copy())
            continue
        ell = np.exp(rng.uniform(-0.3, 0.5, D))
        kernels.append(Sum([RBF(lengthscale=ell, variance=float(np.exp(rng.uniform(0, 1)))),
                            White(variance=float(np.exp(rng.uniform(-2, -0.5))))]))
        Zs.append(X[rng.choice(N, M, replace=False)] + 0.1 * rng.standard_normal((M, D)))
    return X, y.astype(np.int64), kernels, Zs


def converge(state, kernels, Zs, X, rho=0.5, tol=1e-12, max_sweeps=3000):
    """Damped parallel sweeps with fixed hyper-parameters until ``max |change| < tol``."""
    terms = all_terms(kernels, Zs, X)
    idx = np.arange(X.shape[0])
    for sweep in range(max_sweeps):
        if state.update(terms, idx, rho) < tol:
            return sweep
    raise AssertionError("EP did not converge")


def dense(kernel, Z, X):
    Kuu = kernel.K(Z) + INDUCING_JITTER * np.eye(Z.shape[0])
    Kuf = kernel.K(Z, X)
    Ups = np.linalg.solve(Kuu, Kuf)
    s = kernel.K_diag(X) + INDUCING_JITTER - np.sum(Kuf * Ups, axis=0)
    return Kuu, Ups, s


def G(P, h):
    """``G`` of a Gaussian with precision ``P`` and shift ``h`` (no 2 pi terms)."""
    S = np.linalg.inv(P)
    return 0.5 * np.linalg.slogdet(S)[1] + 0.5 * h @ S @ h


def u_space_cavities(state, kernels, Zs, X):
    """Dense ``u``-space cavities per factor role, at the current hyper-parameters.

    Returns ``(Lam, h, cav)`` with ``cav[(i, k)] = ((m_y, V_y), (m_k, V_k))``.
    """
    y = state.y
    C = len(kernels)
    cav = {}
    mats = [dense(k, Z, X) for k, Z in zip(kernels, Zs)]
    Lam, h = state.Lam.copy(), state.h.copy()
    base = [np.linalg.inv(Kuu) for Kuu, _, _ in mats]
    for i in range(X.shape[0]):
        for k in range(C):
            if k == y[i]:
                continue
            out = []
            for c in (y[i], k):
                if isinstance(state, TiedSites):
                    f = 1.0 - 1.0 / state.n_factors[c]
                    P, hh = base[c] + f * Lam[c], f * h[c]
                else:
                    u = state.U[c][:, i]
                    C1 = state.W1[i, k] if c == y[i] else state.L1[i, k]
                    C2 = state.W2[i, k] if c == y[i] else state.L2[i, k]
                    P, hh = base[c] + Lam[c] - C1 * np.outer(u, u), h[c] - C2 * u
                V = np.linalg.inv(P)
                out.append((V @ hh, V))
            cav[(i, k)] = tuple(out)
    return Lam, h, cav


def frozen_surrogate(kernels, Zs, X, y, Lam, h, cav):
    """Spec O6: ``sum_c [G(K^-1 + Lam, h) - G(K)] + sum log Z_ik`` with cavities fixed in
    ``u``-space; its gradient is the one EP / SEP report (§2.7.2-2.7.3)."""
    mats = [dense(k, Z, X) for k, Z in zip(kernels, Zs)]
    value = 0.0
    for c, (Kuu, _, _) in enumerate(mats):
        value += G(np.linalg.inv(Kuu) + Lam[c], h[c]) - 0.5 * np.linalg.slogdet(Kuu)[1]
    for (i, k), ((m_y, V_y), (m_k, V_k)) in cav.items():
        u_y, u_k = mats[y[i]][1][:, i], mats[k][1][:, i]
        z = mats[y[i]][2][i] + mats[k][2][i] + u_y @ V_y @ u_y + u_k @ V_k @ u_k
        value += float(log_ndtr((u_y @ m_y - u_k @ m_k) / np.sqrt(z)))
    return value


def dense_ep_log_z(state: RankOneSites, kernels, Zs, X):
    """EP ``log Z_q`` (eqs. 57-61) with dense inverses and log-determinants (spec O2)."""
    y, C = state.y, len(kernels)
    mask = factor_mask(y, C)
    mats = [dense(k, Z, X) for k, Z in zip(kernels, Zs)]
    qs = []
    value = 0.0
    for c, (Kuu, _, _) in enumerate(mats):
        P = np.linalg.inv(Kuu) + state.Lam[c]
        value += G(P, state.h[c]) - 0.5 * np.linalg.slogdet(Kuu)[1]
        qs.append((P, state.h[c]))
    for i in range(X.shape[0]):
        for k in np.flatnonzero(mask[i]):
            a, b = [], []
            for c, C1, C2 in ((y[i], state.W1[i, k], state.W2[i, k]),
                              (k, state.L1[i, k], state.L2[i, k])):
                u = mats[c][1][:, i]
                P, hh = qs[c][0] - C1 * np.outer(u, u), qs[c][1] - C2 * u
                value += G(P, hh) - G(*qs[c])
                V = np.linalg.inv(P)
                a.append(u @ V @ hh)
                b.append(u @ V @ u + mats[c][2][i])
            value += float(log_ndtr((a[0] - a[1]) / np.sqrt(b[0] + b[1])))
    return value


def hyper(kernels, Zs):
    return HyperParameters(kernels, Z=Zs)


def subset_check(hp, theta0, f, analytic, name, **tol):
    """FD check on the kernel parameters of every class and one inducing coordinate per class
    (keeps the re-converging checks fast; the frozen-cavity tests cover every entry)."""
    from gpinfer.testing import assert_gradient_close

    keep = [i for i, n in enumerate(hp.names) if n.startswith("kernel") or n.endswith("[0,0]")]

    def g(sub):
        theta = theta0.copy()
        theta[keep] = sub
        return f(theta)

    assert_gradient_close(g, analytic[keep], theta0[keep], name=name, **tol)


class InducingSuite(MethodTestSuite):
    """The shared battery's settings for the plugin's inducing-point methods (sep, ep, gfitc):
    three classes, ``M = N`` inducing points (every class holds all inputs, so relabelling is
    exactly equivariant) and the gradient tolerances of their sub-problem objectives."""

    n_classes = 3
    inducing = 40
    gradient_rtol = 1e-4
    gradient_atol = 1e-6

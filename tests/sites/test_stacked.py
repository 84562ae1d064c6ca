"""Oracles of gpinfer.sites.stacked: the class-batched algebra equals the per-class algebra of
gpinfer.sites.inducing (the reference it replaces in SEP) to round-off."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from gpinfer.backend import ops, resolve_backend
from gpinfer.errors import NumericalError
from gpinfer.interfaces import MatrixGradients
from gpinfer.kernels import RBF, White
from gpinfer.kernels.stacked import StackedKernels
from gpinfer.numerics.cholesky import jittered_cholesky
from gpinfer.sites.inducing import WhitenedGaussian
from gpinfer.sites.stacked import (
    Scales,
    StackedGaussians,
    StackedTerms,
    cavity_moments,
    cho_inverse_stack,
    finite_sums,
    latent_terms,
    paired_by_inverse,
    scales,
    shared_paired,
    shared_project,
    stacked_matrix_gradients,
    stacked_terms,
)
from tests.sites.class_gradients import inducing_matrix_gradients

C, M, N, D = 3, 6, 9, 2


def _setup(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D))
    kernels = [RBF(lengthscale=0.7 + 0.3 * c, variance=1.0 + c) + White(0.1) for c in range(C)]
    Zs = [X[rng.choice(N, M, replace=False)] + 0.01 * c for c in range(C)]
    P = np.stack([a @ a.T for a in rng.normal(size=(C, M, M))]) * 0.3
    h = rng.normal(size=(C, M))
    return rng, X, kernels, Zs, P, h


def paired_reference(P_w, h_w, pair, *, inverse: bool = False):
    """The oracle of ``StackedGaussians.paired`` and of numpy's evaluations
    (``paired_by_inverse``, ``shared_paired``): ``(q, cav, log_norm_ratio [2, C])`` as two
    ``StackedGaussians`` of the sums ``P_w [C, M, M]``, ``h_w [C, M]``, scale 1 and the cavity
    scales of ``pair`` (row 1), checked finite once (the library's numpy branch of ``paired``
    until s40, when no numpy caller was left)."""
    finite_sums(P_w, h_w)
    q = StackedGaussians(P_w, h_w, inverse=inverse, finite=True)
    cav = StackedGaussians(P_w, h_w, Scales(pair.matrix[1], pair.vector[1]), inverse=inverse,
                           finite=True)
    lnr = ops.namespace(P_w).stack([q.log_norm_ratio(), cav.log_norm_ratio()])
    return q, cav, lnr


def project_by_inverse(g, A, *, means_by_point: bool = False):
    """The oracle of numpy's cavity moments from ``B^-1`` (``paired_by_inverse``):
    ``(mu [C, n] (``means_by_point``: ``[n, C]``), v = colsum(A * B^-1 A) [C, n],
    B^-1 A [C, M, n])`` of ``g`` along ``A [C, M, n]`` by one product with ``g.B_inv()`` (the
    library's ``project(by_inverse=True)`` until s40)."""
    BiA = g.B_inv() @ A
    mu = ops.einsum("cmn,cm->cn", A, g.w)
    return (ops.mT(mu) if means_by_point else mu), ops.einsum("cmn,cmn->cn", A, BiA), BiA


def test_triangular_solves_and_inverse_match_scipy():
    rng = np.random.default_rng(1)
    K = np.stack([a @ a.T + M * np.eye(M) for a in rng.normal(size=(C, M, M))])
    L = jittered_cholesky(K, name="K").L
    B = rng.normal(size=(C, M, 4))
    for transpose in (False, True):
        ref = np.stack([solve_triangular(L[c], B[c], lower=True, trans=int(transpose))
                        for c in range(C)])
        np.testing.assert_allclose(ops.solve_triangular(L, B, transpose=transpose), ref, rtol=1e-12,
                                   atol=1e-13)
    np.testing.assert_allclose(cho_inverse_stack(L), np.linalg.inv(K), rtol=1e-10, atol=1e-14)


def _on(device: bool, *arrays):
    """``arrays`` as they are, or as torch-CPU tensors (a device's code path)."""
    if not device:
        return arrays
    torch = pytest.importorskip("torch")
    return tuple(torch.as_tensor(a) for a in arrays)


def _host(x) -> np.ndarray:
    return np.asarray(x)


def test_stacked_terms_equal_latent_terms():
    _, X, kernels, Zs, _, _ = _setup()
    stacked = stacked_terms(kernels, Zs, X)
    for c in range(C):
        ref = latent_terms(kernels[c], Zs[c], X)
        np.testing.assert_allclose(stacked.L[c], ref.L, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(stacked.A[c], ref.A, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(stacked.s[c], ref.s, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", [False, True])
def test_stacked_terms_take_kuf_over_from_shared_covariances(device):
    """Given cached covariances, ``stacked_terms`` takes ``Kuf`` over (``A`` solved in its
    place on numpy): the covariances refuse a later ``Kuf`` read, their ``Kuu``, ``Kff_diag``
    and VJPs are those of fresh covariances, and a second ``stacked_terms`` on the same
    covariances (a step prepared again) gets the same terms from a ``Kuf`` formed again."""
    rng, X, kernels, Zs, _, _ = _setup()
    X_, Z_ = _on(device, X, np.stack(Zs))
    family = StackedKernels.of(kernels)
    assert family is not None
    cov = family.covariances(Z_, X_, version=1)
    Kuf = cov.Kuf
    Kuf_before, Kuu_before = _host(Kuf).copy(), _host(cov.Kuu).copy()
    terms = stacked_terms(kernels, Z_, X_, covariances=cov)
    with pytest.raises(RuntimeError, match="handed over"):
        _ = cov.Kuf
    if not device:  # solved in place: the taken array is A (nothing copied)
        assert terms.A is Kuf
    np.testing.assert_array_equal(_host(cov.Kuu), Kuu_before)  # shared: left unchanged
    fresh = stacked_terms(kernels, Z_, X_)
    for a, b in ((terms.L, fresh.L), (terms.A, fresh.A), (terms.s, fresh.s)):
        np.testing.assert_array_equal(_host(a), _host(b))
    again = stacked_terms(kernels, Z_, X_, covariances=cov)  # Kuf formed again, same values
    np.testing.assert_array_equal(_host(again.A), _host(terms.A))
    assert again.A is not terms.A  # a new array (``_host`` would copy a device's: always new)
    np.testing.assert_array_equal(_host(family.covariances(Z_, X_).Kuf), Kuf_before)
    W = [_on(device, w)[0] for w in (rng.normal(size=(C, M, M)), rng.normal(size=(C, M, N)),
                                     rng.normal(size=(C, N)))]
    for got, ref in zip(cov.vjp(*W), family.covariances(Z_, X_).vjp(*W)):
        np.testing.assert_array_equal(_host(got), _host(ref))


@pytest.mark.parametrize("device", [False, True])
def test_whitening_round_trip_and_per_class_equality(device):
    """On numpy and on a device (its sandwich's second solve from the right)."""
    _, X, kernels, Zs, P, h = _setup()
    per_class = [latent_terms(k, Z, X) for k, Z in zip(kernels, Zs)]
    X_, Z_, P_, h_ = _on(device, X, np.stack(Zs), P, h)
    terms = stacked_terms(kernels, Z_, X_)
    Lam, hu = (_host(a) for a in terms.to_u_space(P_, h_))
    np.testing.assert_array_equal(Lam, np.swapaxes(Lam, 1, 2))  # symmetric, bit for bit
    P_back, h_back = (_host(a) for a in terms.to_whitened(*_on(device, Lam, hu)))
    np.testing.assert_allclose(P_back, P, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(h_back, h, rtol=1e-9, atol=1e-10)
    for c in range(C):  # the spec's dense per-class products: L^-T P_w L^-1, L^-T h_w
        L_inv = solve_triangular(per_class[c].L, np.eye(M), lower=True)
        Lam_c, h_c = L_inv.T @ P[c] @ L_inv, L_inv.T @ h[c]
        np.testing.assert_allclose(Lam[c], Lam_c, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(hu[c], h_c, rtol=1e-9, atol=1e-10)


def test_numpy_sandwich_by_solves_equals_the_one_by_the_inverse():
    """numpy terms without ``L^-1`` (``latent_terms``' and gfitc's stacks): ``L^-T S L^-1`` by
    two solves (the second from the right, as on a device), symmetric bit for bit, equal to the
    products with ``L^-1`` to round-off."""
    _, X, kernels, Zs, P, _ = _setup()
    terms = stacked_terms(kernels, np.stack(Zs), X)
    by_solves = StackedTerms(L=terms.L, A=terms.A, s=terms.s).sandwich(P)
    np.testing.assert_array_equal(by_solves, np.swapaxes(by_solves, 1, 2))
    np.testing.assert_allclose(by_solves, terms.sandwich(P), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("scale", [None, np.array([0.5, 0.9, 0.99])])
def test_gaussians_equal_whitened_gaussians(scale, device):
    _, X, kernels, Zs, P, h = _setup()
    X_, Z_, P_, h_ = _on(device, X, np.stack(Zs), P, h)
    terms = stacked_terms(kernels, Z_, X_)
    g = StackedGaussians(P_, h_, scale)
    mu, v, R = (_host(a) for a in g.project(terms.A))
    lnr = _host(g.log_norm_ratio())
    B_inv = _host(g.B_inv())
    terms = stacked_terms(kernels, Zs, X)
    for c in range(C):
        a = 1.0 if scale is None else scale[c]
        ref = WhitenedGaussian(a * P[c], a * h[c])
        p = ref.project(terms.A[c])
        np.testing.assert_allclose(mu[c], p.mu, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(v[c], p.v, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(R[c], p.R, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lnr[c], ref.log_norm_ratio(), rtol=1e-10)
        np.testing.assert_allclose(B_inv[c], ref.B_inv(np.eye(M)), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("device", [False, True])
def test_shared_paired_is_paired_and_shared_project(device):
    """``shared_paired`` (the shared evaluation's Gaussians, on numpy without stacks of
    ``B^-1``, both inverted in place of their factors) gives the two Gaussians
    (``paired_reference(inverse=True)``) and ``shared_project`` of its cavity: factors
    bit for bit (on numpy their log-determinants, ``LB`` then refused, not served as the
    overwritten stack), ``sum_c B_c^-1`` of ``q`` bit for bit on numpy, means, log-norm
    ratios and projections to round-off."""
    rng, X, kernels, Zs, P, h = _setup(4)
    A = rng.normal(size=(M, N))
    frac = (0.8, 0.9, 0.95)
    if device:
        torch = pytest.importorskip("torch")
        A, P, h = (torch.as_tensor(a) for a in (A, P, h))
    pair = scales(P, (1.0,) * C + frac, (2, C))
    q, cav, lnr, moments = shared_paired(P, h, pair, A)
    q0, cav0, lnr0 = paired_reference(P, h, pair, inverse=True)
    host = np.asarray
    for got, want in ((q, q0), (cav, cav0)):
        if device:
            assert np.array_equal(host(got.LB), host(want.LB))
        else:
            assert np.array_equal(got._log_det, StackedGaussians._log_det_of(want.LB))
            with pytest.raises(ValueError, match="inverted in place"):
                _ = got.LB
        np.testing.assert_allclose(host(got.w), host(want.w), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(host(lnr), host(lnr0), rtol=1e-12)  # w . h: the means' round-off
    S0 = host(q0.B_inv()).sum(axis=0)
    if device:
        np.testing.assert_allclose(host(q.B_inv_sum()), S0, rtol=1e-14)
    else:
        assert np.array_equal(q.B_inv_sum(), S0)
    for a, b in zip(moments, shared_project(cav0, A)):
        np.testing.assert_allclose(host(a), host(b), rtol=1e-11, atol=1e-14)


def test_paired_by_inverse_is_paired_and_project_without_the_factors():
    """``paired_by_inverse`` (numpy's per-class evaluation, both Gaussians inverted in place
    of their factors) gives the two Gaussians (``paired_reference(inverse=True)``) and the
    cavity's ``project_by_inverse``: ``q``'s inverses, means and log-norm ratios bit for bit, the
    cavity's (``symv`` / ``symm`` on one triangle) to round-off; ``LB`` is then refused, not
    served as the overwritten stack."""
    rng, X, kernels, Zs, P, h = _setup(5)
    A = rng.normal(size=(C, M, N))
    pair = scales(P, (1.0,) * C + (0.8, 0.9, 0.95), (2, C))
    q0, cav0, lnr0 = paired_reference(P, h, pair, inverse=True)
    moments0 = project_by_inverse(cav0, A, means_by_point=True)
    q, cav, lnr, moments = paired_by_inverse(P, h, pair, A)
    assert np.array_equal(q.B_inv(), q0.B_inv()) and np.array_equal(q.w, q0.w)
    assert np.array_equal(lnr[0], lnr0[0])
    np.testing.assert_allclose(lnr[1], lnr0[1], rtol=1e-13)
    np.testing.assert_allclose(cav.w, cav0.w, rtol=1e-12, atol=1e-14)
    for a, b in zip(moments, moments0):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-14)
    # q keeps its B^-1: its sum is served (only the factors are gone)
    assert np.array_equal(q.B_inv_sum(), q0.B_inv_sum())
    for g in (q, cav):
        with pytest.raises(ValueError, match="inverted in place"):
            _ = g.LB
        with pytest.raises(ValueError, match="inverted in place"):
            g.project(A)  # R = L_B^-1 A needs the factors
    indefinite = np.array(P)
    indefinite[1] = -3.0 * np.eye(M)  # B_1 = I + P_1 = -2 I: q's factorisation fails
    with pytest.raises(NumericalError, match="not positive definite"):
        paired_by_inverse(indefinite, h, pair, A)
    P[0, 0, 0] = np.nan
    with pytest.raises(NumericalError):
        paired_by_inverse(P, h, pair, A)


@pytest.mark.parametrize("device", [False, True])
def test_paired_gaussians_equal_the_two_gaussians_bit_for_bit(device):
    """``StackedGaussians.paired`` (one ``[2, C]`` stack with its ``B^-1``, its halves views
    of it) gives ``q`` and the cavity exactly as two ``StackedGaussians`` with
    ``inverse=True`` do (``paired_reference``): factors, means, projections, ``B^-1``,
    log-norm ratios and the matrix gradients built on them."""
    rng, X, kernels, Zs, P, h = _setup(3)
    frac = (0.8, 0.9, 0.95)
    if device:
        torch = pytest.importorskip("torch")
        X, P, h = (torch.as_tensor(a) for a in (X, P, h))
        Zs = [torch.as_tensor(z) for z in Zs]
    terms = stacked_terms(kernels, Zs, X)
    pair = scales(P, (1.0,) * C + frac, (2, C))
    q, cav, lnr = StackedGaussians.paired(P, h, pair)
    # paired forms B^-1 and the means from it (inverse=True), as one stack
    q0, cav0, _ = paired_reference(P, h, pair, inverse=True)
    same = np.array_equal
    for got, want in ((q, q0), (cav, cav0)):
        assert same(np.asarray(got.LB), np.asarray(want.LB))
        assert same(np.asarray(got.LB_T), np.asarray(want.LB_T))
        assert same(np.asarray(got.w), np.asarray(want.w))
        assert same(np.asarray(got.B_inv()), np.asarray(want.B_inv()))
        for a, b in zip(got.project(terms.A), want.project(terms.A)):
            assert same(np.asarray(a), np.asarray(b))
    assert same(np.asarray(lnr[0]), np.asarray(q0.log_norm_ratio()))
    assert same(np.asarray(lnr[1]), np.asarray(cav0.log_norm_ratio()))
    R = cav.project(terms.A)[2]
    a_sum, b_sum = (rng.normal(size=(C, N)) for _ in range(2))
    if device:
        a_sum, b_sum = torch.as_tensor(a_sum), torch.as_tensor(b_sum)
    g = stacked_matrix_gradients(terms, q, cav, R, a_sum, b_sum)
    g0 = stacked_matrix_gradients(terms, q0, cav0, R, a_sum, b_sum)
    for name in ("Kuu", "Kuf", "Kff_diag"):
        assert same(np.asarray(getattr(g, name)), np.asarray(getattr(g0, name)))


@pytest.mark.parametrize("device", [False, True])
def test_sep_matrix_gradients_equal_the_per_class_gradients(device):
    """On numpy and on a device (sym(A X^T) + S_B one product A (X + A diag B)^T), from
    ``R = L_B^-1 A`` and from ``B^-1 A`` (``project_by_inverse``, numpy's evaluation)."""
    rng, X, kernels, Zs, P, h = _setup()
    per_class = [latent_terms(k, Z, X) for k, Z in zip(kernels, Zs)]
    frac = np.array([0.8, 0.9, 0.95])
    a_sum, b_sum = rng.normal(size=(C, N)), rng.normal(size=(C, N))
    X_, Z_, P_, h_, a_, b_ = _on(device, X, np.stack(Zs), P, h, a_sum, b_sum)
    terms = stacked_terms(kernels, Z_, X_)
    q, cav = StackedGaussians(P_, h_), StackedGaussians(P_, h_, frac)
    mu, v, R = cav.project(terms.A)
    # B_cav^-1 A from the cavity's B^-1 in place of R: the same gradients
    mu_i, v_i, BiA = project_by_inverse(cav, terms.A)
    np.testing.assert_allclose(_host(mu_i), _host(mu), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(_host(v_i), _host(v), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(_host(BiA), _host(ops.solve_triangular(cav.LB, R, transpose=True)),
                               rtol=1e-10, atol=1e-12)
    for applied, arg in ((False, R), (True, BiA)):
        stacked = stacked_matrix_gradients(terms, q, cav, arg, a_, b_, inverse_applied=applied)
        grads = [MatrixGradients(Kuu=_host(g.Kuu), Kuf=_host(g.Kuf),
                                 Kff_diag=_host(g.Kff_diag)) for g in stacked]
        for c in range(C):
            q_c, cav_c = WhitenedGaussian(P[c], h[c]), WhitenedGaussian(frac[c] * P[c],
                                                                         frac[c] * h[c])
            ref = inducing_matrix_gradients(per_class[c], q_c, cav_c,
                                            cav_c.project(per_class[c].A).R, a_sum[c],
                                            b_sum[c])
            np.testing.assert_allclose(grads[c].Kuu, ref.Kuu, rtol=1e-8, atol=1e-10)
            np.testing.assert_allclose(grads[c].Kuf, ref.Kuf, rtol=1e-8, atol=1e-10)
            np.testing.assert_allclose(grads[c].Kff_diag, ref.Kff_diag)


@pytest.mark.parametrize("device", [False, True])
def test_ep_matrix_gradients_equal_the_per_class_gradients(device):
    rng, X, kernels, Zs, P, h = _setup(4)
    per_class = [latent_terms(k, Z, X) for k, Z in zip(kernels, Zs)]
    a_sum, b_sum, e_sum = (rng.normal(size=(C, N)) for _ in range(3))
    X_, Z_, P_, h_, a_, b_, e_ = _on(device, X, np.stack(Zs), P, h, a_sum, b_sum, e_sum)
    terms = stacked_terms(kernels, Z_, X_)
    q = StackedGaussians(P_, h_)
    _, _, R = q.project(terms.A)
    stacked = stacked_matrix_gradients(terms, q, q, R, a_, b_, e_)
    grads = [MatrixGradients(Kuu=_host(g.Kuu), Kuf=_host(g.Kuf), Kff_diag=_host(g.Kff_diag))
             for g in stacked]
    for c in range(C):
        q_c = WhitenedGaussian(P[c], h[c])
        ref = inducing_matrix_gradients(per_class[c], q_c, q_c, q_c.project(per_class[c].A).R,
                                        a_sum[c], b_sum[c], e_sum[c])
        np.testing.assert_allclose(grads[c].Kuu, ref.Kuu, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(grads[c].Kuf, ref.Kuf, rtol=1e-8, atol=1e-10)


def test_stack_of_latent_terms_and_latent_views():
    """``StackedTerms.stack`` of one latent's terms each and ``latent(c)`` invert each other
    (views: the same bits)."""
    _, X, kernels, Zs, _, _ = _setup()
    per_class = [latent_terms(k, Z, X) for k, Z in zip(kernels, Zs)]
    stacked = StackedTerms.stack(per_class)
    assert stacked.L.shape == (C, M, M) and stacked.L_inv is None
    for c in range(C):
        view = stacked.latent(c)
        for a, b in ((view.L, per_class[c].L), (view.A, per_class[c].A),
                     (view.s, per_class[c].s)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("device", [False, True])
def test_single_latent_view_runs_the_stacked_maps(device):
    """The geometry's maps over one latent's 2-D arrays equal the stacked maps' row ``c``:
    ``to_whitened``, ``to_u_space``, ``sandwich`` and ``unwhiten`` take any leading axes (numpy,
    with and without ``L^-1``, and a device)."""
    _, X, kernels, Zs, P, h = _setup()
    X_, Z_, P_, h_ = _on(device, X, np.stack(Zs), P, h)
    terms = stacked_terms(kernels, Z_, X_)
    variants = [terms]
    if not device:  # numpy: both the L^-1 products and the triangular solves
        variants.append(StackedTerms(L=terms.L, A=terms.A, s=terms.s,
                                     L_inv=None if terms.L_inv is not None
                                     else ops.tri_inverse(terms.L)))
    for t in variants:
        Lam, hu = t.to_u_space(P_, h_)
        P_w, h_w = t.to_whitened(Lam, hu)
        S = t.sandwich(P_)
        V = t.unwhiten(ops.mT(P_))
        for c in range(C):
            one = t.latent(c)
            Lam_c, hu_c = one.to_u_space(P_[c], h_[c])
            P_c, h_c = one.to_whitened(Lam_c, hu_c)
            for got, ref in ((Lam_c, Lam[c]), (hu_c, hu[c]), (P_c, P_w[c]), (h_c, h_w[c]),
                             (one.sandwich(P_[c]), S[c]), (one.unwhiten(ops.mT(P_[c])), V[c])):
                assert tuple(got.shape) == tuple(ref.shape)
                np.testing.assert_allclose(_host(got), _host(ref), rtol=1e-10, atol=1e-12)


def test_class_terms_name_is_deprecated_for_latent_terms():
    """The old per-class names work one more release, with a ``DeprecationWarning``."""
    import gpinfer.sites.inducing as inducing

    with pytest.warns(DeprecationWarning, match="latent_terms"):
        assert inducing.class_terms is latent_terms
    with pytest.warns(DeprecationWarning, match="StackedTerms"):
        assert inducing.ClassTerms is StackedTerms
    with pytest.raises(AttributeError):
        _ = inducing.no_such_name


def test_corrupted_sites_are_a_numerical_error():
    _, _, _, _, P, h = _setup()
    with pytest.raises(NumericalError, match="positive definite"):
        StackedGaussians(-10.0 * P, h)
    with pytest.raises(NumericalError, match="not finite"):
        StackedGaussians(P, np.full_like(h, np.inf))


@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("scale", [None, np.array([0.5, 0.9, 0.99])])
def test_means_from_the_inverse_and_variances_by_point(scale, device):
    """``inverse=True`` (``w`` one product with the ``B^-1`` formed at once) gives the solves'
    means and ``B^-1`` to round-off, in ``paired`` too (against the two Gaussians by
    solves); the
    variances by point are the transposed ones (the same values)."""
    _, X, kernels, Zs, P, h = _setup(5)
    X_, Z_, P_, h_ = _on(device, X, np.stack(Zs), P, h)
    terms = stacked_terms(kernels, Z_, X_)
    got, want = StackedGaussians(P_, h_, scale, inverse=True), StackedGaussians(P_, h_, scale)
    assert got._B_inv is not None and want._B_inv is None  # B^-1 formed at once
    np.testing.assert_allclose(_host(got.w), _host(want.w), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(_host(got.B_inv()), _host(want.B_inv()), rtol=1e-12)
    pair = scales(P_, (1.0,) * C + (0.8, 0.9, 0.95), (2, C))
    for a, b in zip(StackedGaussians.paired(P_, h_, pair), paired_reference(P_, h_, pair)):
        if isinstance(a, StackedGaussians):
            a, b = a.w, b.w
        np.testing.assert_allclose(_host(a), _host(b), rtol=1e-12, atol=1e-13)
    mu, v, _ = want.project(terms.A, means_by_point=True)
    mu_p, v_p, _ = want.project(terms.A, means_by_point=True, variances_by_point=True)
    assert _host(v_p).shape == (N, C)
    np.testing.assert_allclose(_host(v_p), _host(v).T, rtol=1e-14)
    assert np.array_equal(_host(mu_p), _host(mu))


@pytest.mark.parametrize("backend_name", ["numpy", "torch"])
@pytest.mark.parametrize("shared", [False, True], ids=["per-class A", "shared A"])
def test_cavity_moments_are_the_dense_cavity_projections(backend_name, shared):
    """``cavity_moments``: ``mu = A^T B^-1 a h_w`` and ``v = diag(A^T B^-1 A)`` per class with
    ``B = I + a P_w`` (dense inverses), for a per-class ``A [C, M, n]`` or one shared
    ``[M, n]`` (numpy solves ``[A, a h_w]`` in place on one array); the sums are left as they
    were."""
    if backend_name == "torch":
        pytest.importorskip("torch")
    backend = resolve_backend(backend_name)
    rng, _, _, _, P, h = _setup(3)
    A = rng.normal(size=(M, N)) if shared else rng.normal(size=(C, M, N))
    a = np.array([0.9, 0.75, 0.6])
    P_before, h_before = P.copy(), h.copy()
    to = backend.asarray
    mu, v = cavity_moments(to(P), to(h), scales(to(P), tuple(a), (C,)), to(A))
    mu, v = ops.to_host(mu), ops.to_host(v)
    assert mu.shape == v.shape == (N, C)
    for c in range(C):
        Ac = A if shared else A[c]
        B_inv = np.linalg.inv(np.eye(M) + a[c] * P[c])
        np.testing.assert_allclose(mu[:, c], Ac.T @ B_inv @ (a[c] * h[c]), rtol=1e-10,
                                   atol=1e-12)
        np.testing.assert_allclose(v[:, c], np.einsum("mn,mk,kn->n", Ac, B_inv, Ac),
                                   rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(P, P_before)
    np.testing.assert_array_equal(h, h_before)

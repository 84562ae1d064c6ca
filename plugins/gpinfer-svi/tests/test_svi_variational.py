"""``gpinfer_svi.variational``: the uncollapsed ELBO and natural-gradient steps (spec
jj-taylor-svi §3; T7, T12), against finite differences, the closed-form optimum of fixed
quadratic sites, the collapsed JJ bound and a 2-D quadrature of ``log p(y)`` (moved with the
module from the core's ``tests/sites``, issue 23)."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_jj.quadratic import (
    CollapsedBound,
    inducing_factors,
    jj_coefficients,
    marginals,
    taylor_coefficients,
)
from gpinfer_svi.variational import (
    likelihood_expectation,
    natural_gradient_step,
    uncollapsed_elbo,
)
from scipy.integrate import quad
from scipy.special import log_expit

from gpinfer.kernels import RBF, White
from gpinfer.likelihoods import BernoulliLogit
from gpinfer.likelihoods.bernoulli import LOGISTIC
from gpinfer.testing.gradcheck import assert_gradient_close


def _logistic_gh(s):
    """The logistic expectation (100-node Gauss-Hermite, the likelihood's default ELBO rule)
    for signs ``s [B]``, as an ``ExpectationFn`` on ``[B, 1]`` columns."""
    return likelihood_expectation(BernoulliLogit(), (np.asarray(s) > 0).astype(np.int64))


def test_t12_gauss_hermite_matches_adaptive_quadrature():
    fn = _logistic_gh(np.ones(1))
    for m in [-10.0, -1.0, 0.0, 2.5, 10.0]:
        for v in [0.01, 1.0, 10.0]:
            def integrand(f, m=m, v=v):
                return log_expit(f) * np.exp(-(f - m) ** 2 / (2 * v)) / np.sqrt(2 * np.pi * v)

            ref = quad(integrand, m - 40 * np.sqrt(v), m + 40 * np.sqrt(v),
                       epsabs=1e-13, epsrel=1e-12, limit=200)[0]
            E = fn(np.array([[m]]), np.array([[v]]))[0][0]
            assert E == pytest.approx(ref, rel=1e-8)
    E, dm, dv = fn(np.array([[0.7]]), np.array([[0.5]]))
    h = 1e-6
    num_m = (fn(np.array([[0.7 + h]]), np.array([[0.5]]))[0] - fn(np.array([[0.7 - h]]),
             np.array([[0.5]]))[0]) / (2 * h)
    num_v = (fn(np.array([[0.7]]), np.array([[0.5 + h]]))[0] - fn(np.array([[0.7]]),
             np.array([[0.5 - h]]))[0]) / (2 * h)
    assert dm[0, 0] == pytest.approx(num_m[0], rel=1e-6)
    assert dv[0, 0] == pytest.approx(num_v[0], rel=1e-6)


def _quadratic_expectation(coef):
    """Fixed quadratic sites ``c + beta f - gamma f^2`` as an svi expectation (conjugate)."""

    def fn(mean, var):
        m, v = mean[:, 0], var[:, 0]
        E = coef.c + coef.beta * m - coef.gamma * (m**2 + v)
        return E, (coef.beta - 2.0 * coef.gamma * m)[:, None], -coef.gamma[:, None]

    return fn


def _matrices(n=25, M=6, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    kern = RBF(lengthscale=1.1, variance=1.5) + White(0.05)
    Z = X[:M] + 0.05
    s = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return kern.K(Z), kern.K(Z, X), kern.K_diag(X), s


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_natural_gradient_unit_step_lands_on_closed_form_optimum(kind):
    """Conjugate case: fixed JJ / Taylor sites make the data term quadratic, so one natural
    step of size 1 from any ``q(u)`` gives the closed-form ``(mu_hat, Sigma_hat)`` of §2.5."""
    Kuu, Kuf, Kdiag, s = _matrices()
    xi = np.abs(np.random.default_rng(4).normal(size=s.size)) + 0.3
    coef = jj_coefficients(xi, s) if kind == "jj" else taylor_coefficients(xi, s, LOGISTIC)
    closed = CollapsedBound(inducing_factors(Kuu, Kuf, Kdiag), coef)
    rng = np.random.default_rng(5)
    M = Kuu.shape[0]
    mu, Lq = rng.normal(size=M), np.tril(rng.normal(size=(M, M)) * 0.3) + 2.0 * np.eye(M)
    fn = _quadratic_expectation(coef)
    est = uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu[None], Lq[None], fn)
    mu1, Lq1 = natural_gradient_step(mu, Lq, est.dmu[0], est.dSigma[0], 1.0)
    np.testing.assert_allclose(mu1, closed.mu_hat, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(Lq1 @ Lq1.T, closed.Sigma_hat, rtol=1e-8, atol=1e-10)
    after = uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu1[None], Lq1[None], fn)
    assert after.value == pytest.approx(closed.value, abs=1e-8)
    np.testing.assert_allclose(after.dmu, 0.0, atol=1e-8)
    np.testing.assert_allclose(after.dSigma, 0.0, atol=1e-8)


def test_dsigma_matches_finite_differences():
    Kuu, Kuf, Kdiag, s = _matrices(n=12, M=4)
    rng = np.random.default_rng(6)
    mu, Lq = rng.normal(size=4), np.tril(rng.normal(size=(4, 4)) * 0.3) + np.eye(4)
    fn = _logistic_gh(s)
    Sigma = Lq @ Lq.T
    est = uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu[None], Lq[None], fn)

    def value(S):
        L = np.linalg.cholesky(0.5 * (S + S.T))
        return uncollapsed_elbo([Kuu], [Kuf], Kdiag[None], mu[None], L[None], fn).value

    G = est.dSigma[0]
    for j, k in [(0, 0), (1, 2), (3, 1)]:
        E = np.zeros((4, 4))
        E[j, k] = E[k, j] = 1e-6
        fd = (value(Sigma + E) - value(Sigma - E)) / 2e-6
        assert fd == pytest.approx(G[j, k] + G[k, j] if j != k else G[j, j], rel=1e-5, abs=1e-7)


def _converged_svi(K, s, steps=200, step=0.7):
    """Full-batch svi at ``Z = X`` (``Kuu = Kuf = K``) by natural-gradient steps."""
    n = s.size
    fn = _logistic_gh(s)
    mu, Lq = np.zeros(n), np.linalg.cholesky(K)
    for _ in range(steps):
        est = uncollapsed_elbo([K], [K], np.diag(K)[None], mu[None], Lq[None], fn)
        mu, Lq = natural_gradient_step(mu, Lq, est.dmu[0], est.dSigma[0], step)
    est = uncollapsed_elbo([K], [K], np.diag(K)[None], mu[None], Lq[None], fn)
    return est


def _jj_converged(K, s):
    fac = inducing_factors(K, K, np.diag(K).copy())
    mean, var = marginals(fac, np.zeros(s.size), np.eye(s.size))
    for _ in range(200):
        b = CollapsedBound(fac, jj_coefficients(np.sqrt(mean**2 + var), s))
        mean, var = b.m_hat, b.S2_hat
    return b


def test_t7_vi_jj_below_full_batch_svi_below_log_marginal():
    """T7 (second part): at ``m = n``, ``Z = X``, ``J_hat <= max_q L(q) <= log p(y)``; ``n = 2``
    so that ``log p(y)`` is a 2-D Gauss-Hermite integral; plus ``n = 20`` for the first step."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(2, 1))
    K = (RBF(lengthscale=0.8, variance=2.0) + White(0.05)).K(X)
    s = np.array([1.0, -1.0])
    est = _converged_svi(K, s)
    np.testing.assert_allclose(est.dmu, 0.0, atol=1e-9)
    np.testing.assert_allclose(est.dSigma, 0.0, atol=1e-9)
    J = _jj_converged(K, s).value
    x, w = np.polynomial.hermite_e.hermegauss(120)
    w = w / w.sum()
    L = np.linalg.cholesky(K)
    F = L @ np.stack(np.meshgrid(x, x, indexing="ij")).reshape(2, -1)  # [2, K^2]
    log_py = np.log(np.exp(log_expit(s[:, None] * F).sum(axis=0)) @ np.outer(w, w).ravel())
    assert J < est.value < log_py
    assert log_py - est.value < 0.5  # sanity: the Gaussian VI gap is small here
    X = rng.normal(size=(20, 2))
    K = (RBF(lengthscale=1.0, variance=1.5) + White(0.05)).K(X)
    s = np.where(X[:, 0] + 0.3 * rng.normal(size=20) > 0, 1.0, -1.0)
    est = _converged_svi(K, s)
    np.testing.assert_allclose(est.dmu, 0.0, atol=1e-8)
    assert _jj_converged(K, s).value < est.value


@pytest.mark.parametrize("n_latent", [1, 2])
def test_uncollapsed_elbo_gradients_by_finite_differences(n_latent):
    """Every gradient of ``uncollapsed_elbo``: ``mu``, ``Lq`` and the matrix gradients
    (``Kuu``, ``Kuf`` of the batch, ``Kff_diag``), with a mini-batch scale."""
    rng = np.random.default_rng(11)
    B, M = 9, 4
    X, Z = rng.normal(size=(B, 2)), rng.normal(size=(M, 2))
    kerns = [RBF(lengthscale=1.0 + 0.3 * l, variance=1.2) + White(0.05) for l in range(n_latent)]
    Kuu = [k.K(Z) for k in kerns]
    Kub = [k.K(Z, X) for k in kerns]
    Kd = np.stack([k.K_diag(X) for k in kerns])
    mu = rng.normal(size=(n_latent, M)) * 0.5
    Lq = np.tril(rng.normal(size=(n_latent, M, M)) * 0.2) + np.eye(M)
    if n_latent == 1:
        fn = _logistic_gh(np.where(rng.random(B) < 0.5, -1.0, 1.0))
    else:
        from gpinfer.likelihoods import RobustMax

        fn = likelihood_expectation(RobustMax(1e-3), rng.integers(0, 2, B))
    scale = 3.0
    est = uncollapsed_elbo(Kuu, Kub, Kd, mu, Lq, fn, scale)

    def value(**over):
        args = {"Kuu": Kuu, "Kub": Kub, "Kdiag": Kd, "mu": mu, "Lq": Lq}
        args.update(over)
        return uncollapsed_elbo(args["Kuu"], args["Kub"], args["Kdiag"], args["mu"],
                                args["Lq"], fn, scale).value

    assert_gradient_close(lambda m: value(mu=m), est.dmu, mu, name="dELBO/dmu")
    assert_gradient_close(lambda L: value(Lq=np.tril(L)), est.dLq, Lq, name="dELBO/dLq")
    for l in range(n_latent):
        G = est.matrix[l]

        def with_kuu(K, l=l):
            return value(Kuu=[0.5 * (K + K.T) if j == l else Kuu[j] for j in range(n_latent)])

        def with_kub(K, l=l):
            return value(Kub=[K if j == l else Kub[j] for j in range(n_latent)])

        def with_kd(d, l=l):
            return value(Kdiag=np.stack([d if j == l else Kd[j] for j in range(n_latent)]))

        assert_gradient_close(with_kuu, G.Kuu, Kuu[l], name=f"dELBO/dKuu[{l}]")
        assert_gradient_close(with_kub, G.Kuf, Kub[l], name=f"dELBO/dKuf[{l}]")
        assert_gradient_close(with_kd, G.Kff_diag, Kd[l], name=f"dELBO/dKff_diag[{l}]")


@pytest.mark.parametrize("backend_name", ["numpy", "torch"])
def test_shared_kuu_path_equals_the_per_latent_algebra(backend_name):
    """One ``Kuu``/``Kub``/``Kdiag`` for every latent (``shared_uncollapsed_elbo``) gives the
    per-latent algebra's ELBO and ``q(u)`` gradients on the broadcast matrices, and its matrix
    gradients are the sums of the per-latent ones (to round-off)."""
    from gpinfer.backend import resolve_backend
    from gpinfer.likelihoods import RobustMax

    if backend_name == "torch":
        pytest.importorskip("torch")
    be = resolve_backend(backend_name)
    rng = np.random.default_rng(1)
    C, M, B = 4, 6, 9
    X, Z = rng.normal(size=(B, 2)), rng.normal(size=(M, 2))
    k = RBF(lengthscale=1.1, variance=1.5) + White(1e-3)
    Kuu, Kub, Kd = (be.asarray(a) for a in (k.K(Z), k.K(Z, X), k.K_diag(X)))
    mu = be.asarray(rng.normal(size=(C, M)))
    Lq = be.asarray(np.tril(rng.normal(size=(C, M, M)) * 0.3) + np.eye(M))
    ex = likelihood_expectation(RobustMax(1e-3), be.as_index(rng.integers(0, C, B)))
    def expand(a):  # the per-latent path on read-only broadcast views
        return a.expand(C, *a.shape) if backend_name == "torch" else np.broadcast_to(
            a, (C, *a.shape))

    per = uncollapsed_elbo(expand(Kuu), expand(Kub), expand(Kd), mu, Lq, ex, 2.5)
    one = uncollapsed_elbo([Kuu], [Kub], Kd[None], mu, Lq, ex, 2.5)

    def host(a):
        return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)

    def close(a, b):
        a, b = host(a), host(b)
        assert np.abs(b).max() > 1e-3  # not a vacuous comparison
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * np.abs(b).max())

    for f in ("value", "kl", "dmu", "dLq", "dSigma", "expected"):
        close(getattr(one, f), getattr(per, f))
    assert len(one.matrix) == 1
    for f in ("Kuu", "Kuf", "Kff_diag"):
        close(getattr(one.matrix[0], f), sum(host(getattr(g, f)) for g in per.matrix))


@pytest.mark.parametrize("shared", [False, True], ids=["per-latent", "shared"])
def test_without_dSigma_the_same_estimate(shared):
    """``with_dSigma=False`` (no natural gradients) leaves ``dSigma`` out and changes nothing
    else (bit for bit)."""
    from gpinfer.likelihoods import RobustMax

    rng = np.random.default_rng(2)
    C, M, B = 3, 5, 8
    X, Z = rng.normal(size=(B, 2)), rng.normal(size=(M, 2))
    k = RBF(lengthscale=0.8, variance=1.2) + White(1e-3)
    Kuu, Kub, Kd = k.K(Z), k.K(Z, X), k.K_diag(X)
    if not shared:
        Kuu, Kub, Kd = np.stack([Kuu] * C), np.stack([Kub] * C), np.stack([Kd] * C)
    else:
        Kuu, Kub, Kd = [Kuu], [Kub], Kd[None]
    mu = rng.normal(size=(C, M))
    Lq = np.tril(rng.normal(size=(C, M, M)) * 0.3) + np.eye(M)
    ex = likelihood_expectation(RobustMax(1e-3), rng.integers(0, C, B))
    full = uncollapsed_elbo(Kuu, Kub, Kd, mu, Lq, ex, 2.0)
    lean = uncollapsed_elbo(Kuu, Kub, Kd, mu, Lq, ex, 2.0, with_dSigma=False)
    assert full.dSigma is not None and lean.dSigma is None
    assert lean.value == full.value and lean.kl == full.kl
    for f in ("dmu", "dLq", "expected"):
        np.testing.assert_array_equal(getattr(lean, f), getattr(full, f))
    for g_lean, g_full in zip(lean.matrix, full.matrix):
        for f in ("Kuu", "Kuf", "Kff_diag"):
            np.testing.assert_array_equal(getattr(g_lean, f), getattr(g_full, f))


def test_kuu_factorised_in_place_only_where_stacked_here(monkeypatch):
    """``L`` matrices ``Kuu`` given as a list are stacked per block, a new array factorised in
    place (``jittered_cholesky``'s ``again``, from order ``ops._POTRF_LOOP_FROM`` on); a
    caller's stack, or a block of one matrix (a view of it), is left as it was; the estimate
    is the same bit for bit either way."""
    import gpinfer_svi.variational as variational

    from gpinfer.backend import ops
    from gpinfer.likelihoods import RobustMax

    rng = np.random.default_rng(4)
    C, M, B = 3, ops._POTRF_LOOP_FROM, 8
    X = rng.normal(size=(B, 2))
    kerns = [RBF(lengthscale=0.8 + 0.2 * c, variance=1.2) + White(1e-2) for c in range(C)]
    Zs = [rng.normal(size=(M, 2)) for _ in range(C)]
    Kuu = [k.K(Z) for k, Z in zip(kerns, Zs)]
    Kub = np.stack([k.K(Z, X) for k, Z in zip(kerns, Zs)])
    Kd = np.stack([k.K_diag(X) for k in kerns])
    mu = rng.normal(size=(C, M))
    Lq = np.tril(rng.normal(size=(C, M, M)) * 0.1) + np.eye(M)
    ex = likelihood_expectation(RobustMax(1e-3), rng.integers(0, C, B))
    kept = [K.copy() for K in Kuu]
    stack = np.stack(Kuu)
    seen = []
    original = variational.jittered_cholesky

    def spy(K, *args, again=None, **options):
        seen.append(again is not None)
        return original(K, *args, again=again, **options)

    monkeypatch.setattr(variational, "jittered_cholesky", spy)
    from_list = uncollapsed_elbo(Kuu, Kub, Kd, mu, Lq, ex, 2.0)
    from_stack = uncollapsed_elbo(stack, Kub, Kd, mu, Lq, ex, 2.0)
    assert seen == [True, False]  # one block of all three: the list's stack is ours
    for K, ref in zip(Kuu, kept):
        np.testing.assert_array_equal(K, ref)
    np.testing.assert_array_equal(stack, np.stack(kept))
    for f in ("value", "kl", "dmu", "dLq", "dSigma"):
        np.testing.assert_array_equal(getattr(from_list, f), getattr(from_stack, f))
    monkeypatch.setattr(variational, "HOST_LATENT_BLOCK_FLOATS", M * B)  # one latent a block
    seen.clear()
    per_block = uncollapsed_elbo(Kuu, Kub, Kd, mu, Lq, ex, 2.0)
    assert seen == [False] * C  # a block of one matrix: a view of the caller's
    for K, ref in zip(Kuu, kept):
        np.testing.assert_array_equal(K, ref)
    assert per_block.value == pytest.approx(from_list.value, rel=1e-12)

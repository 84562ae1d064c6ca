"""sep's ``shared_inducing``: one kernel and one ``Z [M, D]`` for every class (GPflow SVGP's
model; ``Kuu``, its factor and ``L^-1 Kuf`` formed once and broadcast over the classes' tied
sites). With every class given that kernel and ``Z``, the per-class model's site updates and
``log Z_q`` equal the shared one's, and the shared kernel and ``Z`` gradients are the classes'
sums; the shared gradient passes the frozen-cavity finite differences (spec O6); torch-CPU
float64 equals numpy; bad combinations are ``InputError``s before training."""

from __future__ import annotations

import numpy as np
import pytest
from ep_helpers import frozen_surrogate, problem, u_space_cavities
from gpinfer_ep.method import SEP
from gpinfer_ep.state import TiedSites

from gpinfer.backend import ops, resolve_backend
from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import Problem
from gpinfer.kernels import RBF, White
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.sites.stacked import SharedTerms
from gpinfer.testing import assert_gradient_close

N, C, M = 12, 3, 4


def _host(a):
    return np.asarray(ops.to_host(a), dtype=float)


def _pair(backend, seed=2):
    """A shared state and a per-class state whose classes all have the shared kernel and
    ``Z``, with their hyper-parameters and the inputs on ``backend``."""
    X, y, kernels, Zs = problem(N=N, C=C, M=M, seed=seed, shared=True)
    shared = TiedSites(y, C, M, backend=backend)
    shared.shared = True
    per = TiedSites(y, C, M, backend=backend)
    hp_s = HyperParameters([kernels[0].copy()], Z=[backend.asarray(Zs[0])])
    hp_p = HyperParameters([k.copy() for k in kernels], Z=[backend.asarray(z) for z in Zs])
    return X, y, backend.asarray(X), (shared, hp_s), (per, hp_p)


def _terms(state, hp, Xb):
    return state.terms_at(hp.kernels, hp.Z, Xb)


def _summed(names, g, n_latent):
    """A per-class gradient's kernel and ``Z`` entries summed over the classes, in the shared
    layout (one kernel's parameters, then one ``Z``)."""
    out = []
    for kind in ("kernel", "Z"):
        rows = [np.array([i for i, n in enumerate(names) if n.startswith(f"{kind}[{c}]")])
                for c in range(n_latent)]
        out.append(sum(g[r] for r in rows))
    return np.concatenate(out)


@pytest.mark.parametrize("backend_name", ["numpy", "torch"])
def test_shared_equals_per_class_with_one_kernel_and_Z(backend_name):
    if backend_name == "torch":
        pytest.importorskip("torch")
    backend = resolve_backend(backend_name)
    X, _, Xt, (shared, hp_s), (per, hp_p) = _pair(backend)
    batches = [np.arange(0, N, 2), np.arange(1, N, 2), np.arange(N)]
    for idx in batches:  # tied updates, then log Z_q and the gradients, on each batch
        Xb = Xt[backend.as_index(idx)]
        t_s, t_p = _terms(shared, hp_s, Xb), _terms(per, hp_p, Xb)
        assert isinstance(t_s, SharedTerms) and t_s.one is not None
        assert t_s.one.L.shape == (1, M, M) and t_s.A.shape == (C, M, idx.size)
        ch_s, ch_p = shared.update(t_s, idx, 0.5), per.update(t_p, idx, 0.5)
        np.testing.assert_allclose(_host(ch_s), _host(ch_p), rtol=1e-12)
        for a, b in ((shared.Lam, per.Lam), (shared.h, per.h)):
            np.testing.assert_allclose(_host(a), _host(b), rtol=1e-12,
                                       atol=1e-12 * np.abs(_host(b)).max())
        v_s, g_s = shared.evaluate(t_s, idx, scale=N / idx.size)
        v_p, g_p = per.evaluate(t_p, idx, scale=N / idx.size)
        np.testing.assert_allclose(_host(v_s), _host(v_p), rtol=1e-12)
        assert len(g_s) == 1 and len(g_p) == C  # the shared gradients: one latent's stacks
        for name in ("Kuu", "Kuf", "Kff_diag"):
            total = _host(getattr(g_p, name)).sum(axis=0)
            np.testing.assert_allclose(_host(getattr(g_s, name))[0], total, rtol=1e-10,
                                       atol=1e-10 * np.abs(total).max())
        # through the kernels' VJPs: the shared kernel and Z gradients are the classes' sums
        d_s = _host(hp_s.gradient(Xb, g_s))
        d_p = _summed(hp_p.names, _host(hp_p.gradient(Xb, g_p)), C)
        np.testing.assert_allclose(d_s, d_p, rtol=1e-10, atol=1e-10 * np.abs(d_p).max())
        # not vacuous: every class's share differs (latent 0's alone is not the sum)
        g0 = _host(g_p.Kuu)[0]
        assert np.abs(g0 - _host(g_p.Kuu).sum(axis=0)).max() > 1e-3 * np.abs(g0).max()


@pytest.mark.parametrize("backend_name", ["numpy", "torch"])
def test_shared_sites_follow_moving_hyper_parameters_unread(backend_name):
    """Steps whose kernel parameters and ``Z`` move in between (the shared state moves its
    whitened sums to each new factor, ``rebased``, and forms ``Lam``, ``h`` only when read):
    the same sites and ``log Z_q`` as the per-class model; a snapshot restores them."""
    if backend_name == "torch":
        pytest.importorskip("torch")
    backend = resolve_backend(backend_name)
    _, _, Xt, (shared, hp_s), (per, hp_p) = _pair(backend, seed=3)
    rng = np.random.default_rng(4)
    theta_s = _host(hp_s.pack())
    snap = None
    for step, idx in enumerate([np.arange(0, N, 2), np.arange(1, N, 2), np.arange(N)] * 2):
        theta_s = theta_s + 0.05 * rng.standard_normal(theta_s.size)  # kernel and Z move
        hp_s.unpack(ops.like(hp_s.pack(), theta_s))
        hp_p.unpack(ops.like(hp_p.pack(), np.concatenate(  # the same values for every class
            [np.tile(theta_s[:len(hp_s.kernels[0].param_names)], C),
             np.tile(theta_s[len(hp_s.kernels[0].param_names):], C)])))
        Xb = Xt[backend.as_index(idx)]
        t_s, t_p = _terms(shared, hp_s, Xb), _terms(per, hp_p, Xb)
        shared.update(t_s, idx, 0.5)
        per.update(t_p, idx, 0.5)
        v_s, _ = shared.evaluate(t_s, idx)
        v_p, _ = per.evaluate(t_p, idx)
        np.testing.assert_allclose(_host(v_s), _host(v_p), rtol=1e-11)
        if step == 2:
            snap = shared.snapshot()
            expected = _host(per.Lam), _host(per.h)
    for a, b in ((shared.Lam, per.Lam), (shared.h, per.h)):  # read once, at the end
        np.testing.assert_allclose(_host(a), _host(b), rtol=1e-11,
                                   atol=1e-11 * np.abs(_host(b)).max())
    shared.restore(snap)
    np.testing.assert_allclose(_host(shared.Lam), expected[0], rtol=1e-11,
                               atol=1e-11 * np.abs(expected[0]).max())
    np.testing.assert_allclose(_host(shared.h), expected[1], rtol=1e-11,
                               atol=1e-11 * np.abs(expected[1]).max())


@pytest.mark.parametrize("moved", [False, True], ids=["same", "moved-in-a-frame"])
def test_shared_gradient_is_exact_for_the_frozen_cavity_surrogate(moved):
    """O6 on the shared model: the one kernel's parameters (noise included) and every
    coordinate of the one ``Z``, against central differences of the dense surrogate whose
    classes all read that kernel and ``Z``; ``moved``: the kernel and ``Z`` move after the
    updates, and the gradient is that of the sums kept on the updates' factor
    (``gpinfer.sites.stacked.Frame``: ``U Y_o``, ``U (.) U^T``)."""
    X, y, Xt, (state, hp), _ = _pair(resolve_backend("numpy"), seed=1)
    state.frame_drift = np.inf  # kept, however far the factor moves
    idx = np.arange(N)
    for _ in range(4):
        state.update(_terms(state, hp, X), idx, 0.5)
    if moved:
        theta = hp.pack()
        hp.unpack(theta + 0.1 * np.random.default_rng(2).standard_normal(theta.size))
    _, grads = state.evaluate(_terms(state, hp, X), idx)
    frame = state._frame
    assert frame is not None  # read in the updates' frame, U = L^-1 L_o
    drift = np.linalg.norm(frame.Q - np.eye(M))
    assert drift > 0.05 if moved else drift < 1e-12
    analytic = hp.gradient(X, grads)
    kernel = hp.kernels[0]
    Lam, h, cav = u_space_cavities(state, [kernel] * C, hp.Z * C, X)

    def f(theta):
        hp.unpack(theta)
        return frozen_surrogate([kernel] * C, hp.Z * C, X, y, Lam, h, cav)

    assert_gradient_close(f, analytic, hp.pack(), eps=1e-6, rtol=1e-5, atol=1e-7,
                          name="shared sep frozen-cavity gradient")
    assert sum(n.startswith("Z") for n in hp.names) == M * X.shape[1]


def _digits_like(seed=0, n=90, D=5):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % C
    X = rng.normal(size=(n, D)) + y[:, None] * 0.8
    return X, y


def _fit(backend_name, **options):
    X, y = _digits_like()
    est = GPClassifier(method="sep", M=M, kernel="rbf", max_iter=3, batch_size=30,
                       random_state=0, backend=backend_name,
                       method_options={"adam_learning_rate": 0.01, **options})
    return est.fit(X, y), X


def test_torch_float64_fit_equals_numpy():
    pytest.importorskip("torch")
    (a, X), (b, _) = _fit("numpy", shared_inducing=True), _fit("torch", shared_inducing=True)
    np.testing.assert_allclose(b.predict_proba(X), a.predict_proba(X), rtol=1e-10, atol=0)
    theta_a, theta_b = (e.fit_result_.state["theta"] for e in (a, b))
    np.testing.assert_allclose(theta_b, theta_a, rtol=1e-10)


def test_fit_keeps_one_kernel_and_Z_for_every_class():
    est, X = _fit("numpy", shared_inducing=True)
    fit = est.fit_result_
    post = fit.posterior
    assert len(post.Z) == C and all(np.array_equal(z, post.Z[0]) for z in post.Z)
    assert all(k == post.kernels[0] for k in post.kernels)
    P = est.predict_proba(X)
    assert P.shape == (X.shape[0], C) and np.all(np.isfinite(P))
    # the default is the paper's model: a kernel and Z per class (different draws)
    per, _ = _fit("numpy")
    assert not all(np.array_equal(z, per.fit_result_.posterior.Z[0])
                   for z in per.fit_result_.posterior.Z)


def _problem():
    X, y = _digits_like()
    return Problem(X=X, y=y, likelihood=ArgmaxNoise(noise_variance=0.0), n_classes=C, inducing=M,
                   kernel=RBF(lengthscale=1.0, variance=1.0) + White(0.1), max_iter=2,
                   batch_size=30)


@pytest.mark.parametrize("batch_size, schedule", [(30, "inner"), (None, "inner"),
                                                  (None, "outer")])
def test_fixed_hyper_parameter_fit_equals_the_per_class_one(batch_size, schedule):
    """With the kernel and ``Z`` held fixed (k-means ``Z``: the same for every class), a
    shared fit runs the per-class model's fit: the same posterior (mini-batch and batch
    schedules, snapshots and restores on the way)."""
    X, y = _digits_like(1)
    fits = []
    for shared in (False, True):
        problem = Problem(X=X, y=y, likelihood=ArgmaxNoise(noise_variance=0.0), n_classes=C,
                          inducing=M, kernel=RBF(lengthscale=1.5, variance=1.0) + White(0.1),
                          max_iter=3, batch_size=batch_size, optimize=False,
                          rng=np.random.default_rng(0))
        fits.append(SEP(inducing_init="kmeans", schedule=schedule,
                        shared_inducing=shared).fit(problem))
    per, shared = (f.posterior for f in fits)
    assert all(np.array_equal(z, shared.Z[0]) for z in per.Z)  # one model
    assert np.abs(np.array(per.m)).max() > 0.1  # the sites moved
    for a, b in ((shared.m, per.m), (shared.S, per.S)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(shared.predict_proba(X), per.predict_proba(X), rtol=1e-9)


def test_bad_combinations_are_input_errors_before_training():
    problem = _problem()
    with pytest.raises(InputError, match="shared_inducing"):  # ep has no such option
        from gpinfer_ep.method import EP
        EP(shared_inducing=True)
    with pytest.raises(InputError, match="shared_inducing"):
        SEP(shared_inducing="yes")
    per_class = SEP().fit(problem)  # a kernel and Z per class: no shared start for refine
    with pytest.raises(InputError, match="shared_inducing needs a fit whose classes share"):
        SEP(shared_inducing=True).refine(problem, per_class)
    shared = SEP(shared_inducing=True).fit(problem)  # its own fit: refine keeps one of each
    refined = SEP(shared_inducing=True).refine(problem, shared)
    assert all(np.array_equal(z, refined.posterior.Z[0]) for z in refined.posterior.Z)

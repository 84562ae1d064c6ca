"""Optimisers: L-BFGS-B on concave problems, Adam/AdaDelta on a noisy quadratic, stops, errors."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.errors import InputError, NumericalError, UnknownNameError
from gpinfer.optim import LBFGSB, OPTIMIZERS, AdaDelta, Adam, make_optimizer
from gpinfer.optim.adam import _HOST_PIECE

A = np.array([[3.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 1.0]])
X_STAR = np.array([1.0, -2.0, 0.5])


def concave_quadratic(x):
    d = x - X_STAR
    return -0.5 * d @ A @ d + 4.0, -(A @ d)


def neg_rosenbrock(x):
    a, b = 1.0, 100.0
    value = (a - x[0]) ** 2 + b * (x[1] - x[0] ** 2) ** 2
    grad = np.array(
        [-2 * (a - x[0]) - 4 * b * x[0] * (x[1] - x[0] ** 2), 2 * b * (x[1] - x[0] ** 2)]
    )
    return -value, -grad


def test_lbfgs_concave_quadratic():
    res = LBFGSB().maximize(concave_quadratic, np.zeros(3), max_iter=100)
    assert res.success, res.message
    np.testing.assert_allclose(res.x, X_STAR, atol=1e-5)
    assert res.value == pytest.approx(4.0, abs=1e-9)
    assert res.n_iter >= 1


def test_lbfgs_rosenbrock():
    res = LBFGSB(gtol=1e-9, ftol=1e-14).maximize(neg_rosenbrock, np.array([-1.2, 1.0]), 500)
    assert res.success, res.message
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-4)


def test_lbfgs_bounds_single_pair_and_per_coordinate():
    res = LBFGSB(bounds=(-1.0, 0.0)).maximize(concave_quadratic, np.zeros(3), max_iter=100)
    assert np.all(res.x <= 1e-12) and np.all(res.x >= -1.0 - 1e-12)
    res2 = LBFGSB(bounds=[(None, None), (None, None), (None, 0.2)]).maximize(
        concave_quadratic, np.zeros(3), max_iter=100
    )
    assert res2.x[2] == pytest.approx(0.2)
    with pytest.raises(InputError, match="2 bounds for 3"):
        LBFGSB(bounds=[(0, 1), (0, 1)]).maximize(concave_quadratic, np.zeros(3), 10)


def test_lbfgs_callback_once_per_iteration_and_stop():
    seen = []

    def cb(it, x, value):
        seen.append((it, value))
        return it == 3

    res = LBFGSB().maximize(neg_rosenbrock, np.array([-1.2, 1.0]), max_iter=100, callback=cb)
    assert [s[0] for s in seen] == [1, 2, 3]
    assert res.n_iter == 3 and res.success and res.message == "stopped by callback"
    assert res.value == pytest.approx(seen[-1][1])
    np.testing.assert_allclose(neg_rosenbrock(res.x)[0], res.value)


def test_lbfgs_max_iter_is_normal_end():
    res = LBFGSB().maximize(neg_rosenbrock, np.array([-1.2, 1.0]), max_iter=2)
    assert res.n_iter == 2 and res.success
    assert "ITERATIONS" in res.message.upper()


def test_lbfgs_abnormal_termination_is_reported():
    # a gradient that is inconsistent with the value makes the line search fail
    def wrong(x):
        return -float(x @ x), x.copy()

    res = LBFGSB().maximize(wrong, np.ones(2), max_iter=50)
    assert not res.success
    assert res.message


def test_lbfgs_stop_on_trial_failure_keeps_the_last_accepted_iterate():
    """A trial point where the objective breaks down ends the run at the last accepted point."""
    accepted = []

    def breaks_down_past_half(x):
        if x[0] > 0.5:
            raise NumericalError("bound above its limit", quantity="objective")
        return concave_quadratic(x)

    opt = LBFGSB(stop_on_trial_failure=True)
    res = opt.maximize(breaks_down_past_half, np.zeros(3), max_iter=100,
                       callback=lambda it, x, v: accepted.append((x.copy(), v)) and False)
    assert not res.success and "numerical failure at a trial point" in res.message
    assert res.trial_failure
    assert res.x[0] <= 0.5
    if accepted:  # the last point L-BFGS-B accepted, or the start
        np.testing.assert_array_equal(res.x, accepted[-1][0])
        assert res.value == accepted[-1][1]
    else:
        np.testing.assert_array_equal(res.x, np.zeros(3))
    assert res.value == pytest.approx(concave_quadratic(res.x)[0])

    def fails_at_start(x):
        raise NumericalError("broken at the start")

    with pytest.raises(NumericalError, match="broken at the start"):  # nothing to keep
        opt.maximize(fails_at_start, np.zeros(3), max_iter=10)


def test_lbfgs_a_numerical_error_of_the_callback_propagates_at_its_iteration():
    """The fit guard raises in the callback, at an accepted iterate: that is no trial-point
    failure to back off from, even with ``stop_on_trial_failure`` (kl, vb and vi-jj-full once
    ran every iteration after it)."""
    seen = []

    def guard(it, x, value):
        seen.append(it)
        if it == 2:
            raise NumericalError("objective above its limit", iteration=it, quantity="objective")

    with pytest.raises(NumericalError, match="above its limit") as info:
        LBFGSB(stop_on_trial_failure=True).maximize(concave_quadratic, np.zeros(3), max_iter=50,
                                                    callback=guard)
    assert info.value.iteration == 2 and seen == [1, 2]


def test_lbfgs_nan_raises_numerical_error_with_iteration():
    def nan_after(x):
        if x[0] > 0.5:
            return float("nan"), np.zeros(3)
        return concave_quadratic(x)

    with pytest.raises(NumericalError, match="iteration") as info:
        LBFGSB().maximize(nan_after, np.zeros(3), max_iter=100)
    assert info.value.iteration is not None and info.value.iteration >= 1

    def nan_grad(x):
        return 0.0, np.array([np.nan, 0.0])

    with pytest.raises(NumericalError, match="gradient") as info:
        LBFGSB().maximize(nan_grad, np.zeros(2), max_iter=10)
    assert info.value.iteration == 0


def _noisy_quadratic(seed):
    rng = np.random.default_rng(seed)

    def fun(x):
        value, grad = concave_quadratic(x)
        return value, grad + 0.3 * rng.standard_normal(x.shape)

    return fun


@pytest.mark.parametrize(
    "opt, n_iter",
    [(Adam(learning_rate=0.05), 3000), (AdaDelta(learning_rate=1.0), 3000),
     (AdaDelta(learning_rate=0.5, momentum=0.5), 3000)],
)
def test_stochastic_converge_on_noisy_quadratic(opt, n_iter):
    trace = []

    def cb(it, x, value):
        if it > n_iter - 500:
            trace.append(x)

    res = opt.maximize(_noisy_quadratic(0), np.zeros(3), max_iter=n_iter, callback=cb)
    assert res.n_iter == n_iter and res.success
    np.testing.assert_allclose(np.mean(trace, axis=0), X_STAR, atol=0.1)


def test_stochastic_callback_stop_and_nan():
    res = Adam().maximize(concave_quadratic, np.zeros(3), 100, callback=lambda it, x, v: it == 7)
    assert res.n_iter == 7 and res.message == "stopped by callback"

    def nan_at_5(x, calls=[0]):  # noqa: B006 -- a call counter
        calls[0] += 1
        return (float("nan") if calls[0] == 5 else 0.0), np.ones(3)

    with pytest.raises(NumericalError) as info:
        AdaDelta().maximize(nan_at_5, np.zeros(3), 100)
    assert info.value.iteration == 5


def test_adam_first_step_size_is_learning_rate():
    opt = Adam(learning_rate=0.1)
    opt.reset(np.zeros(2))
    x = opt.step(np.zeros(2), np.array([5.0, -0.01]))
    np.testing.assert_allclose(x, [0.1, -0.1], rtol=1e-5)


def test_adadelta_matches_climin_recursion():
    rho, eps, lr = 0.9, 1e-4, 0.7
    opt = AdaDelta(rho=rho, eps=eps, learning_rate=lr)
    opt.reset(np.zeros(1))
    G = S = 0.0
    x, xr = np.zeros(1), 0.0
    for g in [2.0, -1.0, 0.5]:
        x = opt.step(x, np.array([g]))
        G = rho * G + (1 - rho) * g * g
        d = lr * np.sqrt(S + eps) / np.sqrt(G + eps) * g
        S = rho * S + (1 - rho) * d * d
        xr += d
        assert x[0] == pytest.approx(xr)


def test_make_optimizer():
    assert isinstance(make_optimizer("lbfgs", gtol=1e-7), LBFGSB)
    assert isinstance(make_optimizer("L-BFGS-B"), LBFGSB)
    assert make_optimizer("adam", learning_rate=0.1).learning_rate == 0.1
    assert isinstance(make_optimizer("adadelta"), AdaDelta)
    with pytest.raises(UnknownNameError) as info:
        make_optimizer("sgd")
    for name in OPTIMIZERS:
        assert name in str(info.value)
    with pytest.raises(InputError, match="learning_rate"):
        make_optimizer("adam", lr=0.1)


def test_adam_steps_match_the_textbook_formulas():
    """Three steps against the bias-corrected update written out in full (Kingma & Ba, Alg. 1)."""
    rng = np.random.default_rng(5)
    lr, b1, b2, eps = 0.03, 0.8, 0.99, 1e-6
    opt = Adam(learning_rate=lr, beta1=b1, beta2=b2, eps=eps)
    x = rng.standard_normal(6)
    x_ref, m, v = x.copy(), np.zeros(6), np.zeros(6)
    for t in range(1, 4):
        g = rng.standard_normal(6)
        x = opt.step(x, g)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        x_ref = x_ref + lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        np.testing.assert_allclose(x, x_ref, rtol=1e-13, atol=1e-15)


def test_adam_step_into_writes_the_same_bits_into_x():
    rng = np.random.default_rng(3)
    a, b = Adam(learning_rate=0.05), Adam(learning_rate=0.05)
    x = rng.normal(size=7)
    y = x.copy()
    for _ in range(4):
        g = rng.normal(size=7)
        g_before = g.copy()
        new = a.step(x, g)
        assert new is not x
        out = b.step_into(y, g)
        assert out is y
        np.testing.assert_array_equal(g, g_before)  # the gradient is read only
        np.testing.assert_array_equal(out, new)
        x = new


def test_adam_host_pieces_give_the_bits_of_whole_vector_operations():
    rng = np.random.default_rng(4)
    P = 50_000  # several pieces and a short last one
    opt = Adam(learning_rate=0.02)
    x = rng.normal(size=P)
    ref_x, m, v = x.copy(), np.zeros(P), np.zeros(P)
    for t in range(1, 4):
        g = rng.normal(size=P)
        m = m * 0.9 + g * (1.0 - 0.9)
        v = v * 0.999 + (g * g) * (1.0 - 0.999)
        den = np.sqrt(v) * (1.0 / np.sqrt(1.0 - 0.999**t)) + 1e-8
        ref_x = ref_x + (m * (0.02 / (1.0 - 0.9**t))) / den
        x = opt.step_into(x, g)
        np.testing.assert_array_equal(x, ref_x)
    # the host's scratch is one piece (what a copy of the optimiser, svi's kept state, copies)
    assert opt._work is not None and opt._work.shape == (_HOST_PIECE,)


@pytest.mark.parametrize("scalars_as_arrays", [False, True])
def test_adam_on_torch_follows_the_host_update_to_round_off(scalars_as_arrays):
    """The device update (fused operators: ``add_(alpha=)``, ``addcmul_``, ``addcdiv_`` with
    python scalars; its last steps one by one with 0-d scalars, as compiled) against the
    host's over five steps: the same iterates and moments to round-off, the gradient read
    only, and python and 0-d scalars give the same bits."""
    torch = pytest.importorskip("torch")
    from gpinfer.optim.adam import _adam_update

    rng = np.random.default_rng(6)
    P, b1, b2, eps, lr = 40, 0.8, 0.99, 1e-6, 0.03
    host = Adam(learning_rate=lr, beta1=b1, beta2=b2, eps=eps)
    x_h = rng.normal(size=P)
    x_d = torch.tensor(x_h)
    m, v, work, delta = (torch.zeros(P, dtype=torch.float64) for _ in range(4))
    for t in range(1, 6):
        g = rng.normal(size=P) * 10.0 ** rng.integers(-3, 3, size=P)
        g_d = torch.tensor(g)
        x_h = host.step_into(x_h, g)
        inv_bias2 = 1.0 / np.sqrt(1.0 - b2**t)
        shift, step = eps / inv_bias2, lr / (1.0 - b1**t) / inv_bias2
        if scalars_as_arrays:
            shift, step = (torch.tensor(s, dtype=torch.float64) for s in (shift, step))
        _adam_update(x_d, g_d, m, v, work, delta, b1, b2, shift, step)
        np.testing.assert_array_equal(g_d.numpy(), g)
        np.testing.assert_allclose(x_d.numpy(), x_h, rtol=1e-14, atol=0)
        np.testing.assert_allclose(m.numpy(), host.m, rtol=1e-14, atol=0)
        np.testing.assert_allclose(v.numpy(), host.v, rtol=1e-14, atol=0)


def test_adam_on_torch_gives_the_same_bits_with_python_and_0d_scalars():
    """An eager fallback of a compiled step (0-d scalars) equals the plain eager update."""
    torch = pytest.importorskip("torch")
    from gpinfer.optim.adam import _adam_update

    rng = np.random.default_rng(8)
    P = 1000
    states = [[torch.tensor(rng.normal(size=P))] + [torch.zeros(P, dtype=torch.float64)
                                                     for _ in range(4)] for _ in range(2)]
    states[1][0] = states[0][0].clone()
    for t in range(1, 6):
        g = torch.tensor(rng.normal(size=P) * 10.0 ** rng.integers(-4, 4, size=P))
        shift, step = 1e-8 * np.sqrt(1.0 - 0.999**t), 0.01 / (1.0 - 0.9**t) * np.sqrt(
            1.0 - 0.999**t)
        _adam_update(*states[0][:1], g, *states[0][1:], 0.9, 0.999, float(shift), float(step))
        _adam_update(*states[1][:1], g, *states[1][1:], 0.9, 0.999,
                     torch.tensor(shift, dtype=torch.float64),
                     torch.tensor(step, dtype=torch.float64))
        for a, b in zip(states[0][:3], states[1][:3]):
            np.testing.assert_array_equal(a.numpy(), b.numpy())

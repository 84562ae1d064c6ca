"""``gpinfer_binary.newton``: the safeguarded Newton ascent on functions with known maxima:
a concave quadratic in one step, a non-quadratic concave function, an indefinite start (the
Levenberg-Marquardt shift), a projection, and non-finite values as a ``NumericalError``."""

from __future__ import annotations

import numpy as np
import pytest
from gpinfer_binary.newton import newton_maximize

from gpinfer.errors import NumericalError


def _quadratic(A, b):
    def fun(x, derivatives):
        value = float(b @ x - 0.5 * x @ A @ x)
        return (value, b - A @ x, -A) if derivatives else (value, None, None)

    return fun


def test_concave_quadratic_in_one_step():
    rng = np.random.default_rng(0)
    Q = rng.normal(size=(4, 4))
    A, b = Q @ Q.T + np.eye(4), rng.normal(size=4)
    res = newton_maximize(_quadratic(A, b), np.zeros(4), tol=1e-10)
    assert res.converged and res.n_steps == 1 and res.n_shifted == 0
    np.testing.assert_allclose(res.x, np.linalg.solve(A, b), atol=1e-10)


def test_smooth_concave_function():
    """``f(x) = -sum(cosh(x - c))``: maximum at ``c``, value ``-n``."""
    c = np.array([0.5, -1.5, 3.0])

    def fun(x, derivatives):
        d = x - c
        value = -float(np.sum(np.cosh(d)))
        return (value, -np.sinh(d), -np.diag(np.cosh(d))) if derivatives else (value, None, None)

    res = newton_maximize(fun, np.zeros(3), tol=1e-12)
    assert res.converged
    np.testing.assert_allclose(res.x, c, atol=1e-10)
    assert res.value == pytest.approx(-3.0, abs=1e-12)


def test_indefinite_start_takes_shifted_steps_and_converges():
    """``f(x) = -x^4/4 + x^2/2``: ``f'' > 0`` at 0.1 (a minimum nearby); the maxima are +-1."""

    def fun(x, derivatives):
        value = float(-x[0] ** 4 / 4 + x[0] ** 2 / 2)
        g = np.array([-x[0] ** 3 + x[0]])
        return (value, g, np.array([[-3 * x[0] ** 2 + 1]])) if derivatives else (value, None, None)

    res = newton_maximize(fun, np.array([0.1]), tol=1e-12)
    assert res.converged and res.n_shifted >= 1
    assert abs(res.x[0]) == pytest.approx(1.0, abs=1e-10)


def test_projection_keeps_iterates_feasible():
    """Maximise ``-(x - 2)^2`` over ``x <= 1``: the projected optimum is 1."""
    seen = []

    def fun(x, derivatives):
        seen.append(float(x[0]))
        value = -float((x[0] - 2.0) ** 2)
        return (value, np.array([-2 * (x[0] - 2.0)]), np.array([[-2.0]])) if derivatives \
            else (value, None, None)

    res = newton_maximize(fun, np.array([0.0]), project=lambda z: np.minimum(z, 1.0),
                          max_steps=20)
    assert max(seen) <= 1.0
    assert res.x[0] == pytest.approx(1.0)


def _coupled_quadratic(x, derivatives):
    """``-1/2 (x - c)^T A (x - c)``, ``A = [[1, .9], [.9, 1]]``, ``c = (0, 3)``: over ``x_1 <= 0``
    the maximum is at ``x_1 = 0``, ``x_0 = 2.7`` (the KKT point), where the gradient of ``x_1``
    stays positive."""
    A, c = np.array([[1.0, 0.9], [0.9, 1.0]]), np.array([0.0, 3.0])
    r = x - c
    value = -0.5 * float(r @ A @ r)
    return (value, -A @ r, -A) if derivatives else (value, None, None)


def test_projected_newton_reaches_the_bounded_optimum():
    """With ``fixed`` (the coordinates at the bound that the gradient pushes out) the step is
    Newton's on the free coordinates: the KKT point in two steps and a converged flag, where the
    clipped full step alone is no ascent direction and stalls away from it."""
    project = lambda z: np.array([z[0], min(z[1], 0.0)])  # noqa: E731
    start = np.array([-1.0, -0.5])
    res = newton_maximize(_coupled_quadratic, start, project=project, max_steps=50, tol=1e-10,
                          fixed=lambda x, g: np.array([False, x[1] >= 0.0 and g[1] > 0.0]))
    assert res.converged and res.n_steps <= 3
    np.testing.assert_allclose(res.x, [2.7, 0.0], atol=1e-10)
    clipped = newton_maximize(_coupled_quadratic, start, project=project, max_steps=50,
                              tol=1e-10)
    assert not clipped.converged


def test_non_finite_objective_is_a_numerical_error():
    def fun(x, derivatives):
        return float("nan"), np.zeros(1), -np.eye(1)

    with pytest.raises(NumericalError, match="non-finite"):
        newton_maximize(fun, np.zeros(1), name="probe")


def test_hessian_no_shift_regularises_is_a_numerical_error_naming_it():
    """``H = [[0, 1], [1, 0]]``: its diagonal (the shift's scale) is zero, so no shift up to
    ``mu = 1e12`` makes ``-(H - mu D)`` positive definite."""
    def fun(x, derivatives):
        return 0.0, np.array([1.0, 0.0]), np.array([[0.0, 1.0], [1.0, 0.0]])

    with pytest.raises(NumericalError, match=r"^probe: Cholesky of Hessian failed .*not positive "
                                             r"definite \(iteration 0, quantity 'Hessian'\)$"
                       ) as info:
        newton_maximize(fun, np.zeros(2), name="probe")
    assert info.value.quantity == "Hessian" and info.value.iteration == 0


def test_non_finite_hessian_is_a_numerical_error_naming_the_solver_and_quantity():
    def fun(x, derivatives):
        return 0.0, np.array([1.0, 0.0]), np.array([[np.nan, 1.0], [1.0, -1.0]])

    with pytest.raises(NumericalError, match=r"^probe: Hessian has non-finite entries; cannot "
                                             r"factorise \(iteration 0, quantity 'Hessian'\)$"):
        newton_maximize(fun, np.zeros(2), name="probe")


@pytest.mark.parametrize("method", ["vb", "kl"])
def test_the_methods_newton_errors_name_the_method(method, monkeypatch):
    # a Hessian that no shift regularises, in the method's own Newton solve: the error names
    # the method (it named neither method nor solver)
    import gpinfer_binary.newton as newton

    from gpinfer import registry
    from gpinfer.kernels import make_kernel
    from gpinfer.likelihoods import make_likelihood

    def fail(*args, **kwargs):
        raise NumericalError("Cholesky of Hessian failed", iteration=0, quantity="Hessian")

    monkeypatch.setattr(newton, "jittered_cholesky", fail)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    y = (X[:, 0] > 0).astype(np.int64)
    K = make_kernel("rbf", 2).K(X)
    with pytest.raises(NumericalError, match=rf"^{method} Newton: Cholesky of Hessian failed"):
        registry.load_method(method)().solve(K, y, make_likelihood("probit"), None)

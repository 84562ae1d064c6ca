"""Kernels: matrices against naive references, and every VJP against finite differences."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import gpinfer
from gpinfer.errors import InputError, UnknownNameError
from gpinfer.kernels import (
    RBF,
    Kernel,
    Linear,
    Matern32,
    Matern52,
    Product,
    Sum,
    White,
    make_kernel,
)
from gpinfer.testing import assert_gradient_close

from . import reference

D = 3
N, N2 = 6, 5

# name -> factory of a fresh kernel (kernels are mutable)
KERNELS = {
    "rbf": lambda: RBF(lengthscale=0.8, variance=1.3),
    "rbf_ard": lambda: RBF(lengthscale=[0.7, 1.2, 2.0], variance=0.9),
    "matern32": lambda: Matern32(lengthscale=1.1, variance=0.7),
    "matern32_ard": lambda: Matern32(lengthscale=[0.6, 1.5, 0.9], variance=1.4),
    "matern52": lambda: Matern52(lengthscale=0.9, variance=1.2),
    "matern52_ard": lambda: Matern52(lengthscale=[1.3, 0.5, 1.0], variance=0.8),
    "linear": lambda: Linear(variance=0.7),
    "linear_ard": lambda: Linear(variance=[0.5, 1.5, 2.0]),
    "white": lambda: White(variance=0.3),
    "rbf*linear+white": lambda: RBF([0.9, 1.1, 1.4], 1.2) * Linear(0.6) + White(0.1),
    "matern52*rbf": lambda: Matern52([1.3, 0.5, 1.0], 0.8) * RBF(1.5, 1.1),
    "(matern32+linear)*rbf*white": lambda: (Matern32(1.1) + Linear([0.5, 1.0, 2.0]))
    * RBF(0.9, 0.7)
    * White(0.5),
}

# name -> (factory, reference(X, X2)) for the single kernels
REFERENCES = {
    "rbf": lambda X, X2: reference.rbf(X, X2, 0.8, 1.3),
    "rbf_ard": lambda X, X2: reference.rbf(X, X2, [0.7, 1.2, 2.0], 0.9),
    "matern32": lambda X, X2: reference.matern32(X, X2, 1.1, 0.7),
    "matern32_ard": lambda X, X2: reference.matern32(X, X2, [0.6, 1.5, 0.9], 1.4),
    "matern52": lambda X, X2: reference.matern52(X, X2, 0.9, 1.2),
    "matern52_ard": lambda X, X2: reference.matern52(X, X2, [1.3, 0.5, 1.0], 0.8),
    "linear": lambda X, X2: reference.linear(X, X2, 0.7),
    "linear_ard": lambda X, X2: reference.linear(X, X2, [0.5, 1.5, 2.0]),
    "white": lambda X, X2: reference.white(X, X2, 0.3),
    "rbf*linear+white": lambda X, X2: reference.rbf(X, X2, [0.9, 1.1, 1.4], 1.2)
    * reference.linear(X, X2, 0.6)
    + reference.white(X, X2, 0.1),
    "matern52*rbf": lambda X, X2: reference.matern52(X, X2, [1.3, 0.5, 1.0], 0.8)
    * reference.rbf(X, X2, 1.5, 1.1),
    "(matern32+linear)*rbf*white": lambda X, X2: (
        reference.matern32(X, X2, 1.1, 1.0) + reference.linear(X, X2, [0.5, 1.0, 2.0])
    )
    * reference.rbf(X, X2, 0.9, 0.7)
    * reference.white(X, X2, 0.5),
}

NAMES = list(KERNELS)


@pytest.fixture
def data():
    rng = np.random.default_rng(42)
    X = rng.normal(size=(N, D))
    X2 = rng.normal(size=(N2, D))
    dK = rng.normal(size=(N, N))  # deliberately not symmetric: both triangles must count
    dK_cross = rng.normal(size=(N, N2))
    dK_diag = rng.normal(size=N)
    return X, X2, dK, dK_cross, dK_diag


# --------------------------------------------------------------------------------------------
# matrices
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_K_matches_naive_reference(name, data):
    X, X2, *_ = data
    k = KERNELS[name]()
    np.testing.assert_allclose(k.K(X), REFERENCES[name](X, None), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(k.K(X, X2), REFERENCES[name](X, X2), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_K_symmetric_psd_and_diag(name, data):
    X, *_ = data
    k = KERNELS[name]()
    K = k.K(X)
    assert K.shape == (N, N)
    np.testing.assert_allclose(K, K.T, atol=1e-14)
    assert np.min(np.linalg.eigvalsh(K)) >= -1e-10 * np.max(np.abs(K))
    np.testing.assert_allclose(k.K_diag(X), np.diag(K), rtol=1e-12, atol=1e-15)


def test_white_is_zero_between_two_input_sets(data):
    X, *_ = data
    k = White(0.5)
    np.testing.assert_array_equal(k.K(X, X), np.zeros((N, N)))
    np.testing.assert_array_equal(k.K(X), 0.5 * np.eye(N))


@pytest.mark.parametrize("cls", [RBF, Matern32, Matern52])
def test_stationary_far_from_origin_is_accurate(cls, data):
    X, X2, *_ = data
    k = cls(lengthscale=[0.3, 0.5, 0.4])
    shift = 1e4
    np.testing.assert_allclose(k.K(X + shift, X2 + shift), k.K(X, X2), atol=1e-9)
    np.testing.assert_allclose(k.K(X + shift), k.K(X), atol=1e-9)


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_unconstrained_round_trip(name, data):
    X, X2, *_ = data
    k = KERNELS[name]()
    theta = k.get_unconstrained()
    assert theta.shape == (k.n_params,) == (len(k.param_names),)
    assert len(set(k.param_names)) == k.n_params
    k2 = KERNELS[name]()
    k2.set_unconstrained(theta + 0.1)
    np.testing.assert_allclose(k2.get_unconstrained(), theta + 0.1)
    assert not np.allclose(k2.K(X), k.K(X))  # square: White contributes there only
    k2.set_unconstrained(theta)
    np.testing.assert_allclose(k2.K(X), k.K(X), rtol=1e-13)
    np.testing.assert_allclose(k2.K(X, X2), k.K(X, X2), rtol=1e-13)


def test_param_names_and_describe():
    k = RBF(lengthscale=[0.5, 2.0], variance=3.0)
    assert k.param_names == ["lengthscale[0]", "lengthscale[1]", "variance"]
    np.testing.assert_allclose(k.get_unconstrained(), np.log([0.5, 2.0, 3.0]))
    d = k.describe()
    assert set(d) == {"lengthscale", "variance"}
    np.testing.assert_allclose(d["lengthscale"], [0.5, 2.0])
    assert isinstance(d["lengthscale"], list) and isinstance(d["variance"], float)
    assert RBF(0.5).param_names == ["lengthscale", "variance"]
    assert RBF(0.5).describe()["lengthscale"] == pytest.approx(0.5)
    assert Linear([1.0, 2.0]).describe()["variance"] == pytest.approx([1.0, 2.0])
    assert Linear(2.0).param_names == ["variance"]
    assert White(1e-3).describe() == {"variance": pytest.approx(1e-3)}

    s = RBF(0.5) * Linear([1.0, 2.0]) + White(0.1)
    assert s.param_names == [
        "0_product.0_rbf.lengthscale",
        "0_product.0_rbf.variance",
        "0_product.1_linear.variance[0]",
        "0_product.1_linear.variance[1]",
        "1_white.variance",
    ]
    ds = s.describe()
    assert ds["0_product.1_linear.variance"] == pytest.approx([1.0, 2.0])
    assert ds["1_white.variance"] == pytest.approx(0.1)


def test_natural_value_properties():
    k = Matern52(lengthscale=[0.5, 2.0], variance=3.0)
    assert k.ard and k.input_dim == 2
    np.testing.assert_allclose(k.lengthscale, [0.5, 2.0])
    assert k.variance == pytest.approx(3.0)
    assert RBF(0.5).input_dim is None and RBF(0.5).lengthscale == pytest.approx(0.5)
    assert Linear([1.0, 2.0]).input_dim == 2


def test_sums_flatten_and_repeated_kernels_get_their_own_parameters():
    a, b, c = RBF(), Linear(), White()
    s = a + b + c
    assert isinstance(s, Sum) and len(s.parts) == 3
    p = a * b * c
    assert isinstance(p, Product) and len(p.parts) == 3
    k = RBF(1.0)
    twice = k + k
    assert twice.n_params == 4
    twice.set_unconstrained(np.log([1.0, 1.0, 2.0, 3.0]))
    assert twice.describe()["1_rbf.lengthscale"] == pytest.approx(2.0)
    assert twice.describe()["0_rbf.lengthscale"] == pytest.approx(1.0)


# --------------------------------------------------------------------------------------------
# vector-Jacobian products against finite differences
# --------------------------------------------------------------------------------------------


def _objective_of_params(k: Kernel, matrix):
    def f(theta):
        k.set_unconstrained(theta)
        return float(np.sum(matrix(k)))

    return f


@pytest.mark.parametrize("part", ["square", "cross", "diag"])
@pytest.mark.parametrize("name", NAMES)
def test_grad_params(name, part, data):
    """``grad_params`` of ``K(X)`` and ``K(X, X2)``, ``grad_params_diag`` of ``K_diag(X)``."""
    X, X2, dK_square, dK_cross, dK_diag = data
    k = KERNELS[name]()
    theta = k.get_unconstrained()
    if part == "diag":
        grad = k.grad_params_diag(X, dK_diag)
        matrix = lambda kk: dK_diag * kk.K_diag(X)
    else:
        X2, dK = (X2, dK_cross) if part == "cross" else (None, dK_square)
        grad = k.grad_params(X, X2, dK)
        matrix = lambda kk: dK * kk.K(X, X2)
    assert grad.shape == theta.shape
    assert_gradient_close(_objective_of_params(k.copy(), matrix), grad, theta,
                          name=f"{name} grad_params ({part})")


@pytest.mark.parametrize("cross", [False, True], ids=["square", "cross"])
@pytest.mark.parametrize("name", NAMES)
def test_grad_inputs(name, cross, data):
    X, X2, dK_square, dK_cross, _ = data
    X2, dK = (X2, dK_cross) if cross else (None, dK_square)
    k = KERNELS[name]()
    grad = k.grad_inputs(X, X2, dK)
    assert grad.shape == X.shape
    f = lambda Xv: float(np.sum(dK * k.K(Xv, X2)))
    assert_gradient_close(f, grad, X, name=f"{name} grad_inputs ({'cross' if cross else 'square'})")


@pytest.mark.parametrize("name", NAMES)
def test_grad_inputs_diag(name, data):
    X, _, _, _, dK_diag = data
    k = KERNELS[name]()
    grad = k.grad_inputs_diag(X, dK_diag)
    assert grad.shape == X.shape
    f = lambda Xv: float(np.sum(dK_diag * k.K_diag(Xv)))
    assert_gradient_close(f, grad, X, name=f"{name} grad_inputs_diag")


def test_linear_diag_input_gradient_is_not_zero(data):
    X, _, _, _, dK_diag = data
    assert np.max(np.abs(Linear([0.5, 1.5, 2.0]).grad_inputs_diag(X, dK_diag))) > 0.1


@pytest.mark.parametrize("cls", [Matern32, Matern52, RBF])
@pytest.mark.parametrize("lengthscale", [0.9, [0.6, 1.5, 0.9]])
def test_coincident_points_give_finite_gradients(cls, lengthscale, data):
    X, _, dK, _, _ = data
    X = X.copy()
    X[3] = X[1]  # a repeated training point
    Z = X[:4].copy()  # inducing inputs on top of training points
    dK_cross = np.random.default_rng(1).normal(size=(N, 4))
    k = cls(lengthscale=lengthscale, variance=1.2)
    for X2, G in [(None, dK), (Z, dK_cross)]:
        gp = k.grad_params(X, X2, G)
        gx = k.grad_inputs(X, X2, G)
        assert np.all(np.isfinite(gp)) and np.all(np.isfinite(gx))
        f = lambda Xv, X2=X2, G=G: float(np.sum(G * k.K(Xv, X2)))
        assert_gradient_close(f, gx, X, name=f"{cls.__name__} inputs, coincident points")
        fp = _objective_of_params(k.copy(), lambda kk, X2=X2, G=G: G * kk.K(X, X2))
        assert_gradient_close(fp, gp, k.get_unconstrained(), name="params, coincident")
    # only the coincident pair (x_1, z_1) has weight: its input gradient is exactly zero
    E = np.zeros((N, 4))
    E[1, 1] = 1.0
    np.testing.assert_array_equal(k.grad_inputs(X, Z, E), np.zeros_like(X))


def _stationary_classes() -> list[type]:
    """Every concrete ``Stationary`` subclass the package defines (recursively)."""
    from gpinfer.kernels.stationary import Stationary

    out, todo = [], list(Stationary.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("gpinfer.") and not getattr(cls, "__abstractmethods__", None):
            out.append(cls)
    return out


def test_every_stationary_kernel_has_its_own_derivative_shortcut():
    """``dg_dr2_per_g`` (``dg/dr2 = c g``, the stacked path's ``var`` gradient and
    ``_dg_dr2_from``) holds for every class that sets or inherits it, and ``_dg_dr2`` is the
    derivative of ``_g`` (central differences) for every class: a Matern must not take RBF's
    shortcut, a subclass changing ``_g`` must not inherit it."""
    classes = _stationary_classes()
    assert {RBF, Matern32, Matern52} <= set(classes)
    r2 = np.linspace(0.05, 6.0, 40)[None, :]
    h = 1e-6
    for cls in classes:
        k = cls(lengthscale=0.8, variance=1.3)
        g, dg = k._g(r2), k._dg_dr2(r2)
        fd = (k._g(r2 + h) - k._g(r2 - h)) / (2 * h)
        np.testing.assert_allclose(dg, fd, rtol=1e-7, atol=1e-9, err_msg=cls.__name__)
        np.testing.assert_allclose(k._dg_dr2_from(r2, g), dg, rtol=1e-14, err_msg=cls.__name__)
        c = cls.dg_dr2_per_g
        if c is not None:
            np.testing.assert_allclose(c * g, dg, rtol=1e-14, err_msg=cls.__name__)
    assert RBF.dg_dr2_per_g == -0.5
    assert Matern32.dg_dr2_per_g is None and Matern52.dg_dr2_per_g is None


def test_squared_distance_form_is_declared_where_it_holds():
    """``sqdist_form`` (the cached-distance path's declaration) holds for every class that
    sets or inherits it: ``K_from_sqdist`` of raw squared distances is ``K``; RBF declares it,
    the Materns do not."""
    rng = np.random.default_rng(5)
    X, Z = rng.normal(size=(6, 2)), rng.normal(size=(4, 2))
    D = np.sum((Z[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    for cls in _stationary_classes():
        if cls.sqdist_form:
            k = cls(lengthscale=0.8, variance=1.3)
            np.testing.assert_allclose(k.K_from_sqdist(D), k.K(Z, X), rtol=1e-13,
                                       err_msg=cls.__name__)
    assert RBF.sqdist_form and not Matern32.sqdist_form and not Matern52.sqdist_form


def test_a_new_g_drops_the_inherited_shortcuts_and_a_bare_declaration_is_refused():
    """A subclass that changes ``_g`` without declaring again gets no inherited ``sqdist_form``
    or ``dg_dr2_per_g`` (RBF's formulas are not its own, so the fixed-input path falls back to
    ``K``); one that declares ``sqdist_form`` without the squared-distance methods is refused
    at class creation, naming them."""

    class Wider(RBF):
        def _g(self, r2):
            return np.exp(-0.25 * r2)

        def _dg_dr2(self, r2):
            return -0.25 * np.exp(-0.25 * r2)

    class Declared(Wider):
        sqdist_form = True  # an explicit declaration is kept

    assert not Wider.sqdist_form and Wider.dg_dr2_per_g is None
    assert Declared.sqdist_form and Declared.dg_dr2_per_g is None
    with pytest.raises(TypeError, match="sqdist_form.*K_from_sqdist"):

        class _Bare(Matern32):
            sqdist_form = True


# --------------------------------------------------------------------------------------------
# make_kernel
# --------------------------------------------------------------------------------------------


def test_make_kernel_builtins_and_ard_expansion():
    k = make_kernel("rbf", 3, lengthscale=0.5, variance=2.0)
    assert isinstance(k, RBF) and not k.ard
    k = make_kernel("RBF", 3, ard=True, lengthscale=0.5)
    assert isinstance(k, RBF) and k.input_dim == 3
    np.testing.assert_allclose(k.lengthscale, [0.5, 0.5, 0.5])
    k = make_kernel("matern32", 2, ard=True)
    np.testing.assert_allclose(k.lengthscale, [1.0, 1.0])
    k = make_kernel("matern52", 2, lengthscale=[0.5, 2.0])
    np.testing.assert_allclose(k.lengthscale, [0.5, 2.0])
    k = make_kernel("linear", 4, ard=True, variance=2.0)
    assert isinstance(k, Linear)
    np.testing.assert_allclose(k.variance, [2.0] * 4)
    k = make_kernel("rbf", 2, lengthscale=None)  # null in a config means "default"
    assert k.lengthscale == pytest.approx(1.0)


def test_make_kernel_noise_adds_white_term():
    k = make_kernel("matern52", 2, ard=True, noise=1e-3, variance=1.5)
    assert isinstance(k, Sum) and isinstance(k.parts[1], White)
    assert k.parts[1].variance == pytest.approx(1e-3)
    X = np.random.default_rng(0).normal(size=(4, 2))
    np.testing.assert_allclose(np.diag(k.K(X)), 1.5 + 1e-3)
    np.testing.assert_allclose(k.K_diag(X), 1.5 + 1e-3)


def test_make_kernel_accepts_omegaconf_lists():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"lengthscale": [0.5, 2.0], "variance": 1.5})
    k = make_kernel("rbf", 2, **cfg)
    np.testing.assert_allclose(k.lengthscale, [0.5, 2.0])
    k = RBF(lengthscale=cfg.lengthscale)
    np.testing.assert_allclose(k.lengthscale, [0.5, 2.0])


@pytest.fixture
def fake_registry(monkeypatch):
    """A stand-in for gpinfer.registry: knows one plugin kernel, 'mykernel'."""
    calls = []

    def load(group, name):
        calls.append((group, name))
        if name == "mykernel":
            return Linear
        raise UnknownNameError(f"unknown kernel {name!r}; did you mean: rbf, matern32?")

    fake = types.ModuleType("gpinfer.registry")
    fake.load = load
    monkeypatch.setitem(sys.modules, "gpinfer.registry", fake)
    monkeypatch.setattr(gpinfer, "registry", fake, raising=False)
    return calls


def test_make_kernel_asks_the_registry_for_other_names(fake_registry):
    k = make_kernel("mykernel", 2, variance=2.0, noise=0.1)
    assert fake_registry == [("gpinfer.kernels", "mykernel")]
    assert isinstance(k, Sum) and isinstance(k.parts[0], Linear)
    with pytest.raises(UnknownNameError, match="nope"):
        make_kernel("nope", 2)
    with pytest.raises(InputError, match="ard"):
        make_kernel("mykernel", 2, ard=True)


def test_make_kernel_unknown_name_with_the_real_registry():
    try:
        import gpinfer.registry  # noqa: F401
    except ImportError:
        pytest.skip("gpinfer.registry not written yet")
    with pytest.raises(UnknownNameError):
        make_kernel("no_such_kernel_xyz", 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="rbf", input_dim=2, lengthscale=[1.0, 2.0, 3.0]), "3 entries.*input_dim is 2"),
        (dict(name="rbf", input_dim=2, ard=True, lengthscale=[1.0]), "1 entries.*input_dim is 2"),
        (dict(name="linear", input_dim=2, lengthscale=1.0), "unknown parameter.*lengthscale"),
        (dict(name="rbf", input_dim=0), "input_dim"),
        (dict(name="white", input_dim=2, ard=True), "no ARD"),
        (dict(name="rbf", input_dim=2, noise=-1.0), "White variance"),
    ],
)
def test_make_kernel_bad_input(kwargs, match):
    name = kwargs.pop("name")
    input_dim = kwargs.pop("input_dim")
    with pytest.raises(InputError, match=match):
        make_kernel(name, input_dim, **kwargs)


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: RBF(lengthscale=-1.0), "lengthscale must be positive"),
        (lambda: RBF(lengthscale=[1.0, np.nan]), "lengthscale must be positive and finite"),
        (lambda: Matern32(variance=0.0), "variance must be positive"),
        (lambda: Matern52(variance=[1.0, 2.0]), "variance must be a scalar"),
        (lambda: RBF(lengthscale="wide"), "lengthscale must be a positive number"),
        (lambda: RBF(lengthscale=[[1.0, 2.0]]), "shape"),
        (lambda: RBF(lengthscale=[]), "non-empty"),
        (lambda: Linear(variance=[1.0, -1.0]), "Linear variance must be positive"),
        (lambda: White(variance=np.inf), "White variance"),
        (lambda: Sum([]), "at least one"),
        (lambda: Product([RBF(), "rbf"]), "takes kernels"),
    ],
)
def test_constructor_errors(build, match):
    with pytest.raises(InputError, match=match):
        build()


def test_input_errors(data):
    X, X2, dK, dK_cross, _ = data
    with pytest.raises(InputError, match=r"2 ARD entries but X has 3 columns"):
        RBF(lengthscale=[1.0, 2.0]).K(X)
    with pytest.raises(InputError, match=r"2 ARD entries but X has 3 columns"):
        Linear(variance=[1.0, 2.0]).K_diag(X)
    with pytest.raises(InputError, match=r"X has 3 columns but X2 has 2"):
        RBF().K(X, X2[:, :2])
    with pytest.raises(InputError, match="2-D"):
        Matern32().K(X[:, 0])
    Xbad = X.copy()
    Xbad[0, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        RBF().K(Xbad)
    with pytest.raises(InputError, match="dK must have shape"):
        RBF().grad_params(X, X2, dK)
    with pytest.raises(InputError, match="dK must have shape"):
        (RBF() * Linear()).grad_inputs(X, None, dK_cross)
    with pytest.raises(InputError, match="has 2 parameters"):
        RBF().set_unconstrained(np.zeros(3))
    with pytest.raises(InputError, match="finite"):
        RBF().set_unconstrained(np.array([0.0, np.inf]))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("square", [True, False])
def test_vjp_equals_the_two_separate_products(name, square, data):
    """``vjp`` (which shares the distance computation) returns both gradients unchanged."""
    X, X2, dK, dK_cross, _ = data
    k = KERNELS[name]()
    X2_, G = (None, dK) if square else (X2, dK_cross)
    g_params, g_inputs = k.vjp(X, X2_, G)
    np.testing.assert_allclose(g_params, k.grad_params(X, X2_, G), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g_inputs, k.grad_inputs(X, X2_, G), rtol=1e-12, atol=1e-14)
    g_only, none = k.vjp(X, X2_, G, inputs=False)
    assert none is None
    np.testing.assert_allclose(g_only, g_params, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls", [RBF, Matern32, Matern52])
def test_distance_memo_never_returns_a_stale_matrix(cls, data):
    """The memo of the last distances is keyed on values: inputs changed in place, new
    lengthscales and a different second argument all give the matrix a fresh kernel gives."""
    X, X2, _, _, _ = data
    k = cls(lengthscale=[0.7, 1.2, 2.0], variance=0.9)
    X, X2 = X.copy(), X2.copy()
    k.K(X), k.K(X, X2)  # fill both slots
    X[2, 1] += 0.5  # in place: same object, new values
    X2[0, 0] -= 0.3
    fresh = cls(lengthscale=[0.7, 1.2, 2.0], variance=0.9)
    np.testing.assert_array_equal(k.K(X), fresh.K(X))
    np.testing.assert_array_equal(k.K(X, X2), fresh.K(X, X2))
    np.testing.assert_array_equal(k.K(X, X[:4]), fresh.K(X, X[:4]))
    theta = k.get_unconstrained()
    theta[1] += 0.2
    k.set_unconstrained(theta)
    fresh.set_unconstrained(theta)
    np.testing.assert_array_equal(k.K(X, X2), fresh.K(X, X2))
    np.testing.assert_array_equal(k.grad_params(X, None, k.K(X)), fresh.grad_params(X, None, fresh.K(X)))


def test_distance_memo_is_not_copied_or_pickled(data):
    import pickle

    X, X2, _, _, _ = data
    k = RBF(lengthscale=[0.7, 1.2, 2.0])
    k.K(X, X2)
    assert "_memo" in k.__dict__
    assert "_memo" not in k.copy().__dict__
    assert "_memo" not in pickle.loads(pickle.dumps(k)).__dict__
    np.testing.assert_array_equal(k.copy().K(X, X2), k.K(X, X2))


def test_distance_memo_keeps_no_large_inputs(monkeypatch, data):
    """Prediction on many points must not leave copies of them in every class's kernel."""
    import gpinfer.kernels.stationary as stationary

    X, X2, _, _, _ = data
    monkeypatch.setattr(stationary, "_MEMO_MAX_ENTRIES", X.size + X2.size + 2 * N * N2)
    k = RBF(lengthscale=[0.7, 1.2, 2.0])
    k.K(X, X2)
    assert k.__dict__["_memo"][False].X2 is not None  # small enough: kept
    big = np.vstack([X2, X2])
    np.testing.assert_array_equal(k.K(X, big), RBF(lengthscale=[0.7, 1.2, 2.0]).K(X, big))
    assert k.__dict__["_memo"][False].X2.shape == X2.shape  # the large pair was not kept


def test_nested_lists_reach_the_remembered_distances_by_value():
    """``Stationary._distances`` remembers the last inputs by value (``ops.state_token`` is
    ``None`` for host values, lists included): lists and arrays of the same values give the same
    matrices, on a hit as on a miss, and other values a new one."""
    k = RBF(lengthscale=0.7)
    X = [[0.0, 1.0], [2.0, 3.0], [0.5, -1.0]]
    first = k.K(X)
    assert np.array_equal(k.K(np.array(X)), first)
    assert np.array_equal(k.K(X), first)
    moved = [[0.0, 1.0], [2.0, 3.0], [0.5, -2.0]]
    assert not np.array_equal(k.K(moved), first)
    assert np.array_equal(k.K(moved), k.K(np.array(moved)))

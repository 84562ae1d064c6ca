"""Kernels as scikit-learn parameter containers: get_params / set_params / clone / repr.

``get_params`` returns the constructor's arguments exactly as given while the parameters are
unchanged and the learned natural values once training moved them; ``set_params`` rebuilds the
kernel (nested: ``name__param``, a combination's parts by index), and never touches how ``K``
is computed.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from gpinfer.errors import InputError
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

X = np.random.default_rng(0).normal(size=(7, 3))

KERNELS = [
    RBF(lengthscale=5.0),
    Matern32(lengthscale=[0.5, 1.0, 2.0], variance=3.0),
    Matern52(),
    Linear(variance=0.7),
    White(variance=0.01),
    RBF(0.5) + White(),
    RBF(2.0) * Linear([1.0, 2.0, 0.5]) + White(),
]


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
def test_clone_is_an_equal_independent_kernel(kernel: Kernel):
    twin = clone(kernel)
    assert twin is not kernel and type(twin) is type(kernel) and twin == kernel
    assert repr(twin) == repr(kernel)
    np.testing.assert_array_equal(twin.K(X), kernel.K(X))
    np.testing.assert_array_equal(twin.get_unconstrained(), kernel.get_unconstrained())


def test_get_params_returns_the_arguments_as_given():
    ell = [0.5, 1.0, 2.0]
    k = RBF(lengthscale=ell, variance=5.0)
    params = k.get_params()
    assert params["lengthscale"] is ell and params["variance"] == 5.0
    assert RBF(lengthscale=5.0).get_params() == {"lengthscale": 5.0, "variance": 1.0}
    # exp(log(5)) is 4.999999999999999: the given value is reported, not the round trip
    assert np.exp(np.log(5.0)) != 5.0
    assert repr(RBF(lengthscale=5.0)) == "RBF(lengthscale=5.0, variance=1.0)"
    assert repr(RBF(np.array(2.0), variance=np.float32(0.5))) == "RBF(lengthscale=2.0, variance=0.5)"


def test_learned_values_are_reported_once_the_parameters_move():
    k = RBF(lengthscale=5.0)
    k.set_unconstrained(np.log([2.5, 4.0]))
    assert k.get_params() == pytest.approx({"lengthscale": 2.5, "variance": 4.0})
    assert repr(k) == "RBF(lengthscale=2.5, variance=4.0)"
    k.set_unconstrained(np.log([4.999999999999999, 1.0]))
    assert "4.99999" not in repr(k) and "lengthscale=5.0" in repr(k)
    twin = clone(k)  # a clone starts from the learned values
    np.testing.assert_allclose(twin.K(X), k.K(X), rtol=1e-15)


def test_set_params_rebuilds_the_kernel_and_returns_it():
    k = Matern52(lengthscale=1.0)
    assert k.set_params(lengthscale=2.0, variance=3.0) is k
    np.testing.assert_allclose(k.K(X), Matern52(lengthscale=2.0, variance=3.0).K(X))
    assert k.get_params() == {"lengthscale": 2.0, "variance": 3.0}


def test_combinations_expose_their_parts_by_index():
    k = RBF(0.5) + RBF(1.0) * Linear()
    params = k.get_params()
    assert params["0__lengthscale"] == 0.5
    assert params["1__0__lengthscale"] == 1.0 and params["1__1__variance"] == 1.0
    k.set_params(**{"0__lengthscale": 3.0, "1__1__variance": 2.0})
    expected = RBF(3.0) + RBF(1.0) * Linear(2.0)
    np.testing.assert_allclose(k.K(X), expected.K(X))
    assert repr(k) == repr(expected)
    k.set_params(**{"1": White(0.5)})  # a part replaced
    np.testing.assert_allclose(k.K(X), (RBF(3.0) + White(0.5)).K(X))
    assert isinstance(clone(k), Sum) and isinstance(clone(RBF() * RBF()), Product)


def test_make_kernel_results_print_cleanly():
    k = make_kernel("rbf", input_dim=2, ard=True, noise=0.1, lengthscale=0.3)
    assert repr(k) == ("Sum(kernels=[RBF(lengthscale=[0.3, 0.3], variance=1.0), "
                       "White(variance=0.1)])")


@pytest.mark.parametrize("params,match", [
    ({"lengthscal": 1.0}, "invalid parameter 'lengthscal' for kernel RBF"),
    ({"lengthscale__x": 1.0}, "lengthscale is not a kernel"),
    ({"lengthscale": -1.0}, "must be positive"),
])
def test_bad_parameters_are_input_errors_that_change_nothing(params, match):
    k = RBF(lengthscale=2.0)
    with pytest.raises(InputError, match=match):
        k.set_params(**params)
    assert k.get_params() == {"lengthscale": 2.0, "variance": 1.0}


def test_a_part_that_does_not_exist_is_an_input_error():
    with pytest.raises(InputError, match="it has parts 0..1"):
        (RBF() + White()).set_params(**{"2__variance": 1.0})
    with pytest.raises(InputError, match="invalid parameter 'lengthscale' for kernel White"):
        (RBF() + White()).set_params(**{"1__lengthscale": 1.0})


def test_a_repeated_or_nested_part_is_reported_as_the_part_itself():
    k = RBF(1.0)
    twice = k + k  # the second slot is a copy: its own parameters
    twice.set_params(**{"1__lengthscale": 3.0})
    np.testing.assert_allclose(clone(twice).K(X), (RBF(1.0) + RBF(3.0)).K(X))
    nested = Sum([Sum([RBF(1.0), Linear()]), White(0.1)])
    assert len(nested.get_params(deep=False)["kernels"]) == 3
    np.testing.assert_allclose(clone(nested).K(X), nested.K(X))


def test_equality_is_by_class_and_parameter_values():
    assert RBF(1.0) == RBF(1.0) and RBF([1.0, 2.0]) == RBF(np.array([1.0, 2.0]))
    assert RBF(1.0) != RBF(2.0) and RBF(1.0) != Matern32(1.0) and RBF(1.0) != "RBF"
    assert RBF(1.0) + White() == RBF(1.0) + White() != RBF(1.0) + White(0.5)
    assert RBF([1.0, 2.0]) != RBF(1.0)
    with pytest.raises(TypeError):
        hash(RBF())

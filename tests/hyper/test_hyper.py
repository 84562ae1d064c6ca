"""HyperParameters packing and parameter_gradient against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from gpinfer.hyper import HyperParameters, parameter_gradient
from gpinfer.interfaces import ExpectedLogProb, Likelihood, MatrixGradients, TiltedMoments
from gpinfer.kernels.stationary import RBF, Matern52
from gpinfer.testing import assert_gradient_close


class _ScaleLikelihood(Likelihood):
    """A toy likelihood with two unconstrained parameters (only packing is exercised)."""

    def __init__(self):
        self.theta = np.array([0.3, -0.2])

    @property
    def param_names(self):
        return ["a", "b"]

    def get_unconstrained(self):
        return self.theta.copy()

    def set_unconstrained(self, theta):
        self.theta = np.array(theta, dtype=float)

    def log_prob(self, y, F):
        raise NotImplementedError

    def tilted(self, y, mean, var, power=1.0) -> TiltedMoments:
        raise NotImplementedError

    def expected_log_prob(self, y, mean, var) -> ExpectedLogProb:
        raise NotImplementedError

    def predict_proba(self, mean, var):
        raise NotImplementedError


RNG = np.random.default_rng(3)
N, D, M = 7, 2, 4
X = RNG.standard_normal((N, D))
A = [RNG.standard_normal((M, N)) for _ in range(2)]
B = [RNG.standard_normal(N) for _ in range(2)]
C = [RNG.standard_normal((N, N)) for _ in range(2)]
Q = np.array([1.5, -0.7])


def toy_value(hp: HyperParameters) -> float:
    """sum_l log|Kuu_l| + tr(A_l^T Kuf_l) + b_l . diag Kff_l + tr(C_l^T Kff_l) + q . lik."""
    total = 0.0
    for l, kern in enumerate(hp.kernels):
        Z = hp.Z[l]
        total += np.linalg.slogdet(kern.K(Z))[1]
        total += np.sum(A[l] * kern.K(Z, X))
        total += B[l] @ kern.K_diag(X)
        total += np.sum(C[l] * kern.K(X))
    if hp.likelihood is not None:
        total += Q @ hp.likelihood.get_unconstrained()
    return float(total)


def toy_gradients(hp: HyperParameters) -> list[MatrixGradients]:
    """The same objective's matrix gradients, by hand."""
    out = []
    for l, kern in enumerate(hp.kernels):
        Kuu_inv = np.linalg.inv(kern.K(hp.Z[l]))
        out.append(
            MatrixGradients(
                Kuu=0.5 * (Kuu_inv + Kuu_inv.T),
                Kuf=A[l],
                Kff_diag=B[l],
                Kff=0.5 * (C[l] + C[l].T),
                likelihood=Q if l == 0 else None,
            )
        )
    return out


def make_hp(**kw) -> HyperParameters:
    kernels = kw.pop("kernels", None) or [
        RBF(lengthscale=[0.8, 1.3], variance=1.7),
        Matern52(lengthscale=1.1, variance=0.6),
    ]
    Z = [RNG.standard_normal((M, D)) for _ in kernels]
    return HyperParameters(kernels, likelihood=kw.pop("likelihood", _ScaleLikelihood()), Z=Z, **kw)


def check_fd(hp: HyperParameters) -> None:
    theta0 = hp.pack()
    grad = parameter_gradient(hp, X, toy_gradients(hp))
    assert grad.shape == theta0.shape

    def f(theta):
        hp.unpack(theta)
        return toy_value(hp)

    assert_gradient_close(f, grad, theta0, rtol=1e-6, atol=1e-7, name="toy objective")
    hp.unpack(theta0)


def test_names_and_pack_roundtrip():
    hp = make_hp()
    names = hp.names
    assert names[:4] == ["kernel[0].lengthscale[0]", "kernel[0].lengthscale[1]",
                         "kernel[0].variance", "kernel[1].lengthscale"]
    assert "Z[1][3,1]" in names and names[-2:] == ["likelihood.a", "likelihood.b"]
    assert hp.size == len(names) == 3 + 2 + 2 * M * D + 2
    theta = hp.pack() + 0.1
    hp.unpack(theta)
    np.testing.assert_allclose(hp.pack(), theta)
    np.testing.assert_allclose(np.log(hp.kernels[0].lengthscale), np.log([0.8, 1.3]) + 0.1)
    with pytest.raises(ValueError):
        hp.unpack(theta[:-1])


def test_installed_writes_theta_for_the_block_and_the_old_vector_back():
    hp = make_hp()
    before = hp.pack()
    theta = before + 0.25
    with hp.installed(theta):
        np.testing.assert_array_equal(hp.pack(), theta)
    np.testing.assert_array_equal(hp.pack(), before)
    with pytest.raises(RuntimeError), hp.installed(theta):
        raise RuntimeError("the block failed")
    np.testing.assert_array_equal(hp.pack(), before)  # written back after a failure too


def test_single_latent_names():
    hp = HyperParameters(RBF(1.0, 1.0), Z=np.zeros((2, 1)))
    assert hp.names == ["kernel.lengthscale", "kernel.variance", "Z[0,0]", "Z[1,0]"]


def test_kernel_entries_select_by_name_without_the_inducing_names():
    for hp in (make_hp(), make_hp(fixed=["kernel[0].variance"]), make_hp(optimize_inducing=False)):
        for part in ("lengthscale", "variance", ""):
            expected = [n.startswith("kernel") and part in n for n in hp.names]
            assert hp.kernel_entries(part).tolist() == expected
    hp = make_hp()
    assert hp._names_cache is None  # names are formed only when asked for
    assert hp.n_entries == len(hp.all_names) == hp.size


def test_gradient_matches_finite_differences():
    check_fd(make_hp())


def test_fixed_blocks_and_entries():
    hp = make_hp(optimize_inducing=False, fixed=["kernel[1].variance", "likelihood.a"])
    assert not any(n.startswith("Z") for n in hp.names)
    assert "kernel[1].variance" not in hp.names and "likelihood.b" in hp.names
    before = hp.kernels[1].variance
    hp.unpack(hp.pack() + 0.2)
    assert hp.kernels[1].variance == pytest.approx(before)
    check_fd(hp)
    assert make_hp(optimize=False).size == 0
    with pytest.raises(ValueError, match="unknown hyper-parameter"):
        make_hp(fixed=["nope"])


def test_tied_kernel_sums_gradients():
    k = RBF(lengthscale=[0.9, 1.2], variance=1.1)
    hp = make_hp(kernels=[k, k], likelihood=None)
    assert hp.names[:3] == ["kernel.lengthscale[0]", "kernel.lengthscale[1]", "kernel.variance"]
    assert hp.size == 3 + 2 * M * D
    check_fd(hp)


def test_dense_only_gradient_and_bounds():
    kern = Matern52(lengthscale=[0.7, 1.4], variance=2.0)
    hp = HyperParameters(kern)
    G = 0.5 * (C[0] + C[0].T)
    grad = parameter_gradient(hp, X, MatrixGradients(Kff=G))

    def f(theta):
        hp.unpack(theta)
        return float(np.sum(G * kern.K(X)))

    assert_gradient_close(f, grad, hp.pack(), rtol=1e-6)
    assert hp.bounds(kernel=(-5, 5)) == [(-5, 5)] * 3
    with pytest.raises(ValueError, match="no inducing inputs"):
        parameter_gradient(hp, X, MatrixGradients(Kuu=np.eye(2)))


@pytest.mark.parametrize("stacked", [True, False])
def test_fixed_inducing_inputs_skip_the_input_vjp(monkeypatch, stacked):
    """With Z held fixed the (costly) inducing-input VJP is never computed, on the batched
    kernel path (``gpinfer.kernels.stacked``) and on the per-latent one."""
    from gpinfer.kernels.stacked import StackedCovariances

    rng = np.random.default_rng(1)
    X, Z = rng.standard_normal((7, 2)), rng.standard_normal((3, 2))
    kern = RBF(lengthscale=[0.9, 1.4], variance=1.3)
    hp = HyperParameters(kern, Z=Z, optimize_inducing=False)
    G = MatrixGradients(Kuu=np.eye(3), Kuf=np.ones((3, 7)))

    calls = []
    expected = kern.grad_params(Z, None, G.Kuu) + kern.grad_params(Z, X, G.Kuf)
    if stacked:
        assert hp.stacked is not None
        original_stacked = StackedCovariances.vjp

        def recording_stacked(self, *args, inputs=True, **kwargs):
            calls.append(inputs)
            return original_stacked(self, *args, inputs=inputs, **kwargs)

        monkeypatch.setattr(StackedCovariances, "vjp", recording_stacked)
    else:
        hp.stacked = None
        original_vjp = kern.vjp

        def recording_vjp(*args, inputs=True):
            calls.append(inputs)
            return original_vjp(*args, inputs=inputs)

        monkeypatch.setattr(kern, "vjp", recording_vjp)
    assert not hp.inducing_is_free(0)
    np.testing.assert_allclose(hp.gradient(X, G), expected, rtol=1e-12)
    assert calls == ([False] if stacked else [False, False])


@pytest.mark.parametrize("stacked", [True, False])
def test_unpack_owned_gives_the_same_values_without_a_copy(stacked):
    kernels = (lambda: [RBF([0.8, 1.3], 1.7), RBF([1.1, 0.9], 0.6)]) if stacked else (
        lambda: [RBF([0.8, 1.3], 1.7), Matern52(1.1, 0.6)])
    hp, ref = make_hp(kernels=kernels()), make_hp(kernels=kernels())
    assert (hp.stacked is not None) == stacked
    theta = hp.pack() + 0.05
    ref.unpack(theta)
    hp.unpack(theta, owned=True)
    np.testing.assert_array_equal(hp.pack(), ref.pack())
    for z, z_ref in zip(hp.Z, ref.Z):
        np.testing.assert_array_equal(z, z_ref)
    assert np.shares_memory(hp.Z[0], theta)  # handed over: the inducing inputs are views
    assert not np.shares_memory(ref.Z[0], theta)


def test_pack_reuses_the_vector_handed_over_while_nothing_moved():
    """``pack(reuse=theta)`` after ``unpack(theta, owned=True)``: ``theta`` itself, its kernel
    and likelihood entries read again from their objects (values equal a fresh ``pack``'s);
    after ``touch``, another ``unpack`` or for another array: a new array, ``theta`` left
    alone (whatever views of it are held do not move)."""
    kernels = [RBF([0.8, 1.3], 1.7), RBF([1.1, 0.9], 0.6)]
    hp = make_hp(kernels=kernels)
    assert hp.stacked is not None
    theta = hp.pack() + 0.05
    hp.unpack(theta, owned=True)
    kernels[1].set_unconstrained(kernels[1].get_unconstrained() + 0.5)  # a kernel's own move
    hp.likelihood.set_unconstrained(np.array([0.1, 0.2]))
    expected = hp.pack()
    assert hp.pack(reuse=theta) is theta  # no new array
    np.testing.assert_array_equal(theta, expected)
    assert np.shares_memory(hp.Z[1], theta)
    for move in (hp.touch, lambda: hp.unpack(theta + 0.0)):
        hp.unpack(theta, owned=True)
        move()
        before = theta.copy()
        packed = hp.pack(reuse=theta)
        assert packed is not theta and not np.shares_memory(packed, theta)
        np.testing.assert_array_equal(theta, before)
    hp.unpack(theta, owned=True)
    other = theta.copy()
    assert hp.pack(reuse=other) is not other
    hp.unpack(theta)  # not handed over: a copy is installed, nothing to reuse
    assert hp.pack(reuse=theta) is not theta
    single = theta.astype(np.float32)  # handed over, but unpack installs a float64 copy
    hp.unpack(single, owned=True)
    assert hp.pack(reuse=single) is not single


def test_the_gradient_is_written_into_a_vector_given_for_it():
    """``gradient(out=v)`` with stacked matrix gradients: the values of a new vector, written
    into ``v`` (whatever it held) and returned as it; a vector that does not fit (length,
    dtype, layout) is left alone and a new one returned."""
    from gpinfer.kernels.stacked import StackedMatrixGradients

    hp = HyperParameters([RBF([0.8, 1.3], 1.7), RBF([1.1, 0.9], 0.6)],
                         Z=[RNG.standard_normal((M, D)) for _ in range(2)])
    grads = StackedMatrixGradients(np.stack([RNG.standard_normal((M, M)) for _ in range(2)]),
                                   np.stack(A), np.stack(B))
    expected = hp.gradient(X, grads)
    out = np.full(hp.size, np.nan)
    assert hp.gradient(X, grads, out=out) is out
    np.testing.assert_array_equal(out, expected)
    for unfit in (np.zeros(hp.size + 1), np.zeros(hp.size, np.float32),
                  np.zeros(2 * hp.size)[::2]):
        before = unfit.copy()
        got = hp.gradient(X, grads, out=unfit)
        assert got is not unfit
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(unfit, before)


@pytest.mark.parametrize("on_torch", [True, False], ids=["torch", "numpy"])
@pytest.mark.parametrize("tied", [False, True])
def test_device_kernels_stay_on_the_device_until_asked_for(tied, on_torch):
    """``device_kernels=True`` on torch: ``unpack`` reads nothing back (the kernel objects
    lag), the stacked covariances, ``pack`` and ``describe`` use the device values, and
    ``kernels`` / ``sync_host`` / ``touch`` write them into the kernel objects; every value
    equals the immediate path's. The methods ask for it on a device only; asked for on numpy
    it defers the kernel objects' writes alike (the same values)."""
    torch = pytest.importorskip("torch")
    from gpinfer.backend import ops

    to = torch.as_tensor if on_torch else np.asarray
    Z = [to(RNG.standard_normal((M, D))) for _ in range(2)]

    def build(device_kernels: bool) -> HyperParameters:
        shared = RBF([0.8, 1.3], 1.7)
        kernels = [shared, shared] if tied else [RBF([0.8, 1.3], 1.7), RBF([1.1, 0.9], 0.6)]
        return HyperParameters(kernels, Z=Z, device_kernels=device_kernels)

    lazy, eager = build(True), build(False)
    theta = lazy.pack() + 0.05
    reads = []
    original = ops.to_host
    try:
        ops.to_host = lambda x: reads.append(1) or original(x)  # type: ignore[assignment]
        lazy.unpack(theta)
        Xt = to(X)
        cov = lazy.covariances(Xt)
        packed = lazy.pack()
        assert not reads  # nothing read back
    finally:
        ops.to_host = original  # type: ignore[assignment]
    eager.unpack(theta)
    ref = eager.covariances(Xt)
    assert not np.allclose(lazy._kernels[0].get_unconstrained(),
                           eager._kernels[0].get_unconstrained())  # the objects lag
    for a, b in ((cov.Kuu, ref.Kuu), (cov.Kuf, ref.Kuf), (cov.Kff_diag, ref.Kff_diag),
                 (packed, eager.pack())):
        np.testing.assert_allclose(ops.to_host(a), ops.to_host(b), rtol=1e-15, atol=0)
    for k, k_ref in zip(lazy.kernels, eager.kernels):  # asking for them writes them
        np.testing.assert_array_equal(k.get_unconstrained(), k_ref.get_unconstrained())
    lazy.unpack(theta + 0.1)
    lazy.touch()  # written, then the kernel objects hold them again
    eager.unpack(theta + 0.1)
    assert lazy._device_kernels is None
    np.testing.assert_array_equal(ops.to_host(lazy.pack()), ops.to_host(eager.pack()))


def test_a_vector_handed_over_on_a_device_is_packed_as_one_copy():
    """``unpack(owned=True)`` on torch with ``device_kernels``: the kept kernel entries and
    ``Z`` are views of the vector handed over, and ``pack`` at that version returns a copy of
    it (writing into the copy changes nothing held); after ``touch`` or a second unpack
    ``pack`` reads the current values again. Values equal the copying path's."""
    torch = pytest.importorskip("torch")
    from gpinfer.backend import ops

    Z = [torch.as_tensor(RNG.standard_normal((M, D))) for _ in range(2)]

    def build() -> HyperParameters:
        kernels = [RBF([0.8, 1.3], 1.7), RBF([1.1, 0.9], 0.6)]
        return HyperParameters(kernels, Z=[z.clone() for z in Z], device_kernels=True)

    owned, copied = build(), build()
    theta = owned.pack() + 0.05
    copied.unpack(theta.clone())
    owned.unpack(theta, owned=True)
    assert owned._owned is not None and owned._owned[1].data_ptr() == theta.data_ptr()
    assert owned._device_kernels.data_ptr() == theta.data_ptr()  # a view, no copy
    packed = owned.pack()
    assert packed.data_ptr() != theta.data_ptr()
    np.testing.assert_array_equal(packed.numpy(), copied.pack().numpy())
    packed += 1.0  # the caller's to write: nothing held moves
    np.testing.assert_array_equal(owned.pack().numpy(), copied.pack().numpy())
    np.testing.assert_array_equal(ops.to_host(owned.Z[1]), ops.to_host(copied.Z[1]))
    owned.unpack(theta + 0.1)  # a copy: no owned vector
    copied.unpack(theta + 0.1)
    assert owned._owned is None
    np.testing.assert_array_equal(owned.pack().numpy(), copied.pack().numpy())
    owned.unpack(theta + 0.2, owned=True)
    owned.touch()  # the version moves: pack reads the kernels and Z again
    copied.unpack(theta + 0.2)
    np.testing.assert_array_equal(owned.pack().numpy(), copied.pack().numpy())


@pytest.mark.parametrize("stacked", [True, False])
def test_free_prefix_packs_and_unpacks_as_the_masked_path(stacked):
    """Only the kernels learned (``Z`` and the likelihood fixed: the free entries are the
    leading blocks): ``pack``, ``unpack`` and the gradient skip the full vector, with the values
    of the masked path (``fixed`` naming one more entry forces that path), and the gradient
    matches finite differences."""
    kernels = (lambda: [RBF([0.8, 1.3], 1.7), RBF([1.1, 0.9], 0.6)]) if stacked else (
        lambda: [RBF([0.8, 1.3], 1.7), Matern52(1.1, 0.6)])
    hp = make_hp(kernels=kernels(), optimize_inducing=False, optimize_likelihood=False)
    masked = make_hp(kernels=kernels(), optimize_inducing=False, fixed=["likelihood.a"])
    masked.Z = [z.copy() for z in hp.Z]
    assert hp._free_prefix and not masked._free_prefix
    P = hp.size
    theta = hp.pack() + 0.1
    hp.unpack(theta)
    masked.unpack(np.concatenate([theta, masked.pack()[P:]]))
    np.testing.assert_array_equal(hp.pack(), masked.pack()[:P])
    for z, z_ref in zip(hp.Z, masked.Z):
        np.testing.assert_array_equal(z, z_ref)
    G = toy_gradients(hp)
    no_Kff = [MatrixGradients(Kuu=g.Kuu, Kuf=g.Kuf, Kff_diag=g.Kff_diag) for g in G]
    for grads in (G, no_Kff):  # no Kff: the stacked VJP's path when the kernels batch
        np.testing.assert_array_equal(parameter_gradient(hp, X, grads),
                                      parameter_gradient(masked, X, grads)[:P])
    check_fd(hp)

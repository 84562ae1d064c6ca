"""``gpinfer.backend.choice``: what a user asks for (backend, device, dtype), checked up front.

Real parts only: on this machine torch is the CPU build, so asking for CUDA is the real
"no GPU" error; the "torch not installed" case runs in a subprocess where an import hook makes
``import torch`` fail (``sys.modules["torch"] = None`` would not do: scipy's vendored
array-api-compat then finds ``None`` in ``sys.modules`` and fails at import).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpinfer.backend.choice import (
    NUMPY,
    TORCH_INSTALL,
    Backend,
    resolve_backend,
)
from gpinfer.errors import InputError
from gpinfer.registry import load_method
from gpinfer.validation import check_method_backend

torch = pytest.importorskip("torch", reason="the torch backend's tests need PyTorch (make test "
                            "installs its CPU build)")

CUDA = torch.cuda.is_available()


def test_defaults_are_numpy_on_the_cpu_in_float64() -> None:
    assert resolve_backend() == NUMPY
    assert resolve_backend("numpy", "cpu", "float64") == NUMPY
    assert NUMPY.params() == {"backend": "numpy", "device": "cpu", "dtype": "float64"}
    assert resolve_backend(device="cpu") == NUMPY  # cpu alone stays on numpy


def test_torch_on_the_cpu() -> None:
    b = resolve_backend("torch")
    assert b == Backend("torch", "cpu", "float64") and not b.is_numpy
    assert resolve_backend("torch", "cpu", "float32").params() == {
        "backend": "torch", "device": "cpu", "dtype": "float32"}


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"backend": "jax"}, r"unknown backend 'jax': use one of \['numpy', 'torch'\]"),
        ({"backend": "torch", "device": "tpu"}, r"unknown device 'tpu': use 'cpu', 'cuda'"),
        ({"device": "gpu0"}, r"unknown device 'gpu0'"),
        ({"device": 0}, r"device must be a string"),
        ({"dtype": "float16"}, r"unknown dtype 'float16': use one of \['float64', 'float32'\]"),
        ({"backend": "numpy", "device": "cuda"}, r"backend='numpy' runs on the CPU only.*"
                                                 r"backend='torch'"),
        ({"dtype": "float32"}, r"dtype='float32' needs backend='torch'"),
        ({"backend": "numpy", "dtype": "float32"}, r"dtype='float32' needs backend='torch'"),
    ],
)
def test_bad_settings_name_the_fix(kwargs: dict, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        resolve_backend(**kwargs)


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU: asking for it is no error")
@pytest.mark.parametrize("kwargs", [{"device": "cuda"}, {"backend": "torch", "device": "cuda:0"}])
def test_cuda_without_a_gpu_is_a_clear_error(kwargs: dict) -> None:
    with pytest.raises(InputError, match=r"sees no CUDA GPU.*device='cpu'"):
        resolve_backend(**kwargs)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_alone_implies_torch() -> None:  # pragma: no cover - GPU machines only
    b = resolve_backend(device="cuda")
    assert b.name == "torch" and b.device.startswith("cuda")
    with pytest.raises(InputError, match="CUDA device"):
        resolve_backend(device=f"cuda:{torch.cuda.device_count()}")


def test_a_numpy_only_method_refuses_torch() -> None:
    laplace = load_method("laplace")
    assert tuple(laplace.backends) == ("numpy",)
    check_method_backend(laplace, "laplace", NUMPY)  # fine
    with pytest.raises(InputError, match=r"method 'laplace' runs on numpy only.*ep, sep, svi"):
        check_method_backend(laplace, "laplace", resolve_backend("torch"))


def test_float32_needs_a_method_stable_in_single_precision() -> None:
    single = resolve_backend("torch", dtype="float32")
    laplace = load_method("laplace")
    with pytest.raises(InputError, match="runs on numpy only"):  # the backend is checked first
        check_method_backend(laplace, "laplace", single)
    for name in ("sep", "ep", "svi"):
        try:
            cls = load_method(name)
        except Exception as exc:  # a plugin being converted may not import at the moment
            pytest.skip(f"method {name!r} does not load: {exc}")
        if "torch" not in tuple(cls.backends):
            pytest.skip(f"method {name!r} does not declare the torch backend yet")
        if cls.float32:
            check_method_backend(cls, name, single)
        else:
            with pytest.raises(InputError, match=rf"method {name!r} needs dtype='float64'"):
                check_method_backend(cls, name, single)


_NO_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:  # `import torch` fails as it does without the package
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
    import numpy as np
    from gpinfer import GPClassifier
    from gpinfer.backend.choice import resolve_backend
    from gpinfer.errors import InputError

    assert resolve_backend().params()["backend"] == "numpy"  # the default needs no torch
    for kwargs in ({"backend": "torch"}, {"device": "cuda"}):
        try:
            resolve_backend(**kwargs)
        except InputError as err:
            print("ERROR", err)
        else:
            raise SystemExit(f"no error for {kwargs}")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2)); y = (X[:, 0] > 0).astype(int)
    try:
        GPClassifier(method="laplace", backend="torch", max_iter=2).fit(X, y)
    except InputError as err:
        print("ERROR", err)
    clf = GPClassifier(method="laplace", max_iter=2).fit(X, y)
    print("FITTED", clf.backend_)
""")


def test_torch_not_installed_names_the_extra() -> None:
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH], capture_output=True, text=True,
                          timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 3, proc.stdout
    for line in errors:
        assert "needs PyTorch, which is not installed" in line and "gpinfer[torch]" in line
    assert TORCH_INSTALL in errors[0]
    assert "device='cuda'" in errors[1]
    assert "FITTED numpy:cpu:float64" in proc.stdout

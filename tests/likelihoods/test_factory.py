"""make_likelihood, the built-in table and its agreement with the declared entry points."""

from __future__ import annotations

import sys
import tomllib
import types
from importlib import import_module
from pathlib import Path

import pytest

import gpinfer
from gpinfer.errors import InputError
from gpinfer.likelihoods import (
    BUILTIN_LIKELIHOODS,
    ArgmaxNoise,
    BernoulliProbit,
    Gaussian,
    Likelihood,
    RobustMax,
    make_likelihood,
)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_every_declared_entry_point_is_a_builtin():
    """No likelihood without a class and no class without an entry point (GPflow-style completeness)."""
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["gpinfer.likelihoods"]
    assert set(declared) == set(BUILTIN_LIKELIHOODS)
    for name, target in declared.items():
        module, attr = target.split(":")
        cls = getattr(import_module(module), attr)
        assert cls is BUILTIN_LIKELIHOODS[name]
        assert cls.name == name
        assert isinstance(cls(), Likelihood)


def test_make_likelihood_builtins_and_parameters():
    assert isinstance(make_likelihood("probit"), BernoulliProbit)
    assert isinstance(make_likelihood(" Probit "), BernoulliProbit)
    assert make_likelihood("gaussian", variance=0.3).variance == pytest.approx(0.3)
    assert make_likelihood("robustmax", epsilon=0.01).epsilon == pytest.approx(0.01)
    assert isinstance(make_likelihood("argmax"), ArgmaxNoise)
    lik = RobustMax()
    assert make_likelihood(lik) is lik
    with pytest.raises(InputError, match="ready"):
        make_likelihood(lik, epsilon=0.1)
    with pytest.raises(InputError, match="bad parameters"):
        make_likelihood("probit", variance=1.0)
    with pytest.raises(InputError):
        make_likelihood(3)
    with pytest.raises(InputError):
        make_likelihood("gaussian", variance=-1.0)


def test_unknown_names_go_to_the_registry(monkeypatch):
    calls = []

    def load(group, name):
        calls.append((group, name))
        return lambda **params: Gaussian(**params)

    fake = types.ModuleType("gpinfer.registry")
    fake.load = load
    monkeypatch.setitem(sys.modules, "gpinfer.registry", fake)
    monkeypatch.setattr(gpinfer, "registry", fake, raising=False)
    lik = make_likelihood("student_t_plugin", variance=2.0)
    assert calls == [("gpinfer.likelihoods", "student_t_plugin")]
    assert isinstance(lik, Gaussian) and lik.variance == 2.0

    fake.load = lambda group, name: (lambda: object())
    with pytest.raises(InputError, match="not a Likelihood"):
        make_likelihood("broken_plugin")


def test_unknown_name_error_from_the_real_registry():
    from gpinfer.errors import UnknownNameError

    with pytest.raises(UnknownNameError):
        make_likelihood("no_such_likelihood_xyz")

"""Method options: one declaration per method (``gpinfer.options``), checked before training.

Covers the option kinds and their messages, that every registered method of this project
declares every option it accepts (and that each default passes its own declaration), that the
Hydra method configs agree with the declarations, and the bad values of issue 16 through the
estimator (an ``InputError`` naming method, option, value and what is allowed, before ``fit``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml

from gpinfer import registry
from gpinfer.errors import InputError
from gpinfer.estimator import GPClassifier
from gpinfer.interfaces import FitResult, Method, Problem
from gpinfer.options import (
    Interval,
    bounds,
    check_options,
    choice,
    custom,
    flag,
    integer,
    mapping,
    real,
)
from gpinfer.testing.method_suite import make_suite_data

CONF_METHOD = Path(__file__).resolve().parents[1] / "conf" / "method"


# --------------------------------------------------------------------------------------------
# the option kinds
# --------------------------------------------------------------------------------------------


def test_interval_parsing_membership_and_text():
    iv = Interval.parse("(0, 1]")
    assert (0.0 in iv, 1e-300 in iv, 1.0 in iv, 1.0000001 in iv) == (False, True, True, False)
    assert str(iv) == "(0, 1]"
    assert str(Interval.parse("[1, inf)")) == "[1, inf)" and 1e300 in Interval.parse("[1, inf)")
    assert -5.0 in Interval.parse("(-inf, 0]") and 0.5 not in Interval.parse("(-inf, 0]")
    with pytest.raises(ValueError, match="malformed interval"):
        Interval.parse("0..1")


@pytest.mark.parametrize(
    "option, good, normalised, bad",
    [
        (real(0.5, "(0, 1]"), 1, 1.0, ["abc", 0, 7, True, math.nan, None, [0.5]]),
        (real(None, "[0, inf)", none=True), None, None, [-1e-9, math.inf, "0.1"]),
        (integer(3, "[1, inf)"), np.int64(4), 4, [0, 2.5, "3", True, None]),
        (integer(1, "[1, inf)", also=(-1,)), -1, -1, [0, -2]),
        (flag(False), np.bool_(True), True, [0, 1, "true", None]),
        (choice("a", ("a", "b")), "b", "b", ["c", None, 1]),
        (choice(None, (None, "a")), None, None, ["b"]),
        (bounds((0.5, 2.0), "(0, inf)"), [1, 3], (1.0, 3.0),
         [[2.0, 1.0], [0.0, 1.0], [1.0], "ab", None, [1.0, "x"]]),
        (mapping(), {"a": 1}, {"a": 1}, [[("a", 1)], "a=1"]),
        (custom(None, "a list", lambda v: isinstance(v, list), none=True), [1], [1], [(1,), 1]),
    ],
)
def test_option_accepts_normalises_and_refuses(option, good, normalised, bad):
    value = option.validate(good, "m", "o")
    assert value == normalised and type(value) is type(normalised)
    for value in bad:
        with pytest.raises(InputError) as err:
            option.validate(value, "m", "o")
        msg = str(err.value)
        assert msg.startswith(f"method 'm': option 'o' = {value!r} is not allowed; expected ")
        assert option.allowed in msg


def test_messages_say_what_is_allowed():
    cases = {
        real(0.5, "(0, 1]"): "a real number in (0, 1]",
        integer(3, "[1, inf)"): "an integer in [1, inf)",
        choice("a", ("a", "b")): "one of 'a', 'b'",
        real(None, "(0, inf)", none=True): "a real number in (0, inf) or null",
    }
    for option, allowed in cases.items():
        with pytest.raises(InputError, match=f"expected {allowed}$".replace("(", r"\(")
                           .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
            option.validate("zzz", "m", "o")


def test_check_options_passes_undeclared_keys_and_with_default_keeps_the_check():
    spec = {"a": real(1.0, "(0, inf)")}
    assert check_options("m", spec, {"a": 2, "b": "x"}) == {"a": 2.0, "b": "x"}
    moved = spec["a"].with_default(3.0)
    assert moved.default == 3.0 and moved.allowed == spec["a"].allowed
    with pytest.raises(InputError, match="option 'a' = -1"):
        moved.validate(-1, "m", "a")


class _Declared(Method):
    name: ClassVar[str] = "declared"
    option_spec: ClassVar[dict] = {"damping": real(0.5, "(0, 1]"), "n": integer(2, "[1, inf)")}

    def fit(self, problem: Problem, callback=None) -> FitResult:  # pragma: no cover
        raise AssertionError("never reached: the options are refused first")


def test_method_derives_default_options_and_checks_values():
    assert _Declared.default_options == {"damping": 0.5, "n": 2}
    assert _Declared(damping=1).options == {"damping": 1.0, "n": 2}
    with pytest.raises(InputError, match=r"method 'declared': option 'damping' = 7 is not"):
        _Declared(damping=7)
    with pytest.raises(InputError, match=r"unknown option\(s\) \['dampign'\]; known options: "):
        _Declared(dampign=0.1)


def test_declaring_both_option_spec_and_default_options_is_refused():
    with pytest.raises(TypeError, match="declares both option_spec and default_options"):
        type("Twice", (Method,), {"option_spec": {"a": flag(True)}, "default_options": {"a": 1},
                                  "fit": lambda self, p, c=None: None})


# --------------------------------------------------------------------------------------------
# every method of this project declares its options; the Hydra configs agree
# --------------------------------------------------------------------------------------------


def _own_methods() -> list[str]:
    return [e.name for e in registry.entries(registry.METHODS) if e.dist in registry.OWN_DISTRIBUTIONS]


@pytest.mark.parametrize("name", _own_methods())
def test_every_own_method_declares_every_option_and_defaults_pass(name):
    cls = registry.load_method(name)
    spec = cls.option_spec
    assert set(spec) == set(cls.default_options), f"{name}: undeclared options"
    for key, option in spec.items():
        assert option.validate(option.default, name, key) == option.default or (
            isinstance(option.default, tuple)  # a pair given as a tuple stays one
        ), f"{name}: default of {key!r} fails its own declaration"


def _yaml_configs() -> list[Path]:
    return sorted(CONF_METHOD.glob("*.yaml"))


def _with_default_groups(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the ``${optimizer.name}`` / ``${optimizer.options}`` interpolations of a
    method config resolved against the default optimizer group (``conf/config.yaml``'s), as
    Hydra composes a run without overrides."""
    from omegaconf import OmegaConf

    defaults = yaml.safe_load((CONF_METHOD.parent / "config.yaml").read_text())["defaults"]
    group = next(d["optimizer"] for d in defaults if isinstance(d, dict) and "optimizer" in d)
    optimizer = yaml.safe_load((CONF_METHOD.parent / "optimizer" / f"{group}.yaml").read_text())
    composed = OmegaConf.create({"optimizer": optimizer, "options": options})
    resolved = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(resolved, dict)
    return dict(resolved["options"])


@pytest.mark.parametrize("path", _yaml_configs(), ids=lambda p: p.stem)
def test_hydra_method_config_matches_the_declaration(path):
    """Each ``conf/method/<name>.yaml`` names the registered method ``<name>``, and every option
    it sets is declared, allowed and equal to the declared default (no drift)."""
    conf = yaml.safe_load(path.read_text())
    assert conf["name"] == path.stem, f"{path.name} configures {conf['name']!r}"
    cls = registry.load_method(conf["name"])
    options = _with_default_groups(conf.get("options") or {})
    undeclared = sorted(set(options) - set(cls.option_spec))
    assert not undeclared, f"{path.name}: options {undeclared} are not declared by {cls.name}"
    for key, value in options.items():
        option = cls.option_spec[key]
        checked = option.validate(value, cls.name, key)
        default = option.validate(option.default, cls.name, key)
        assert checked == default, (
            f"{path.name}: {key}: {value!r} differs from the code default {option.default!r}"
        )


def test_the_yaml_check_catches_a_drifted_default(tmp_path):
    """The test above fails on a config whose value differs from the code (it can fail)."""
    conf = yaml.safe_load((CONF_METHOD / "sep.yaml").read_text())
    conf["options"]["damping"] = 0.7
    drifted = tmp_path / "sep.yaml"
    drifted.write_text(yaml.safe_dump(conf))
    with pytest.raises(AssertionError, match="damping: 0.7 differs from the code default 0.5"):
        test_hydra_method_config_matches_the_declaration(drifted)


# --------------------------------------------------------------------------------------------
# bad option values through the estimator: refused before any training
# --------------------------------------------------------------------------------------------

#: (method, options, the words of the message after "option ...")
BAD = [
    ("sep", {"damping": "abc"}, r"option 'damping' = 'abc' is not allowed; expected a real "
     r"number in \(0, 1\]"),
    ("sep", {"damping": 7}, r"option 'damping' = 7 is not allowed"),
    ("ep", {"outer_tol": -1e-3}, r"option 'outer_tol' = -0.001 is not allowed; expected a real "
     r"number in \(0, inf\)"),
    ("pep", {"tol": -1.0}, r"option 'tol' = -1.0"),
    ("laplace", {"max_newton": 2.5}, r"option 'max_newton' = 2.5 is not allowed; expected an "
     r"integer in \[1, inf\)"),
    ("svi", {"scale": "huge"}, r"option 'scale' = 'huge' is not allowed; expected one of "
     r"'batch', 'per_datum', 'full'"),
    ("ivm", {"L": 0}, r"option 'L' = 0"),
    ("mcmc-ais", {"budget": "tiny!"}, r"option 'budget' = 'tiny!'"),
    ("vi-jj", {"bounds": [3.0, -3.0]}, r"option 'bounds' = \[3.0, -3.0\] is not allowed; "
     r"expected a pair \[low, high\]"),
    ("lr", {"noise": "abc"}, r"option 'noise' = 'abc'.* or null$"),
]


@pytest.mark.parametrize("method, options, message", BAD, ids=[f"{m}-{next(iter(o))}" for m, o, _
                                                                 in BAD])
def test_bad_option_value_is_one_input_error_before_training(method, options, message):
    X, y = make_suite_data(3 if registry.load_method(method).multiclass else 2, n=30)
    calls: list[Any] = []
    est = GPClassifier(method=method, method_options=options)
    with pytest.raises(InputError, match=rf"^method '{method}': {message}") as err:
        est.fit(X, y, callback=calls.append)
    assert calls == [] and not hasattr(est, "posterior_")
    assert err.value.__cause__ is None or isinstance(err.value.__cause__, InputError)

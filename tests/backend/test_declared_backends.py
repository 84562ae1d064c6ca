"""The backends that methods and likelihood expectation rules declare, against what runs and
against ``docs/backends.md``: the docs' two tables are the declarations (a declaration dropped
or added fails here), and every built-in rule runs on the backends it declares and is refused,
naming the rule and the backend, on the others."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpinfer import registry
from gpinfer.errors import InputError
from gpinfer.likelihoods import BUILTIN_LIKELIHOODS, make_likelihood

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends.md"
RULES_HEADER = "| likelihood | `expectation` rule | classes | backends |"
METHODS_HEADER = "| method | backends | `dtype=\"float32\"` |"


def _doc_table(header: str) -> list[str]:
    """The rows of the table of ``docs/backends.md`` that starts at ``header`` (header and
    separator included), up to the first line that is not a table row."""
    lines = DOC.read_text().splitlines()
    start = lines.index(header)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def _rule_rows() -> list[str]:
    """The table of rules x backends as the built-in likelihoods declare it: a row per rule,
    and a rule with a class count of its own (``expectation_backends[(rule, C)]``) a row for
    that count and one for the others."""
    rows = [RULES_HEADER, "|---|---|---|---|"]
    for name in BUILTIN_LIKELIHOODS:
        lik = make_likelihood(name)
        for i, rule in enumerate(lik.expectation_rules):
            label = f"`{rule}`" + (" (default)" if i == 0 else "")
            counts = sorted(key[1] for key in lik.expectation_backends
                            if isinstance(key, tuple) and key[0] == rule)
            for count in counts:
                rows.append(f"| `{name}` | {label} | {count} | "
                            f"{', '.join(sorted(lik.supported_backends(rule, count)))} |")
            rest = ("3 or more" if counts == [2] else "others") if counts else "any"
            rows.append(f"| `{name}` | {label} | {rest} | "
                        f"{', '.join(sorted(lik.supported_backends(rule)))} |")
    return rows


def test_the_rules_table_is_the_declarations() -> None:
    expected = _rule_rows()
    assert _doc_table(RULES_HEADER) == expected, (
        "docs/backends.md's table of expectation rules differs from the declarations "
        "(Likelihood.expectation_backends); the table they give:\n" + "\n".join(expected))


def _methods() -> dict[str, type]:
    """The installed methods that load, by name."""
    return {name: registry.load_method(name)
            for name in registry.methods_supporting(lambda m: True)}


def test_the_methods_table_is_the_declarations() -> None:
    """Each row naming methods gives their ``backends`` and ``float32``; "every other method"
    is numpy only, in float64."""
    methods, named = _methods(), set()
    for row in _doc_table(METHODS_HEADER)[2:]:
        who, backends, single = (cell.strip() for cell in row.strip("|").split("|"))
        names = re.findall(r"`([^`]+)`", who) or sorted(set(methods) - named)
        named |= set(names)
        for name in names:
            cls = methods[name]
            assert ", ".join(cls.backends) == backends, (name, cls.backends, row)
            assert bool(cls.float32) == single.startswith("yes"), (name, cls.float32, row)


def _cases() -> list[tuple[str, str, int | None]]:
    """(likelihood, rule, classes) of every built-in rule: 2 and 3 classes for a multi-class
    likelihood, None for a single-latent one."""
    cases = []
    for name in BUILTIN_LIKELIHOODS:
        lik = make_likelihood(name)
        for rule in lik.expectation_rules:
            cases += [(name, rule, c) for c in ((2, 3) if lik.multiclass else (None,))]
    return cases


def _inputs(lik, n_classes: int | None, n: int = 30):
    rng = np.random.default_rng(0)
    shape = (n,) if n_classes is None else (n, n_classes)
    mean, var = rng.normal(size=shape) * 2.0, np.exp(rng.uniform(-3.0, 2.0, shape))
    if lik.task == "regression":
        return rng.normal(size=n), mean, var
    return rng.integers(0, n_classes or 2, n), mean, var


@pytest.mark.parametrize(("name", "rule", "n_classes"), _cases(), ids=str)
def test_every_rule_runs_where_it_is_declared_and_is_refused_elsewhere(name, rule, n_classes):
    torch = pytest.importorskip("torch", reason="the torch backend needs PyTorch")
    lik = make_likelihood(name).with_expectation(rule)
    y, mean, var = _inputs(lik, n_classes)
    on_torch = (torch.as_tensor(mean), torch.as_tensor(var))
    if "torch" in lik.supported_backends(rule, n_classes):
        host = lik.variational_expectations(y, mean, var, rng=np.random.default_rng(3))
        dev = lik.variational_expectations(y, *on_torch, rng=np.random.default_rng(3))
        for a, b in zip(host, dev):
            assert isinstance(b, torch.Tensor)
            np.testing.assert_allclose(b.numpy(), a, rtol=1e-12, atol=1e-12)
    else:
        with pytest.raises(InputError, match=rf"\(expectation='{rule}'\).* runs on numpy only, "
                                             r"not on the torch backend"):
            lik.variational_expectations(y, *on_torch)


def test_supported_backends_reads_the_declarations() -> None:
    softmax = make_likelihood("softmax")
    assert softmax.supported_backends() == {"numpy", "torch"}  # the rule in use, any count
    assert softmax.supported_backends(n_classes=2) == {"numpy"}
    assert softmax.supported_backends("monte_carlo", 2) == {"numpy", "torch"}
    robustmax = make_likelihood("robustmax").with_expectation("log_space")
    assert robustmax.supported_backends() == {"numpy"}
    assert robustmax.supported_backends("trapezoid", 4) == {"numpy", "torch"}
    with pytest.raises(InputError, match=r"expectation must be one of \['trapezoid', "
                                         r"'log_space', 'gauss_hermite'\], got 'nope'"):
        robustmax.supported_backends("nope")


def test_a_third_party_rule_is_numpy_only_unless_declared() -> None:
    from gpinfer.interfaces import EVERY_BACKEND
    from gpinfer.likelihoods import BernoulliLogit

    class Mine(BernoulliLogit):
        expectation_rules = ("gauss_hermite", "adaptive", "mine")

    assert Mine().supported_backends("mine") == {"numpy"}
    assert Mine().supported_backends("gauss_hermite") == EVERY_BACKEND  # inherited
    with pytest.raises(InputError, match=r"Mine\(expectation='mine'\) runs on numpy only, not "
                                         r"on the torch backend: on torch use "
                                         r"expectation='gauss_hermite', or leave backend"):
        Mine(expectation="mine").require_backend("torch")


@pytest.mark.parametrize("names", [{"torch"}, {"numpy", "jax"}], ids=str)
def test_a_declaration_must_name_numpy_and_known_backends(names) -> None:
    """numpy runs every rule (the checks skip it), so a declaration without it, or with a
    backend that does not exist, fails when the class is defined."""
    from gpinfer.likelihoods import BernoulliLogit

    with pytest.raises(TypeError, match=r"Bad.expectation_backends\['gauss_hermite'\] must "
                                        r"name numpy and only the backends"):
        type("Bad", (BernoulliLogit,), {"expectation_backends": {"gauss_hermite": names}})


def test_the_docs_example_message_is_the_check_s() -> None:
    """The refusal quoted in docs/backends.md is what svi with ``RobustMax(expectation=
    "log_space")`` on torch gets (three classes)."""
    from gpinfer.backend.choice import Backend
    from gpinfer.validation import check_method_compatible

    lines = DOC.read_text().splitlines()
    start = lines.index("method 'svi' evaluates its likelihood's rule on the torch backend, and")
    quoted = " ".join(lines[start:lines.index("```", start)])
    lik = make_likelihood("robustmax").with_expectation("log_space")
    with pytest.raises(InputError) as err:
        check_method_compatible(registry.load_method("svi"), 3, "classification", None,
                                "robustmax", likelihood=lik, backend=Backend("torch"))
    assert str(err.value) == quoted

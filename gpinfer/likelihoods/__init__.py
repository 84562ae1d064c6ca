"""Likelihoods ``p(y | f)``: Bernoulli (probit, logit), Gaussian, and the multi-class family.

``make_likelihood("probit")`` builds a built-in likelihood by name; other names are looked up in
the ``gpinfer.likelihoods`` entry-point group through ``gpinfer.registry``. Each likelihood owns
its maths (tilted moments for any power, expected log-likelihoods with their gradients and the
rule of ``variational_expectations``, predictive probabilities) and declares its
``capabilities``; methods never look at a likelihood's name or link.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpinfer.errors import InputError
from gpinfer.likelihoods.base import (
    ExpectedLogProb,
    Likelihood,
    ScalarLikelihood,
    TiltedMoments,
    check_labels,
)
from gpinfer.likelihoods.bernoulli import Bernoulli, BernoulliLogit, BernoulliProbit, as_bernoulli
from gpinfer.likelihoods.gaussian import Gaussian
from gpinfer.likelihoods.multiclass import (
    ArgmaxNoise,
    MulticlassLikelihood,
    MultinomialProbit,
    PairwiseProbitTilted,
    RobustMax,
    Softmax,
    argmax_factor_tilted,
    argmax_probability,
)

#: built-in likelihoods by name (the same names as the entry points in ``pyproject.toml``)
BUILTIN_LIKELIHOODS: dict[str, type[Likelihood]] = {
    "probit": BernoulliProbit,
    "logit": BernoulliLogit,
    "gaussian": Gaussian,
    "argmax": ArgmaxNoise,
    "robustmax": RobustMax,
    "softmax": Softmax,
    "multinomial_probit": MultinomialProbit,
}


def make_likelihood(spec: str | Likelihood, **params: Any) -> Likelihood:
    """A likelihood from a name (built-in or registered plugin) and its parameters.

    A ``Likelihood`` instance is returned unchanged (then ``params`` must be empty). Unknown
    names are looked up in the entry-point group ``gpinfer.likelihoods``.
    """
    if isinstance(spec, Likelihood):
        if params:
            raise InputError(
                f"parameters {sorted(params)} given together with a ready "
                f"{type(spec).__name__} instance"
            )
        return spec
    if not isinstance(spec, str):
        raise InputError(
            f"a likelihood is a name or a Likelihood instance, got {type(spec).__name__}"
        )
    factory = BUILTIN_LIKELIHOODS.get(spec.strip().lower())
    if factory is None:
        from gpinfer import registry  # lazy: the registry imports plugins

        factory = registry.load("gpinfer.likelihoods", spec)
    try:
        likelihood = factory(**params)
    except TypeError as exc:
        raise InputError(f"bad parameters {sorted(params)} for likelihood {spec!r}: {exc}") from exc
    if not isinstance(likelihood, Likelihood):
        raise InputError(
            f"likelihood {spec!r} built a {type(likelihood).__name__}, not a Likelihood"
        )
    return likelihood


def default_likelihood(names: Sequence[str], n_classes: int) -> Likelihood | None:
    """The first of the likelihood ``names`` (a method's ``likelihoods``) suited to
    ``n_classes`` classes (multi-class for more than two; the first name when none is), built
    by ``make_likelihood``; ``None`` when ``names`` is empty."""
    candidates = [make_likelihood(name) for name in names]
    suited = [lik for lik in candidates if bool(lik.multiclass) == (n_classes > 2)]
    return (suited or candidates)[0] if candidates else None


__all__ = [
    "BUILTIN_LIKELIHOODS",
    "ArgmaxNoise",
    "Bernoulli",
    "BernoulliLogit",
    "BernoulliProbit",
    "ExpectedLogProb",
    "Gaussian",
    "Likelihood",
    "MulticlassLikelihood",
    "MultinomialProbit",
    "PairwiseProbitTilted",
    "RobustMax",
    "ScalarLikelihood",
    "Softmax",
    "TiltedMoments",
    "argmax_factor_tilted",
    "argmax_probability",
    "as_bernoulli",
    "check_labels",
    "default_likelihood",
    "make_likelihood",
]

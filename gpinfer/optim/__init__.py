"""Optimisers for hyper-parameters: L-BFGS-B (scipy), Adam, AdaDelta; all maximise.

``make_optimizer(name, **options)`` builds one by name (``"lbfgs"``, ``"adam"``, ``"adadelta"``).
"""

from __future__ import annotations

import inspect
from typing import Any

from gpinfer.errors import InputError, UnknownNameError
from gpinfer.interfaces import Optimizer
from gpinfer.optim.adadelta import AdaDelta
from gpinfer.optim.adam import Adam
from gpinfer.optim.lbfgs import LBFGSB
from gpinfer.optim.stochastic import StochasticAscent

#: optimiser names accepted by ``make_optimizer``
OPTIMIZERS: dict[str, type[Optimizer]] = {"lbfgs": LBFGSB, "adam": Adam, "adadelta": AdaDelta}


def make_optimizer(name: str, **options: Any) -> Optimizer:
    """The optimiser called ``name`` built with ``options`` (its constructor's keywords).

    Unknown names raise ``UnknownNameError`` listing the known ones; unknown options raise
    ``InputError`` listing the accepted keywords.
    """
    key = str(name).lower().replace("-", "").replace("_", "")
    aliases = {"lbfgsb": "lbfgs"}
    key = aliases.get(key, key)
    if key not in OPTIMIZERS:
        raise UnknownNameError(
            f"unknown optimizer {name!r}; known optimizers: {', '.join(sorted(OPTIMIZERS))}"
        )
    cls = OPTIMIZERS[key]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InputError(
            f"optimizer {key!r} got unknown option(s) {unknown}; accepted: {', '.join(accepted)}"
        )
    return cls(**options)


__all__ = ["OPTIMIZERS", "AdaDelta", "Adam", "LBFGSB", "StochasticAscent", "make_optimizer"]

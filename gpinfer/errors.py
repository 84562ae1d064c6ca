"""Exceptions raised by gpinfer. Every message names the problem and, where it helps, the fix."""

from __future__ import annotations

from typing import Any


class GPInferError(Exception):
    """Base class of all gpinfer errors."""


class InputError(GPInferError, ValueError):
    """Bad user input (shapes, NaN/inf, labels, option values), detected before training."""


class NonFiniteError(InputError):
    """An array with NaN or infinite values, found by an input check (a kernel's or a
    likelihood's). ``quantity`` names the array. Raised during a fit, whose user inputs were
    checked before training, it is about a computed quantity: the estimators report it as a
    ``NumericalError`` (``gpinfer.fit_guard.internal_values``)."""

    def __init__(self, message: str, *, quantity: str | None = None):
        super().__init__(message)
        self.quantity = quantity


class UnknownNameError(GPInferError, KeyError):
    """A method, dataset, kernel or likelihood name that no registered plugin provides."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0]) if self.args else ""


class PluginLoadError(GPInferError, ImportError):
    """A registered plugin whose entry point failed to import or is not of the expected type.

    ``entry``: the registry's description of the entry point (set by ``gpinfer.registry``).
    """

    entry: object = None


class GroupError(GPInferError, RuntimeError):
    """A data-parallel fit's process group (``gpinfer.training.distributed``) broke: another
    rank ended (it raised, was interrupted or killed) or a collective timed out; or this
    process left its group after such a failure and a fit asked for the group again."""


class NumericalError(GPInferError, ArithmeticError):
    """Numerical trouble during training: failed Cholesky, non-finite objective, divergence.

    ``iteration`` and ``quantity`` name where it happened, when known.
    """

    def __init__(self, message: str, *, iteration: int | None = None, quantity: str | None = None):
        where = []
        if iteration is not None:
            where.append(f"iteration {iteration}")
        if quantity is not None:
            where.append(f"quantity {quantity!r}")
        suffix = f" ({', '.join(where)})" if where else ""
        super().__init__(message + suffix)
        self.iteration = iteration
        self.quantity = quantity


class FitFailedError(NumericalError):
    """A fit that ran to its end but whose model is no better than knowing nothing (predicting
    the class frequencies, or a constant Gaussian for regression): ``gpinfer.fit_guard``.

    ``result`` is the method's ``FitResult`` with the guard's ``warnings`` and ``diagnostics``
    (``train_nll``, ``baseline_nll``, ...), for a caller that records them (the runner writes
    them to ``result.json`` and MLflow).
    """

    def __init__(self, message: str, *, result: Any = None, quantity: str | None = None):
        super().__init__(message, quantity=quantity)
        self.result = result

"""L-BFGS-B (scipy) behind the ``Optimizer`` interface: maximisation by negation at the boundary.

The parameter vector may live on any array backend (numpy, torch on a CPU or GPU): L-BFGS-B
itself always runs on the host in float64 (scipy), on a host copy of the parameters; each
evaluation moves the trial point to the parameters' device and dtype and the gradient back, one
vector of ``P`` values each way. The objective, the expensive part, runs where the parameters
live, and numpy and torch follow the same optimiser path (to round-off in float64).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

import numpy as np
from scipy.optimize import minimize

from gpinfer.backend import ops
from gpinfer.errors import InputError, NumericalError
from gpinfer.interfaces import (
    Array,
    IterationCallback,
    OptimizationResult,
    Optimizer,
    ValueAndGrad,
)

#: one ``(low, high)`` pair for every coordinate, or a list of pairs (``None`` = unbounded)
Bounds = tuple[float | None, float | None] | Sequence[tuple[float | None, float | None]]

#: message reported when the callback asked to stop
STOPPED_BY_CALLBACK = "stopped by callback"


class _TrialPointFailure(Exception):
    """A ``NumericalError`` raised while evaluating a trial point (``fun`` or its finiteness
    check), kept apart from one raised by the callback at an accepted iterate, which must reach
    the caller whatever ``stop_on_trial_failure`` says."""

    def __init__(self, error: NumericalError):
        super().__init__(str(error))
        self.error = error

    def unwrapped(self) -> NumericalError:
        """The original error, to re-raise without this wrapper in its context."""
        self.error.__suppress_context__ = True
        return self.error


def check_finite(value: float, grad: Array, iteration: int, where: str = "objective") -> None:
    """``NumericalError`` naming ``iteration`` when ``value`` or ``grad [P]`` is not finite."""
    if not np.isfinite(value):
        raise NumericalError(f"{where} value is {value}", iteration=iteration, quantity=where)
    if not ops.all_finite(grad):  # any array-API namespace; the host copy only on failure
        idx = np.flatnonzero(~np.isfinite(ops.to_host(grad)))[:5].tolist()
        raise NumericalError(
            f"{where} gradient has non-finite entries at {idx}",
            iteration=iteration,
            quantity=f"{where} gradient",
        )


def _is_scalar_or_none(b: object) -> bool:
    return b is None or isinstance(b, Real)


def expand_bounds(bounds: Bounds | None, n: int) -> list[tuple[float | None, float | None]] | None:
    """Per-coordinate bounds for ``n`` coordinates (a single pair is broadcast)."""
    if bounds is None:
        return None
    items: list[Any] = list(bounds)
    if len(items) == 2 and all(_is_scalar_or_none(b) for b in items):
        pair = (items[0], items[1])
        return [pair] * n
    if len(items) != n:
        raise InputError(f"L-BFGS-B got {len(items)} bounds for {n} parameters")
    out = []
    for b in items:
        lo, hi = b
        out.append((lo, hi))
    return out


def _caller_space(x0: Array) -> Callable[[Array], Array]:
    """The map from L-BFGS-B's host float64 vectors ``[P]`` to the caller's space: a fresh
    host float64 copy for a numpy ``x0``, else an array on ``x0``'s backend, device and
    dtype."""
    ref = ops.as_array(x0)
    return lambda x: ops.like(ref, np.array(x, dtype=float))


class LBFGSB(Optimizer):
    """Maximise with ``scipy.optimize.minimize(method="L-BFGS-B", jac=True)`` on ``-fun``.

    * ``bounds``: ``None``, one ``(low, high)`` pair for all coordinates, or one pair per
      coordinate (``None`` entries are unbounded).
    * ``ftol``, ``gtol``, ``maxfun``, ``maxcor``, ``maxls``: scipy's options (``maxfun=None``
      keeps scipy's default).

    ``maximize`` calls ``callback(iteration, x, value)`` once per L-BFGS-B iteration; a True
    return stops the run (``success=True``, message ``"stopped by callback"``). Reaching
    ``max_iter`` or ``maxfun`` is a normal end (``success=True``, scipy's message kept); any
    other end (e.g. an abnormal line-search termination) gives ``success=False`` with scipy's
    message. A non-finite value or gradient raises ``NumericalError`` naming the iteration
    (0 for the initial point). With ``stop_on_trial_failure``, a ``NumericalError`` at a trial
    point after the first (``fun``'s own, or a non-finite value) instead ends the run at the last
    accepted iterate with ``success=False``, ``trial_failure=True`` and the error in the
    message, so that one point where the objective breaks down does not lose the progress made
    (the one trial-failure rule: ``gpinfer.training.outer`` warns and marks the history). A
    ``NumericalError`` raised by ``callback`` (at an accepted iterate: the fit guard's
    objective-limit check, say) always propagates, at that iteration.

    ``x0 [P]`` may be a numpy array or an array of another backend (a torch tensor on a CPU or
    GPU, float64 or float32): ``fun``, ``callback`` and the result's ``x`` then see arrays of
    that backend, device and dtype, while L-BFGS-B's own state (the iterate, its ``maxcor``
    correction pairs, the line search) is kept on the host in float64 (module docstring). In
    float32 the objective and gradient carry float32 round-off (about ``1e-7`` relative): the
    path follows the float64 one closely at first and drifts from it as round-off accumulates
    (svi, 90 points, 3 classes: probabilities within 1e-5 after 20 iterations, 1e-2 after 100),
    and near an optimum the line search may end abnormally (``success=False``, scipy's message)
    where float64 would go on.
    """

    def __init__(
        self,
        bounds: Bounds | None = None,
        ftol: float = 2.2e-9,
        gtol: float = 1e-5,
        maxfun: int | None = None,
        maxcor: int = 10,
        maxls: int = 20,
        stop_on_trial_failure: bool = False,
    ):
        _check_settings(ftol=ftol, gtol=gtol, maxfun=maxfun, maxcor=maxcor, maxls=maxls)
        self.bounds = bounds
        self.ftol = ftol
        self.gtol = gtol
        self.maxfun = maxfun
        self.maxcor = maxcor
        self.maxls = maxls
        self.stop_on_trial_failure = stop_on_trial_failure

    def maximize(self, fun: ValueAndGrad, x0: Array, max_iter: int,
                 callback: IterationCallback | None = None) -> OptimizationResult:
        run = _Run(fun, callback, _caller_space(x0))
        x0 = np.array(ops.to_host(ops.as_array(x0)), dtype=float).reshape(-1)
        bounds = expand_bounds(self.bounds, x0.size)
        if max_iter < 1 or x0.size == 0:
            return run.no_iterations(x0)
        try:
            res = minimize(
                run.negated, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                callback=run.on_iteration, options=self._options(max_iter),
            )
        except _TrialPointFailure as failure:
            if not (self.stop_on_trial_failure and run.accepted):
                raise failure.unwrapped()  # noqa: B904 - the original, cause kept
            return run.stopped_at_accepted(failure.error)
        return run.result(res)

    def _options(self, max_iter: int) -> dict[str, float | int]:
        """scipy's L-BFGS-B options."""
        options: dict[str, float | int] = {
            "maxiter": int(max_iter),
            "ftol": self.ftol,
            "gtol": self.gtol,
            "maxcor": self.maxcor,
            "maxls": self.maxls,
        }
        if self.maxfun is not None:
            options["maxfun"] = int(self.maxfun)
        return options


def _check_settings(**settings: object) -> None:
    """``InputError`` naming the L-BFGS-B setting that is not what scipy needs: ``ftol`` and
    ``gtol`` numbers >= 0, ``maxcor``, ``maxls`` and ``maxfun`` (or None) integers >= 1 (scipy
    reads a negative ``maxfun`` as "stop at once" and a string fails inside the fit)."""
    for key, value in settings.items():
        if key in ("ftol", "gtol"):
            ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
                  and float(value) >= 0.0)
            what = "a number >= 0"
        else:
            ok = (value is None and key == "maxfun") or (
                not isinstance(value, bool) and isinstance(value, numbers.Integral)
                and int(value) >= 1)
            what = "an integer >= 1" + (" or None" if key == "maxfun" else "")
        if not ok:
            raise InputError(f"optimizer 'lbfgs': {key} must be {what}; got {value!r}")


class _Run:
    """One ``LBFGSB.maximize`` call: the negated objective scipy minimises (on host float64
    vectors ``[P]``; ``to_caller`` maps them to the caller's space), the iteration count, the
    callback, and the last accepted iterate (``accepted``: ``x``, ``value``; the starting
    point until the first iteration)."""

    def __init__(self, fun: ValueAndGrad,
                 callback: IterationCallback | None,
                 to_caller: Callable[[Array], Array]):
        self.fun, self.callback, self.to_caller = fun, callback, to_caller
        self.iteration, self.n_eval, self.stopped = 0, 0, False
        self.accepted: dict[str, Array | float] = {}

    def negated(self, x: Array) -> tuple[float, Array]:
        """``(-fun, -grad [P])`` at ``x [P]``; a ``NumericalError`` (``fun``'s own, or a
        non-finite value) comes out as a ``_TrialPointFailure``."""
        it = self.iteration + (1 if self.n_eval else 0)
        self.n_eval += 1
        try:
            value, grad = self.fun(self.to_caller(x))
            grad = np.asarray(ops.to_host(grad), dtype=float).reshape(-1)
            check_finite(float(value), grad, it)
        except NumericalError as err:
            raise _TrialPointFailure(err) from err
        if not self.accepted:
            self.accepted.update(x=np.array(x, dtype=float), value=float(value))
        return -float(value), -grad

    def on_iteration(self, intermediate_result: Any) -> None:
        """scipy's callback (``intermediate_result`` is the parameter name scipy looks for):
        the accepted iterate kept, the caller's callback called; its True stops the run."""
        self.iteration += 1
        self.accepted.update(x=np.array(intermediate_result.x, dtype=float),
                             value=-float(intermediate_result.fun))
        if self.callback is not None and self.callback(
            self.iteration, self.to_caller(intermediate_result.x),
            -float(intermediate_result.fun)
        ):
            self.stopped = True
            raise StopIteration

    def no_iterations(self, x0: Array) -> OptimizationResult:
        """One evaluation at ``x0 [P]`` (no iterations requested, or no parameters)."""
        try:
            value, _ = self.negated(x0)
        except _TrialPointFailure as failure:
            raise failure.unwrapped()  # noqa: B904 - the original, cause kept
        return OptimizationResult(x=self.to_caller(x0), value=-value, n_iter=0, success=True,
                                  message="no iterations requested")

    def stopped_at_accepted(self, err: NumericalError) -> OptimizationResult:
        """The result of a run that a trial point's ``err`` ended: the last accepted iterate."""
        return OptimizationResult(
            x=self.to_caller(np.asarray(self.accepted["x"])),
            value=float(self.accepted["value"]),
            n_iter=int(self.iteration), success=False,
            message=f"stopped at the last accepted iterate: numerical failure at a trial "
                    f"point ({err})", trial_failure=True,
        )

    def result(self, res: Any) -> OptimizationResult:
        """The result of scipy's ``res``: a stop request is a normal end, as are scipy's
        ``status`` 0 and 1 (converged; ``maxiter`` or ``maxfun`` reached)."""
        if self.stopped:
            success, message = True, STOPPED_BY_CALLBACK
        else:
            success, message = res.status in (0, 1), str(res.message)
        return OptimizationResult(
            x=self.to_caller(res.x),
            value=-float(res.fun),
            n_iter=int(res.nit),
            success=bool(success),
            message=message,
        )

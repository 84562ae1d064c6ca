"""Where a method's kernel starts: the ``lengthscale_init`` option, decided once for every
method that has it (ep, sep, gfitc, svi, vi-robustmax and the vi-jj family).

``"median"`` sets every stationary length-scale to the square root of the median pairwise
distance (spec ep-sep §2.11, P18); ``"kernel"`` keeps the kernel's own; ``"auto"`` (the
default) is ``"kernel"`` when the caller gave a ``Kernel`` object (``Problem.kernel_given``)
and holds its parameters fixed (``optimize=False``: the caller asked for exactly that kernel,
as scikit-learn's ``optimizer=None`` does), else ``"median"`` (a named kernel's length-scale
is a placeholder; optimised hyper-parameters start from the heuristic, the paper protocols').

The decision would sit in ``gpinfer.kernels.initialisation.prepare_kernel``, which takes the
resolved rule; it lives here until that module is free to change (issue 25).
"""

from __future__ import annotations

from gpinfer.errors import InputError
from gpinfer.interfaces import Array, Problem
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.initialisation import LENGTHSCALE_INITS, prepare_kernel
from gpinfer.options import Option, choice

#: the values of the ``lengthscale_init`` option: ``"auto"`` and the rules of ``prepare_kernel``
LENGTHSCALE_INIT_CHOICES = ("auto", *LENGTHSCALE_INITS)


def lengthscale_init_option() -> Option:
    """The ``lengthscale_init`` option every method with the median heuristic declares."""
    return choice("auto", LENGTHSCALE_INIT_CHOICES,
                  doc="median: squared length-scale = median distance; kernel: the kernel's; "
                      "auto: kernel for a Kernel object held fixed, else median")


def resolve_lengthscale_init(value: str, kernel_given: bool, optimize: bool,
                             owner: str = "kernel set-up") -> str:
    """The rule ``prepare_kernel`` applies for the option ``value``: ``"auto"`` is
    ``"kernel"`` when ``kernel_given`` (a ``Kernel`` object from the caller) and not
    ``optimize``, else ``"median"``; ``"median"`` and ``"kernel"`` are themselves. Anything
    else is an ``InputError`` naming ``owner`` and the allowed values."""
    if value == "auto":
        return "kernel" if kernel_given and not optimize else "median"
    if value not in LENGTHSCALE_INITS:
        raise InputError(f"{owner}: lengthscale_init must be one of {LENGTHSCALE_INIT_CHOICES}, "
                         f"got {value!r}")
    return value


def start_kernel(problem: Problem, X: Array, noise: float | None, lengthscale_init: str,
                 owner: str) -> Kernel:
    """``prepare_kernel`` of ``problem.kernel`` on ``X [N, D]`` (the rows the median distance
    reads) with the rule ``lengthscale_init`` resolves to for ``problem``
    (``resolve_lengthscale_init``): a copy, with ``White(noise)`` added when it has none
    (``noise`` not None)."""
    rule = resolve_lengthscale_init(str(lengthscale_init), problem.kernel_given,
                                    problem.optimize, owner)
    return prepare_kernel(problem.kernel, X, noise, rule, owner=owner)

"""Kernel set-up shared by inducing-point methods (spec ep-sep §2.11, P18).

``prepare_kernel`` adds a white-noise term when the kernel has none and can set every
stationary length-scale by the median heuristic, exactly as the reference code of seed 000
does for EP, SEP, GFITC and the VI baseline (so all four start from the same kernel).

Where a method's kernel starts is its ``lengthscale_init`` option (``lengthscale_init_option``),
decided here once for every method that has it (ep, sep, gfitc, svi, vi-robustmax and the
vi-jj family): ``"median"`` sets every stationary length-scale to the square root of the
median pairwise distance (spec ep-sep §2.11, P18); ``"kernel"`` keeps the kernel's own;
``"auto"`` (the default) is ``"kernel"`` when the caller gave a ``Kernel`` object
(``Problem.kernel_given``) and holds its parameters fixed (``optimize=False``: the caller asked
for exactly that kernel, as scikit-learn's ``optimizer=None`` does), else ``"median"`` (a named
kernel's length-scale is a placeholder; optimised hyper-parameters start from the heuristic,
the paper protocols'). ``resolve_lengthscale_init`` makes that decision, ``prepare_kernel``
applies it (``start_kernel``: both for a method's ``Problem``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpinfer.errors import InputError
from gpinfer.kernels.base import Array, Kernel
from gpinfer.kernels.combination import Combination, Sum
from gpinfer.kernels.stationary import Stationary
from gpinfer.kernels.white import White
from gpinfer.options import Option, choice

if TYPE_CHECKING:
    from gpinfer.interfaces import Problem

#: points used for the median pairwise distance (spec ep-sep §2.11: 1000 for MNIST)
MEDIAN_SUBSET = 1000
#: the length-scale initialisations ``prepare_kernel`` applies
LENGTHSCALE_INITS = ("median", "kernel")
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


def leaf_kernels(kernel: Kernel) -> list[Kernel]:
    """The non-combination parts of ``kernel``, depth first (the kernel itself if it is one)."""
    if isinstance(kernel, Combination):
        return [q for p in kernel.parts for q in leaf_kernels(p)]
    return [kernel]


def median_distance(X: Array, rng: np.random.Generator, subset: int = MEDIAN_SUBSET) -> float:
    """Median pairwise Euclidean distance among at most ``subset`` random rows of ``X [N, D]``
    (1.0 when it is zero or there is a single row)."""
    if X.shape[0] > subset:
        X = X[rng.choice(X.shape[0], subset, replace=False)]
    sq = np.sum(X * X, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * X @ X.T, 0.0)
    med = float(np.median(np.sqrt(d2[np.triu_indices(X.shape[0], 1)]))) if X.shape[0] > 1 else 1.0
    return med if med > 0 else 1.0


def prepare_kernel(kernel: Kernel, X: Array, noise: float | None, lengthscale_init: str,
                   owner: str = "kernel set-up") -> Kernel:
    """A copy of ``kernel`` with ``White(noise)`` added when it has no white term (``noise`` not
    None) and, for ``lengthscale_init == "median"``, every stationary length-scale set to the
    square root of the median pairwise distance of ``X [N, D]`` (spec P18: the median distance
    is the *squared* length-scale); ``"kernel"`` keeps the kernel's own length-scales."""
    if lengthscale_init not in LENGTHSCALE_INITS:
        raise InputError(f"{owner}: lengthscale_init must be one of {LENGTHSCALE_INITS}, "
                         f"got {lengthscale_init!r}")
    base = kernel.copy()
    if noise is not None and not any(isinstance(p, White) for p in leaf_kernels(base)):
        base = Sum([base, White(variance=float(noise))])
    if lengthscale_init == "median":
        set_lengthscales(base, float(np.sqrt(median_distance(X, np.random.default_rng(0)))))
    return base


def set_lengthscales(kernel: Kernel, value: float) -> None:
    """Set every length-scale of every stationary part of ``kernel`` to ``value`` (in place)."""
    for part in leaf_kernels(kernel):
        if isinstance(part, Stationary):
            theta = part.get_unconstrained()
            theta[:-1] = np.log(value)
            part.set_unconstrained(theta)


def standardised_lengthscale(X: Array) -> float:
    """The starting length-scale of a named kernel on standardised inputs ``X [N, D]``:
    ``sqrt(max(D', 2) / 2)`` with ``D'`` the non-constant columns. Two standardised points are
    ``2 D'`` apart in squared distance on average, so the prior correlation of a typical pair,
    ``exp(-2 D' / (2 l^2))``, is ``e^-2`` whatever ``D'`` (length-scale 1 for ``D' <= 2``; on
    64 pixels, length-scale 1 would make the kernel matrix nearly the identity)."""
    varying = int(np.count_nonzero(np.ptp(X, axis=0) > 0)) if X.shape[0] > 1 else 0
    return float(np.sqrt(max(varying, 2) / 2.0))

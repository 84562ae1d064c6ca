"""Model set-up shared by ep, sep and gfitc: per-class kernels and inducing inputs (spec §2.11)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from gpinfer.errors import InputError
from gpinfer.interfaces import Array, Problem
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.combination import Combination, Sum
from gpinfer.kernels.stationary import Stationary
from gpinfer.kernels.white import White
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.sites.inducing import ClassTerms, class_terms
from gpinfer_ep.noise import latent_noise

#: default number of inducing points per class when ``M`` is not given
DEFAULT_M = 50
#: points used for the median pairwise distance (spec §2.11: 1000 for MNIST)
MEDIAN_SUBSET = 1000


def check_likelihood(problem: Problem, method: str) -> None:
    """The family needs the noise-free argmax likelihood (noise lives in the kernel)."""
    lik = problem.likelihood
    if not isinstance(lik, ArgmaxNoise) or np.any(np.asarray(lik.noise_variance) != 0):
        raise InputError(
            f"{method} uses the argmax likelihood with the Gaussian noise in the kernel "
            f"(likelihood 'argmax' with noise_variance 0); got {lik!r}"
        )


def _parts(kernel: Kernel) -> list[Kernel]:
    if isinstance(kernel, Combination):
        return [q for p in kernel.parts for q in _parts(p)]
    return [kernel]


def median_distance(X: Array, rng: np.random.Generator) -> float:
    """Median pairwise Euclidean distance among at most ``MEDIAN_SUBSET`` random rows."""
    if X.shape[0] > MEDIAN_SUBSET:
        X = X[rng.choice(X.shape[0], MEDIAN_SUBSET, replace=False)]
    sq = np.sum(X * X, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * X @ X.T, 0.0)
    med = float(np.median(np.sqrt(d2[np.triu_indices(X.shape[0], 1)]))) if X.shape[0] > 1 else 1.0
    return med if med > 0 else 1.0


def class_kernels(problem: Problem, noise: float | None, lengthscale_init: str,
                  noise_in_Kuu: bool = True) -> list[Kernel]:
    """One kernel per class: the problem's kernel (+ ``White(noise)`` when it has none), with
    stationary length-scales set by the median heuristic when ``lengthscale_init == "median"``
    (the median distance is assigned to the *squared* length-scale, spec P18).

    ``noise_in_Kuu`` (spec P10): True puts the white noise on ``diag Kuu`` and in ``kappa``;
    False turns every ``White`` term (the added one or the problem's own) into ``LatentNoise``,
    so the noise is in ``kappa`` (the FITC variances ``s_i``) only.
    """
    if not isinstance(noise_in_Kuu, bool | np.bool_):
        raise InputError(f"noise_in_Kuu must be true or false, got {noise_in_Kuu!r}")
    base = problem.kernel.copy()
    if noise is not None and not any(isinstance(p, White) for p in _parts(base)):
        base = Sum([base, White(variance=float(noise))])
    if not noise_in_Kuu:
        base = latent_noise(base)
    if lengthscale_init == "median":
        ell = np.sqrt(median_distance(problem.X, np.random.default_rng(0)))
        for part in _parts(base):
            if isinstance(part, Stationary):
                theta = part.get_unconstrained()
                theta[:-1] = np.log(ell)
                part.set_unconstrained(theta)
    elif lengthscale_init != "kernel":
        raise InputError(f"lengthscale_init must be 'median' or 'kernel', got {lengthscale_init!r}")
    return [base.copy() for _ in range(problem.n_classes)]


def initial_inducing(problem: Problem, method: str) -> list[Array]:
    """``Z_c [M, D]``: ``M`` distinct training inputs drawn independently for each class.

    ``M > N`` is capped at ``N`` with a warning; an array ``[M, D]`` is used for every class.
    """
    X, C = problem.X, problem.n_classes
    if isinstance(problem.inducing, np.ndarray):
        Z = np.asarray(problem.inducing, dtype=float)
        if Z.ndim != 2 or Z.shape[1] != X.shape[1]:
            raise InputError(f"{method}: inducing inputs must be [M, {X.shape[1]}], got {Z.shape}")
        return [Z.copy() for _ in range(C)]
    M = DEFAULT_M if problem.inducing is None else int(problem.inducing)
    if M < 1:
        raise InputError(f"{method}: M must be at least 1, got {M}")
    if M > X.shape[0]:
        warnings.warn(f"{method}: M={M} exceeds the {X.shape[0]} training points; using "
                      f"M={X.shape[0]}", RuntimeWarning, stacklevel=3)
        M = X.shape[0]
    return [X[problem.rng.choice(X.shape[0], M, replace=False)] for _ in range(C)]


def all_terms(kernels: Sequence[Kernel], Zs: Sequence[Array], X: Array,
              iteration: int | None = None) -> list[ClassTerms]:
    """``ClassTerms`` of every class at ``X [n, D]``."""
    return [class_terms(k, Z, X, iteration=iteration) for k, Z in zip(kernels, Zs)]

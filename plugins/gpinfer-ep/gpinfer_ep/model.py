"""Model set-up shared by ep, sep and gfitc: per-class kernels and inducing inputs (spec §2.11)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpinfer.data.source import median_input
from gpinfer.errors import InputError
from gpinfer.inducing import initial_inducing as core_initial_inducing
from gpinfer.interfaces import Array, Problem
from gpinfer.kernels.base import Kernel
from gpinfer.kernels.initialisation import start_kernel
from gpinfer.likelihoods.multiclass import ArgmaxNoise
from gpinfer.parallel import map_latents
from gpinfer.sites.stacked import StackedTerms, latent_terms
from gpinfer_ep.noise import latent_noise


def check_likelihood(problem: Problem, method: str) -> None:
    """The family needs the noise-free argmax likelihood (noise lives in the kernel)."""
    lik = problem.likelihood
    if not isinstance(lik, ArgmaxNoise) or np.any(np.asarray(lik.noise_variance) != 0):
        raise InputError(
            f"{method} uses the argmax likelihood with the Gaussian noise in the kernel "
            f"(likelihood 'argmax' with noise_variance 0); got {lik!r}"
        )


def class_kernels(problem: Problem, noise: float | None, lengthscale_init: str,
                  noise_in_Kuu: bool = True) -> list[Kernel]:
    """One kernel per class: the problem's kernel (+ ``White(noise)`` when it has none), with
    stationary length-scales set by the median heuristic when ``lengthscale_init`` resolves to
    ``"median"`` (the median distance is assigned to the *squared* length-scale, spec P18;
    ``"auto"``: ``gpinfer.kernels.initialisation``).

    ``noise_in_Kuu`` (spec P10): True puts the white noise on ``diag Kuu`` and in ``kappa``;
    False turns every ``White`` term (the added one or the problem's own) into ``LatentNoise``,
    so the noise is in ``kappa`` (the FITC variances ``s_i``) only.
    """
    if not isinstance(noise_in_Kuu, bool | np.bool_):
        raise InputError(f"noise_in_Kuu must be true or false, got {noise_in_Kuu!r}")
    base = start_kernel(problem, median_input(problem.X), noise, lengthscale_init,
                        owner="ep/sep/gfitc")
    if not noise_in_Kuu:
        base = latent_noise(base)
    return [base.copy() for _ in range(problem.n_classes)]


def initial_inducing(problem: Problem, method: str, init: str = "random",
                     n_latent: int | None = None) -> list[Array]:
    """``Z_c [M, D]`` for each class by the core rule (``gpinfer.inducing.initial_inducing``):
    ``M`` distinct training inputs drawn independently per class (``init="random"``, the
    paper's) or shared k-means centres; ``M`` defaults to ``gpinfer.inducing.DEFAULT_M``.
    ``n_latent``: that many sets instead of one per class (1: sep's ``shared_inducing``, the
    first class's draw)."""
    n = problem.n_classes if n_latent is None else n_latent
    return core_initial_inducing(problem.inducing, problem.X, problem.rng, n, init=init,
                                 owner=method)


def all_terms(kernels: Sequence[Kernel], Zs: Sequence[Array], X: Array,
              iteration: int | None = None, n_jobs: int = 1) -> StackedTerms:
    """The inducing geometry of every class at ``X [n, D]``, each class's terms formed on its
    own (``latent_terms``, classes on ``n_jobs`` threads) and stacked (``L [C, M, M]``,
    ``A [C, M, n]``, ``s [C, n]``): each class's ``A`` is copied into the stack as soon as it is
    formed, so that the ``[M, n]`` arrays are not held twice."""
    # each A[c] column-major, as the triangular solve gives it (and as stacking kept it): the
    # per-class products that read it then give the same bits
    A = np.empty((len(kernels), X.shape[0], Zs[0].shape[0])).transpose(0, 2, 1)

    def one(c: int) -> tuple[Array, Array]:
        t = latent_terms(kernels[c], Zs[c], X, iteration=iteration)
        A[c] = t.A
        return t.L, t.s

    Ls, ss = zip(*map_latents(one, range(len(kernels)), n_jobs))
    return StackedTerms(L=np.stack(Ls), A=A, s=np.stack(ss))

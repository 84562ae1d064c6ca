"""FLOP models of one step / reported iteration of the scalable methods (sep, ep, svi, pep and
the collapsed vi-jj, vi-taylor, vi-jj-hybrid, vi-jj-full).

``benchmarks/scale_suite.py`` puts each method's time per reported iteration next to its "FLOP
floor": the FLOP count of the iteration's *necessary* dense linear algebra divided by the
machine's one-thread dgemm rate. The models below were derived by reading the code of each
method's step; every term names the formula and where in the code it happens.

Counting rules (sizes: batch ``B`` or data ``N``, inducing points ``M``, features ``D``):

* GEMM ``[a, b] @ [b, c]``: ``2 a b c``; triangular solve or multiply with an ``[M, M]``
  triangle and ``c`` right-hand sides: ``M^2 c``; Cholesky of ``[M, M]``: ``M^3 / 3``; syrk of
  ``[M, k]`` (``A diag(d) A^T``, ``X X^T``): ``M^2 k``; triangular inverse: ``M^3 / 3``; the
  inverse of an SPD matrix from its Cholesky factor (LAPACK ``potri`` = ``trtri`` + ``lauum``):
  ``2 M^3 / 3``.
* Kernel matrix ``[M, B]`` with ``D`` features: ``2 M B D`` (the distance GEMM); a kernel VJP
  w.r.t. the inducing inputs (or, with ARD, the length-scales) needs one more ``[M, B] @ [B, D]``
  product, ``2 M B D``.
* Only products whose size involves ``B``/``N`` or ``M^3`` count; ``O(MB)``, ``O(M^2)``,
  ``O(BD)`` element-wise work (quadrature, exponentials, matrix-vector products) is ignored.

The ``coded`` counts of sep and ep are those of their per-class code before the class-batched
engine (``gpinfer/sites/stacked.py``, ``gpinfer/training/loop.py``), which now forms
``L^T Lam L`` once per step (sep), solves with the factors instead of forming ``B^-1`` against
the identity, and replaces ``B_g^-1 S_E`` by one ``[M, B]`` solve; their ``where`` fields point
at the class-batched code that forms each product now (all classes in one call; the per-class
formulas of ``gpinfer/sites/inducing.py`` are its test oracle). The ``needed`` counts, which the
scale suite uses, do not depend on how the code is arranged.

Each term has two counts: ``needed`` (what the algorithm needs: a product the code forms twice
counts once, a triangular or symmetric product counts at the triangular/syrk rate even where the
code calls a general GEMM, and work whose result is never used counts zero) and ``coded`` (what
the code executes today). The public functions return ``needed`` unless ``coded=True``;
``*_terms`` give the itemised lists (``Term``), whose ``where`` fields point at the code.

What one reported iteration (``IterationInfo`` / history row) is:

* ``sep``, ``ep`` with ``batch_size``: one epoch, ``ceil(N / B)`` steps (``MiniBatches``: the last
  batch is smaller when ``B`` does not divide ``N``); ep also refreshes its site sums from all
  stored sites at the end of the epoch. No ``extra`` key is needed (``site_change``,
  ``damping``... carry no counts).
* ``svi`` with ``batch_size``: ``report_every`` steps, by default
  ``max(1, round(0.1 * ceil(N / B)))`` (a tenth of an epoch); ``extra["steps"]`` is the
  *cumulative* step count, so the steps of iteration ``k`` are the difference of consecutive
  rows (``extra["epoch"]`` = steps / steps per epoch).
* ``vi-jj``, ``vi-taylor``, ``vi-jj-hybrid``: one outer iteration (Stage 1, then a Stage-2
  L-BFGS-B with ``extra["nfev"]`` evaluations); ``vi-jj-full``: one L-BFGS-B iteration, whose
  ``extra["nfev"]`` is cumulative (difference consecutive rows). See ``collapsed_iteration_flops``.
* ``pep`` full batch on a binary problem: one L-BFGS-B iteration, i.e. ``nfev`` evaluations of the
  bound (usually 1; 2 in the first iteration, which includes the evaluation at the starting point;
  more when the line search backtracks), each running the sites to convergence (``S`` parallel
  sweeps, warm-started; about 25-45 on the synthetic problem) and then the energy and its
  gradient. pep reports both per iteration in ``extra`` (``nfev``, ``sweeps``).

Usage: ``iteration_flops(method, extra, n=, m=, d=, n_latent=, batch=)`` (what ``scale_suite``
calls), or the per-method functions. ``python benchmarks/flop_models.py`` prints the models at
the suite's sizes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass


def dgemm_rate(g: int = 2000, repeats: int = 5, clock=None) -> float:
    """Best one-thread dgemm rate (FLOP/s) of ``[g, g] @ [g, g]`` over ``repeats`` products
    (call it inside ``threadpool_limits(limits=1)``). ``clock``: the timer (default
    ``time.perf_counter``; ``time.process_time`` to compare with process-CPU step times on a
    machine with other work running)."""
    import time

    import numpy as np

    clock = clock or time.perf_counter

    rng = np.random.default_rng(1)
    A, B, out = rng.normal(size=(g, g)), rng.normal(size=(g, g)), np.empty((g, g))
    np.matmul(A, B, out=out)  # warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = clock()
        np.matmul(A, B, out=out)
        best = min(best, clock() - t0)
    return 2.0 * g**3 / best


# --------------------------------------------------------------------------------------------
# Terms
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One counted product: what it is, where the code forms it, and its two FLOP counts."""

    what: str
    where: str
    needed: float
    coded: float


def _sum(terms: list[Term], coded: bool) -> float:
    return float(sum(t.coded if coded else t.needed for t in terms))


def _scaled(terms: list[Term], factor: float) -> list[Term]:
    return [Term(t.what, t.where, factor * t.needed, factor * t.coded) for t in terms]


def steps_per_epoch(N: int, B: int) -> int:
    """Mini-batches per epoch, ``ceil(N / B)`` (``gpinfer.data.minibatch.MiniBatches``)."""
    return -(-int(N) // int(B))


def _epoch_batches(N: int, B: int) -> list[tuple[int, int]]:
    """``[(batch size, count)]`` of one epoch: full batches and the smaller last one."""
    full, rest = divmod(int(N), int(B))
    return [(int(B), full)] + ([(rest, 1)] if rest else [])


# --------------------------------------------------------------------------------------------
# sep: tied sites (plugins/gpinfer-ep/gpinfer_ep/state.py:TiedSites)
# --------------------------------------------------------------------------------------------

_STACKED = "gpinfer/sites/stacked.py"
_STATE = "plugins/gpinfer-ep/gpinfer_ep/state.py"


def _class_terms(B: float, M: float, D: float) -> list[Term]:
    """Kernel quantities of one class at the batch (shared by sep and ep)."""
    return [
        Term("Kuf = k(Z, Xb): distances 2 M B D", f"{_STACKED}:stacked_terms -> "
             "gpinfer/kernels/stacked.py:StackedCovariances", 2 * M * B * D, 2 * M * B * D),
        Term("chol(Kuu): M^3/3", f"{_STACKED}:stacked_terms (jittered_cholesky)",
             M**3 / 3, M**3 / 3),
        Term("A = L^-1 Kuf: M^2 B", f"{_STACKED}:stacked_terms (ops.solve_triangular)", M**2 * B,
             M**2 * B),
    ]


def _vjp_term(B: float, M: float, D: float, learn_inducing: bool) -> Term:
    flops = 2 * M * B * D if learn_inducing else 0.0
    return Term("Kuf VJP w.r.t. Z: G @ Xb 2 M B D (distances reused from the memo, not "
                "recomputed)", "gpinfer/hyper.py:_stacked_parameter_gradient -> gpinfer/kernels/"
                "stacked.py:StackedCovariances.vjp", flops, flops)


def _gradient_tail(B: int, M: int, D: int, learn_inducing: bool) -> list[Term]:
    """The gradient terms sep and ep share: ``B_q^-1`` for the prior term, ``G_K``, ``G_uf`` and
    the kernel VJP."""
    return [
        Term("gradient: B_q^-1 for the prior term: potri 2 M^3/3 (coded: two solves "
             "against I, 2 M^3)", f"{_STACKED}:stacked_matrix_gradients (q.B_inv())",
             2 * M**3 / 3, 2 * M**3),
        Term("gradient: G_K = L^-T inner L^-1: 2 M^3", f"{_STACKED}:stacked_matrix_gradients",
             2 * M**3, 2 * M**3),
        Term("gradient: G_uf = L^-T X: M^2 B", f"{_STACKED}:stacked_matrix_gradients",
             M**2 * B, M**2 * B),
        _vjp_term(B, M, D, learn_inducing),
    ]


def sep_step_terms(B: int, M: int, C: int, D: int, n_latent: int,
                   learn_inducing: bool = True) -> list[Term]:
    """Itemised ``sep_step_flops`` (every term already multiplied by ``n_latent``)."""
    B, M, D = float(B), float(M), float(D)
    per_class = _class_terms(B, M, D) + [
        # TiedSites.update -> _tied_sums
        Term("update: the site sums whitened on the step's factor, P_w = L^T Lam L: two "
             "triangular multiplies 2 M^3 (coded: the kept whitened sums moved by "
             "T = L_old^-1 L, T^T P_w T, three triangular multiplies, 3 M^3)",
             f"{_STACKED}:rebased via {_STATE}:TiedSites._whitened_sums", 2 * M**3,
             3 * M**3),
        Term("update: chol of the cavity B = I + f P_w: M^3/3",
             f"{_STACKED}:StackedGaussians.__init__", M**3 / 3, M**3 / 3),
        Term("update: cavity projections R = L_B^-1 A: M^2 B",
             f"{_STACKED}:StackedGaussians.project", M**2 * B, M**2 * B),
        Term("update: new site precision A diag(tau) A^T (syrk): M^2 B",
             f"{_STATE}:_tied_sums (A diag(tau) A^T)", M**2 * B, M**2 * B),
        Term("update: back to u-space L^-T P L^-1: 2 M^3 (coded 0 per step: the sums are "
             "kept whitened, Lam and h formed only when read, e.g. a snapshot per epoch)",
             f"{_STACKED}:StackedTerms.to_u_space", 2 * M**3, 0.0),
        # TiedSites.evaluate
        Term("evaluate: whiten the updated site sums again: needed 0 (a round trip of the "
             "to_u_space just done with the same L; keep * P_w_old + rho * A diag(tau) A^T is "
             "the result), coded 4 M^3",
             f"{_STATE}:_SiteSums._whitened_sums (now kept from the update)",
             0.0, 4 * M**3),
        Term("evaluate: chol of B_q and of the cavity B_cav: 2 M^3/3",
             f"{_STACKED}:StackedGaussians.__init__", 2 * M**3 / 3, 2 * M**3 / 3),
        Term("evaluate: cavity projections R = L_Bcav^-1 A: M^2 B",
             f"{_STACKED}:StackedGaussians.project", M**2 * B, M**2 * B),
        Term("gradient: B_cav^-1 A diag(E) = L_B^-T (R diag E): M^2 B",
             f"{_STACKED}:stacked_matrix_gradients", M**2 * B, M**2 * B),
        Term("gradient: S_B = A diag(b) A^T (syrk; S_E = 2 S_B is free): M^2 B",
             f"{_STACKED}:stacked_matrix_gradients (A diag(b) A^T)", M**2 * B, M**2 * B),
        Term("gradient: B_cav^-1 S_E: two triangular solves 2 M^3",
             f"{_STACKED}:StackedGaussians.B_inv", 2 * M**3, 2 * M**3),
        *_gradient_tail(B, M, D, learn_inducing),
    ]
    return _scaled(per_class, float(n_latent))


def sep_step_flops(B: int, M: int, C: int, D: int, n_latent: int, *,
                   learn_inducing: bool = True, coded: bool = False) -> float:
    """FLOP of one sep mini-batch step (``TrainingLoop``'s step: ``TiedSites.terms_at``,
    ``TiedSites.update``, ``TiedSites.evaluate``, ``hp.gradient``; then an Adam step, O(P)).

    Per latent (``n_latent = C`` for the argmax likelihood; ``C`` enters only element-wise
    work, which is not counted):

    * kernel terms, ``gpinfer/sites/stacked.py:stacked_terms``: ``Kuf`` distances ``2 M B D``,
      ``chol(Kuu)`` ``M^3/3``, ``A = L^-1 Kuf`` ``M^2 B``;
    * ``TiedSites.update`` (state.py): whitening ``L^T Lam L`` ``2 M^3`` (coded: the kept
      whitened sums moved to the step's factor, ``rebased``, ``3 M^3``), cavity Cholesky
      ``M^3/3``, projections ``L_B^-1 A`` ``M^2 B`` (``StackedGaussians.project``), new site
      precision ``A diag(tau) A^T`` ``M^2 B`` (``_tied_sums``, syrk), ``to_u_space``
      ``2 M^3`` (coded 0: formed only when read);
    * ``TiedSites.evaluate``: the re-whitening of the just-updated sums is a round trip of
      ``to_u_space`` with the same ``L`` (counted 0, coded ``4 M^3``), Cholesky of ``B_q`` and
      ``B_cav`` ``2 M^3/3``, projections ``M^2 B``;
    * ``stacked_matrix_gradients`` (stacked.py): ``L_B^-T (R diag E)`` ``M^2 B``,
      ``S_B = A diag(b) A^T`` ``M^2 B``, ``B_cav^-1 S_E`` ``2 M^3``, ``B_q^-1`` ``2 M^3/3``
      (potri; coded as two solves against ``I``, ``2 M^3``), ``G_K = L^-T inner L^-1``
      ``2 M^3``, ``G_uf = L^-T X`` ``M^2 B``;
    * kernel VJP (``gpinfer/hyper.py:_stacked_parameter_gradient`` ->
      ``StackedCovariances.vjp``): ``G @ Xb`` ``2 M B D`` when the inducing inputs are learned
      (the default); the distances are kept from the forward pass.

    needed = ``n_latent * (4 M B D + 7 M^2 B + 10 M^3)``;
    coded = ``n_latent * (4 M B D + 7 M^2 B + 43/3 M^3)``.
    """
    return _sum(sep_step_terms(B, M, C, D, n_latent, learn_inducing), coded)


def sep_iteration_flops(N: int, B: int, M: int, C: int, D: int, n_latent: int, *,
                        learn_inducing: bool = True, coded: bool = False) -> float:
    """One reported sep iteration in mini-batch mode: an epoch of ``ceil(N / B)`` steps
    (``TrainingLoop._minibatch``; the last batch has ``N mod B`` points when ``B`` does not divide
    ``N``). Nothing else at the epoch's end (TiedSites has no ``refresh``)."""
    return sum(count * sep_step_flops(b, M, C, D, n_latent, learn_inducing=learn_inducing,
                                      coded=coded) for b, count in _epoch_batches(N, B))


# --------------------------------------------------------------------------------------------
# ep: rank-one sites (plugins/gpinfer-ep/gpinfer_ep/state.py:RankOneSites)
# --------------------------------------------------------------------------------------------


def ep_step_terms(B: int, M: int, C: int, D: int, n_latent: int,
                  learn_inducing: bool = True) -> list[Term]:
    """Itemised ``ep_step_flops`` (every term already multiplied by ``n_latent``)."""
    B, M, D = float(B), float(M), float(D)
    per_class = _class_terms(B, M, D) + [
        # RankOneSites.update
        Term("update: whiten the site sums L^T Lam L: 2 M^3 (coded 4 M^3, general GEMMs)",
             f"{_STACKED}:StackedTerms.to_whitened via {_STATE}:_SiteSums._whitened_sums", 2 * M**3,
             4 * M**3),
        Term("update: chol(B_q): M^3/3", f"{_STACKED}:StackedGaussians.__init__",
             M**3 / 3, M**3 / 3),
        Term("update: projections on the current directions L_B^-1 A: M^2 B",
             f"{_STACKED}:StackedGaussians.project", M**2 * B, M**2 * B),
        Term("update: stored directions in whitened coordinates L^T U_old: triangular "
             "multiply M^2 B (coded as a general GEMM, 2 M^2 B)",
             f"{_STATE}:RankOneSites.update (transpose(terms.L) @ U_old)", M**2 * B,
             2 * M**2 * B),
        Term("update: projections on the stored directions L_B^-1 (L^T U_old): M^2 B",
             f"{_STACKED}:StackedGaussians.project", M**2 * B, M**2 * B),
        Term("update: new directions Ups = L^-T A: M^2 B",
             f"{_STACKED}:StackedTerms.unwhiten via {_STATE}:RankOneSites.update",
             M**2 * B, M**2 * B),
        Term("update: add Ups diag(tau) Ups^T (syrk): M^2 B",
             f"{_STATE}:RankOneSites.update (U diag(tau) U^T)", M**2 * B, M**2 * B),
        Term("update: remove U_old diag(tau_old) U_old^T (syrk): M^2 B",
             f"{_STATE}:RankOneSites.update (U diag(tau) U^T)", M**2 * B, M**2 * B),
        # RankOneSites.evaluate
        Term("evaluate: whiten the updated site sums: 2 M^3 (coded 4 M^3)",
             f"{_STACKED}:StackedTerms.to_whitened via {_STATE}:RankOneSites.evaluate",
             2 * M**3, 4 * M**3),
        Term("evaluate: chol(B_q): M^3/3", f"{_STACKED}:StackedGaussians.__init__",
             M**3 / 3, M**3 / 3),
        Term("evaluate: projections L_B^-1 A: M^2 B", f"{_STACKED}:StackedGaussians.project",
             M**2 * B, M**2 * B),
        Term("gradient: B^-1 A diag(E) = L_B^-T (R diag E): M^2 B",
             f"{_STACKED}:stacked_matrix_gradients", M**2 * B, M**2 * B),
        Term("gradient: S_B = A diag(b) A^T (syrk): M^2 B",
             f"{_STACKED}:stacked_matrix_gradients (A diag(b) A^T)", M**2 * B, M**2 * B),
        Term("gradient: S_E = A diag(E) A^T (syrk): M^2 B",
             f"{_STACKED}:stacked_matrix_gradients (A diag(b) A^T)", M**2 * B, M**2 * B),
        Term("gradient: B^-1 S_E: 2 M^3", f"{_STACKED}:StackedGaussians.B_inv",
             2 * M**3, 2 * M**3),
        *_gradient_tail(B, M, D, learn_inducing),
    ]
    return _scaled(per_class, float(n_latent))


def ep_step_flops(B: int, M: int, C: int, D: int, n_latent: int, *,
                  learn_inducing: bool = True, coded: bool = False) -> float:
    """FLOP of one ep mini-batch step (``TrainingLoop._step`` with ``RankOneSites``).

    Per latent (``n_latent = C``; ``C`` itself enters only element-wise work):

    * kernel terms (stacked.py:stacked_terms): ``2 M B D + M^3/3 + M^2 B``;
    * ``RankOneSites.update`` (state.py): whitening ``2 M^3`` (coded ``4 M^3``),
      ``chol(B_q)`` ``M^3/3``, projections on the current directions ``L_B^-1 A`` ``M^2 B``,
      stored directions in whitened coordinates ``L^T U_old`` ``M^2 B`` (a triangular
      multiply; coded as a general GEMM, ``2 M^2 B``), their projections ``M^2 B``, new
      directions ``L^-T A`` ``M^2 B``, the fold-in ``Ups diag(tau) Ups^T`` and
      ``U_old diag(tau_old) U_old^T`` ``2 M^2 B`` (syrk);
    * ``RankOneSites.evaluate``: whitening ``2 M^3`` (coded ``4 M^3``; needed, the fold-in was
      in u-space), ``chol(B_q)`` ``M^3/3``, projections ``M^2 B``;
    * ``stacked_matrix_gradients``: ``L_B^-T (R diag E)``, ``S_B``, ``S_E`` (EP has its own
      ``E``), ``G_uf``: ``4 M^2 B``; ``B^-1 S_E`` ``2 M^3``, ``B^-1`` ``2 M^3/3`` (coded
      ``2 M^3``), ``G_K`` ``2 M^3``;
    * kernel VJP ``G @ Xb`` ``2 M B D`` (inducing inputs learned).

    needed = ``n_latent * (4 M B D + 12 M^2 B + 29/3 M^3)``;
    coded = ``n_latent * (4 M B D + 13 M^2 B + 15 M^3)``.
    Per epoch add ``ep_epoch_extra_flops`` (the site-sum refresh).
    """
    return _sum(ep_step_terms(B, M, C, D, n_latent, learn_inducing), coded)


def ep_epoch_extra_flops(N: int, M: int, n_latent: int) -> float:
    """End of an ep epoch: ``RankOneSites.refresh`` recomputes ``Lam_c = U_c diag(tau_c)
    U_c^T`` from all ``N`` stored directions (syrk, ``M^2 N`` per latent; state.py:refresh).
    It only removes floating-point drift of the incremental fold-ins; the per-epoch snapshot
    (a deep copy of ``U [C, M, N]``, ``TrainingLoop._minibatch``) is memory traffic, not FLOP."""
    return float(n_latent) * float(M) ** 2 * float(N)


def ep_iteration_flops(N: int, B: int, M: int, C: int, D: int, n_latent: int, *,
                       learn_inducing: bool = True, coded: bool = False) -> float:
    """One reported ep iteration in mini-batch mode: ``ceil(N / B)`` steps plus the refresh."""
    steps = sum(count * ep_step_flops(b, M, C, D, n_latent, learn_inducing=learn_inducing,
                                      coded=coded) for b, count in _epoch_batches(N, B))
    return steps + ep_epoch_extra_flops(N, M, n_latent)


# --------------------------------------------------------------------------------------------
# svi (plugins/gpinfer-svi/gpinfer_svi/method.py, plugins/gpinfer-svi/gpinfer_svi/variational.py)
# --------------------------------------------------------------------------------------------

_VAR = "plugins/gpinfer-svi/gpinfer_svi/variational.py"
#: ``gpinfer.kernels.fixed.DISTANCE_CACHE_MAX_ENTRIES``: svi caches the ``[M, N]`` distances up
#: to this
SVI_DISTANCE_CACHE_MAX_ENTRIES = 30_000_000


def svi_step_terms(B: int, M: int, D: int, n_latent: int, *, learn_inducing: bool = False,
                   ard: bool = False, distances_cached: bool = True,
                   natural_gradient: bool = False) -> list[Term]:
    """Itemised ``svi_step_flops`` (every term already multiplied by ``n_latent``)."""
    B, M, D = float(B), float(M), float(D)
    generic = learn_inducing  # fast path (gpinfer.kernels.fixed) only with Z fixed
    kern = 2 * M * B * D if (generic or ard or not distances_cached) else 0.0
    vjp = 2 * M * B * D if (generic or ard) else 0.0
    per = [
        Term("Kub: distances 2 M B D (0 on the default fast path: isotropic RBF, Z fixed, "
             "[N, M] distances cached once at set-up)",
             "gpinfer/kernels/stacked.py:_fixed_forward (fixed.py:fixed_matrices; generic: "
             "kernel.K)", kern, kern),
        Term("chol(Kuu): M^3/3", f"{_VAR}:uncollapsed_elbo", M**3 / 3, M**3 / 3),
        Term("Rb = L_K^-1 Kub: M^2 B", f"{_VAR}:uncollapsed_elbo", M**2 * B, M**2 * B),
        Term("A = L_K^-T Rb: M^2 B", f"{_VAR}:uncollapsed_elbo", M**2 * B, M**2 * B),
        Term("Lq^T A: triangular multiply M^2 B (coded as a general GEMM, 2 M^2 B)",
             f"{_VAR}:uncollapsed_elbo (LtA)", M**2 * B, 2 * M**2 * B),
        Term("KL: P = L_K^-1 Lq and Kuu^-1 Lq = L_K^-T P: 2 M^3", f"{_VAR}:_kl_terms",
             2 * M**3, 2 * M**3),
        Term("Pv = A diag(gv) A^T: syrk M^2 B (coded as a general GEMM, 2 M^2 B)",
             f"{_VAR}:uncollapsed_elbo (Pv)", M**2 * B, 2 * M**2 * B),
        Term("Pv Lq: triangular multiply M^3 (coded 2 M^3)", f"{_VAR}:uncollapsed_elbo (dLq)",
             M**3, 2 * M**3),
        Term("Kuu^-1 Sigma = (Kuu^-1 Lq) Lq^T: triangular multiply M^3 (coded 2 M^3)",
             f"{_VAR}:uncollapsed_elbo (Kinv_S)", M**3, 2 * M**3),
        Term("Kuu^-1: potri 2 M^3/3 (coded: solve against I M^3 + syrk M^3)",
             f"{_VAR}:uncollapsed_elbo (Lk_inv, Kinv)", 2 * M**3 / 3, 2 * M**3),
        Term("G_uf = (Kuu^-1 Lq) (Lq^T A): 2 M^2 B", f"{_VAR}:uncollapsed_elbo (G_uf)",
             2 * M**2 * B, 2 * M**2 * B),
        Term("SP = (Kuu^-1 Sigma) Pv: 2 M^3", f"{_VAR}:uncollapsed_elbo (SP)", 2 * M**3,
             2 * M**3),
        Term("(Kuu^-1 Lq)(Kuu^-1 Lq)^T: syrk M^3", f"{_VAR}:uncollapsed_elbo (G_uu)", M**3, M**3),
        Term("dSigma's Sigma^-1 = Lq^-T Lq^-1: potri 2 M^3/3 with natural gradients, else 0 "
             "(dSigma is unused then); coded with natural gradients only: potri M^3 + Pv",
             f"{_VAR}:uncollapsed_elbo (with_dSigma)",
             2 * M**3 / 3 if natural_gradient else 0.0, 2 * M**3 if natural_gradient else 0.0),
        Term("kernel VJP: 2 M B D with learned Z (G @ Xb) or ARD (H @ A); 0 on the isotropic "
             "fast path (element-wise)",
             "gpinfer/kernels/stacked.py:_fixed_vjp (fixed.py:fixed_gradient) / "
             "gpinfer/hyper.py",
             vjp, vjp),
    ]
    if natural_gradient:
        per += [
            Term("natural step: Sigma^-1 again: 0 (duplicate of dSigma's), coded M^3 + M^3",
                 f"{_VAR}:natural_gradient_step (Lq_inv, Lam)", 0.0, 2 * M**3),
            Term("natural step: chol(Lambda'): M^3/3", f"{_VAR}:natural_gradient_step",
                 M**3 / 3, M**3 / 3),
            Term("natural step: Sigma' = Lambda'^-1: potri 2 M^3/3 (coded M^3 + syrk M^3)",
                 f"{_VAR}:natural_gradient_step (W, W^T W)", 2 * M**3 / 3, 2 * M**3),
            Term("natural step: chol(Sigma'): M^3/3", f"{_VAR}:natural_gradient_step",
                 M**3 / 3, M**3 / 3),
        ]
    return _scaled(per, float(n_latent))


def svi_step_flops(B: int, M: int, D: int, n_latent: int, *, learn_inducing: bool = False,
                   ard: bool = False, distances_cached: bool = True,
                   natural_gradient: bool = False, coded: bool = False) -> float:
    """FLOP of one svi mini-batch step (``VariationalState.estimate`` ->
    ``gpinfer_svi/variational.py:uncollapsed_elbo`` + kernel gradient; then an AdaDelta step,
    O(P)). ``n_latent`` = 1 for logit/probit, ``C`` for robust-max/softmax.

    Per latent, with the defaults (isotropic RBF, inducing inputs fixed -> the fast path of
    ``gpinfer/kernels/fixed.py:fixed_matrices``, the fixed-input mode of
    ``gpinfer/kernels/stacked.py``, distances cached once when ``M N <= 3e7``):

    * forward (``uncollapsed_elbo``): ``chol(Kuu)`` ``M^3/3``, ``Rb = L_K^-1 Kub`` ``M^2 B``,
      ``A = L_K^-T Rb`` ``M^2 B``, ``Lq^T A`` ``M^2 B`` (triangular; coded as a GEMM
      ``2 M^2 B``);
    * backward: ``_kl_terms`` ``Kuu^-1 Lq`` ``2 M^3``; ``Pv = A diag(gv) A^T`` ``M^2 B``
      (syrk; coded as a GEMM ``2 M^2 B``); ``Pv Lq`` ``M^3`` (coded ``2 M^3``);
      ``Kuu^-1 Sigma`` ``M^3`` (coded ``2 M^3``); ``Kuu^-1`` ``2 M^3/3`` (coded ``2 M^3``);
      ``G_uf`` ``2 M^2 B``; ``SP`` ``2 M^3``; ``(Kuu^-1 Lq)(.)^T`` ``M^3`` (syrk);
    * ``dSigma``'s ``Sigma^-1`` (variational.py, ``Lq_inv``): counted 0 unless
      ``natural_gradient`` (nothing reads ``dSigma`` otherwise; not coded then either),
      coded ``2 M^3``;
    * kernel: 0 on the fast path (element-wise ``exp`` of cached distances); ``4 M B D``
      (matrix + VJP) with ``learn_inducing`` or ``ard``; ``2 M B D`` when the distances are not
      cached (``distances_cached=False``, ``M N > 3e7``).
    * ``natural_gradient``: add ``natural_gradient_step`` (chol, potri, chol:
      ``4/3 M^3``; its ``Sigma^-1`` duplicates ``dSigma``'s and counts 0).

    needed (defaults) = ``n_latent * (6 M^2 B + 8 M^3)``;
    coded (defaults) = ``n_latent * (8 M^2 B + 34/3 M^3)``.
    """
    return _sum(svi_step_terms(B, M, D, n_latent, learn_inducing=learn_inducing, ard=ard,
                               distances_cached=distances_cached,
                               natural_gradient=natural_gradient), coded)


def svi_steps_per_iteration(N: int, B: int | None, report_every: int | None = None) -> int:
    """Steps per reported svi iteration: ``report_every``, by default
    ``max(1, round(0.1 * ceil(N / B)))`` (``SVI._fit_stochastic``; full batch: 1)."""
    if report_every:
        return int(report_every)
    spe = 1 if B is None else steps_per_epoch(N, B)
    return max(1, round(0.1 * spe))


# --------------------------------------------------------------------------------------------
# pep, full batch, binary (plugins/gpinfer-pep/gpinfer_pep/method.py, .../rank_one.py)
# --------------------------------------------------------------------------------------------

_R1 = "plugins/gpinfer-pep/gpinfer_pep/rank_one.py"
#: sweeps per bound evaluation assumed when they were not counted (measured 26-46 on a
#: synthetic N = 20 000, D = 3 problem with the defaults; pep reports its own counts)
PEP_DEFAULT_SWEEPS_PER_EVAL = 30


def pep_evaluation_terms(N: int, M: int, D: int, sweeps: float, *,
                         learn_inducing: bool = True) -> list[Term]:
    """Itemised cost of ``sweeps`` site sweeps and the fixed work of one bound evaluation
    (``_Classification.evaluate``: ``converge`` = geometry + ``run_sites``; ``energy``;
    ``parameter_gradient``). Parallel schedule (the default)."""
    N, M, D, S = float(N), float(M), float(D), float(sweeps)
    vjp = 2 * M * N * D if learn_inducing else 0.0
    return [
        Term("geometry: Kuf distances 2 M N D", f"{_R1}:kernel_geometry",
             2 * M * N * D, 2 * M * N * D),
        Term("geometry: chol(Kuu + jitter): M^3/3", f"{_R1}:matrix_geometry",
             M**3 / 3, M**3 / 3),
        Term("geometry: A = L^-1 Kuf: M^2 N", f"{_R1}:matrix_geometry", M**2 * N,
             M**2 * N),
        Term("set_geometry: B = I + A diag(tau) A^T: syrk M^2 N (coded as a general GEMM "
             "(A * tau) @ A.T, 2 M^2 N) + chol(B) M^3/3", f"{_R1}:RankOnePEPSites._rebuild",
             M**2 * N + M**3 / 3, 2 * M**2 * N + M**3 / 3),
        Term("per sweep: cavities C = L_B^-1 A: M^2 N", f"{_R1}:RankOnePEPSites.cavity",
             S * M**2 * N, S * M**2 * N),
        Term("per sweep: rebuild B (syrk M^2 N, coded 2 M^2 N) + chol(B) M^3/3",
             f"{_R1}:RankOnePEPSites._parallel -> _rebuild",
             S * (M**2 * N + M**3 / 3), S * (2 * M**2 * N + M**3 / 3)),
        Term("energy: C = L_B^-1 A: M^2 N", f"{_R1}:RankOnePEPSites.cavity(with_P=True)",
             M**2 * N, M**2 * N),
        Term("energy: P = L^-T L_B^-T C: 2 M^2 N", f"{_R1}:RankOnePEPSites.cavity(with_P=True)",
             2 * M**2 * N, 2 * M**2 * N),
        Term("energy: W = L^-T A: M^2 N", f"{_STACKED}:StackedTerms.W", M**2 * N, M**2 * N),
        Term("energy: G = (-Xi d1 + W dv - 2 Zeta dv) W^T: one GEMM 2 M^2 N (coded as three "
             "GEMMs with the same right factor W^T, 6 M^2 N)", f"{_R1}:RankOnePEPSites.energy",
             2 * M**2 * N, 6 * M**2 * N),
        Term("energy: beta = L^-T (I - B^-1) L^-1: 8/3 M^3 (coded 4 M^3)",
             f"{_R1}:RankOnePEPSites.beta", 8 * M**3 / 3, 4 * M**3),
        Term("gradient: Kuf VJP w.r.t. Z: G @ X 2 M N D (distances from the kernel memo while "
             "M D + N D + 2 M N <= 2^22; beyond that they are recomputed, +2 M N D coded)",
             "gpinfer/hyper.py:_latent_gradients -> gpinfer/kernels/stationary.py",
             vjp, vjp + (0.0 if M * D + N * D + 2 * M * N <= 1 << 22 else 2 * M * N * D)),
    ]


def pep_iteration_flops(N: int, M: int, D: int, nfev: float, sweeps: float | None = None, *,
                        learn_inducing: bool = True, coded: bool = False) -> float:
    """FLOP of one reported pep iteration, full batch, binary classification.

    One reported iteration is one L-BFGS-B iteration (``_Fit.maximize_lbfgs`` ->
    ``gpinfer/optim/lbfgs.py``): ``nfev`` bound evaluations (usually 1; the first iteration also
    holds the evaluation at the starting point, so 2; more when the line search backtracks).
    Each evaluation (``_Classification.evaluate``) re-installs the geometry, runs parallel site
    sweeps to convergence (``converge`` -> ``RankOnePEPSites.run``, warm-started) and evaluates
    the energy with its gradient. ``sweeps`` is the total number of site sweeps over the
    iteration's evaluations (default ``nfev * PEP_DEFAULT_SWEEPS_PER_EVAL``, a rough guess).
    pep reports both counts of each iteration in ``IterationInfo.extra`` (``nfev``,
    ``sweeps``).

    Per evaluation with ``S`` sweeps (rank_one.py):

    * geometry (``kernel_geometry``/``matrix_geometry``): distances ``2 M N D``,
      ``chol(Kuu)`` ``M^3/3``, ``A = L^-1 Kuf`` ``M^2 N``;
    * ``set_geometry`` -> ``_rebuild``: ``B = I + A diag(tau) A^T`` ``M^2 N`` (syrk; coded as a
      general GEMM, ``2 M^2 N``) + ``chol(B)`` ``M^3/3``;
    * each sweep (``_parallel``): cavities ``L_B^-1 A`` ``M^2 N``, rebuild ``M^2 N`` (coded
      ``2 M^2 N``) + ``M^3/3``;
    * ``energy``: ``L_B^-1 A`` ``M^2 N``, ``P`` ``2 M^2 N``, ``W = L^-T A`` ``M^2 N``,
      ``G`` ``2 M^2 N`` (coded as three GEMMs, ``6 M^2 N``), ``beta`` ``8/3 M^3``
      (coded ``4 M^3``);
    * kernel VJP w.r.t. ``Z`` (``learn_inducing``, default True): ``2 M N D``.

    needed = ``nfev (4 M N D + 8 M^2 N + 10/3 M^3) + S (2 M^2 N + M^3/3)``;
    coded = ``nfev (4 M N D + 13 M^2 N + 14/3 M^3) + S (3 M^2 N + M^3/3)`` (+ ``2 M N D`` per
    evaluation once ``M D + N D + 2 M N > 2^22``: the kernel's distance memo,
    ``gpinfer/kernels/stationary.py:Stationary._distances``, then keeps nothing and the VJP
    recomputes the distances). Not in any iteration: the initial ``set_geometry`` before the
    first evaluation (method.py ``_Classification.fit``, repeated by that evaluation), the
    re-evaluation of the final point after L-BFGS-B (``_Fit.maximize_lbfgs``) and the
    post-training geometry, sweeps and energy in ``fit``.
    """
    nfev = float(nfev)
    S = nfev * PEP_DEFAULT_SWEEPS_PER_EVAL if sweeps is None else float(sweeps)
    fixed = _sum(pep_evaluation_terms(N, M, D, 0.0, learn_inducing=learn_inducing), coded)
    per_sweep = _sum(pep_evaluation_terms(N, M, D, 1.0, learn_inducing=learn_inducing),
                     coded) - fixed
    return nfev * fixed + S * per_sweep


# --------------------------------------------------------------------------------------------
# Dispatcher (what scale_suite.py calls)
# --------------------------------------------------------------------------------------------

_WARNED: set[str] = set()


# --------------------------------------------------------------------------------------------
# Collapsed JJ / Taylor bounds (plugins/gpinfer-jj)
# --------------------------------------------------------------------------------------------

#: Stage-1 rounds of the collapsed methods (``n_upd``, default options)
COLLAPSED_N_UPD = 3


def collapsed_iteration_flops(method: str, N: int, M: int, nfev: float,
                              n_upd: int = COLLAPSED_N_UPD,
                              guard_halvings: float | None = None) -> float:
    """Needed FLOP of one reported iteration of vi-jj / vi-taylor / vi-jj-hybrid / vi-jj-full.

    Every term is ``N M^2``-sized (``M^3`` and ``O(N M)`` work is not counted; a triangular
    solve or ``syrk`` with ``N`` right-hand sides is ``N M^2``, a general ``[M, M] x [M, N]``
    product or contraction ``2 N M^2``):

    * Stage 1 (not vi-jj-full), ``n_upd`` closed-form rounds at fixed ``theta``, each
      ``C = I + 2 R Gamma R^T`` (syrk: ``N M^2``) and, for the JJ rule, the marginal variances
      ``||L_C^-1 r_i||^2`` (``N M^2``); the marginals of the carried ``q(u)`` are those of the
      previous Stage-2 end point (no product). (``gpinfer_jj.method._stage1``,
      ``gpinfer_jj.taylor.newton_rounds``)
    * Stage 2, ``nfev`` evaluations of the bound and its gradient
      (``gpinfer_jj.bound.CollapsedObjective.value_and_grad``). The first is at the Stage-1
      end point, where ``R``, ``C`` and the marginals are known: only the ``Kuf`` part of the
      kernel gradient (``2 N M^2``). Each further one: ``R = L_K^-1 Kuf`` (``N M^2``), ``C``
      (``N M^2``), the contraction (``2 N M^2``) and, where ``xi`` moves too (hybrid), the
      marginal variances for ``dF/dxi`` (``N M^2``): ``4`` or ``5 N M^2``.
    * vi-jj-full: ``nfev`` evaluations at new points, ``5 N M^2`` each.
    * vi-taylor's Stage-2 guard (``extra["guard_halvings"]`` given,
      ``gpinfer_jj.taylor.guarded_step``): the ELBO of ``q(u)`` at the start and at the
      proposal, one pass for the marginal variances each (``2 N M^2``; the proposal is the last
      L-BFGS-B point, whose ``R`` and ``C`` are kept), and per halving (at most
      ``GUARD_HALVINGS = 4``) ``R``, ``C`` and the variances at the new trial (``3 N M^2``).
    """
    nm2 = float(N) * M * M
    if method == "vi-jj-full":
        return float(nfev) * 5.0 * nm2
    per_eval = 5.0 if method == "vi-jj-hybrid" else 4.0
    stage2 = (2.0 + per_eval * (float(nfev) - 1.0)) * nm2 if nfev >= 1 else 0.0
    stage1 = n_upd * (1.0 if method == "vi-taylor" else 2.0) * nm2
    guard = 0.0
    if method == "vi-taylor" and guard_halvings is not None and math.isfinite(guard_halvings):
        guard = (2.0 + 3.0 * min(float(guard_halvings), 4.0)) * nm2
    return stage1 + stage2 + guard


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def iteration_flops(method: str, extra: dict[str, float] | None = None, *, n: int, m: int,
                    d: int, n_latent: int, batch: int | None, coded: bool = False) -> float:
    """Needed FLOP of one reported iteration of ``method`` with default options.

    ``extra``: that iteration's ``IterationInfo.extra``. Used keys: svi ``steps_in_iteration``
    (else the default ``report_every``; its own ``steps`` key is cumulative), pep ``nfev`` and
    ``sweeps`` (per iteration; else 1 evaluation and ``PEP_DEFAULT_SWEEPS_PER_EVAL`` sweeps,
    with a warning), the collapsed methods' ``nfev`` (per iteration; vi-jj-full's own
    key is cumulative: pass the difference). Methods without a model here give NaN (with a warning).
    """
    extra = dict(extra or {})
    if method in ("sep", "ep"):
        if batch is None:
            _warn_once(method, f"flop_models: no model of {method} in batch mode; NaN")
            return math.nan
        fn = sep_iteration_flops if method == "sep" else ep_iteration_flops
        return fn(n, batch, m, n_latent, d, n_latent, coded=coded)
    if method == "svi":
        steps = extra.get("steps_in_iteration") or svi_steps_per_iteration(n, batch)
        cached = m * n <= SVI_DISTANCE_CACHE_MAX_ENTRIES
        return float(steps) * svi_step_flops(n if batch is None else batch, m, d, n_latent,
                                             distances_cached=cached, coded=coded)
    if method == "pep":
        if batch is not None:
            _warn_once("pep-batch", "flop_models: pep is modelled in full-batch mode only; NaN")
            return math.nan
        if "nfev" not in extra:
            _warn_once("pep", "flop_models: pep's extra has no nfev/sweeps; assuming 1 "
                       "evaluation and "
                       f"{PEP_DEFAULT_SWEEPS_PER_EVAL} sweeps per iteration")
        nfev = float(extra.get("nfev", 1.0))
        return pep_iteration_flops(n, m, d, nfev, extra.get("sweeps"), coded=coded)
    if method in ("vi-jj", "vi-taylor", "vi-jj-hybrid", "vi-jj-full"):
        return collapsed_iteration_flops(method, n, m, float(extra.get("nfev", math.nan)),
                                         guard_halvings=extra.get("guard_halvings"))
    _warn_once(method, f"flop_models: no FLOP model for method {method!r}; NaN")
    return math.nan


def main() -> None:
    """Print the models at the scale suite's sizes (M = 100, B = 500)."""
    M, B = 100, 500
    print(f"{'method':<6} {'N':>7} {'D':>3} {'L':>2} {'GFLOP/step':>11} {'steps/it':>8} "
          f"{'GFLOP/it':>9} {'coded GFLOP/it':>15}")
    for N, D, C in ((200_000, 3, 2), (100_000, 10, 2), (100_000, 50, 2), (100_000, 3, 3)):
        for meth in ("sep", "ep", "svi", "pep"):
            if meth == "pep" and C > 2:
                continue
            L = C if meth in ("sep", "ep") else (1 if C == 2 else C)
            if meth == "sep":
                step, k = sep_step_flops(B, M, C, D, L), steps_per_epoch(N, B)
            elif meth == "ep":
                step, k = ep_step_flops(B, M, C, D, L), steps_per_epoch(N, B)
            elif meth == "svi":
                step, k = svi_step_flops(B, M, D, L), svi_steps_per_iteration(N, B)
            else:
                step, k = pep_iteration_flops(N, M, D, 1, 0), 1
            batch = None if meth == "pep" else B
            it = iteration_flops(meth, {"nfev": 1, "sweeps": PEP_DEFAULT_SWEEPS_PER_EVAL},
                                 n=N, m=M, d=D, n_latent=L, batch=batch)
            itc = iteration_flops(meth, {"nfev": 1, "sweeps": PEP_DEFAULT_SWEEPS_PER_EVAL},
                                  n=N, m=M, d=D, n_latent=L, batch=batch, coded=True)
            print(f"{meth:<6} {N:>7} {D:>3} {L:>2} {step / 1e9:>11.4f} {k:>8} "
                  f"{it / 1e9:>9.2f} {itc / 1e9:>15.2f}")
    print(f"(pep: 'GFLOP/step' is one evaluation without sweeps; GFLOP/it assumes 1 evaluation "
          f"and {PEP_DEFAULT_SWEEPS_PER_EVAL} sweeps)")


if __name__ == "__main__":
    main()

"""Sparse multi-class EP and SEP (Villacampa-Calvo & Hernandez-Lobato 2017; spec ep-sep §2).

Both methods train in the core training loop (``gpinfer.training.loop.TrainingLoop``); they
differ only in their site state (``RankOneSites`` for EP, ``TiedSites`` for SEP), which
``SparseSites`` presents to the loop as a ``SiteApproximation``. Batch mode (``batch_size``
None, spec §2.8.1): an iteration is one parallel damped sweep over all factors plus one
sign-adaptive ascent step on the hyper-parameters (``schedule="inner"``), or EP to convergence
then one step (``schedule="outer"``). Mini-batch mode (§2.8.3-2.8.4): an iteration is one epoch;
for every batch its sites are refined (no damping), then one Adam step on the
``N/|batch|``-scaled gradient.

Failure policy (§2.5.4, the loop's): a non-finite site, an invalid cavity or a failed Cholesky
restores the last good state (sites and hyper-parameters), halves the damping and every learning
rate and retries. Divergence (batch mode): when log Z_q has stayed below its best value for
``patience`` iterations, the state with the best log Z_q is restored and the damping and every
learning rate are halved. (The sign-adaptive steps grow by 2 % an iteration up to 1 in log
units; once they overshoot, log Z_q falls and oscillates, which a count of *consecutive* falls
misses: waveform, M = 5 %, climbed to -98.4 at iteration 212 and fell to -108.7 by 250 without
two dozen falls in a row.) Both are reported in ``IterationInfo.extra`` (``failures``,
``damping_raises``, ``damping``).

Data-parallel (``gpinfer.training.distributed``, issue 24 item 2): in a ``torch.distributed``
process group of ``K`` ranks, sep's mini-batch fit takes each rank's part of every global batch
(``SparseSites.prepare``); the tied update sums the ranks' site contributions
(``TiedSites.group``) and the loop averages the objective and gradient (``TrainingLoop.group``),
so every rank holds the one-process fit on the union batches. ep, full-batch sep, ``compile``,
``time_limit_s`` and batches with fewer points than ranks are refused before training
(``_check_group``).

Optimiser coordinates (spec §2.9): the paper steps in ``log l`` with ``l = ell^2`` the *squared*
length-scale, while the kernels' unconstrained parameter is ``log ell``. Both optimisers therefore
act on ``xi = d * theta`` with ``d = 2`` for length-scale entries (1 elsewhere) and gradient
``g / d``; in ``log ell`` units a sign-adaptive step is a quarter (an Adam step half) of what it
would be in the kernels' own coordinates.
"""

from __future__ import annotations

from typing import ClassVar, cast

import numpy as np

from gpinfer.backend import ops
from gpinfer.backend.choice import NUMPY, Backend
from gpinfer.backend.compile import COMPILE_MODES, check_compile
from gpinfer.data.source import host_rows
from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters
from gpinfer.inducing import INDUCING_INITS
from gpinfer.interfaces import (
    Array,
    FitCallback,
    FitResult,
    Likelihood,
    Method,
    ObjectiveValue,
    Problem,
    Scalar,
    SiteApproximation,
)
from gpinfer.kernels.initialisation import lengthscale_init_option
from gpinfer.numerics.cholesky import jittered_cholesky
from gpinfer.options import Option, choice, flag, integer, real
from gpinfer.parallel import blas_threads_for, check_n_jobs
from gpinfer.posterior import InducingPosterior
from gpinfer.sites.stacked import (
    StackedGaussians,
    StackedTerms,
    stacked_terms,
    symmetrize,
)
from gpinfer.training import distributed
from gpinfer.training.loop import Schedule, TrainingLoop
from gpinfer_ep.model import check_likelihood, class_kernels, initial_inducing
from gpinfer_ep.state import RankOneSites, TiedSites

#: failed updates tolerated in one fit before giving up
MAX_FAILURES = 30


class _SparseEPBase(Method):
    """Shared options and loop of ``ep`` and ``sep``.

    Options: ``damping`` (initial rho, batch mode), ``damping_decay`` (per iteration),
    ``learning_rate`` (initial sign-adaptive step), ``adam_learning_rate`` (mini-batch),
    ``schedule`` (``"inner"``/``"outer"``), ``outer_tol``/``outer_max_sweeps``, ``noise``
    (white-noise variance added to the kernel if it has none; None: none), ``noise_in_Kuu``
    (spec P10; True: the noise is on ``diag Kuu`` and in ``kappa``; False: in ``kappa``, i.e. the
    FITC variances, only, via ``LatentNoise``), ``lengthscale_init``
    (``"median"``: spec §2.11 heuristic; ``"kernel"``: keep; ``"auto"``, the default: keep a
    ``Kernel`` object held fixed, else the median, ``gpinfer.kernels.initialisation``), ``patience``
    (iterations below the best log Z_q before the best state is restored and the damping and
    steps are halved), ``time_limit_s`` (stop after this much training time; the callback's time,
    where test metrics are computed, is not counted, nor is it in ``elapsed``), ``n_jobs`` (threads
    for the per-class kernel VJPs, ``gpinfer.parallel``: same results; one BLAS thread meanwhile),
    ``read_every`` (mini-batch on a device: the loss and checks read once per ``k`` steps, the same
    fit with fewer host syncs: ``gpinfer.training.loop``), ``compile`` (torch: ``"default"`` runs
    the step's tensor regions ``torch.compile``d, ``"reduce-overhead"`` adds CUDA graphs on a GPU; a
    compiled mini-batch fit drops each epoch's last short batch: ``gpinfer.backend.compile``).
    """

    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    multiclass: ClassVar[bool] = True
    uses_inducing_points: ClassVar[bool] = True
    supports_minibatch: ClassVar[bool] = True
    supports_out_of_core: ClassVar[bool] = True
    likelihoods: ClassVar[tuple[str, ...]] = ("argmax",)
    option_spec: ClassVar[dict[str, Option]] = {
        "damping": real(0.5, "(0, 1]", doc="initial damping rho (batch)"),
        "damping_decay": real(0.99, "(0, 1]", doc="damping factor per iteration"),
        "learning_rate": real(0.01, "(0, inf)", doc="initial sign-adaptive step (batch)"),
        "adam_learning_rate": real(0.001, "(0, inf)", doc="Adam step (mini-batch)"),
        "schedule": choice("inner", ("inner", "outer")),
        "outer_tol": real(1e-3, "(0, inf)"),
        "outer_max_sweeps": integer(1000, "[1, inf)"),
        "noise": real(1.0, "(0, inf)", none=True, doc="white noise added to the kernel"),
        "noise_in_Kuu": flag(True, doc="spec P10"),
        "lengthscale_init": lengthscale_init_option(),
        "inducing_init": choice("random", INDUCING_INITS,
                                doc="random: M training inputs per class (the paper's)"),
        "patience": integer(20, "[1, inf)", doc="iterations below the best before a restore"),
        "time_limit_s": real(None, "(0, inf)", none=True),
        "n_jobs": integer(1, "[1, inf)", also=(-1,), doc="threads for the per-class kernel VJPs"),
        "read_every": integer(1, "[1, inf)",
                              doc="mini-batch on a device: read values and checks every k steps"),
        "compile": choice("none", COMPILE_MODES, doc="torch.compile the step (torch only)"),
    }

    backends: ClassVar[tuple[str, ...]] = ("numpy", "torch")

    def make_state(self, y: Array, C: int, M: int, backend: Backend) -> RankOneSites | TiedSites:
        raise NotImplementedError

    def shared_inducing(self) -> bool:
        """Whether one kernel and one ``Z`` serve every class (sep's option; ep: never)."""
        return False

    # -- entry point -------------------------------------------------------------------------
    def fit(self, problem: Problem, callback: FitCallback | None = None) -> FitResult:
        return self._train(problem, callback)

    def _train(self, problem: Problem, callback: FitCallback | None,
               start: tuple[FitResult, dict[str, Array]] | None = None) -> FitResult:
        """The fit; from ``start`` = ``(fitted, sites)`` (``refine``): ``fitted``'s kernels
        and inducing inputs, held fixed, and the site state ``sites`` (``snapshot``'s)."""
        check_likelihood(problem, self.name)
        o = self.options
        schedule = self._schedule()
        schedule.check(self.name, problem.batch_size is not None)
        compile_mode = check_compile(o["compile"], problem.backend, f"{self.name} option")
        X, y = host_rows(problem.X), np.asarray(problem.y, dtype=np.int64)
        shared = self.shared_inducing()
        if start is None:
            kernels = class_kernels(problem, o["noise"], o["lengthscale_init"],
                                    o["noise_in_Kuu"])
            Zs = initial_inducing(problem, self.name, self.options["inducing_init"],
                                  n_latent=1 if shared else None)
        else:
            post = cast(InducingPosterior, start[0].posterior)
            kernels, Zs = [k.copy() for k in post.kernels], [np.array(z) for z in post.Z]
            if shared:
                check_shared_fit(kernels, Zs, self.name)
        if shared:  # one kernel and one Z for every class (the classes' copies are equal)
            kernels, Zs = kernels[:1], Zs[:1]
        backend = problem.backend
        group = distributed.current()
        if group is not None:
            self._check_group(problem, group)
        # on a device the kernel parameters stay there between steps (SparseSites.posterior
        # and the end of the fit write them into ``kernels``: hp.sync_host)
        hp = HyperParameters(kernels, Z=[backend.asarray(z) for z in Zs],
                             optimize=problem.optimize and start is None,
                             device_kernels=not backend.is_numpy)
        n_jobs = check_n_jobs(o["n_jobs"], f"{self.name} option n_jobs")
        state = self.make_state(y, problem.n_classes, Zs[0].shape[0], backend)
        if shared:
            cast(TiedSites, state).shared = True
        if group is not None:
            cast(TiedSites, state).group = group
        if start is not None:
            state.restore({k: backend.asarray(v) for k, v in start[1].items()})
        sites = SparseSites(state, kernels, hp, X, problem.likelihood, backend, group)
        # the paper steps in log l with l = ell^2 (spec §2.9): xi = 2 theta for length-scales
        coordinates = np.where(hp.kernel_entries("lengthscale"), 2.0, 1.0)
        loop = TrainingLoop(self.name, problem, sites, hp, X, schedule, callback,
                            time_limit_s=o["time_limit_s"], coordinates=coordinates,
                            n_jobs=n_jobs, compile_mode=compile_mode, group=group)
        with blas_threads_for(n_jobs):
            loop.run()
        hp.sync_host()  # ``kernels`` hold the fitted parameters
        posterior = sites.posterior()
        return FitResult(
            posterior=posterior,
            log_evidence=loop.value,
            kernel=kernels,
            n_iter=loop.iteration,
            history=loop.history,
            state={**posterior.state(), "theta": ops.to_host(hp.pack()),
                   "failures": np.array(loop.failures), "damping": np.array(loop.rho),
                   **self.site_state(state)},
        )

    def _check_group(self, problem: Problem, group: distributed.Group) -> None:
        """``InputError`` for what of sep is not data-parallel in a process group (ep, whose
        per-point sites are not, declares no ``supports_process_group``): full-batch training,
        ``compile``, ``time_limit_s`` (the ranks would stop at different steps) and a batch
        with fewer points than ranks."""
        where = "in a process group (torch.distributed)"
        if problem.batch_size is None:
            raise InputError(f"{self.name}: full-batch training is not available {where}; "
                             "give a batch_size")
        if self.options["compile"] != "none":
            raise InputError(f"{self.name}: compile is not available {where}; use "
                             "compile='none'")
        if self.options["time_limit_s"] is not None:
            raise InputError(f"{self.name}: time_limit_s is not available {where}; bound the "
                             "fit by max_iter")
        smallest = distributed.smallest_batch(problem.X.shape[0], problem.batch_size)
        if smallest < group.size:
            raise InputError(f"{self.name}: a batch of {smallest} points for {group.size} "
                             f"ranks {where}; choose batch_size so that every batch has at "
                             "least one point per rank")

    def _schedule(self) -> Schedule:
        """The site and hyper-parameter schedule from this method's options."""
        o = self.options
        return Schedule(kind=o["schedule"], damping=float(o["damping"]),
                        damping_decay=float(o["damping_decay"]),
                        outer_tol=float(o["outer_tol"]),
                        outer_max_sweeps=int(o["outer_max_sweeps"]),
                        learning_rate=float(o["learning_rate"]),
                        adam_learning_rate=float(o["adam_learning_rate"]),
                        patience=int(o["patience"]), max_failures=MAX_FAILURES,
                        read_every=int(o["read_every"]))

    def site_state(self, state: RankOneSites | TiedSites) -> dict[str, Array]:
        """The site arrays ``refine`` starts from, on the host, under ``site_`` names in the
        result's ``state`` (none for a method without ``refines``)."""
        return {}


class SparseSites(SiteApproximation):
    """The site state of ep / sep (``RankOneSites`` / ``TiedSites``) as the core training loop
    drives it: ``prepare`` moves a batch's inputs from the host ``X`` to the backend and
    computes their kernel terms at the current kernels and inducing inputs (``hp``), ``update``
    and ``objective`` run the state's moment matching and ``log Z_q`` with its per-class matrix
    gradients on them. Full-batch inputs are moved once.
    """

    def __init__(self, state: RankOneSites | TiedSites, kernels: list, hp: HyperParameters,
                 X: Array, likelihood: Likelihood, backend: Backend = NUMPY,
                 group: distributed.Group | None = None):
        self.state, self.kernels, self.hp, self.X = state, kernels, hp, X
        self.group = group  # a process group: each batch's terms are of this rank's points
        self.likelihood = likelihood
        self.backend = backend
        self._prepared: tuple[Array, StackedTerms, Array] | None = None  # (batch, terms, inputs)
        self._all_inputs: Array | None = None

    def _inducing(self) -> list[Array]:
        if self.hp.Z is None:
            raise TypeError("ep/sep hyper-parameters carry inducing inputs")
        return self.hp.Z

    def _batch_terms(self) -> tuple[Array, StackedTerms, Array]:
        if self._prepared is None:
            raise RuntimeError("SparseSites: call prepare(batch) before update / objective")
        return self._prepared

    def _inputs(self, batch: Array) -> Array:
        """``X[batch]`` on the backend (the whole of ``X`` is moved once)."""
        if batch.shape[0] == self.X.shape[0]:
            if self._all_inputs is None:
                self._all_inputs = self.backend.asarray(self.X)
            return self._all_inputs
        return self.backend.asarray(self.X[batch])

    def prepare(self, batch: Array, iteration: int) -> None:
        if self.group is not None:
            batch = self.group.rows(batch)
        inputs = self._inputs(batch)
        cov = self.hp.covariances(inputs)  # shared with the VJPs of hp.gradient (one version)
        Zs = self._inducing() if cov is None else cov.Z
        terms = self.state.terms_at(self.kernels, Zs, inputs, iteration, covariances=cov)
        self._prepared = (batch, terms, inputs)

    def batch_inputs(self) -> Array:
        return self._batch_terms()[2]

    def update(self, damping: float, iteration: int) -> Scalar:
        batch, terms, _ = self._batch_terms()
        return self.state.update(terms, batch, damping, iteration=iteration)

    def objective(self, scale: float, iteration: int) -> ObjectiveValue:
        batch, terms, _ = self._batch_terms()
        value, grads = self.state.evaluate(terms, batch, scale, iteration=iteration)
        return ObjectiveValue(value, grads)

    def snapshot(self) -> object:
        return self.state.snapshot()

    def restore(self, snapshot: object) -> None:
        self.state.restore(snapshot)
        self._prepared = None  # the terms belong to other hyper-parameters: prepare again

    def end_epoch(self) -> None:
        self.state.refresh()

    def posterior(self) -> InducingPosterior:
        """``q(u_c) = N(m_c, S_c)`` per class, on the host (pickles without the backend)."""
        self.hp.sync_host()  # ``self.kernels`` hold the current parameters
        Zs = self._inducing()
        terms = self.state.terms_at(self.kernels, Zs, self.backend.asarray(self.X[:1]))
        q = StackedGaussians(*terms.to_whitened(self.state.Lam, self.state.h))
        m, S = (ops.to_host(a).astype(float) for a in q.moments(terms.L))
        C = self.state.h.shape[0]
        kernels = self.kernels * C if len(self.kernels) != C else self.kernels  # shared: one
        Z = [ops.to_host(z).astype(float) for z in Zs]
        return InducingPosterior(self.likelihood, [k.copy() for k in kernels],
                                 Z * C if len(Z) != C else Z, list(m), list(S))


class EP(_SparseEPBase):
    """Sparse multi-class EP: one rank-one site per (point, non-label class) pair and role;
    memory ``O(N M C)`` (spec §2)."""

    name: ClassVar[str] = "ep"
    float64_reason: ClassVar[str] = (
        "its rank-one sites are removed by subtraction (cavity denominators 1 - C1 v and "
        "u-space site sums updated in place), which loses all digits in float32; use sep for "
        "float32")

    def make_state(self, y: Array, C: int, M: int, backend: Backend) -> RankOneSites:
        return RankOneSites(y, C, M, backend=backend)


class SEP(_SparseEPBase):
    """Stochastic EP: sites tied per class, memory ``O(C M^2)`` whatever ``N`` (spec §2.3.1).

    ``shared_inducing`` (default ``False``, the paper's model: a kernel and ``Z_c`` per class):
    one kernel and one ``Z [M, D]`` shared by every class, GPflow SVGP's model. ``Kuu``, its
    Cholesky factor and ``L^-1 Kuf`` are formed once per step and broadcast over the classes'
    tied sites (``gpinfer.sites.stacked.shared_terms``); the kernel and ``Z`` gradients are the
    classes' sums (``shared_matrix_gradients``). Equal to the per-class model whose classes all
    have that kernel and ``Z``.
    """

    name: ClassVar[str] = "sep"
    float32: ClassVar[bool] = True
    #: data-parallel mini-batch fits (``_check_group``: the tied sites' sums all-reduced)
    supports_process_group: ClassVar[bool] = True
    option_spec: ClassVar[dict[str, Option]] = {
        **_SparseEPBase.option_spec,
        "shared_inducing": flag(False, doc="one Z and one kernel shared by every class"),
    }

    def shared_inducing(self) -> bool:
        return bool(self.options["shared_inducing"])

    #: ``refine``: the tied sites at the fit's kernel parameters and inducing inputs
    refines: ClassVar[bool] = True
    #: early stopping's ``refit="auto"``: the refit for the chosen count, then 50 sweeps of the
    #: tied sites at its hyper-parameters (better than the refit alone on all six wine and
    #: breast_cancer replicas of ``benchmarks/early_stopping.py``; sep's average loses)
    early_stopping_rule: ClassVar[tuple[bool | str, int]] = (True, 50)

    def make_state(self, y: Array, C: int, M: int, backend: Backend) -> TiedSites:
        return TiedSites(y, C, M, backend=backend)

    def site_state(self, state: RankOneSites | TiedSites) -> dict[str, Array]:
        """``site_Lam [C, M, M]`` and ``site_h [C, M]``: the tied sites (host arrays)."""
        return {"site_Lam": np.array(ops.to_host(state.Lam)),
                "site_h": np.array(ops.to_host(state.h))}

    def refine(self, problem: Problem, fitted: FitResult,
               callback: FitCallback | None = None) -> FitResult:
        """The tied sites updated further (the fit's schedule, no hyper-parameter step) at
        ``fitted``'s kernel parameters and inducing inputs, held fixed, from its sites
        (``site_Lam``, ``site_h`` in its ``state``) (``Method.refine``)."""
        post = fitted.posterior
        if not isinstance(post, InducingPosterior):
            raise InputError("sep.refine needs a fit of sep (an InducingPosterior); got "
                             f"{type(post).__name__}")
        if "site_Lam" in fitted.state:
            sites = {"Lam": fitted.state["site_Lam"], "h": fitted.state["site_h"]}
        else:  # a posterior alone (an iterate): the sites that give its q(u)
            sites = tied_sites_of(post, np.asarray(problem.X[:1], dtype=float))
        return self._train(problem, callback, (fitted, sites))


def check_shared_fit(kernels: list, Zs: list[Array], method: str) -> None:
    """``InputError`` unless every class of a fit has the same kernel parameters and ``Z``
    (a fit ``shared_inducing`` can start from: its classes' copies are one)."""
    if not all(np.array_equal(z, Zs[0]) for z in Zs) or not all(k == kernels[0]
                                                                 for k in kernels):
        raise InputError(f"{method}: shared_inducing needs a fit whose classes share one "
                         "kernel and one Z (a shared_inducing fit); this one has a kernel and "
                         "Z per class")


def tied_sites_of(posterior: InducingPosterior, x: Array) -> dict[str, Array]:
    """The ``u``-space site sums ``Lam [C, M, M]``, ``h [C, M]`` whose ``q(u_c) = N(m_c,
    S_c)`` is ``posterior``'s: ``S^-1 = Kuu^-1 + Lam`` and ``S^-1 m = h``, with ``Kuu`` the
    jittered one of the site algebra (``stacked_terms`` at one input row ``x [1, D]``, whose
    factor ``L [C, M, M]`` gives ``Kuu^-1``); all classes at once. ``NumericalError`` naming
    the class for a covariance ``S_c`` that is not positive definite."""
    L = np.asarray(ops.to_host(stacked_terms(posterior.kernels, posterior.Z, x).L), float)
    # both factors are this function's own (a fresh stack, the local terms' L): inverted in place
    S_inv, _ = ops.cho_inverse(jittered_cholesky(np.stack(posterior.S),
                                                 name="posterior covariance S").L, overwrite=True)
    Kuu_inv, _ = ops.cho_inverse(L, overwrite=True)
    return {"Lam": symmetrize(S_inv - Kuu_inv),
            "h": np.einsum("cij,cj->ci", S_inv, np.stack(posterior.m))}

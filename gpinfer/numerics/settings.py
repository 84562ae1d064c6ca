"""Numerical knobs named in one place (never buried as literals in method code)."""

from __future__ import annotations

import numpy as np

#: first jitter added to the diagonal (relative to the mean diagonal) when a Cholesky fails
JITTER_START = 1e-10
#: largest relative jitter tried before giving up
JITTER_MAX = 1e-2
#: factor between successive jitter attempts
JITTER_FACTOR = 10.0
#: jitter added to the inducing covariances ``Kuu`` and to ``kappa`` (spec ep-sep §1.2, the
#: reference code): the sparse families' ``gpinfer.sites.inducing.inducing_jitter``
INDUCING_JITTER = 1e-10
#: the same in single precision, where 1e-10 is below round-off (float32 eps is 1.2e-7)
INDUCING_JITTER_FLOAT32 = 1e-6
#: box on the unconstrained (log) kernel and likelihood parameters of full-batch L-BFGS-B fits
#: (e^-14 .. e^12, i.e. 8e-7 .. 1.6e5): keeps line searches sane and stops the evidence's climb
#: towards an infinite signal variance on separable data (pep, fitc, vfe; the dense driver uses
#: the upper end only, see ``gpinfer.sites.driver``)
LOG_PARAMETER_BOUNDS = (-14.0, 12.0)
#: the vi-jj family's default box on the log kernel parameters (its ``bounds`` option; spec
#: jj-taylor-svi §4.2, widened): 1e-4 .. 1e6
VI_LOG_PARAMETER_BOUNDS = (float(np.log(1e-4)), float(np.log(1e6)))
#: IVM's box on every unconstrained hyper-parameter during learning (+-8: e^-8 .. e^8)
IVM_LOG_PARAMETER_BOUND = 8.0
#: default number of Gauss-Hermite nodes for expectations under moderate variances
GAUSS_HERMITE_POINTS = 40

# -- likelihood numerics (normal functions, the 1-D Gaussian-integral engine, multi-class rules) --
#: below this argument (t < -cut) probit derivatives psi'' .. psi'''' use asymptotic series
PROBIT_ASYMPTOTIC_CUT = 10.0
#: number of terms of those asymptotic series (in powers of 1/t^2)
PROBIT_ASYMPTOTIC_TERMS = 18
#: smallest latent variance used internally (larger inputs are untouched; 0 is floored to this)
VARIANCE_FLOOR = 1e-200
#: logistic: for |t| > cut, log sigmoid(t) equals min(t, 0) to double precision (binary §1.3)
LOGISTIC_TAIL_CUT = 36.0
#: probit: beyond t > cut, log Phi(t) is 0 to double precision (log Phi(9) = -1.1e-19)
PROBIT_TAIL_CUT = 9.0
#: Gaussian-integral engine: half-width of the integration window in standard deviations
ENGINE_WINDOW_SD = 12.0
#: engine: Gauss-Legendre panels in the middle part (where the likelihood varies)
ENGINE_MIDDLE_PANELS = 96
#: engine: Gauss-Legendre panels on each outer part (plain Gaussian expectations only)
ENGINE_OUTER_PANELS = 32
#: engine: Gauss-Legendre nodes per panel
ENGINE_PANEL_NODES = 8
#: engine: safeguarded-Newton iterations used to locate a tilted mode
ENGINE_MODE_ITERATIONS = 60
#: multi-class argmax probability (ep-sep §2.10): base trapezoid step, standardised variable
ARGMAX_BASE_STEP = 0.25
#: multi-class argmax probability: the step is halved up to this many times for unequal variances
ARGMAX_MAX_REFINEMENTS = 8
#: multi-class argmax probability: half-width of the trapezoid window around the integrand's mode
ARGMAX_WINDOW = 12.0
#: multi-class argmax probability (predictions): nodes whose log integrand is provably this many
#: nats below the peak are skipped (their total weight is below round-off)
ARGMAX_NEGLIGIBLE_NATS = 50.0
#: multi-class expectations (softmax, power != 1): target number of nodes of the product
#: Gauss-Hermite rule on the (C-1)-dimensional subspace orthogonal to the ones vector
MULTICLASS_GH_NODE_BUDGET = 8192
#: multi-class expectations: fewest and most Gauss-Hermite nodes per dimension
MULTICLASS_GH_MIN_ORDER = 3
MULTICLASS_GH_MAX_ORDER = 128
#: largest number of floats in one block of a vectorised multi-class quadrature (memory bound)
QUADRATURE_CHUNK_FLOATS = 2**22
#: floats in one block of the blocked O(N M) passes over data rows (2 MiB: a few fit in the L3
#: cache, so the element-wise work around each BLAS call touches the block while it is cached)
CACHE_BLOCK_FLOATS = 2**18
#: multi-class nested expectations (argmax with noise: expected log-likelihood, power != 1), whose
#: integrand is itself a 1-D quadrature: node budget of the outer Gauss-Hermite product rule
MULTICLASS_NESTED_GH_NODE_BUDGET = 1024
#: largest Gauss-Hermite rule numpy computes reliably (its weights underflow beyond ~350 nodes)
GAUSS_HERMITE_MAX_POINTS = 300
#: engine: extra panels, graded geometrically in |t|, on the left outer part of a link whose left
#: tail is not linear (probit: its derivatives vary on the scale |t| there)
ENGINE_GRADED_PANELS = 24

#: Gauss-Hermite nodes of the Bernoulli variational expectations (svi's ELBO, spec
#: jj-taylor-svi §3.2)
VARIATIONAL_GAUSS_HERMITE_POINTS = 100
#: Gauss-Hermite nodes in ``f_y`` of the robust-max ``"gauss_hermite"`` expectation rule
ROBUSTMAX_GAUSS_HERMITE_POINTS = 20
#: Monte-Carlo draws per point of the softmax ``"monte_carlo"`` expectation rule
SOFTMAX_MC_SAMPLES = 32

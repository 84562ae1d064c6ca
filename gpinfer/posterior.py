"""The one fitted-posterior type every method returns.

A ``Posterior`` predicts latent means and variances ``[N*, L]`` at new inputs and turns them
into class probabilities through its likelihood. Representations shared by many methods live
here: the dense diagonal-site form (Laplace, EP, KL, VB, LR; spec binary §1.4, the "B-trick")
and independent Gaussians over inducing values per latent (sparse EP/SEP, Power EP, VI).
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Sequence
from functools import reduce

import numpy as np

from gpinfer.backend import ops
from gpinfer.interfaces import Likelihood
from gpinfer.kernels.base import Kernel
from gpinfer.numerics.cholesky import jittered_cholesky, tri_solve

Array = np.ndarray


def class_columns(P: Array, n_classes: int) -> Array:
    """Host class probabilities as ``[N, C]``: a binary ``[N]`` or ``[N, 1]`` (the probability of
    class 1) becomes ``[1 - p, p]``; anything else is returned as float64."""
    P = np.asarray(ops.to_host(P), dtype=np.float64)
    if P.ndim == 1 or (P.ndim == 2 and P.shape[1] == 1 and n_classes == 2):
        p1 = P.reshape(-1)
        P = np.stack([1.0 - p1, p1], axis=1)
    return P


class Posterior(abc.ABC):
    """An approximate posterior over the latent functions, ready for prediction."""

    def __init__(self, likelihood: Likelihood):
        self.likelihood = likelihood

    @abc.abstractmethod
    def predict_f(self, X: Array) -> tuple[Array, Array]:
        """Latent predictive means and variances at ``X [N*, D]``, each ``[N*, L]``."""

    def _likelihood_args(self, mean: Array, var: Array) -> tuple[Array, Array]:
        """The likelihood's arguments: on the latent predictions' device when the likelihood
        computes there (``device_predictions``), else on the host (``[N*, L]`` values)."""
        if not self.likelihood.device_predictions:
            mean, var = ops.to_host(mean), ops.to_host(var)
        if self.likelihood.multiclass:
            return mean, var
        return mean[:, 0], var[:, 0]

    def predict_proba(self, X: Array) -> Array:
        """Class probabilities ``[N*, C]`` on the host; rows sum to one."""
        moments = self._likelihood_args(*self.predict_f(X))
        return ops.to_host(self.likelihood.predict_proba(*moments))

    def log_predictive(self, X: Array, y: Array) -> Array:
        """``log p(y_n | x_n, data)`` for test points, ``[N*]``, on the host."""
        return ops.to_host(
            self.likelihood.log_predictive(y, *self._likelihood_args(*self.predict_f(X))))

    def state(self) -> dict[str, Array]:
        """Named arrays describing the posterior (saved as the run's artifact)."""
        return {}

    def __repr__(self) -> str:
        """The class, the likelihood, the kernels and the shapes of the arrays, e.g.
        ``InducingPosterior(likelihood=Softmax, kernels=3 x RBF, Z=3 x [20, 4], ...)``."""
        shown = [f"{key}={_summary(value)}" for key, value in vars(self).items()
                 if not key.startswith("_")]
        return f"{type(self).__name__}({', '.join(shown)})"


def _summary(value: object) -> str:
    """A short description of a posterior's attribute: a likelihood's class name, a kernel's
    repr, an array's shape ``[N, D]``, ``L x ...`` for a list of alike ones."""
    if isinstance(value, Likelihood):
        return type(value).__name__
    if isinstance(value, Kernel):
        return repr(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"[{', '.join(str(int(n)) for n in shape)}]"
    if isinstance(value, list | tuple) and value:
        parts = [type(v).__name__ if isinstance(v, Kernel) else _summary(v) for v in value]
        if len(value) == 1:
            return f"[{_summary(value[0])}]"
        return f"{len(parts)} x {parts[0]}" if len(set(parts)) == 1 else f"[{', '.join(parts)}]"
    if isinstance(value, bool | int | float | str | None):
        return repr(value)
    return type(value).__name__


class DenseSitePosterior(Posterior):
    """``q(f) = N(K alpha, (K^-1 + W)^-1)`` with diagonal ``W = diag(sqrt_w**2)`` (one latent).

    ``L_B`` is the Cholesky factor of ``B = I + diag(sqrt_w) K diag(sqrt_w)``.
    Prediction: ``mu* = k*^T alpha``, ``var* = k** - ||L_B^-1 (sqrt_w * k*)||^2``.
    """

    def __init__(
        self,
        likelihood: Likelihood,
        kernel: Kernel,
        X_train: Array,
        alpha: Array,
        sqrt_w: Array,
        L_B: Array,
    ):
        super().__init__(likelihood)
        self.kernel = kernel
        self.X_train = X_train
        self.alpha = alpha
        self.sqrt_w = sqrt_w
        self.L_B = L_B

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        Ks = self.kernel.K(self.X_train, X)  # [N, N*]
        mean = Ks.T @ self.alpha
        V = tri_solve(self.L_B, self.sqrt_w[:, None] * Ks)
        var = self.kernel.K_diag(X) - np.sum(V * V, axis=0)
        return mean[:, None], np.maximum(var, 1e-300)[:, None]

    def state(self) -> dict[str, Array]:
        return {"alpha": self.alpha, "sqrt_w": self.sqrt_w, "X_train": self.X_train}


class InducingPosterior(Posterior):
    """Independent ``q(u_l) = N(m_l, S_l)`` over inducing values for each latent ``l``.

    * ``kernels``: one kernel per latent (length ``L``); ``Z``: inducing inputs per latent,
      each ``[M_l, D]``; ``m``: means, each ``[M_l]``; ``S``: covariances, each ``[M_l, M_l]``.

    Prediction (per latent): ``A = Kuu^-1 Ku*``, ``mean = A^T m``,
    ``var = k** - diag(Ku*^T Kuu^-1 Ku*) + diag(A^T S A)``. The arrays are kept on the host
    (a fitted posterior pickles without a GPU); ``predict_f`` runs where ``X`` lives: host
    inputs on numpy, a torch tensor on its device and dtype (``gpinfer.backend``).
    """

    def __init__(
        self,
        likelihood: Likelihood,
        kernels: Sequence[Kernel],
        Z: Sequence[Array],
        m: Sequence[Array],
        S: Sequence[Array],
    ):
        super().__init__(likelihood)
        if not (len(kernels) == len(Z) == len(m) == len(S)):
            raise ValueError("kernels, Z, m and S need one entry per latent function")
        self.kernels = list(kernels)
        self.Z = [np.asarray(z) for z in Z]
        self.m = [np.asarray(v) for v in m]
        self.S = [np.asarray(s) for s in S]
        self._Luu = [jittered_cholesky(k.K(z)).L for k, z in zip(self.kernels, self.Z)]

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        X = ops.as_array(X)
        xp = ops.namespace(X)
        floor = 1e-300 if str(X.dtype).endswith("float64") else 1e-30  # variances > 0
        means, variances = [], []
        for kern, Z, m, S, Luu in zip(self.kernels, self.Z, self.m, self.S, self._Luu):
            Z, m, S, Luu = (ops.like(X, a) for a in (Z, m, S, Luu))
            Kus = kern.K(Z, X)  # [M, N*]
            V = ops.solve_triangular(Luu, Kus)  # Luu^-1 Ku*
            A = ops.solve_triangular(Luu, V, transpose=True)  # Kuu^-1 Ku*
            means.append(ops.mT(A) @ m)
            var = kern.K_diag(X) - xp.sum(V * V, axis=0) + xp.sum(A * (S @ A), axis=0)
            variances.append(xp.clip(var, min=floor))
        return xp.stack(means, axis=1), xp.stack(variances, axis=1)

    def state(self) -> dict[str, Array]:
        out: dict[str, Array] = {}
        for l, (Z, m, S) in enumerate(zip(self.Z, self.m, self.S)):
            out[f"Z_{l}"], out[f"m_{l}"], out[f"S_{l}"] = Z, m, S
        return out


class AveragedPosterior(Posterior):
    """An equally weighted mixture of fitted posteriors ``members`` (``K`` of them, alike: the
    same likelihood and number of latents), e.g. the validation folds' models of early stopping
    with ``refit="average"`` (``gpinfer.training.early_stopping``).

    It predicts as their average: ``predict_proba`` is the mean of the members' class
    probabilities (``[N*, C]``, or ``[N*]`` for a binary likelihood, as theirs), and
    ``log_predictive`` the log of the mean of their predictive densities, ``[N*]``. The test
    NLL of the average is at most the average of the members' (Jensen). ``predict_f`` gives the
    mixture's latent moments ``[N*, L]`` (the mean of the means; the mean of ``var + mean^2``
    less the squared mean), which are exact for the mixture but are not what its class
    probabilities are computed from. ``likelihood`` is the first member's.
    """

    def __init__(self, members: Sequence[Posterior]):
        if not members:
            raise ValueError("AveragedPosterior needs at least one member posterior")
        super().__init__(members[0].likelihood)
        self.members = list(members)

    def predict_f(self, X: Array) -> tuple[Array, Array]:
        moments = [member.predict_f(X) for member in self.members]
        k = len(moments)
        mean = reduce(operator.add, [m for m, _ in moments]) / k
        second = reduce(operator.add, [v + m * m for m, v in moments]) / k
        floor = 1e-300 if str(mean.dtype).endswith("float64") else 1e-30
        return mean, ops.namespace(mean).clip(second - mean * mean, min=floor)

    def predict_proba(self, X: Array) -> Array:
        each = [np.asarray(ops.to_host(member.predict_proba(X))) for member in self.members]
        return reduce(operator.add, each) / len(each)

    def log_predictive(self, X: Array, y: Array) -> Array:
        logs = np.stack([np.asarray(ops.to_host(member.log_predictive(X, y)), dtype=float)
                         for member in self.members])  # [K, N*]
        return np.logaddexp.reduce(logs, axis=0) - np.log(len(self.members))

    def state(self) -> dict[str, Array]:
        """The members' arrays, ``member<k>_<name>``."""
        return {f"member{k}_{key}": value for k, member in enumerate(self.members)
                for key, value in member.state().items()}

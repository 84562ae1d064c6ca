"""Early stopping: hold out a validation fraction, watch its NLL, keep the best iterate.

Several methods pass through a much better test NLL than the one they end with (vi-robustmax on
wine: 0.047 then 0.114; sep on breast_cancer: 0.073 then 0.105): the hyper-parameters keep
climbing the training objective after the predictions have stopped improving. With
``validation_fraction`` set, the estimators hold out that fraction of the training data
(stratified by class, ``split_validation``), and ``ValidationMonitor`` - a fit callback that
works for every method, since every method reports ``IterationInfo.posterior`` - computes the
validation NLL every ``validation_interval`` iterations, remembers the best iterate and asks
training to stop (its return value ``True``, see ``gpinfer.reporting``) after
``n_iter_no_change`` checks without improvement.

What the fit then keeps (``EarlyStopping.refit``): by default (``refit="auto"``, ``AUTO``) the
rule the method declares, ``Method.early_stopping_rule = (refit, refine_iter)``
(``EarlyStopping.resolved``; a regressor refits where the rule averages): svi and its presets
such as vi-robustmax ``("average", 250)``, sep ``(True, 50)``, every other method ``(True, 0)``
(the measurements that chose them are below and in ``benchmarks/early_stopping.py``).
Explicitly:

* ``refit=True``: the method is trained again, on *all* the data (the held-out
  part included), up to the point the validation chose (``best_iteration``, ``k``). The model
  does not lose the data it held out. (Keeping the best iterate of the fit on the reduced data
  met the 5 % target of ``benchmarks/early_stopping.py`` in 1 of 6 cases: on wine and
  breast_cancer, 20 % is 30-100 points that the model then never sees.) Where the refit stops
  (``refit_rule``):

  - ``"iterations"`` (the default): for ``k`` iterations.
  - ``"objective"``: at the first iteration whose training objective *per point* reaches the
    level the monitored fits had at ``k`` (their mean of objective / training rows, a fit
    that stopped before ``k`` at its last value; ``level_target``, ``RefitStop``), or at
    ``max_iter``. The idea: the refit's path is not the folds' path (more rows, other
    optimiser steps), so the same *count* may land at another stage of the fit.
  - ``"gain"``: where the objective per point has gained as much since the first iteration as
    the folds' had at ``k`` (insensitive to a level shift between folds and refit).

  Why the count stays the default (``benchmarks/early_stopping.py``, 10 stratified test
  folds, test NLL of the stop over the best one count on the mean path): sep on wine 1.006
  with the count, 1.257 with ``"objective"``; the objective per point of a fit on more rows
  is higher at the same stage (the prior's cost is shared by more points), so the refit reaches
  the folds' level early (iteration ~160 where the folds chose 250). ``"gain"`` removes that
  offset for sep (1.013) but on vi-robustmax's L-BFGS-B path the first iterations differ
  between folds and refit and it often never reaches the target (wine 1.806 against 1.312).
  No transfer rule measured beat the count on the four (dataset, method) pairs together.
  With ``"objective"`` or ``"gain"``, a mini-batch fit (a noisy objective) or a method whose
  objective is a surrogate (``objective_kind``) still takes the count.
* ``refit=False``: the best validation iterate's posterior of the fit on the reduced data
  (``restore``), with no second fit (a single hold-out only).
* ``refit="average"`` (``AVERAGE``): no second fit; every monitored fit's own best validation
  iterate is kept and the model predicts with the mean of their class probabilities
  (``averaged_result``, ``gpinfer.posterior.AveragedPosterior``: K members, each trained on
  ``(K - 1) / K`` of the data; the NLL of the average is at most the average of theirs). It
  sidesteps the choice of one count, where the refit loses on vi-robustmax, at the price of
  models that never see a K-th of the data, and K times the prediction cost and model size.
  With one hold-out it is the one model (as ``refit=False``). Classifiers only (a regressor's
  folds learn their own noise variances). Measured (``benchmarks/early_stopping.py``, ratio of
  means over 10 stratified test folds per replica r1-r3, 5 folds inside; target <= 1.05):
  vi-robustmax wine 1.312 / 1.146 / 1.405 with the refit -> 1.216 / 1.062 / 1.061 averaged,
  breast_cancer 1.196 / 1.010 / 1.076 -> 1.110 / 0.917 / 1.012 (better on all six replicas;
  on the three replicas' pooled mean path wine 1.189 -> 1.018, breast_cancer 1.059 -> 0.979);
  but vi-robustmax digits (3 test folds) 1.077 -> 1.104 with K = 5 forced and 1.014 -> 1.051
  with the default hold-out (its one model), sep wine r1 / r2 1.006 /
  1.035 -> 1.449 / 1.194 (sep's best is near the end of the path, and a model on 4/5 of 128-160
  rows is much worse than one on all of them) and sep breast_cancer 1.011 / 1.067 -> 1.042 /
  1.007, so the refit stays the default (the tables: the benchmark's fifth round).

``refine_iter`` (``EarlyStopping.refine_iter``; by default the count of the method's rule, 0
for an explicit ``refit``): after the refit (or, with
``refit="average"``, for every fold's model), up to that many further iterations on the
approximate posterior alone, on all the data, with the kernel parameters and inducing inputs
held where that model left them (``Method.refine``: svi and its presets move ``q(u)`` with the
fit's optimiser, sep its tied sites with the fit's sweeps; ``InputError`` for other methods).
What over-fits with iterations is the hyper-parameters (the kernel parameters and, for
vi-robustmax, ``Z``); at fixed ones the optimal ``q(u)`` is the posterior approximation and
cannot over-fit, while the refit stopped at the chosen count leaves it half-trained
(vi-robustmax's L-BFGS-B moves ``q(u)``, ``Z`` and the kernel jointly). With the average,
each fold model's ``q(u)`` also sees the rows its fold held out. Diagnostics: ``refined``,
the refinement's iterations (the members' mean with the average). Measured
(``benchmarks/early_stopping.py``, sixth round; ratio of means per replica r1-r3, target <=
1.05): vi-robustmax with ``refit="average", refine_iter=250`` wine 1.185 / 1.039 / 1.015,
breast_cancer 1.045 / 0.857 / 0.922 (the refit: 1.312 / 1.146 / 1.405, 1.196 / 1.010 /
1.076; the plain average 1.216 / 1.062 / 1.061, 1.110 / 0.917 / 1.012); the refit with
``refine_iter=250`` 1.168 / 1.129 / 1.250, 1.124 / 0.939 / 0.975 (the count it refines is
too early); vi-robustmax digits (three test splits, one hold-out) 1.014 with the refit, 1.016
averaged and refined (1.051 averaged alone); sep wine r1 1.006 -> 1.004 and bc r2 1.067 ->
1.056 with the refit and ``refine_iter=50``, while its average on wine stays far off (1.449 ->
1.353). No one setting is best for both families, hence the per-method rules of
``refit="auto"`` (session 36: sep's ``refine_iter=50`` beat its refit on all three wine and
breast_cancer replicas, 1.004 / 1.036 / 1.021 -> 1.004 / 1.033 / 1.010 and 1.018 / 1.073 / 1.073
-> 0.996 / 1.056 / 1.054, and on digits, 1.028 -> 1.022).

``choice_refine_iter`` (``EarlyStopping.choice_refine_iter``, 0 by default): the model that
early stopping returns is refined (``refine_iter``), so the choice should rank the
hyper-parameter iterates by their *refined* posteriors, not by their half-trained ones. With
``choice_refine_iter=K``, every monitored fit keeps the posterior of each checked iterate
(``ValidationMonitor.posteriors``), and after the fit each is refined ``K`` iterations at its
frozen hyper-parameters on that fit's own rows (``Method.refine``) and scored again on the
held-out rows (``ValidationMonitor.rescore``); the curves, the best iterates (the refined
posteriors) and so the count and the averaged members are those of the refined posteriors.
One refinement per check, and one kept posterior per check while the fit runs. Off by default:
on vi-robustmax wine (``benchmarks/early_stopping.py``, seventh round) it made the averaged,
refined model worse on all three replicas (1.185 / 1.039 / 1.015 -> 1.201 / 1.124 / 1.020 with
30 iterations per check) for four times the fit's CPU.

Small data (``EarlyStopping.folds``): a hold-out of a few dozen points says little about which
iteration is best, so where the hold-out would have fewer than ``MIN_HOLDOUT`` points the
number of iterations is chosen by stratified K-fold cross-validation instead, ``K =
round(1 / validation_fraction)`` (5 folds for 0.2): one fit per fold, each on the other folds
and monitored on its own, so every training point is used for validation once, and the
validation NLL is averaged over the folds (``ValidationChoice``). The folds also say how well
the curve's excess over its minimum is known: the chosen iteration is the earliest whose excess
is within ``ONE_SE`` standard errors of it (the one-standard-error rule of cross-validation),
since later iterations that the folds cannot tell apart from the minimum only fit the training
data harder. The standard error is that of the folds' *paired* differences (iteration ``j``
minus the minimum, fold by fold, ``paired_se``): every fold scores every
iteration on the same rows, so the folds' levels (one fold's rows are harder than another's)
cancel. The folds' spread at the minimum, used before, counts those levels: on wine with
vi-robustmax it was 3-5 times the paired error and chose iterations on the curve's steep
descent. A single hold-out takes the minimum.
``folds=1`` forces the single hold-out, ``folds=K`` (``>= 2``) K folds whatever ``N``.

That is ``choice_rule="one_se"``, the default; the others (``choose_check``): ``"log_one_se"``,
the same rule on the folds' log NLL (the excess relative to the level; classification only);
``"min"``, the minimum of the folds' mean curve; ``"median"``, the median over the folds of
each fold's own best iteration (robust to one fold's spike, blind to how much each fold gains).
Why ``one_se`` stays the default (``benchmarks/early_stopping.py``, its fourth round: the rules
replayed on the recorded fold curves of 10 stratified test folds per repeat): on vi-robustmax
(L-BFGS-B, whose validation and test curves jump by 10-50 % from one iteration to the next)
``median`` is better on wine (1.312 -> 1.132; 1.235 -> 1.112 on two more repeats),
breast_cancer (1.196 -> 1.131; 1.028 -> 1.021) and a generated 3-class set on one replica
(1.239 -> 1.198) and on sep iris and the generated set (1.123 -> 1.039, 1.051 -> 1.019), but
worse on vi-robustmax iris (1.231 -> 1.329; 1.188 -> 1.464) and the generated set's second
replica (1.013 -> 1.021), and on sep wine, whose fold curves are smooth and flat near the end
(one fold's minimum anywhere in the flat part, the median blind to how much each fold still
gains), it chooses too early: 1.006 -> 1.079, past the target (bc 1.011 -> 1.029). No rule
reaches 1.05 for vi-robustmax on wine: the counts within 5 % of the mean test path's best are 5
(12-15 and 17) on one replica of the test folds and 2 (7-8) on two others, and the rules on the
folds' curves choose 6-16 on the first. The choice does not apply to a single hold-out (digits:
one curve, its minimum, whatever the rule).

Either way the numbers are kept: ``FitResult.diagnostics`` has ``best_iteration`` (the chosen
number of iterations), ``best_val_nll``, ``stopped_early`` (1.0 when patience ran out before
``max_iter``, in every fold), ``refit`` (1.0 when the model was refitted), ``validation_folds``
and ``validation_checks``, and with a refit stopped by its objective ``refit_target`` (per point)
and ``refit_reached`` (the iteration, 0 when ``max_iter`` came first); ``FitResult.state``
has ``val_iteration [K]`` and ``val_nll [K]``, one entry per check (the mean over the folds),
``val_nll_folds [F, K]``, the monitored fits' training objectives ``objective_folds [F, T]``
and their training rows ``fold_points [F]``.

The names follow scikit-learn's estimators with early stopping (``validation_fraction``,
``n_iter_no_change``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from gpinfer.errors import InputError
from gpinfer.fit_guard import mean_nll as guard_mean_nll
from gpinfer.fit_guard import posterior_kernel
from gpinfer.interfaces import Array, FitCallback, FitResult, IterationInfo
from gpinfer.posterior import AveragedPosterior, Posterior

#: warning code / diagnostics key: the fit ended at the best validation iterate
EARLY_STOPPED = "early_stopped"
#: with ``folds=None``, a hold-out smaller than this many points is replaced by K folds
MIN_HOLDOUT = 200
#: K folds: the earliest iteration within this many (paired) standard errors of the minimum
ONE_SE = 1.0
#: where the refit on all the data stops (``EarlyStopping.refit_rule``, module docstring)
REFIT_RULES = ("objective", "gain", "iterations")
#: ``EarlyStopping.refit``'s setting that predicts with the validation folds' models
AVERAGE = "average"
#: ``EarlyStopping.refit``'s default: the rule the method declares (``Method.early_stopping_rule``)
AUTO = "auto"
#: how K folds choose the number of iterations (``EarlyStopping.choice_rule``, ``choose_check``)
CHOICE_RULES = ("one_se", "log_one_se", "min", "median")


@dataclass(frozen=True)
class EarlyStopping:
    """Validated early-stopping settings.

    ``validation_fraction`` in ``(0, 0.5]``; ``validation_interval`` (``k``) and
    ``n_iter_no_change`` (patience, in checks) positive integers; ``refit``: ``True``, train
    again on all the data for the chosen number of iterations; ``False``, keep the hold-out
    fit's best iterate; ``"average"`` (``AVERAGE``), predict with the average of the monitored
    fits' best iterates (module docstring); ``"auto"`` (``AUTO``, the estimators' default), the
    method's declared rule (``resolved``). ``refine_iter`` ``None``: the declared rule's count
    with ``"auto"``, else 0.
    """

    validation_fraction: float
    validation_interval: int = 1
    n_iter_no_change: int = 10
    refit: bool | str = True
    folds: int | None = None
    refit_rule: str = "iterations"
    choice_rule: str = "one_se"
    refine_iter: int | None = 0
    choice_refine_iter: int = 0

    @classmethod
    def from_settings(cls, validation_fraction: object, validation_interval: object,
                      n_iter_no_change: object, refit: object = AUTO,
                      folds: object = None, refit_rule: object = "iterations",
                      choice_rule: object = "one_se",
                      refine_iter: object = None,
                      choice_refine_iter: object = 0) -> EarlyStopping | None:
        """The settings, or ``None`` when ``validation_fraction`` is ``None`` (off);
        ``InputError`` naming the bad setting otherwise."""
        if validation_fraction is None:
            return None
        _check_schedule(validation_fraction, validation_interval, n_iter_no_change)
        _check_refit(refit)
        n_folds = _checked_folds(folds, refit)
        _check_rules(refit_rule, choice_rule)
        _check_refine(refine_iter, choice_refine_iter, refit)
        return cls(float(cast(float, validation_fraction)), int(cast(int, validation_interval)),
                   int(cast(int, n_iter_no_change)),
                   refit if isinstance(refit, str) else bool(refit), n_folds,
                   str(refit_rule), str(choice_rule),
                   None if refine_iter is None else int(cast(int, refine_iter)),
                   int(cast(int, choice_refine_iter)))  # all checked above

    def resolved(self, preferred: tuple[bool | str, int], classifier: bool = True
                 ) -> EarlyStopping:
        """The settings that run: ``refit="auto"`` replaced by the method's declared rule
        ``preferred = (refit, refine_iter)`` (``Method.early_stopping_rule``; its ``"average"``
        becomes ``True`` where ``classifier`` is False, a regressor's folds learn their own
        noise variances), and ``refine_iter=None`` by that rule's count (0 for an explicit
        ``refit``); an explicit ``refine_iter`` is kept. ``InputError`` for a ``refine_iter``
        that the resolved ``refit=False`` cannot use."""
        refit, refine = self.refit, self.refine_iter
        if refit == AUTO:
            refit, count = preferred
            if refit == AVERAGE and not classifier:
                refit = True
            refine = count if refine is None else refine
        refine = refine or 0
        if refine and not refit:
            raise InputError(f"refine_iter={refine} needs refit=True or {AVERAGE!r}; the "
                             f"method's rule (refit={AUTO!r}) is refit=False")
        return replace(self, refit=refit, refine_iter=refine)

    @property
    def averages(self) -> bool:
        """Whether the fitted model is the average of the monitored fits' best iterates."""
        return self.refit == AVERAGE

    def n_folds(self, n: int) -> int:
        """The folds for ``n`` training points: ``folds``, or with ``folds=None`` one hold-out
        unless it would have fewer than ``MIN_HOLDOUT`` points (then ``round(1 / fraction)``
        folds; one hold-out when ``refit`` is off)."""
        if self.folds is not None:
            return self.folds
        if not self.refit or self.validation_fraction * n >= MIN_HOLDOUT:
            return 1
        return max(2, round(1.0 / self.validation_fraction))


def _is_count(value: object, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return (not isinstance(value, bool) and isinstance(value, numbers.Integral)
            and int(value) >= least)


def _check_schedule(validation_fraction: object, validation_interval: object,
                    n_iter_no_change: object) -> None:
    """``InputError`` unless the fraction is in (0, 0.5] and the two counts are positive."""
    if (isinstance(validation_fraction, bool)
            or not isinstance(validation_fraction, numbers.Real)
            or not 0.0 < float(validation_fraction) <= 0.5):
        raise InputError(
            f"validation_fraction must be None (no early stopping) or a number in (0, 0.5]; "
            f"got {validation_fraction!r}"
        )
    for name, value in (("validation_interval", validation_interval),
                        ("n_iter_no_change", n_iter_no_change)):
        if not _is_count(value, 1):
            raise InputError(f"{name} must be a positive integer; got {value!r}")


def _check_refit(refit: object) -> None:
    """``InputError`` unless ``refit`` is a bool, ``AVERAGE`` or ``AUTO``."""
    if not isinstance(refit, bool | np.bool_) and refit not in (AVERAGE, AUTO):
        raise InputError(f"refit must be {AUTO!r} (the method's own rule, "
                         f"Method.early_stopping_rule), True (train again on all the data for the "
                         f"chosen number of iterations), False (keep the best iterate) or "
                         f"{AVERAGE!r} (predict with the average of the validation folds' "
                         f"models); got {refit!r}")


def _checked_folds(folds: object, refit: object) -> int | None:
    """``folds`` as an int (``None`` stays ``None``); ``InputError`` for a non-positive count
    or for K >= 2 folds without a refit (nothing would give one model)."""
    if folds is None:
        return None
    if not _is_count(folds, 1):
        raise InputError(f"validation_folds must be None (K folds on small data), 1 (one "
                         f"hold-out) or an integer K >= 2 (K folds); got {folds!r}")
    n_folds = int(cast(int, folds))
    if n_folds > 1 and not refit:
        raise InputError(f"validation_folds={n_folds} needs refit=True: K folds choose the "
                         "number of iterations, and only a refit on all the data gives one "
                         f"model (or refit={AVERAGE!r}: their average); use "
                         "validation_folds=1 to keep the best iterate")
    return n_folds


def _check_rules(refit_rule: object, choice_rule: object) -> None:
    """``InputError`` unless both rules are known names."""
    if refit_rule not in REFIT_RULES:
        raise InputError(f"refit_rule must be one of {list(REFIT_RULES)} (where the refit on "
                         f"all the data stops); got {refit_rule!r}")
    if choice_rule not in CHOICE_RULES:
        raise InputError(f"choice_rule must be one of {list(CHOICE_RULES)} (how K folds choose "
                         f"the number of iterations); got {choice_rule!r}")


def _check_refine(refine_iter: object, choice_refine_iter: object, refit: object) -> None:
    """``InputError`` unless both refine counts are non-negative integers (``refine_iter`` may
    be ``None``) and a positive ``refine_iter`` has a refit to continue."""
    if refine_iter is not None and not _is_count(refine_iter, 0):
        raise InputError(f"refine_iter must be a non-negative integer (iterations on the "
                         f"approximate posterior after the refit, hyper-parameters fixed) "
                         f"or None (the method's own count with refit={AUTO!r}, else 0); "
                         f"got {refine_iter!r}")
    if not _is_count(choice_refine_iter, 0):
        raise InputError(f"choice_refine_iter must be a non-negative integer (iterations on "
                         f"the posterior of every checked iterate before it is scored); got "
                         f"{choice_refine_iter!r}")
    if refine_iter and not refit:
        raise InputError(f"refine_iter={refine_iter} needs refit=True (it continues the "
                         f"refit on all the data) or refit={AVERAGE!r} (each fold's model "
                         f"on all the data); got refit={refit!r}")


def _held_out(rows: int, fraction: float) -> int:
    """Rows held out of ``rows`` (those of one class, or all for regression): at least one."""
    return max(1, int(round(fraction * rows)))


def validation_size(y: Array, fraction: float, n_classes: int) -> int:
    """``V``, the number of rows ``split_validation`` holds out of ``y [N]`` (labels of any
    type for classification, ``n_classes > 0``), without drawing them: the training rows are
    ``N - V``."""
    if not n_classes:
        return _held_out(np.shape(y)[0], fraction)
    _, counts = np.unique(np.asarray(y), return_counts=True)
    return sum(_held_out(int(c), fraction) for c in counts)


def split_validation(y: Array, fraction: float, rng: np.random.Generator,
                     n_classes: int) -> tuple[Array, Array]:
    """Row indices ``(train [N - V], validation [V])``, each sorted.

    Classification (``n_classes > 0``): stratified, ``round(fraction * N_c)`` points of every
    class ``c`` (at least one); ``InputError`` when a class would be left without a training or
    a validation point. Regression: a random ``round(fraction * N)`` rows (at least one, and at
    least one left for training).
    """
    n = y.shape[0]
    if n_classes:
        y = np.asarray(y, dtype=np.int64)
        held: list[Array] = []
        for c in range(n_classes):
            rows = np.flatnonzero(y == c)
            take = _held_out(rows.size, fraction)
            if take >= rows.size:
                raise InputError(
                    f"validation_fraction={fraction:g} leaves class {c} ({rows.size} point"
                    f"{'s' if rows.size != 1 else ''}) without a training or a validation "
                    "point; use a larger data set or no early stopping"
                )
            held.append(rng.choice(rows, size=take, replace=False))
        val = np.sort(np.concatenate(held))
    else:
        take = _held_out(n, fraction)
        if take >= n:
            raise InputError(f"validation_fraction={fraction:g} leaves no training point")
        val = np.sort(rng.choice(n, size=take, replace=False))
    train = np.setdiff1d(np.arange(n), val, assume_unique=True)
    return train, val


def validation_splits(y: Array, settings: EarlyStopping, rng: np.random.Generator,
                      n_classes: int) -> list[tuple[Array, Array]]:
    """``(train, validation)`` row indices, each sorted: one pair for a hold-out
    (``split_validation``), K for K folds (``settings.n_folds``). Folds are stratified for
    classification (each class's rows shuffled and dealt round the folds), so every row is
    held out exactly once; ``InputError`` when a class has fewer than two points (a fold would
    train without it)."""
    n = y.shape[0]
    folds = settings.n_folds(n)
    if folds == 1:
        return [split_validation(y, settings.validation_fraction, rng, n_classes)]
    if folds > n:
        raise InputError(f"validation_folds={folds} exceeds the {n} training points")
    fold_of = np.empty(n, dtype=np.int64)
    if n_classes:
        y = np.asarray(y, dtype=np.int64)
        start = 0
        for c in range(n_classes):
            rows = rng.permutation(np.flatnonzero(y == c))
            if rows.size < 2:
                raise InputError(f"class {c} has {rows.size} point(s): {folds}-fold validation "
                                 "needs two or more per class; use a larger data set or no "
                                 "early stopping")
            fold_of[rows] = (start + np.arange(rows.size)) % folds  # classes dealt on in turn
            start += rows.size
    else:
        fold_of[rng.permutation(n)] = np.arange(n) % folds
    return [(np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)) for f in range(folds)]


def mean_nll(X: Array, y: Array) -> Callable[[Posterior], float]:
    """The mean negative log predictive density of a posterior on ``X [V, D]``, ``y [V]``
    (``fit_guard.mean_nll`` at fixed rows)."""
    return lambda posterior: guard_mean_nll(posterior, X, y)


def renumbered(callback: FitCallback | None, offset: int, tag: str) -> FitCallback | None:
    """``callback`` for one of several fits in a row (folds, the refit): iterations numbered on
    from ``offset`` (one increasing count for loggers and progress bars), the fit's own count in
    ``extra[tag]``."""
    if callback is None:
        return None

    def call(info: IterationInfo) -> bool | None:
        return callback(IterationInfo(offset + info.iteration, info.objective, info.elapsed,
                                      info.posterior, {**info.extra, tag: info.iteration}))

    return call


class ValidationMonitor:
    """A fit callback: the validation NLL every ``interval`` iterations, the best iterate, and a
    stop request after ``patience`` checks without improvement.

    ``nll(posterior) -> float`` is the mean validation NLL of a posterior. Wraps ``callback``
    (called with ``val_nll`` added to ``IterationInfo.extra`` on checked iterations, so the
    runner logs it as a metric); a stop request of the wrapped callback passes through.
    """

    def __init__(self, nll: Callable[[Posterior], float], settings: EarlyStopping,
                 callback: FitCallback | None = None, n_points: int | None = None):
        self.nll = nll
        self.settings = settings
        self.callback = callback
        #: the monitored fit's training points (the objective per point: ``ValidationChoice``)
        self.n_points = n_points
        #: the reported training objective of every iteration, iteration -> value
        self.objectives: dict[int, float] = {}
        self.best_nll = np.inf
        self.best_iteration: int | None = None
        self.best_posterior: Posterior | None = None
        self.last_iteration = 0
        self.checks_without_improvement = 0
        self.stopped = False
        #: the validation NLL of every checked iteration, iteration -> value
        self.val_nll: dict[int, float] = {}
        self.checks: list[tuple[int, float]] = []  # (iteration, validation NLL) per check
        #: the posterior of every checked iteration, kept with ``choice_refine_iter`` (``rescore``)
        self.posteriors: dict[int, Posterior] = {}
        #: whether ``rescore`` replaced the checks by the refined posteriors' values
        self.rescored = False

    def __call__(self, info: IterationInfo) -> bool:
        self.last_iteration = info.iteration
        self.objectives[info.iteration] = float(info.objective)
        due = info.iteration % self.settings.validation_interval == 0
        if due and info.posterior is not None:
            posterior = info.posterior()
            value = float(self.nll(posterior))
            self.val_nll[info.iteration] = value
            info = IterationInfo(info.iteration, info.objective, info.elapsed, info.posterior,
                                 {**info.extra, "val_nll": value})
            self.checks.append((info.iteration, value))
            if self.settings.choice_refine_iter:
                self.posteriors[info.iteration] = posterior
            if np.isfinite(value) and value < self.best_nll:
                self.best_nll, self.best_iteration = value, info.iteration
                self.best_posterior = posterior
                self.checks_without_improvement = 0
            else:
                self.checks_without_improvement += 1
        stop = self.checks_without_improvement >= self.settings.n_iter_no_change
        self.stopped = self.stopped or stop
        inner = self.callback(info) if self.callback is not None else None
        return stop or inner is True

    def rescore(self, refine: Callable[[Posterior], Posterior]) -> None:
        """Score every kept checked posterior (``posteriors``) again after ``refine`` (the
        posterior trained further at its frozen hyper-parameters on the monitored fit's rows:
        ``choice_refine_iter``): the checks, ``val_nll``, the best iterate and its posterior
        (the refined one) become those of the refined posteriors, so that the choice ranks the
        hyper-parameter iterates by the model that early stopping returns (refined), not by
        their half-trained posteriors. The kept posteriors are dropped."""
        if not self.posteriors:
            return
        self.best_nll, self.best_iteration, self.best_posterior = np.inf, None, None
        checks = []
        for iteration, _ in self.checks:
            posterior = refine(self.posteriors[iteration])
            value = float(self.nll(posterior))
            checks.append((iteration, value))
            self.val_nll[iteration] = value
            if np.isfinite(value) and value < self.best_nll:
                self.best_nll, self.best_iteration = value, iteration
                self.best_posterior = posterior
        self.checks, self.posteriors, self.rescored = checks, {}, True

    def restore(self, result: FitResult) -> FitResult:
        """``result`` with the best validation iterate's posterior (and its kernels), with the
        early-stopping numbers (``ValidationChoice.record``) and ``val_nll`` in the ``history``
        entries of the checked iterations."""
        for position, entry in enumerate(result.history, start=1):  # one entry per iteration
            value = self.val_nll.get(int(entry.get("iteration", position)))
            if value is not None:
                entry.setdefault("val_nll", value)
        if self.best_posterior is None:
            return result
        best = self.replacement
        if best is not None:
            result.kernel = posterior_kernel(best, result.kernel)
            result.posterior = best
        return ValidationChoice([self]).record(result, refitted=False)

    @property
    def replacement(self) -> Posterior | None:
        """The posterior the monitored fit keeps instead of its final one: the best validation
        iterate's where that is an earlier iterate or was refined (``rescore``); ``None`` where
        the final posterior stays (the best is the last iterate, or no check was finite)."""
        if self.best_posterior is None or (self.best_iteration == self.last_iteration
                                           and not self.rescored):
            return None
        return self.best_posterior


class ValidationChoice:
    """The number of iterations chosen by one or more monitored fits (a hold-out, or K folds).

    The validation NLL curve is the mean over the monitors at every checked iteration; a fold
    that stopped early keeps its last value beyond its last check (it had been getting worse for
    ``patience`` checks). ``best_iteration`` is the first minimum of that curve for one monitor;
    for several, the earliest iteration whose excess over the minimum is within ``ONE_SE``
    standard errors of the folds' paired differences (``excess_se``, module docstring); ``None``
    when no check gave a finite value. ``best_nll`` is
    the curve's value there, ``min_iteration`` and ``min_nll`` the minimum's.
    """

    def __init__(self, monitors: list[ValidationMonitor], rule: str = "one_se"):
        self.monitors = monitors
        iterations = sorted({it for m in monitors for it, _ in m.checks})
        self.iterations = np.array(iterations, dtype=np.int64)
        curves = []
        for m in monitors:
            its = np.array([it for it, _ in m.checks], dtype=np.int64)
            vals = np.array([v for _, v in m.checks], dtype=float)
            if its.size == 0:
                curves.append(np.full(self.iterations.size, np.nan))
                continue
            # the value of the last check at or before each iteration (before the first: NaN)
            at = np.searchsorted(its, self.iterations, side="right") - 1
            curves.append(np.where(at >= 0, vals[np.maximum(at, 0)], np.nan))
        #: per-fold curves ``[F, K]`` (NaN before a fold's first check)
        self.fold_curves = np.array(curves).reshape(len(monitors), self.iterations.size)
        self.curve = mean_curve(self.fold_curves)
        self.best_iteration: int | None = None
        self.best_nll = self.min_nll = np.inf
        self.min_iteration: int | None = None
        if self.curve.size and np.isfinite(self.curve.min()):
            k = int(np.argmin(self.curve))
            self.min_iteration, self.min_nll = int(self.iterations[k]), float(self.curve[k])
            k = cast(int, choose_check(self.fold_curves, rule))  # not None: a finite check
            self.best_iteration, self.best_nll = int(self.iterations[k]), float(self.curve[k])

    def excess_se(self, k: int) -> Array:
        """``[K]``: the standard error of the fold-averaged curve's excess over its value at
        check ``k`` (``paired_se`` of the fold curves)."""
        return paired_se(self.fold_curves, k)

    def refit_target(self, rule: str) -> float | None:
        """Where the refit on all the data stops (``level_target`` at the chosen iteration
        ``best_iteration``, from the monitored fits' objectives); ``None``: train for
        ``best_iteration`` iterations."""
        if self.best_iteration is None or any(not m.n_points for m in self.monitors):
            return None
        points = np.array([m.n_points or 0 for m in self.monitors], dtype=float)
        return level_target(self.objective_curves(), points, self.best_iteration, rule)

    def record(self, result: FitResult, refitted: bool,
               stop: RefitStop | None = None) -> FitResult:
        """``result`` with the early-stopping numbers: ``diagnostics`` (``best_iteration``,
        ``best_val_nll``, ``min_val_iteration``, ``min_val_nll``, ``stopped_early``, ``refit``,
        ``validation_folds``,
        ``validation_checks``; and ``best_val_iteration``, the same as ``best_iteration``, for
        earlier readers) and ``state`` (``val_iteration [K]``, ``val_nll [K]``, and
        ``val_nll_folds [F, K]`` per fold)."""
        best = float(self.best_iteration or 0)
        result.diagnostics.update(
            best_iteration=best, best_val_iteration=best, best_val_nll=self.best_nll,
            min_val_iteration=float(self.min_iteration or 0), min_val_nll=self.min_nll,
            stopped_early=float(all(m.stopped for m in self.monitors)), refit=float(refitted),
            validation_folds=float(len(self.monitors)),
            validation_checks=float(self.iterations.size))
        if stop is not None:  # the refit stopped by its objective (``RefitStop``)
            result.diagnostics.update(refit_target=stop.target,
                                      refit_reached=float(stop.reached or 0))
        result.state["val_iteration"] = self.iterations.copy()
        result.state["val_nll"] = self.curve.copy()
        result.state["val_nll_folds"] = self.fold_curves.copy()
        result.state["objective_folds"] = self.objective_curves()
        result.state["fold_points"] = np.array([m.n_points or 0 for m in self.monitors],
                                               dtype=np.int64)
        return result

    def objective_curves(self) -> Array:
        """``[F, T]``: each monitored fit's training objective at iterations ``1..T`` (``T``
        the most iterations any of them ran), NaN where a fit did not report."""
        last = max((max(m.objectives) for m in self.monitors if m.objectives), default=0)
        curves = np.full((len(self.monitors), last), np.nan)
        for f, m in enumerate(self.monitors):
            for it, value in m.objectives.items():
                curves[f, it - 1] = value
        return curves


def averaged_result(monitors: list[ValidationMonitor], results: list[FitResult],
                    choice: ValidationChoice) -> FitResult:
    """The fitted model of ``refit="average"``: an ``AveragedPosterior`` of every monitored
    fit's best validation iterate (its result's posterior where that is its last iterate, as
    ``ValidationMonitor.restore``, or where no check was finite), in a ``FitResult``
    with the early-stopping numbers (``ValidationChoice.record``; ``refit`` 0), ``averaged``
    (the number of members) in ``diagnostics`` and ``member_iteration [F]`` (each member's
    iteration) in ``state``. ``kernel`` is the first member's; ``log_evidence`` the mean of the
    fits' (each on its own rows); ``n_iter`` the iterations of all the fits; ``history`` theirs,
    one after the other, each entry with its ``fold``."""
    members = [r.posterior if m.replacement is None else m.replacement
               for m, r in zip(monitors, results)]  # as ``restore``
    history = [{**entry, "fold": float(f)} for f, r in enumerate(results) for entry in r.history]
    result = FitResult(
        posterior=AveragedPosterior(members),
        log_evidence=float(np.mean([float(r.log_evidence) for r in results])),
        kernel=posterior_kernel(members[0], results[0].kernel),
        n_iter=sum(int(r.n_iter) for r in results), history=history)
    result = choice.record(result, refitted=False)
    result.diagnostics["averaged"] = float(len(members))
    result.state["member_iteration"] = np.array(
        [m.best_iteration or m.last_iteration for m in monitors], dtype=np.int64)
    return result


def mean_curve(fold_curves: Array) -> Array:
    """``[K]``: the folds' mean of ``fold_curves [F, K]``, ``inf`` at a check where a fold has
    no finite value (such a check is never chosen)."""
    with np.errstate(invalid="ignore"):
        curve = np.mean(fold_curves, axis=0)
    return np.where(np.isfinite(curve), curve, np.inf)


def paired_se(fold_curves: Array, k: int) -> Array:
    """``[K]``: the standard error of the fold-averaged curve's excess over its value at check
    ``k`` (the minimum), from the folds' paired differences (``fold_curves [F, K]``): every fold
    validates every iteration on the same rows, so a fold that is hard at one iteration is hard
    at all of them, and only the spread of the per-fold *differences* says whether iteration
    ``j`` is worse than ``k``. (The spread of the folds' levels at the minimum, which the rule
    used before, mostly measures how the folds differ from each other: on wine it was 3-10
    times the paired one and picked iterations on the curve's steep descent.) ``inf`` where
    fewer than two folds have finite values at both checks; 0 at ``k``."""
    diff = fold_curves - fold_curves[:, [k]]
    ok = np.isfinite(diff)
    count = ok.sum(axis=0)
    d = np.where(ok, diff, 0.0)
    mean = d.sum(axis=0) / np.maximum(count, 1)
    var = np.where(ok, (d - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count - 1, 1)
    se = np.sqrt(var / np.maximum(count, 1))
    return np.where(count >= 2, se, np.inf)


def choose_check(fold_curves: Array, rule: str) -> int | None:
    """The index of the chosen check in the folds' validation NLL curves ``fold_curves [F, K]``
    (NaN where a fold has no value; only checks where every fold has one are candidates);
    ``None`` when there is none. One curve (a hold-out): its first minimum, whatever ``rule``.
    Several (K folds, ``rule`` in ``CHOICE_RULES``, module docstring):

    * ``"one_se"``: the earliest check whose mean excess over the minimum of the mean curve
      is within ``ONE_SE`` paired standard errors (``paired_se``);
    * ``"log_one_se"``: the same on the folds' log NLL (the excess relative to the level);
      ``InputError`` for a non-positive NLL (a density's, in regression);
    * ``"min"``: the first minimum of the mean curve;
    * ``"median"``: the median over the folds of each fold's own first minimum (the lower
      median for an even number of folds).
    """
    curves = np.asarray(fold_curves, dtype=float)
    if rule == "log_one_se" and curves.shape[0] > 1:
        if np.any(curves[np.isfinite(curves)] <= 0):
            raise InputError("choice_rule='log_one_se' needs a positive validation NLL (a "
                             "classifier's); use 'one_se' where the NLL can be negative")
        curves = np.log(curves)
    curve = mean_curve(curves)
    if curve.size == 0 or not np.isfinite(curve.min()):
        return None
    k = int(np.argmin(curve))
    if curves.shape[0] == 1 or rule == "min":
        return k
    if rule == "median":
        candidate = np.isfinite(curve)
        own = np.sort([int(np.argmin(np.where(candidate, c, np.inf))) for c in curves])
        return int(own[(own.size - 1) // 2])
    within = curve - curve[k] <= ONE_SE * paired_se(curves, k)
    return int(np.argmax(within & np.isfinite(curve)))


def level_target(objectives: Array, n_points: Array, k: int, rule: str) -> float | None:
    """The per-point level where the refit on all the data stops (``RefitStop``), from the
    monitored fits' training objectives ``objectives [F, T]`` (iterations ``1..T``, NaN where
    a fit did not report) on ``n_points [F]`` rows each, at the chosen iteration ``k``:
    ``"objective"``, their mean objective per training point at ``k``; ``"gain"``, their mean
    gain per training point from iteration 1 to ``k``. A fit that stopped before ``k`` counts
    with its last value (as its validation NLL is carried on in ``ValidationChoice``). ``None``
    for ``"iterations"`` (the refit trains for ``k`` iterations) and where a fit has no finite
    value up to ``k`` (or at 1)."""
    if rule == "iterations" or k < 1 or objectives.shape[1] == 0:
        return None
    upto = objectives[:, :k]
    finite = np.isfinite(upto)
    last = upto.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)  # last finite up to k
    levels = np.where(finite.any(axis=1), upto[np.arange(upto.shape[0]), last], np.nan)
    if rule == "gain":
        levels = levels - objectives[:, 0]
    target = float(np.mean(levels / n_points))
    return target if np.isfinite(target) else None


class RefitStop:
    """A fit callback for the refit on all the data (``n_points`` rows): a stop request at the
    first iteration whose training objective per point reaches ``target``
    (``ValidationChoice.refit_target``): its level (``rule="objective"``) or its gain since the
    first report (``"gain"``). Wraps ``callback`` (whose stop request passes through);
    ``reached`` is that iteration, ``None`` while the target is not reached.
    """

    def __init__(self, rule: str, target: float, n_points: int,
                 callback: FitCallback | None = None):
        if rule not in ("objective", "gain"):
            raise ValueError(f"RefitStop needs the rule 'objective' or 'gain'; got {rule!r}")
        self.rule, self.target, self.n_points, self.callback = rule, target, n_points, callback
        self.first: float | None = None
        self.reached: int | None = None

    def __call__(self, info: IterationInfo) -> bool:
        level = float(info.objective) / self.n_points
        if self.first is None:
            self.first = level
        if self.rule == "gain":
            level -= self.first
        if self.reached is None and level >= self.target:
            self.reached = info.iteration
        inner = self.callback(info) if self.callback is not None else None
        return self.reached is not None or inner is True


def stop_at(objectives: Array, rule: str, target: float, n_points: int) -> int | None:
    """The iteration (1-based) where ``RefitStop`` stops a fit that reports ``objectives [T]``
    (iterations 1..T), ``None`` when the target is not reached: the same rule, on a recorded
    path (benchmarks replay it)."""
    stop = RefitStop(rule, target, n_points)
    for t, value in enumerate(np.asarray(objectives, dtype=float), start=1):
        if stop(IterationInfo(t, float(value), 0.0)):
            return t
    return None

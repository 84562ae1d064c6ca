"""The outer optimiser schedule (``gpinfer.training.outer``): the one memo, reports at accepted
iterates only, the one trial-failure rule, the warnings and the solve at the end."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from gpinfer.errors import NumericalError
from gpinfer.interfaces import (
    Array,
    IterationCallback,
    OptimizationResult,
    Optimizer,
    ValueAndGrad,
)
from gpinfer.numerics.settings import LOG_PARAMETER_BOUNDS
from gpinfer.optim import LBFGSB
from gpinfer.training.outer import OuterSchedule

CENTRE = np.array([0.3, -0.2])


class Solver:
    """A method's solve: the objective ``-sum(scale (theta - CENTRE)^2)`` and its gradient; ``at`` is the
    hyper-parameters its state holds (a failed solve leaves them there, as a method's does),
    ``solves`` every ``theta`` solved at."""

    def __init__(self, fails: Callable[[Array], bool] = lambda theta: False,
                 scale: tuple[float, float] = (1.0, 1.0)):
        self.fails, self.scale = fails, np.array(scale)
        self.at: Array | None = None
        self.solves: list[Array] = []

    def __call__(self, theta: Array) -> tuple[float, Array]:
        self.at = np.array(theta, dtype=float)
        self.solves.append(self.at)
        if self.fails(theta):
            raise NumericalError("the inner solver broke down", quantity="cavity")
        d = self.at - CENTRE
        return -float(d @ (self.scale * d)), -2.0 * self.scale * d


class Scripted(Optimizer):
    """An optimiser that evaluates and accepts given points in a given order: ``("eval", x)``
    calls ``fun``, ``("accept", x)`` the callback; returns at the last point accepted."""

    def __init__(self, script: list[tuple[str, list[float]]], success: bool = True):
        self.script, self.success = script, success

    def maximize(self, fun: ValueAndGrad, x0: Array, max_iter: int,
                 callback: IterationCallback | None = None
                 ) -> OptimizationResult:
        it, x = 0, np.asarray(x0, dtype=float)
        for what, point in self.script:
            if what == "eval":
                fun(np.array(point, dtype=float))
                continue
            it, x = it + 1, np.array(point, dtype=float)
            if callback is not None and callback(it, x.copy(), 0.0):
                break
        return OptimizationResult(x=x, value=0.0, n_iter=it, success=self.success,
                                  message="" if self.success else "ABNORMAL: line search")


def points(seq: list[Array]) -> list[list[float]]:
    return [np.asarray(p).tolist() for p in seq]


def test_the_memo_re_solves_an_accepted_iterate_only_when_the_last_solve_was_elsewhere():
    solver, reported = Solver(), []
    script = [("eval", [0.0, 0.0]), ("eval", [1.0, 0.0]), ("accept", [1.0, 0.0]),  # a hit
              ("eval", [2.0, 0.0]), ("eval", [0.5, 0.0]), ("accept", [2.0, 0.0])]  # a miss

    def report(it: int, theta: Array, value: float) -> bool:
        reported.append((it, solver.at.tolist()))  # the state the report reads
        return False

    result = OuterSchedule("toy", report).run(Scripted(script), solver, np.zeros(2), 10)
    assert points(solver.solves) == [[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.5, 0.0],
                                     [2.0, 0.0]]  # one re-solve, at the missed iterate
    assert reported == [(1, [1.0, 0.0]), (2, [2.0, 0.0])]
    np.testing.assert_array_equal(result.x, [2.0, 0.0])  # the memo is there: no final solve


def test_without_refresh_the_report_reads_the_last_solve_and_no_memo_is_kept():
    solver, reported = Solver(), []
    script = [("eval", [2.0, 0.0]), ("eval", [0.5, 0.0]), ("accept", [2.0, 0.0])]
    schedule = OuterSchedule("toy", lambda it, theta, v: reported.append(theta.tolist()),
                             refresh=False, finish="never")
    schedule.run(Scripted(script), solver, np.zeros(2), 10)
    assert points(solver.solves) == [[2.0, 0.0], [0.5, 0.0]] and reported == [[2.0, 0.0]]


@pytest.mark.parametrize("finish, solves", [("moved", 3), ("always", 3), ("never", 2)])
def test_finish_solves_at_the_returned_point(finish, solves):
    solver = Solver()
    script = [("eval", [1.0, 0.0]), ("eval", [2.0, 0.0]), ("accept", [1.0, 0.0])]
    OuterSchedule("toy", finish=finish).run(Scripted(script), solver, np.zeros(2), 10)
    assert len(solver.solves) == solves
    if finish != "never":
        np.testing.assert_array_equal(solver.at, [1.0, 0.0])


def test_finish_always_solves_again_where_the_memo_is():
    solver = Solver()
    script = [("eval", [1.0, 0.0]), ("accept", [1.0, 0.0])]
    OuterSchedule("toy", finish="always").run(Scripted(script), solver, np.zeros(2), 10)
    OuterSchedule("toy", finish="moved").run(Scripted(script), solver, np.zeros(2), 10)
    assert points(solver.solves) == [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]


def test_reports_come_at_the_accepted_iterates_of_lbfgs_only_and_a_stop_request_ends_it():
    solver, trace, reported = Solver(scale=(1.0, 30.0)), [], []

    def report(it: int, theta: Array, value: float) -> bool:
        reported.append((it, theta.copy(), value))
        return it == 3

    result = OuterSchedule("toy", report).run(LBFGSB(), solver, np.array([2.0, 2.0]), 50)
    assert [r[0] for r in reported] == [1, 2, 3] and result.n_iter == 3
    assert len(solver.solves) > len(reported)  # line-search trial points were not reported
    # each reported iterate is one L-BFGS-B accepted (the run again, with its own callback;
    # unstopped, it goes on past 3)
    full = LBFGSB().maximize(Solver(scale=(1.0, 30.0)), np.array([2.0, 2.0]), 50,
                             lambda it, x, v: trace.append((it, x.copy(), v)))
    assert full.n_iter > 3
    for (it, x, v), (it2, x2, v2) in zip(reported, trace):
        assert it == it2 and v == v2
        np.testing.assert_array_equal(x, x2)


def test_a_trial_failure_ends_at_the_last_accepted_iterate_with_a_warning_and_the_state_there():
    solver = Solver(fails=lambda theta: theta[0] < 0.9)  # L-BFGS-B steps past it from 2
    history: list[dict[str, float]] = []

    def report(it: int, theta: Array, value: float) -> bool:
        history.append({"objective": value})
        return False

    schedule = OuterSchedule("toy", report, history=history)
    with pytest.warns(RuntimeWarning, match="toy: numerical failure at a trial point of "
                                            "L-BFGS-B; training stopped at iteration"):
        result = schedule.run(LBFGSB(stop_on_trial_failure=True), solver, np.array([2.0, 0.0]),
                              50)
    assert result.trial_failure and not result.success
    assert result.n_iter == len(history) and history[-1]["stopped_on_failure"] == 1.0
    assert result.x[0] >= 0.9
    np.testing.assert_array_equal(solver.at, result.x)  # re-solved after the failed trial
    assert solver.fails(solver.solves[-2]) and not solver.fails(solver.solves[-1])


def test_a_failure_at_the_start_or_without_the_rule_propagates():
    with pytest.raises(NumericalError, match="broke down"):
        OuterSchedule("toy").run(LBFGSB(stop_on_trial_failure=True),
                                 Solver(fails=lambda theta: True), np.zeros(2), 10)
    with pytest.raises(NumericalError, match="broke down"):
        OuterSchedule("toy").run(LBFGSB(), Solver(fails=lambda theta: theta[0] < 0.9),
                                 np.array([2.0, 0.0]), 50)


def test_an_abnormal_end_warns_unless_the_method_records_it_itself():
    script = [("eval", [1.0, 0.0]), ("accept", [1.0, 0.0])]
    with pytest.warns(RuntimeWarning, match="toy: optimizer 'x' ended abnormally: ABNORMAL"):
        OuterSchedule("toy", label="optimizer 'x'").run(Scripted(script, success=False),
                                                        Solver(), np.zeros(2), 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = OuterSchedule("toy", warn=False).run(Scripted(script, success=False),
                                                      Solver(), np.zeros(2), 10)
        OuterSchedule("toy").run(Scripted(script), Solver(), np.zeros(2), 10)
    assert not result.success and result.message.startswith("ABNORMAL")


def test_the_default_box_warning_names_the_parameters_on_its_upper_bound():
    hi = LOG_PARAMETER_BOUNDS[1]
    script = [("eval", [hi, 0.0]), ("accept", [hi, 0.0])]
    with pytest.warns(ConvergenceWarning, match=r"toy: variance ended on the upper bound"):
        OuterSchedule("toy", upper_names=["variance", "lengthscale"]).run(
            Scripted(script), Solver(), np.zeros(2), 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OuterSchedule("toy", upper_names=["variance", "lengthscale"]).run(
            Scripted([("eval", [hi - 1.0, 0.0]), ("accept", [hi - 1.0, 0.0])]), Solver(),
            np.zeros(2), 10)


def test_an_unknown_finish_is_refused():
    with pytest.raises(ValueError, match="finish must be one of"):
        OuterSchedule("toy", finish="sometimes").run(LBFGSB(), Solver(), np.zeros(2), 10)

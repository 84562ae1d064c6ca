"""The core training loop and the shared reporter: schedules checked before training, stop
requests and training-only time for every iterative method."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gpinfer
from gpinfer.errors import InputError
from gpinfer.hyper import HyperParameters
from gpinfer.interfaces import MatrixGradients, ObjectiveValue, Problem, SiteApproximation
from gpinfer.kernels import RBF
from gpinfer.likelihoods.bernoulli import BernoulliProbit
from gpinfer.testing.datasets import ring_classes
from gpinfer.training.loop import Schedule, TrainingLoop

#: (method, estimator arguments, binary?) for every iterative method family
ITERATIVE = [
    ("sep", {"M": 6}, False),
    ("ep", {"M": 6}, False),
    ("sep", {"M": 6, "batch_size": 10}, False),
    ("gfitc", {"M": 6}, False),
    ("svi", {"M": 6, "batch_size": 10, "method_options": {"optimizer": "adam"}}, False),
    ("vi-jj", {"M": 6}, True),
    ("laplace", {}, True),
    ("kl", {}, True),
    ("pep", {"M": 6}, True),
]


def _data(binary: bool, n: int = 40):
    return ring_classes(n, seed=3, n_classes=2 if binary else 3, radius=2.0)


@pytest.mark.parametrize("kind", ["sweeps", "", None])
def test_an_unknown_schedule_is_an_input_error(kind):
    with pytest.raises(InputError, match="schedule must be one of"):
        Schedule(kind=kind).check("sep", minibatch=False)


def test_minibatches_need_the_inner_schedule():
    with pytest.raises(InputError, match="inner schedule only"):
        Schedule(kind="outer").check("sep", minibatch=True)


def test_bad_schedule_option_is_refused_before_training():
    X, y = _data(False)
    calls = []
    with pytest.raises(InputError, match="schedule"):
        gpinfer.GPClassifier(method="sep", M=6, method_options={"schedule": "sweeps"}).fit(
            X, y, callback=calls.append)
    assert calls == []


@pytest.mark.parametrize("method,kwargs,binary", ITERATIVE)
def test_every_iterative_method_stops_when_the_callback_asks(method, kwargs, binary):
    X, y = _data(binary)
    seen = []

    def stop_at_two(info):
        seen.append(info.iteration)
        return info.iteration >= 2

    est = gpinfer.GPClassifier(method=method, max_iter=50, random_state=0, **kwargs)
    est.fit(X, y, callback=stop_at_two)
    assert seen[:2] == [1, 2]
    assert len(seen) == 2, f"{method} went on after a stop request: {seen}"
    assert len(est.history_) == 2


@pytest.mark.parametrize("method,kwargs,binary", ITERATIVE)
def test_elapsed_is_training_time_for_every_method(method, kwargs, binary):
    """The callback's time (where the runner evaluates test metrics) is not training time."""
    X, y = _data(binary)
    pause = 0.3
    t0 = time.perf_counter()
    est = gpinfer.GPClassifier(method=method, max_iter=3, random_state=0, **kwargs)
    est.fit(X, y, callback=lambda info: time.sleep(pause))
    wall = time.perf_counter() - t0
    n = len(est.history_)
    assert n >= 1
    last = est.history_[-1]["elapsed"]
    assert last <= wall - n * pause + 1e-3
    assert all(b["elapsed"] >= a["elapsed"] for a, b in zip(est.history_, est.history_[1:]))


def test_checked_inputs_skips_the_value_scan_only_inside_the_context():
    from gpinfer.kernels import RBF
    from gpinfer.kernels.checks import checked_inputs

    bad = np.array([[0.0, np.nan], [1.0, 2.0]])
    with pytest.raises(InputError, match="NaN"):
        RBF().K(bad)
    with checked_inputs():
        assert RBF().K(bad).shape == (2, 2)  # the caller vouches for the values
        with pytest.raises(InputError, match="2-D"):
            RBF().K(np.zeros(3))  # shapes are still checked
    with pytest.raises(InputError, match="NaN"):
        RBF().K(bad)


class _HalvingSites(SiteApproximation):
    """Sites whose ``k``-th update changes them by ``2^-k``; a zero objective."""

    def __init__(self):
        self.updates, self.dampings = 0, []

    def prepare(self, batch, iteration):
        pass

    def update(self, damping, iteration):
        self.updates += 1
        self.dampings.append(damping)
        return 0.5**self.updates

    def objective(self, scale, iteration):
        return ObjectiveValue(0.0, MatrixGradients())

    def snapshot(self):
        return self.updates

    def restore(self, snapshot):
        self.updates = snapshot

    def posterior(self):
        raise NotImplementedError


@pytest.mark.parametrize(("max_sweeps", "first", "second"), [(100, 7, 1), (3, 4, 3)])
def test_the_outer_schedule_sweeps_below_outer_tol_or_to_its_cap(max_sweeps, first, second):
    """``outer``: sweeps at the iteration's damping until the change is below ``outer_tol``
    (2^-7 < 0.01), at most ``outer_max_sweeps + 1`` per iteration."""
    X, y = _data(True, n=10)
    problem = Problem(X=X, y=y, n_classes=2, kernel=RBF(), likelihood=BernoulliProbit(),
                      optimize=False, max_iter=2)
    sites = _HalvingSites()
    schedule = Schedule(kind="outer", damping=0.5, damping_decay=0.9, outer_tol=0.01,
                        outer_max_sweeps=max_sweeps)
    loop = TrainingLoop("halving", problem, sites, HyperParameters(problem.kernel, optimize=False),
                        X, schedule)
    loop.run()
    assert sites.dampings == [0.5] * first + [0.45] * second
    assert loop.history[-1]["site_change"] == 0.5 ** (first + second)


def test_minibatch_steps_reuse_one_parameter_vector_and_reported_states_stay_put(monkeypatch):
    """sep's mini-batch steps on numpy: every Adam step after the first writes into the vector
    the step before handed to ``hp.unpack(owned=True)``, and every gradient after the first
    into the one before (no new ``[P]`` arrays per step); what a report kept (``IterationInfo.posterior``: the fit guard builds it after training)
    is not moved by the later steps written in place."""
    handed: list[int] = []
    unpack = HyperParameters.unpack

    def recording(self, theta, *, owned=False):
        if owned:
            handed.append(id(theta))
        return unpack(self, theta, owned=owned)

    gradient, gradients = HyperParameters.gradient, []

    def recording_gradient(self, *args, **kwargs):
        grad = gradient(self, *args, **kwargs)
        gradients.append(id(grad))
        return grad

    monkeypatch.setattr(HyperParameters, "unpack", recording)
    monkeypatch.setattr(HyperParameters, "gradient", recording_gradient)
    X, y = _data(False)
    builders, at_report = [], []

    def callback(info):
        builders.append(info.posterior)
        at_report.append(info.posterior())

    gpinfer.GPClassifier(method="sep", M=6, batch_size=10, max_iter=3, random_state=0,
                         method_options={"adam_learning_rate": 0.05}).fit(X, y, callback=callback)
    assert len(handed) == 12 and len(set(handed)) <= 1 + len(builders)  # new after a report
    assert handed[1] == handed[0] and handed[2] == handed[0]
    assert len(gradients) == 12 and len(set(gradients)) == 1
    for build, then in zip(builders, at_report):
        later = build()
        for a, b in zip([*later.Z, *later.m], [*then.Z, *then.m]):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(at_report[0].Z[0], at_report[-1].Z[0])  # the steps moved Z

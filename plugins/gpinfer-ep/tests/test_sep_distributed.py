"""sep in a process group (issue 24 item 2): K = 2 gloo ranks, each refining the tied sites
with its part of every global batch (the ranks' site contributions and class counts summed in
one all_reduce, the objective's gradient averaged), fit the model of one process on the union
batches (float64 probabilities within 1e-10, numpy and torch-CPU, per-class and shared inducing
inputs); what a group does not do (ep, pep, full batch, compile, a time limit, a batch with fewer
points than ranks) is refused before training."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch.distributed needs PyTorch (make test installs it)")

# 3 classes, 3 epochs of 110 points in batches of 25 (the last one 10: the ranks' parts 13/12
# and 5/5); Adam at a step large enough that the hyper-parameters move
FITS = """
from sklearn.datasets import make_classification
from gpinfer.estimator import GPClassifier
X, y = make_classification(110, 4, n_informative=3, n_redundant=0, n_classes=3,
                           n_clusters_per_class=1, random_state=1)
Xte = X[:30] + 0.1
def fit(shared=False, **settings):
    est = GPClassifier(method="sep", M=8, batch_size=25, max_iter=3, random_state=0,
                       method_options={"adam_learning_rate": 0.05,
                                       "shared_inducing": shared}, **settings)
    return est.fit(X, y).predict_proba(Xte)
fits = {"numpy": fit(), "shared": fit(shared=True),
        "torch": fit(backend="torch", device="cpu", dtype="float64"),
        "torch_shared": fit(True, backend="torch", device="cpu", dtype="float64")}
"""


def test_two_gloo_ranks_fit_the_one_process_model(tmp_path):
    from gpinfer.testing.ranks import worst_rank_differences

    worst = worst_rank_differences(FITS, tmp_path)
    assert set(worst) == {"numpy", "shared", "torch", "torch_shared"}
    assert all(w < 1e-10 for w in worst.values()), worst


def test_group_refuses_what_is_not_data_parallel(tmp_path):
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks("""
        from gpinfer.errors import InputError
        from gpinfer.estimator import GPClassifier
        X = np.random.default_rng(0).normal(size=(40, 2)); y = (X[:, 0] > 0).astype(int)
        msgs = []
        for method, kw in (("ep", {"batch_size": 10}), ("pep", {"batch_size": 10}),
                           ("sep", {"batch_size": None}),
                           ("sep", {"batch_size": 13}),
                           ("sep", {"batch_size": 10, "method_options": {"time_limit_s": 5.0}})):
            try:
                GPClassifier(method=method, M=4, max_iter=2, random_state=0, **kw).fit(X, y)
                msgs.append("fitted")
            except InputError as e:
                msgs.append(str(e))
        save(msgs=np.array(msgs))
    """, 2, tmp_path)
    for o in out:
        ep, pep, full, short, limit = o["msgs"]
        assert "'ep' does not train data-parallel" in ep and "pep, sep" not in ep
        assert "'pep' does not train data-parallel" in pep
        assert "full-batch" in full and "process group" in full
        assert "a batch of 1 points for 2 ranks" in short  # 40 = 3 * 13 + 1
        assert "time_limit_s" in limit and "process group" in limit


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path, backend):
    """``Group.agreed_sums``: rank 1's NumericalError (its parts ignored) raises on both ranks
    after the one collective, so no rank waits on another; without a failure the sums are the
    ranks' sums."""
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks(f"""
        import torch
        from gpinfer.errors import NumericalError
        from gpinfer.training.distributed import current
        group = current()
        wrap = (lambda a: a) if {backend!r} == "numpy" else torch.from_numpy
        parts = [wrap(np.full((2, 2), RANK + 1.0)), wrap(np.arange(3.0) * (RANK + 1))]
        sums = [np.asarray(a) for a in group.agreed_sums(parts, None)]
        failure = NumericalError("bad sites") if RANK == 1 else None
        try:
            group.agreed_sums(parts, failure)
            msg = "no error"
        except NumericalError as e:
            msg = str(e)
        save(P=sums[0], h=sums[1], msg=np.array(msg))
    """, 2, tmp_path)
    for o in out:
        np.testing.assert_array_equal(o["P"], np.full((2, 2), 3.0))
        np.testing.assert_array_equal(o["h"], np.arange(3.0) * 3)
    assert "another rank" in str(out[0]["msg"])
    assert str(out[1]["msg"]) == "bad sites"


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_agreed_mean_takes_a_failed_ranks_host_zero(tmp_path, backend):
    """``Group.agreed_mean`` as ``TrainingLoop._group_objective`` calls it on a rank whose part
    failed (value the host 0.0, gradient zeros of the backend): every rank raises the
    ``NumericalError`` after the collective (a torch gradient included)."""
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks(f"""
        import torch
        from gpinfer.errors import NumericalError
        from gpinfer.training.distributed import current
        group = current()
        wrap = (lambda a: a) if {backend!r} == "numpy" else torch.from_numpy
        failure = NumericalError("bad objective") if RANK == 1 else None
        value = 0.0 if RANK == 1 else (2.0 if {backend!r} == "numpy" else wrap(np.array(2.0)))
        try:
            group.agreed_mean(value, wrap(np.zeros(3)), failure)
            msg = "no error"
        except NumericalError as e:
            msg = str(e)
        save(msg=np.array(msg))
    """, 2, tmp_path)
    assert "another rank" in str(out[0]["msg"])
    assert str(out[1]["msg"]) == "bad objective"

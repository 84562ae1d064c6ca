"""svi in a process group (issue 24 item 2): K = 2 gloo ranks, each evaluating its part of every
global batch, fit the model of one process on the union batches (float64 probabilities within
1e-10, numpy and torch-CPU); what a group does not do yet (natural gradients, L-BFGS-B, a batch
with fewer points than ranks) is refused before training."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch.distributed needs PyTorch (make test installs it)")

# the fits of the ranks and of the one process: 3 classes, robust-max, Adam, 3 epochs; 110
# points in batches of 25 (the last one 10: the ranks' parts 13/12 and 5/5)
FITS = """
from sklearn.datasets import make_classification
from gpinfer.estimator import GPClassifier
X, y = make_classification(110, 4, n_informative=3, n_redundant=0, n_classes=3,
                           n_clusters_per_class=1, random_state=1)
Xte = X[:30] + 0.1
def fit(**settings):
    est = GPClassifier(method="svi", likelihood="robustmax", M=8, batch_size=25, max_iter=6,
                       random_state=0, method_options={
                           "optimizer": "adam", "report_every": 2,
                           "optimizer_options": {"learning_rate": 0.05}}, **settings)
    return est.fit(X, y).predict_proba(Xte)
fits = {"numpy": fit(), "torch": fit(backend="torch", device="cpu", dtype="float64")}
"""


def test_two_gloo_ranks_fit_the_one_process_model(tmp_path):
    from gpinfer.testing.ranks import worst_rank_differences

    worst = worst_rank_differences(FITS, tmp_path)
    assert set(worst) == {"numpy", "torch"}
    assert all(w < 1e-10 for w in worst.values()), worst


def test_group_refuses_natural_gradients_lbfgs_and_short_batches(tmp_path):
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks("""
        from gpinfer.errors import InputError
        from gpinfer.estimator import GPClassifier
        X = np.random.default_rng(0).normal(size=(40, 2)); y = (X[:, 0] > 0).astype(int)
        msgs = []
        for kw in ({"batch_size": 10, "method_options": {"optimizer": "adam",
                                                          "natural_gradient": 0.5}},
                   {"batch_size": None, "method_options": {"optimizer": "lbfgs"}},
                   {"batch_size": 13, "method_options": {"optimizer": "adam"}}):
            try:
                GPClassifier(method="svi", M=4, max_iter=2, random_state=0, **kw).fit(X, y)
                msgs.append("fitted")
            except InputError as e:
                msgs.append(str(e))
        save(msgs=np.array(msgs))
    """, 2, tmp_path)
    for o in out:
        ngd, lbfgs, short = o["msgs"]
        assert "natural_gradient" in ngd and "process group" in ngd
        assert "L-BFGS-B" in lbfgs and "process group" in lbfgs
        assert lbfgs.startswith("svi with L-BFGS-B (optimizer='lbfgs')") and "adadelta" in lbfgs
        assert "a batch of 1 points for 2 ranks" in short  # 40 = 3 * 13 + 1


def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path):
    """A ``NumericalError`` in rank 1's ELBO (a failed Cholesky, say) travels as the failure
    flag of the step's collective: both ranks raise, neither waits for the timeout."""
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks("""
        from gpinfer.errors import NumericalError
        from gpinfer.estimator import GPClassifier
        from gpinfer_svi.method import VariationalState
        if RANK == 1:
            def broken(self, *args, **kwargs):
                raise NumericalError("broken on purpose", quantity="Kuu")
            VariationalState.estimate = broken
        X = np.random.default_rng(0).normal(size=(40, 2)); y = (X[:, 0] > 0).astype(int)
        try:
            GPClassifier(method="svi", M=4, max_iter=2, batch_size=10, random_state=0,
                         method_options={"optimizer": "adam"}).fit(X, y)
            msg = "fitted"
        except NumericalError as e:
            msg = str(e)
        save(msg=np.array(msg))
    """, 2, tmp_path, timeout_s=90.0)
    assert "broken on purpose" in str(out[1]["msg"])
    assert "another rank" in str(out[0]["msg"])

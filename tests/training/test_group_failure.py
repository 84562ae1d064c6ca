"""A rank that fails outside a step ends the data-parallel fit on every rank at once
(``distributed.leave_on_failure``), not at the collective timeout: rank 1's callback raises
``KeyboardInterrupt`` mid-fit and rank 1 stays alive (as a caller that caught it would), and
rank 0 must raise a ``GroupError`` within 30 s (seconds, in fact), where the collective
timeout is 60 s (before the mend rank 0 waited the whole 60 s). A process that left its group
is told so by ``current`` instead of fitting alone."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch.distributed needs PyTorch (make test installs it)")

COLLECTIVE_S = 60.0
_EPILOGUE = "\nif dist.is_initialized():\n    dist.destroy_process_group()\n"


@pytest.mark.parametrize("private", ["kept", "gone"])
def test_a_rank_interrupted_outside_a_step_ends_the_fit_on_every_rank(tmp_path, private):
    """(``private="gone"``: torch's private ``_get_default_store`` raises; the failure is
    posted and read all the same through the store ``start_group`` kept, as under
    ``gpinfer-run``: before the mend the message was lost.)"""
    from gpinfer.testing.ranks import launch_ranks

    done = tmp_path / "rank0.done"
    ended = launch_ranks(f"""
        import time
        if {private!r} == "gone":
            def _private():
                raise RuntimeError("no private store getter")
            dist.distributed_c10d._get_default_store = _private
        from gpinfer.errors import GroupError
        from gpinfer.estimator import GPClassifier
        from gpinfer.training import distributed
        X = np.random.default_rng(0).normal(size=(200, 3)); y = (X[:, 0] > 0).astype(int)
        def stop(info):
            if RANK == 1 and info.iteration == 3:
                raise KeyboardInterrupt("stopped by hand")
        est = GPClassifier(method="svi", M=5, batch_size=20, max_iter=100, random_state=0,
                           method_options={{"optimizer": "adam", "report_every": 1}})
        try:
            est.fit(X, y, callback=stop)
            what = "fitted"
        except (KeyboardInterrupt, Exception) as e:
            what = f"{{type(e).__name__}}: {{e}}"
        t = time.time()
        left = "still in the group"
        try:
            distributed.current()
        except GroupError as e:
            left = str(e)
        if RANK == 1:  # alive until rank 0 has ended its fit (or for 100 s)
            while not os.path.exists({str(done)!r}) and time.time() - t < 100:
                time.sleep(0.1)
        save(what=np.array(what), t=np.array(t), left=np.array(left))
        if RANK == 0:
            open({str(done)!r}, "w").close()
    """, 2, tmp_path, timeout_s=150, collective_s=COLLECTIVE_S)
    assert [rc for rc, _ in ended] == [0, 0], ended
    out = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    assert str(out[1]["what"]) == "KeyboardInterrupt: stopped by hand"
    assert str(out[0]["what"]).startswith(  # rank 1 posted its error before it left
        "GroupError: rank 0 of 2: a collective of the process group failed: the first failure: "
        "rank 1: KeyboardInterrupt: stopped by hand"), out[0]
    waited = float(out[0]["t"]) - float(out[1]["t"])
    assert waited < 30.0 < COLLECTIVE_S, waited
    # both left the group: a further fit would not run alone on one rank
    assert "left its process group after a failure (rank 1: KeyboardInterrupt" in \
        str(out[1]["left"])
    assert "left its process group after a failure (rank 0: GroupError" in str(out[0]["left"])


def test_any_error_in_a_ranks_part_of_a_step_raises_on_every_rank(tmp_path):
    """``attempt`` takes any ``Exception`` of a rank's part of a step (a bug, a
    ``NonFiniteError`` from a kernel check), not only a ``NumericalError``: it travels as the
    step collective's second flag, the failed rank raises its own error and the others a
    ``GroupError`` (not a ``NumericalError``, which the failure policy would retry alone), at
    the same collective; the group stays usable (before the mend the ``ValueError`` left
    ``attempt`` on rank 1 only and rank 0 waited in the collective)."""
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks("""
        from gpinfer.training.distributed import attempt, current
        group = current()
        def part():
            if RANK == 1:
                raise ValueError("a bug in rank 1's part")
            return np.ones(3)
        done, failure = attempt(part)
        try:
            group.agreed_sums([np.zeros(3) if done is None else done], failure)
            msg = "no error"
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
        after = group.agreed_sums([np.full(2, RANK + 1.0)], None)[0]  # still usable
        save(msg=np.array(msg), after=after)
    """, 2, tmp_path)
    assert str(out[1]["msg"]) == "ValueError: a bug in rank 1's part"
    assert str(out[0]["msg"]).startswith("GroupError: an error on another rank of 2")
    for o in out:
        np.testing.assert_array_equal(o["after"], [3.0, 3.0])


def test_a_rank_refused_by_its_checks_ends_the_fit_on_every_rank(tmp_path):
    """Rank 1 is given other data than rank 0 (a NaN in its row 7): its check refuses it with an
    ``InputError`` before training, and the checks end in one agreement
    (``distributed.checks_agreed``), so rank 0 raises an ``InputError`` naming rank 1 and its
    message at once instead of entering training (before the mend rank 0 waited in its first
    step's collective for the timeout, 60 s), and the group stays usable on both ranks."""
    from gpinfer.testing.ranks import launch_ranks

    ended = launch_ranks("""
        import time
        import torch
        from gpinfer.estimator import GPClassifier
        X = np.random.default_rng(0).normal(size=(200, 3)); y = (X[:, 0] > 0).astype(int)
        if RANK == 1:
            X[7, 2] = np.nan
        est = GPClassifier(method="svi", M=5, batch_size=20, max_iter=100, random_state=0,
                           method_options={"optimizer": "adam", "report_every": 1})
        try:
            est.fit(X, y)
            what = "fitted"
        except Exception as e:
            what = f"{type(e).__name__}: {e}"
        t = time.time()
        after = np.full(2, RANK + 1.0)
        dist.all_reduce(torch.from_numpy(after))
        save(what=np.array(what), t=np.array(t), after=after)
    """, 2, tmp_path, timeout_s=150, epilogue=_EPILOGUE, collective_s=COLLECTIVE_S)
    assert [rc for rc, _ in ended] == [0, 0], ended
    out = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    own = str(out[1]["what"])
    assert own.startswith("InputError: ") and "row 7" in own, own
    assert str(out[0]["what"]) == (
        "InputError: the checks before training failed on another rank of the process group "
        f"(this is rank 0 of 2): rank 1: {own}"), out[0]
    waited = abs(float(out[0]["t"]) - float(out[1]["t"]))
    assert waited < 30.0 < COLLECTIVE_S, waited
    for o in out:  # the group stays usable: the sum of both ranks
        np.testing.assert_array_equal(o["after"], [3.0, 3.0])

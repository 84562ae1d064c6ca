"""sep's tied sites kept whitened between steps: an update leaves ``L^T Lam L``, ``L^T h`` on
its terms and the next step moves them to its own factor ``L'`` by ``T = L^-1 L'``
(``gpinfer.sites.stacked.rebased``), forming ``Lam``, ``h`` only when read. With the kernels
and ``Z`` moving between steps this gives what the round trip through ``u``-space gives (the
sums formed after every update and whitened again on the next terms), per class and with one
kernel and ``Z`` shared, on numpy and torch; a snapshot (the kept sums themselves, no copy)
restores the same sums, also after steps from it. Shared sums on numpy are read where they are
(``gpinfer.sites.stacked.Frame``) until the frame drifts: kept every step, moved every step, and
the default (both) give the same steps."""

from __future__ import annotations

import numpy as np
import pytest
from ep_helpers import problem
from gpinfer_ep.state import TiedSites

from gpinfer.backend import ops, resolve_backend
from gpinfer.hyper import HyperParameters
from gpinfer.sites.stacked import FRAME_DRIFT

N, C, M = 12, 3, 4


def _host(a):
    return np.asarray(ops.to_host(a), dtype=float)


def _close(a, b, tol=1e-11):
    a, b = _host(a), _host(b)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


def _states(backend, shared, n_points=N, m=M):
    X, y, kernels, Zs = problem(N=n_points, C=C, M=m, seed=5, shared=shared)
    states = []
    for _ in range(2):
        state = TiedSites(y, C, m, backend=backend)
        state.shared = shared
        states.append(state)
    n = 1 if shared else C
    hp = HyperParameters([k.copy() for k in kernels[:n]],
                         Z=[backend.asarray(z) for z in Zs[:n]])
    return backend.asarray(X), states, hp


@pytest.mark.parametrize(("shared", "drift"), [
    (False, FRAME_DRIFT), (True, FRAME_DRIFT), (True, 0.0), (True, 0.2), (True, np.inf)],
    ids=["per-class", "shared", "shared-moved", "shared-mixed", "shared-kept"])
@pytest.mark.parametrize("backend_name", ["numpy", "torch"])
def test_kept_whitened_sums_equal_the_u_space_round_trip(backend_name, shared, drift):
    if backend_name == "torch":
        pytest.importorskip("torch")
    backend = resolve_backend(backend_name)
    Xt, (kept, trip), hp = _states(backend, shared)
    kept.frame_drift = drift
    framed = []  # per step: whether the kept sums were read in a frame (not moved)
    rng = np.random.default_rng(6)
    theta = _host(hp.pack())
    previous = None
    for step, idx in enumerate([np.arange(0, N, 2), np.arange(1, N, 2), np.arange(N)] * 2):
        theta = theta + 0.05 * rng.standard_normal(theta.size)  # the kernels and Z move
        hp.unpack(ops.like(hp.pack(), theta))
        Xb = Xt[backend.as_index(idx)]
        terms = kept.terms_at(hp.kernels, hp.Z, Xb)
        P_w, _ = kept._whitened_sums(terms)  # the kept sums moved onto this step's factor
        if previous is not None:  # the factor moved: sums kept as they were would be wrong
            assert np.abs(_host(P_w) - previous).max() > 1e-3 * np.abs(previous).max()
        trip_terms = trip.terms_at(hp.kernels, hp.Z, Xb)
        _close(kept.update(terms, idx, 0.5), trip.update(trip_terms, idx, 0.5))
        framed.append(kept._frame is not None)
        trip.Lam, trip.h = trip.Lam, trip.h  # formed in u-space: the next step whitens them
        v_k, g_k = kept.evaluate(terms, idx, scale=N / idx.size)
        v_t, g_t = trip.evaluate(trip_terms, idx, scale=N / idx.size)
        _close(v_k, v_t)
        for name in ("Kuu", "Kuf", "Kff_diag"):
            _close(getattr(g_k, name), getattr(g_t, name), 1e-10)
        previous = _host(kept._whitened_sums(terms)[0])
        if step == 2:  # kept: the whitened sums (no copy); trip: u-space copies
            snaps = kept.snapshot(), trip.snapshot()
            expected = _host(trip.Lam), _host(trip.h)
    assert kept._based is not None and kept._u_stale  # nothing read the u-space sums
    # frames: shared sums on numpy only, from the second step (the first has no kept sums)
    if not shared or backend_name == "torch" or drift == 0.0:
        assert not any(framed)
    elif drift == np.inf:
        assert framed == [False] + [True] * 5
    elif drift == 0.2:  # these moves take Q 0.19-0.3 from I: kept, then moved, ...
        assert framed[:3] == [False, True, False] and any(framed[3:])
    # what is kept across steps (and a snapshot holds) is the factor, no [C, M, n] array
    assert all(a is None or a.shape[-2:] == (M, M) for a in kept._based[0][:2])
    _close(kept.Lam, trip.Lam)
    _close(kept.h, trip.h)
    kept.restore(snaps[0])
    trip.restore(snaps[1])
    # a step from the restored state (its sums moved on from the snapshot's factor)
    hp.unpack(ops.like(hp.pack(), theta + 0.05 * rng.standard_normal(theta.size)))
    idx = np.arange(N)
    terms, trip_terms = (s.terms_at(hp.kernels, hp.Z, Xt) for s in (kept, trip))
    _close(kept.update(terms, idx, 0.5), trip.update(trip_terms, idx, 0.5))
    _close(kept.evaluate(terms, idx)[0], trip.evaluate(trip_terms, idx)[0])
    kept.restore(snaps[0])  # a snapshot restores again (it was not moved by the step)
    _close(kept.Lam, expected[0])
    _close(kept.h, expected[1])


@pytest.mark.parametrize("phase", ["update", "evaluate"])
@pytest.mark.parametrize("shared", [False, True], ids=["per-class", "shared"])
@pytest.mark.parametrize(("poison", "message"), [
    ("nan_P", "site sums are not finite"), ("inf_h", "site sums are not finite"),
    ("indefinite", "not positive definite")])
@pytest.mark.parametrize("m", [M, 70], ids=["small", "potrf"])
def test_the_sums_are_checked_once_and_the_problem_named(phase, shared, poison, message, m):
    """numpy: the update's cavity, and the evaluation's q and cavity (one ``P_w``), checked
    finite once (``finite_sums``) and factorised in place unchecked; a non-finite ``P_w`` or
    ``h_w`` and an indefinite ``B`` still raise ``NumericalError`` (quantity ``"B"``) naming
    the problem, also where the stacks are factorised by ``potrf`` in place (``M >= 64``)."""
    from gpinfer.errors import NumericalError

    backend = resolve_backend("numpy")
    n_points = N if m == M else 80
    Xt, (state, _), hp = _states(backend, shared, n_points, m)
    idx = np.arange(n_points)
    terms = state.terms_at(hp.kernels, hp.Z, Xt)
    state.update(terms, idx, 0.5)
    P_w, h_w = (np.array(a) for a in state._whitened_sums(terms))
    if poison == "nan_P":
        P_w[1, 2, 0] = np.nan
    elif poison == "inf_h":
        h_w[2, 1] = np.inf
    else:
        P_w[1] -= (5.0 + 3.0 * np.abs(P_w[1]).max()) * np.eye(m)  # every a: indefinite
    state._whitened = (terms, P_w, h_w)
    with pytest.raises(NumericalError, match=message) as err:
        getattr(state, phase)(terms, idx, *(() if phase == "evaluate" else (0.5,)))
    assert err.value.quantity == "B"


@pytest.mark.parametrize("shared", [False, True], ids=["per-class", "shared"])
def test_setting_one_u_space_sum_keeps_the_other_current(shared):
    """After an update (``Lam``, ``h`` unformed: the kept whitened sums), setting one of them
    alone, unread, leaves the other what the update made (formed from the kept sums before
    they are dropped), not the value from before the update."""
    backend = resolve_backend("numpy")
    Xt, (state, other), hp = _states(backend, shared)
    idx = np.arange(N)
    state.update(state.terms_at(hp.kernels, hp.Z, Xt), idx, 0.5)
    other.restore(state.snapshot())
    expected = _host(other.Lam), _host(other.h)
    state.h = np.zeros((C, M))  # unread: Lam not formed yet
    _close(state.Lam, expected[0])
    other.restore(state.snapshot())  # u-space copies now
    other.Lam = np.eye(M) * np.ones((C, 1, 1))
    np.testing.assert_array_equal(other.h, np.zeros((C, M)))
    np.testing.assert_array_equal(other.Lam, np.eye(M) * np.ones((C, 1, 1)))
    state.update(state.terms_at(hp.kernels, hp.Z, Xt), idx, 0.5)
    state.restore({"Lam": np.ones((C, M, M)), "h": np.ones((C, M))})  # over kept sums
    np.testing.assert_array_equal(state.Lam, np.ones((C, M, M)))
    assert state._based is None and not state._u_stale


@pytest.mark.parametrize("shared", [False, True], ids=["per-class", "shared"])
def test_formed_u_space_sums_are_read_only(shared):
    """``Lam``, ``h`` formed from the kept whitened sums after an update are numpy arrays the
    state does not read back (the next step moves the kept sums): a write in place raises
    instead of being lost; setting the attribute still replaces the sums (the next update
    starts from them)."""
    backend = resolve_backend("numpy")
    Xt, (state, other), hp = _states(backend, shared)
    idx = np.arange(N)
    terms = state.terms_at(hp.kernels, hp.Z, Xt)
    state.update(terms, idx, 0.5)
    with pytest.raises(ValueError, match="read-only"):
        state.Lam[0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        state.h[...] = 0.0
    Lam = np.array(state.Lam)  # writable copies, set as a whole: the state's sums now
    Lam[:, 0, 0] += 1.0
    state.Lam = Lam
    assert state.Lam is Lam and state._based is None
    other.Lam, other.h = Lam.copy(), np.array(state.h)
    state.update(terms, idx, 0.5)
    other.update(terms, idx, 0.5)
    _close(state.Lam, other.Lam)
    _close(state.h, other.h)

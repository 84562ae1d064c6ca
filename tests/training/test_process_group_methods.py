"""One refusal for the methods that do not train in a process group
(``Method.supports_process_group``, checked by ``validation.check_process_group`` inside
``check_method_compatible``): in a group of two gloo ranks, every full-batch method (and ep,
pep) is an ``InputError`` naming the methods that do, raised before training (the callback is
never called), where before every rank fitted the whole model alone; sep and svi fit."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch.distributed needs PyTorch (make test installs it)")

REFUSED = ("laplace", "vi-jj", "ivm", "mcmc-ais", "gfitc", "ep", "pep", "ep-dense")


def test_methods_without_a_process_group_are_refused_before_training(tmp_path):
    from gpinfer import registry
    from gpinfer.testing.ranks import run_ranks

    out = run_ranks(f"""
        from gpinfer import registry
        from gpinfer.errors import InputError
        from gpinfer.estimator import GPClassifier
        from gpinfer.validation import check_process_group
        X = np.random.default_rng(0).normal(size=(40, 2)); y = (X[:, 0] > 0).astype(int)
        msgs, called = [], []
        for method in {REFUSED!r} + ("sep", "svi"):
            cls = registry.load_method(method)
            est = GPClassifier(method=method, M=4 if cls.uses_inducing_points else None,
                               max_iter=2, random_state=0, baseline_failure="warn",
                               batch_size=10 if method in ("sep", "svi") else None,
                               method_options={{"optimizer": "adam"}} if method == "svi"
                               else None)
            calls = []
            try:
                est.fit(X, y, callback=calls.append)
                msgs.append("fitted")
            except InputError as e:
                msgs.append(str(e))
            called.append(len(calls))
        # the same check for every installed method, by its declaration alone
        declared = []
        for name in registry.names(registry.METHODS):
            try:
                check_process_group(registry.load_method(name), name)
                declared.append(name)
            except InputError:
                pass
        save(msgs=np.array(msgs), called=np.array(called), declared=np.array(declared))
    """, 2, tmp_path)
    can = sorted(n for n in registry.names(registry.METHODS)
                 if registry.load_method(n).supports_process_group)
    assert {"sep", "svi"} <= set(can)
    assert not set(REFUSED) & set(can)
    for o in out:
        *refused, sep, svi = (str(m) for m in o["msgs"])
        assert sep == "fitted" and svi == "fitted"
        for method, msg in zip(REFUSED, refused):
            assert f"method {method!r} does not train data-parallel" in msg, msg
            assert "a process group of 2 ranks" in msg and ", ".join(can) in msg
        # the refusals came before training; sep's and svi's fits reported iterations
        assert list(o["called"][:-2]) == [0] * len(REFUSED) and min(o["called"][-2:]) > 0
        assert sorted(str(n) for n in o["declared"]) == can


def test_no_group_no_refusal():
    """Without a process group the check passes every method (one process: nothing changes)."""
    from gpinfer import registry
    from gpinfer.validation import check_process_group

    for name in registry.names(registry.METHODS):
        check_process_group(registry.load_method(name), name)

"""The thread policy (gpinfer.threads): one BLAS thread inside every fit unless asked otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpinfer.errors import InputError
from gpinfer.threads import (
    BLAS_THREADS_TAG,
    RUNTIME_ENVS,
    THREAD_ENV_TAG,
    THREADS_ENV,
    blas_threads,
    export_policy,
    run_tags,
)

#: a fit under the process's own thread settings, forced to 2 BLAS threads before it starts (the
#: default of OpenBLAS on any machine with two or more cores); the callback records what the
#: BLAS libraries loaded in the process use *during* training
_PROBE = r"""
import json, sys
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
import gpinfer

threadpool_limits(limits=2, user_api="blas")  # what a default process looks like
seen = []

def callback(info):
    seen.append(sorted({(lib["internal_api"], lib["filepath"], lib["num_threads"])
                        for lib in threadpool_info() if lib["user_api"] == "blas"}))

rng = np.random.default_rng(0)
X = rng.normal(size=(60, 2))
y = (X[:, 0] + 0.3 * rng.normal(size=60) > 0).astype(int)
gpinfer.GPClassifier(method=sys.argv[1], max_iter=3, random_state=0, **json.loads(sys.argv[2])
                     ).fit(X, y, callback=callback)
after = sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})
print(json.dumps({"inside": seen, "after": after}))
"""


def _probe(method: str, extra: dict, env_threads: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_ENVS and k != THREADS_ENV}
    if env_threads is not None:
        env[THREADS_ENV] = env_threads
    out = subprocess.run([sys.executable, "-c", _PROBE, method, json.dumps(extra)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("method,extra", [
    ("laplace", {}),
    ("sep", {"M": 10, "method_options": {"n_jobs": 1}}),
])
def test_a_fit_runs_with_one_blas_thread_under_default_settings(method, extra):
    probe = _probe(method, extra, env_threads=None)
    assert probe["inside"], "the callback was never called"
    libraries = probe["inside"][0]
    assert libraries, "no BLAS library was seen inside the fit"
    # numpy's and scipy's OpenBLAS are both loaded and both held to one thread
    assert all(threads == 1 for step in probe["inside"] for (_, _, threads) in step)
    assert probe["after"] == [2], "the process's own setting is restored after the fit"


def test_the_knob_raises_the_thread_count():
    probe = _probe("laplace", {}, env_threads="2")
    assert {threads for step in probe["inside"] for (_, _, threads) in step} == {2}


def test_inherit_leaves_the_process_settings():
    probe = _probe("laplace", {}, env_threads="inherit")
    assert {threads for step in probe["inside"] for (_, _, threads) in step} == {2}


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_thread_setting_is_an_input_error_before_training(monkeypatch, bad):
    import numpy as np

    import gpinfer

    assert blas_threads("3") == 3 and blas_threads("inherit") is None
    with pytest.raises(InputError, match=THREADS_ENV):
        blas_threads(bad)
    monkeypatch.setenv(THREADS_ENV, bad)
    calls = []
    with pytest.raises(InputError, match="positive integer"):
        gpinfer.GPClassifier(method="laplace").fit(np.eye(4), [0, 1, 0, 1],
                                                   callback=calls.append)
    assert calls == []


def test_export_policy_sets_unset_runtime_variables_only(monkeypatch):
    for name in RUNTIME_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    export_policy()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "3"


def test_run_tags_record_the_policy_and_the_runtime_variables_that_are_set(monkeypatch):
    for name in RUNTIME_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert run_tags() == {BLAS_THREADS_TAG: "1", THREAD_ENV_TAG: "none"}
    monkeypatch.setenv("MKL_NUM_THREADS", "4")
    monkeypatch.setenv(THREADS_ENV, "4")
    assert run_tags() == {BLAS_THREADS_TAG: "4",
                          THREAD_ENV_TAG: f"{THREADS_ENV}=4 MKL_NUM_THREADS=4"}
    monkeypatch.setenv(THREADS_ENV, "inherit")
    assert run_tags()[BLAS_THREADS_TAG] == "inherit"

"""The plugin of docs/example_plugin runs its own test file (the shared method battery), the one
the plugin guide shows, so the guide stays true."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np

from gpinfer.kernels import RBF

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_plugin"
GUIDE = EXAMPLE.parent / "plugins.md"
PLUGIN_TEST = EXAMPLE / "tests" / "test_labelreg.py"

sys.path.insert(0, str(EXAMPLE))
from gpinfer_labelreg import label_regression_evidence  # noqa: E402


def _load_plugin_test():
    """The example plugin's own test module (docs/example_plugin/tests/test_labelreg.py)."""
    spec = importlib.util.spec_from_file_location("example_plugin_test_labelreg", PLUGIN_TEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the plugin's own test suite, collected here: the shared battery (gradient check included)
TestExampleLabelRegression = _load_plugin_test().TestLabelRegression


def test_the_guide_shows_the_plugin_test_file_whole():
    """docs/plugins.md section 4 shows docs/example_plugin/tests/test_labelreg.py verbatim."""
    section = GUIDE.read_text().split("## 4. Tests", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert blocks == [PLUGIN_TEST.read_text()]
    assert "..." not in blocks[0]


def test_example_evidence_equals_dense_gaussian_log_density():
    """Oracle: the evidence is the log density of N(0, K + noise I), computed directly."""
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(3)
    X = rng.standard_normal((12, 2))
    t = np.where(rng.random(12) < 0.5, -1.0, 1.0)
    kernel = RBF(lengthscale=1.1, variance=1.7)
    value = label_regression_evidence(kernel, X, t, 0.3)[0]
    expected = multivariate_normal(np.zeros(12), kernel.K(X) + 0.3 * np.eye(12)).logpdf(t)
    assert abs(value - expected) < 1e-9


def _example_problem(max_iter):
    from gpinfer.interfaces import Problem
    from gpinfer.likelihoods import BernoulliProbit

    rng = np.random.default_rng(5)
    X = rng.standard_normal((30, 2))
    y = (X[:, 0] + 0.3 * rng.standard_normal(30) > 0).astype(np.int64)
    return Problem(X=X, y=y, n_classes=2, kernel=RBF(lengthscale=2.0, variance=0.5),
                   likelihood=BernoulliProbit(), max_iter=max_iter)


def test_example_reports_through_the_engine():
    """The example trains on the engine's outer schedule and reports through its reporter: a
    stop request ends the fit after the iteration shown, every iteration has its number and
    training time, and an iteration's posterior is the one at that iterate, built later."""
    from gpinfer_labelreg import LabelRegression

    infos = []
    fit = LabelRegression().fit(_example_problem(8), callback=infos.append)
    assert fit.n_iter == len(infos) > 2
    assert [h["iteration"] for h in fit.history] == [float(i) for i in range(1, fit.n_iter + 1)]
    stopped = LabelRegression().fit(_example_problem(8), callback=lambda info: True)
    assert stopped.n_iter == 1
    one = LabelRegression().fit(_example_problem(1))  # the kernel of iterate 1
    Xs = np.linspace(-2, 2, 7)[:, None] * np.ones((1, 2))
    np.testing.assert_allclose(infos[0].posterior().predict_f(Xs)[0],
                               one.posterior.predict_f(Xs)[0], rtol=1e-12)
    assert np.max(np.abs(infos[0].posterior().predict_f(Xs)[0]
                         - fit.posterior.predict_f(Xs)[0])) > 1e-6

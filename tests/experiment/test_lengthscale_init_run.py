"""``gpinfer-run``'s kernel is named (the kernel group's length-scale 1 is a placeholder), so
``lengthscale_init="auto"`` is the median heuristic there even with ``optimize=false``
(``gpinfer.kernels.initialisation``), as before ``"auto"``: the run's estimator, fitted on the run's
rows, starts from the median and keeps it; a ``kernel.lengthscale`` set off 1.0 with
``optimize=false`` is lost so, with a warning naming ``lengthscale_init=kernel``."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from gpinfer.experiment.runner import _make_estimator, _params, prepare
from gpinfer.kernels.initialisation import leaf_kernels, median_distance
from gpinfer.kernels.stationary import Stationary

from .helpers import require_plugin, store_cfg


@pytest.mark.parametrize("method", ["vi-robustmax", "vi-jj"])
def test_a_run_with_a_named_kernel_keeps_the_median(tmp_path: Path, store_uri: str,
                                                     method: str) -> None:
    require_plugin(method)
    binary = ("dataset.keep_classes=[0,1]",) if method == "vi-jj" else ()
    with pytest.warns(UserWarning, match=r"kernel.lengthscale=2.0 is replaced by the median "
                                         r"heuristic .* method.options.lengthscale_init=kernel"):
        p = prepare(store_cfg(store_uri, f"method={method}", "dataset=iris", "optimize=false",
                              "iterations=2", "kernel.lengthscale=2.0", *binary), tmp_path / "run")
    assert p.method_options["lengthscale_init"] == "median"
    assert p.config["method"]["options"]["lengthscale_init"] == "auto"
    assert _params(p)["method.options.lengthscale_init"] == "median"  # MLflow: what ran
    est = _make_estimator(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(p.X_train, p.y_train)
    kernels = getattr(est.posterior_, "kernels", None) or [est.kernel_]
    median = np.sqrt(median_distance(p.X_train, np.random.default_rng(0)))
    parts = [q for k in kernels for q in leaf_kernels(k) if isinstance(q, Stationary)]
    assert parts
    for part in parts:
        np.testing.assert_allclose(np.exp(part.get_unconstrained()[0]), median, rtol=1e-12)


@pytest.mark.parametrize(("overrides", "rule"), [
    (("optimize=false",), "median"),  # the kernel group's length-scale: nothing to lose
    (("optimize=false", "kernel.lengthscale=2.0", "method.options.lengthscale_init=median"),
     "median"),
    (("optimize=false", "kernel.lengthscale=2.0", "method.options.lengthscale_init=kernel"),
     "kernel"),
    (("kernel.lengthscale=2.0",), "median"),  # optimised (the method's default): a start only
])
def test_the_median_warning_only_where_a_fixed_length_scale_is_lost(
        tmp_path: Path, store_uri: str, overrides: tuple[str, ...], rule: str) -> None:
    require_plugin("vi-robustmax")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        p = prepare(store_cfg(store_uri, "method=vi-robustmax", "dataset=iris", *overrides),
                    tmp_path / "run")
    assert p.method_options["lengthscale_init"] == rule

"""Experiments: the Hydra app ``gpinfer-run``, MLflow logging, ``result.json`` and progress.

* ``app.main``: the console script (also ``python -m gpinfer``), composing ``conf/config.yaml``;
* ``runner.run_experiment(cfg)``: one run, from validation to ``result.json`` (its settings
  checked by ``settings.parse_settings``, everything before training by ``prepare.prepare``);
* ``tracking.RunLogger``: the MLflow run (params, tags, batched metrics, artifacts, status);
* ``publish``: after the fit, learned hyper-parameters, the model (``model_logging``), dataset
  inputs and plots (``figures``); ``report``: the sweep report (``gpinfer report``);
* ``results`` (``result.json``, peak memory, summary line); the progress bar is
  ``gpinfer.progress``.

Importing this package is cheap: Hydra and MLflow are imported by the modules that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpinfer.experiment.runner import run_experiment

__all__ = ["run_experiment"]


def __getattr__(name: str) -> Any:
    if name == "run_experiment":
        from gpinfer.experiment.runner import run_experiment

        return run_experiment
    raise AttributeError(f"module 'gpinfer.experiment' has no attribute {name!r}")

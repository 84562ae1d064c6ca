"""Helpers shared by the experiment tests (constants of the toy plugin, Hydra compose)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from gpinfer import registry
from gpinfer.experiment.app import CONF_DIR

TOY_PKG = "gpinfer_exptoy_zz"
TOY_DIST = "gpinfer-exptoy"
TOY_VERSION = "9.9.0"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


#: the toy methods run on a binary dataset with laplace's (empty) option set, whatever the
#: project's default experiment is; overrides naming another method or dataset win
TOY_GROUPS = (("method", "laplace"), ("dataset", "breast_cancer"))


def compose_cfg(*overrides: str) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides``, as ``gpinfer-run`` would (no hydra node).

    The ``method`` and ``dataset`` groups default to ``TOY_GROUPS`` unless overridden.
    """
    base = [
        f"{group}={default}"
        for group, default in TOY_GROUPS
        if not any(o.startswith(f"{group}=") for o in overrides)
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="test"):
        return compose(config_name="config", overrides=[*base, *overrides])


def plugin_importable(name: str) -> str | None:
    """``None`` when method plugin ``name`` loads, else the reason (for ``pytest.skip``)."""
    try:
        registry.load_method(name)
    except Exception as exc:  # not installed yet, or broken
        return f"method plugin {name!r} is not importable yet: {exc}"
    try:
        from gpinfer.likelihoods import make_likelihood  # noqa: F401
    except ImportError as exc:
        return f"gpinfer.likelihoods.make_likelihood is missing: {exc}"
    return None

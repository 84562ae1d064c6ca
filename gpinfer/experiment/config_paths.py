"""Where Hydra finds gpinfer's configuration: the core's ``conf/`` and every plugin's own.

* ``core_conf_dir()``: the core's configuration folder. A wheel ships the top-level ``conf/`` as
  the package data ``gpinfer/conf`` (see ``setup.py``); an editable install reads
  ``<repo>/conf`` directly.
* ``plugin_conf_dirs()``: the ``conf/`` folder inside each plugin distribution's package (a
  plugin registering a method ships ``<its package>/conf/method/<name>.yaml``). Found from the
  entry-point metadata without importing the plugins; the Hydra search-path plugin
  ``hydra_plugins.gpinfer_hydra.searchpath`` appends them to the search path of ``gpinfer-run``, so
  ``method=<name>`` composes with no ``hydra.searchpath`` override.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
from pathlib import Path

import gpinfer

CONFIG_NAME = "config"
#: entry-point groups whose distributions may ship configuration
_GROUPS = ("gpinfer.methods", "gpinfer.datasets", "gpinfer.kernels", "gpinfer.likelihoods")


def core_conf_dir() -> Path:
    """The core's configuration folder (the one holding ``config.yaml``).

    The packaged copy ``<gpinfer>/conf`` when it exists (wheel install), else the repository's
    ``conf/`` next to the package (editable install or source tree).
    """
    package = Path(gpinfer.__file__).resolve().parent
    packaged = package / "conf"
    if (packaged / f"{CONFIG_NAME}.yaml").is_file():
        return packaged
    return package.parent / "conf"


def _package_dir(module: str) -> Path | None:
    """The folder of top-level package ``module`` without importing it (``None``: not found)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def plugin_conf_dirs() -> list[Path]:
    """``<package>/conf`` of every distribution registering gpinfer entry points, the core's
    own excepted, in a stable order (distribution name, then package)."""
    core = core_conf_dir().resolve()
    found: dict[tuple[str, str], Path] = {}
    for group in _GROUPS:
        for ep in metadata.entry_points(group=group):
            top = ep.value.split(":", 1)[0].split(".", 1)[0].strip()
            dist = ep.dist.name if ep.dist is not None else ""
            if not top or top == "gpinfer" or (dist, top) in found:
                continue
            folder = _package_dir(top)
            conf = None if folder is None else folder / "conf"
            if conf is not None and conf.is_dir() and conf.resolve() != core:
                found[(dist, top)] = conf
    return [found[key] for key in sorted(found)]


def register_hydra_plugins() -> None:
    """Make sure Hydra knows gpinfer's plugins (``hydra_plugins.gpinfer_hydra``).

    Hydra finds plugins by listing the folders of the ``hydra_plugins`` namespace; an editable
    install exposes gpinfer's through an import hook that cannot be listed, so they are
    registered here by name (a wheel install is found by Hydra's own scan: then nothing is
    added twice). Importing the sweeper module also stores its config (``hydra/sweeper:
    gpinfer``). Called when ``gpinfer.experiment.app`` is imported.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # Hydra's scan runs first
    from hydra_plugins.gpinfer_hydra import searchpath, sweeper

    for cls in (searchpath.GPInferSearchPathPlugin, sweeper.GPInferSweeper):
        if f"{cls.__module__}.{cls.__name__}" not in plugins.class_name_to_class:
            plugins.register(cls)


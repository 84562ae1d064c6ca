"""Append every gpinfer plugin's own ``conf/`` folder to Hydra's search path.

Active only when the primary configuration is gpinfer's (``gpinfer-run``, or ``compose`` on
the core's ``conf/``), so other Hydra applications in the same environment are left alone.
A plugin's ``<package>/conf/method/<name>.yaml`` then composes as ``method=<name>``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "gpinfer-plugin"


def _local(path: str) -> Path | None:
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        return None
    try:
        return Path(path).resolve()
    except OSError:
        return None


class GPInferSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from gpinfer.experiment.config_paths import core_conf_dir, plugin_conf_dirs

        core = core_conf_dir().resolve()
        if not any(_local(element.path) == core for element in search_path.get_path()):
            return
        for conf in plugin_conf_dirs():
            search_path.append(provider=PROVIDER, path=f"file://{conf}")

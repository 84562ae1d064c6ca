"""What a paper protocol (``conf/experiment/*.yaml``) needs, told before it starts.

A protocol's config carries a ``protocol`` node::

    protocol:
      name: villacampa2017_uci
      paper: Villacampa-Calvo & Hernandez-Lobato (2017), Tables 2-3
      data: [mnist]          # datasets when the sweep does not name them
      time_2_cores: about 5 h one job at a time
      note: ...

``describe(protocol, sweeper_params)`` counts the jobs of the sweep (the product of the sweep
values, ``range(...)`` included), checks that every dataset the sweep names is either
registered (generated or bundled) or a file in the data folder (``GPINFER_DATA_DIR``), and
returns the text ``gpinfer-run`` prints before the first job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def sweep_values(params: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each swept key's values, as Hydra expands them (``a,b``, ``range(1,21)``, ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out: dict[str, list[str]] = {}
    for key, value in params.items():
        override = parser.parse_overrides([f"{key}={value}"])[0]
        if override.is_sweep_override():
            out[str(key)] = [str(v) for v in override.sweep_string_iterator()]
        else:
            out[str(key)] = [str(override.get_value_element_as_str())]
    return out


def missing_datasets(names: list[str]) -> tuple[list[str], list[str]]:
    """``(file datasets found, file datasets missing)`` among ``names`` (registered ones are
    neither: they need no file)."""
    from gpinfer import registry
    from gpinfer.data.paths import data_dir, data_files

    registered = set(registry.names(registry.DATASETS))
    try:
        files = set(data_files(data_dir()))
    except Exception:  # a GPINFER_DATA_DIR that does not exist: nothing is found
        files = set()
    need = [n for n in names if n not in registered]
    return [n for n in need if n in files], [n for n in need if n not in files]


def describe(protocol: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    """The notice printed before a protocol starts (see the module docstring)."""
    from gpinfer.data.paths import data_dir

    values = sweep_values(params)
    jobs = 1
    for v in values.values():
        jobs *= len(v)
    sizes = " x ".join(f"{len(v)} {k}" for k, v in values.items() if len(v) > 1)
    lines = [f"protocol {protocol.get('name', '?')}: {protocol.get('paper', '')}".rstrip(": "),
             f"  jobs: {jobs}" + (f" ({sizes})" if sizes else "")]
    datasets = values.get("dataset") or [str(d) for d in protocol.get("data") or []]
    found, missing = missing_datasets(datasets)
    if found or missing:
        try:
            where = str(data_dir() or "no data folder: set GPINFER_DATA_DIR")
        except Exception as exc:  # noqa: BLE001 - told, not raised
            where = str(exc)
        lines.append(f"  data files ({where}): " + (", ".join(found) or "none") + " found"
                     + (f"; MISSING: {', '.join(missing)} (their jobs will fail)"
                        if missing else ""))
    if protocol.get("time_2_cores"):
        lines.append(f"  time on 2 cores: {protocol['time_2_cores']}")
    if protocol.get("note"):
        lines.append(f"  {protocol['note']}")
    return "\n".join(lines)

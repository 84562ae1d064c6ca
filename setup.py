"""Build hook of the gpinfer core: everything else is declared in ``pyproject.toml``.

The Hydra configuration stays at the top level of the repository (``conf/``) and ships inside
the package as ``gpinfer.conf`` (``package-dir`` in ``pyproject.toml``), so that ``gpinfer-run``
finds it from a plain wheel install. Setuptools' ``packages.find`` cannot rename a folder, so
the package list is built here: the code packages found on disk plus one package per folder of
``conf/``, nested ones included (``conf/hydra/launcher`` is ``gpinfer.conf.hydra.launcher``;
each a data-only package holding YAML files).
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

CONF = Path(__file__).resolve().parent / "conf"
CONF_PACKAGES = ["gpinfer.conf"] + [
    "gpinfer.conf." + ".".join(folder.relative_to(CONF).parts)
    for folder in sorted(CONF.rglob("*")) if folder.is_dir() and folder.name != "__pycache__"
]

setup(
    packages=[
        *find_namespace_packages(
            include=["gpinfer", "gpinfer.*", "hydra_plugins.*"], exclude=["*__pycache__*"]
        ),
        *CONF_PACKAGES,
    ],
    package_data={**{name: ["*.yaml"] for name in CONF_PACKAGES}, "gpinfer": ["py.typed"]},
)

"""Which registered plugins of a group have no test battery (for the completeness tests)."""

from __future__ import annotations

from collections.abc import Collection

from gpinfer import registry


def missing_batteries(group: str, recorded: Collection[str]) -> list[str]:
    """``"name (ClassName)"`` of every entry point of ``group`` (``gpinfer.kernels``,
    ``gpinfer.likelihoods``) whose class name is not in ``recorded`` (``KERNEL_SUITES``,
    ``LIKELIHOOD_SUITES``: the classes some battery subclass was declared for)."""
    missing = []
    for entry in registry.entries(group):
        cls = registry.load(group, entry.name)
        if cls.__name__ not in recorded:
            missing.append(f"{entry.name} ({cls.__name__})")
    return missing

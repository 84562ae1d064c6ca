"""Deprecated: the kernel's starting values moved beside ``prepare_kernel`` into
``gpinfer.kernels.initialisation`` (issue 23); the old names work for one more release."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpinfer.moved import renamed

if not TYPE_CHECKING:  # at run time only: mypy keeps checking the imports from here
    __getattr__ = renamed(__name__, {
        name: f"gpinfer.kernels.initialisation:{name}"
        for name in ("LENGTHSCALE_INIT_CHOICES", "lengthscale_init_option",
                     "resolve_lengthscale_init", "start_kernel")})

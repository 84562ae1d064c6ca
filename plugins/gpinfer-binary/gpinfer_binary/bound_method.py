"""What the KL and VB methods share as methods: a bound on ``log p(y)`` maximised by Newton
ascent (``gpinfer_binary.newton``), and the options of that ascent."""

from __future__ import annotations

from typing import ClassVar

from gpinfer.options import Option, integer, real
from gpinfer.sites.driver import DenseBinaryMethod


class NewtonBoundMethod(DenseBinaryMethod):
    """A dense binary method whose sites maximise a bound on ``log p(y)`` by
    ``newton_maximize`` (KL, VB)."""

    #: the objective, log p(y) of discrete labels or a bound on it, is never positive
    objective_limit: ClassVar[float | None] = 0.0
    objective_kind = "bound"

    @staticmethod
    def newton_options(gradient: str) -> dict[str, Option]:
        """The driver's options, ``tol`` (max-norm of ``gradient``) and ``max_newton``."""
        return {
            **DenseBinaryMethod.driver_options,
            "tol": real(1e-8, "(0, inf)", doc=f"max-norm of the {gradient}"),
            "max_newton": integer(100, "[1, inf)"),
        }

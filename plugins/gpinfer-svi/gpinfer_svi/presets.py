"""Registered presets of svi: a method name whose option defaults are a published set-up.

``vi-robustmax``: the robust-max VI baseline of Villacampa-Calvo & Hernandez-Lobato (2017),
spec ep-sep §3.2 / §2.11: ``RobustMax(epsilon=1e-3)``, batch L-BFGS-B on the full ELBO over
``q(u_c)``, ``Z_c`` and the log kernel parameters bounded to ``[-10, 10]``; white noise 1 added
to the kernel, squared length-scale = median distance (``lengthscale_init="auto"``: but for a
``Kernel`` object held fixed, which is kept), ``M`` distinct training inputs drawn per
class (at most ``N``), ``q(u)`` = prior. ``GPClassifier(method="vi-robustmax")`` and
``gpinfer-run method=vi-robustmax`` use it; every svi option can still be overridden.
"""

from __future__ import annotations

from typing import ClassVar

from gpinfer.options import Option
from gpinfer_svi.method import SVI

#: the preset's defaults (everything else as svi)
VI_ROBUSTMAX_DEFAULTS = {
    "optimizer": "lbfgs",
    "scale": "full",
    "inducing_init": "random",
    "init_q": "prior",
    "noise": 1.0,
    "lengthscale_init": "auto",
    "learn_inducing": True,
    "hyper_bounds": (-10.0, 10.0),
}


class ViRobustMax(SVI):
    """svi with the robust-max baseline's set-up as its defaults (module docstring)."""

    name: ClassVar[str] = "vi-robustmax"
    likelihoods: ClassVar[tuple[str, ...]] = ("robustmax",)
    #: batch L-BFGS-B keeps its state on the host and evaluates the ELBO on the backend, so the
    #: baseline runs on numpy and torch alike (the same fit, to round-off, in float64)
    backends: ClassVar[tuple[str, ...]] = ("numpy", "torch")
    option_spec: ClassVar[dict[str, Option]] = {
        key: opt.with_default(VI_ROBUSTMAX_DEFAULTS[key]) if key in VI_ROBUSTMAX_DEFAULTS else opt
        for key, opt in SVI.option_spec.items()
    }

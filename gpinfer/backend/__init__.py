"""Array backends: the hot path of the kernels and of the methods that declare the torch
backend (``Method.backends``; ``gpinfer.validation.check_method_backend`` names them from the
registry) written once against the Python array API standard, run on numpy (the default) or
PyTorch (CPU, CUDA).

* ``gpinfer.backend.choice``: what a user asks for (``backend``, ``device``, ``dtype``),
  checked up front, and the ``Backend`` a fit runs on (moving arrays to it and back);
* ``gpinfer.backend.ops``: the operations the standard lacks (triangular solves, Cholesky
  with failure reports, ``log_ndtr``, ``erfcx``, ``einsum``), mapped once per namespace.

Code on the hot path takes ``xp = namespace(x)`` from its inputs and never names numpy or
torch itself; the plugins stay backend-blind.
"""

from gpinfer.backend.choice import BACKENDS, DTYPES, Backend, resolve_backend
from gpinfer.backend.ops import namespace

__all__ = ["BACKENDS", "DTYPES", "Backend", "namespace", "resolve_backend"]

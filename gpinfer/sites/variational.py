"""Moved to ``gpinfer_svi.variational`` (issue 23): a deprecated path (``gpinfer.moved``)."""

from gpinfer.moved import moved_to

__getattr__ = moved_to(__name__, "gpinfer_svi.variational")

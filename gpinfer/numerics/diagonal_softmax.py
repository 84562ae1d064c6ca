"""Moved to ``gpinfer_ivm.diagonal_softmax`` (issue 23): a deprecated path (``gpinfer.moved``)."""

from gpinfer.moved import moved_to

__getattr__ = moved_to(__name__, "gpinfer_ivm.diagonal_softmax")

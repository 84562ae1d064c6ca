"""Moved to ``gpinfer_ep.gram`` (issue 23: its one client is gfitc): a deprecated path
(``gpinfer.moved``)."""

from gpinfer.moved import moved_to

__getattr__ = moved_to(__name__, "gpinfer_ep.gram")

"""Example gpinfer method plugin (see docs/plugins.md)."""

from gpinfer_labelreg.method import LabelRegression, label_regression_evidence

__all__ = ["LabelRegression", "label_regression_evidence"]

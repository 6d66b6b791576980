"""The old name of `auditor.collect.useful_output`, kept only for `auditor/cli.py`'s import of
`parse_metric` until the CLI package lands; delete this module once the CLI imports
`auditor.collect.useful_output`."""

from __future__ import annotations

from auditor.collect.useful_output import parse_metric

__all__ = ["parse_metric"]

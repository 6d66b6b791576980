"""The pure classification core (SPEC §3): tenures, coverage, idle runs, gangs, findings.

No I/O, no clock: DataFrames in, DataFrames out. `build_tenures` says who held which GPU
when; `classify` splits every capacity second of a window into waste categories.
"""

from auditor.classify.pipeline import Classification, classify
from auditor.classify.tenures import TENURE_COLUMNS, build_tenures

__all__ = ["TENURE_COLUMNS", "Classification", "build_tenures", "classify"]

"""Integer codes of the waste categories, as the vectorised classifier carries them.

A code is the category's position in `auditor.model.CATEGORIES`; `PENDING` marks a held
idle part whose category the sample-by-sample rules (straggler, checkpoint) still decide.
"""

from __future__ import annotations

from auditor.model import CATEGORIES, WasteCategory

BUSY = CATEGORIES.index(WasteCategory.BUSY)
UNALLOCATED = CATEGORIES.index(WasteCategory.UNALLOCATED)
RESERVED_IDLE = CATEGORIES.index(WasteCategory.RESERVED_IDLE)
STARTUP = CATEGORIES.index(WasteCategory.STARTUP)
TEARDOWN = CATEGORIES.index(WasteCategory.TEARDOWN)
CHECKPOINT = CATEGORIES.index(WasteCategory.CHECKPOINT)
STRAGGLER_WAIT = CATEGORIES.index(WasteCategory.STRAGGLER_WAIT)
COMPUTE_IDLE = CATEGORIES.index(WasteCategory.COMPUTE_IDLE)
UNOBSERVED = CATEGORIES.index(WasteCategory.UNOBSERVED)
N_CATEGORIES = len(CATEGORIES)

PENDING = -1
"""Decided later, sample by sample."""
NO_CATEGORY = -2
"""No second category on this piece."""

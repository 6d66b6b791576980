"""Idle-culling policies (SPEC §9) as `auditor whatif --policy` reads them.

`idle>=DURATION` (required), then optionally `kind=KIND`, `team=TEAM`, `grace=DURATION`,
`util<PERCENT` (or `util<=PERCENT`), comma-separated, each at most once. A DURATION reads
as every time option's does (`auditor.timespec`: 30m, 12h, 7d, 1w). A bad spec is one
`InputError` naming the field (`--policy grace`, ...).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from auditor.errors import InputError
from auditor.settings import Thresholds
from auditor.timespec import duration_ms

UTIL_EPSILON = 1e-9
"""Utilisation is recovered from seconds (busy / length): compare with this much slack."""

_FIELDS = ("idle", "kind", "team", "grace", "util")


@dataclass(frozen=True)
class Policy:
    """One culling policy as `parse_policy` reads it."""

    text: str
    """The spec as given (stripped): the policy's name in every output."""
    idle_ms: int
    kind: str | None = None
    team: str | None = None
    grace_ms: int = 0
    util_below: float | None = None
    """A row is idle when its utilisation is below this (percent); None: the classifier's
    test, at most `idle_threshold_pct`."""

    def idle(self, util: np.ndarray, thresholds: Thresholds) -> np.ndarray:
        """Per utilisation (percent): idle by this policy's test."""
        if self.util_below is None:
            return np.asarray(util <= thresholds.idle_threshold_pct + UTIL_EPSILON)
        return np.asarray(util < self.util_below - UTIL_EPSILON)


def parse_policy(text: str) -> Policy:
    """`idle>=2h[,kind=Notebook][,team=research][,grace=1h][,util<10]` → a Policy.

    A bad spec raises one `InputError` naming the field (`--policy idle`, ...)."""
    spec = text.strip()
    values: dict[str, str] = {}
    for raw in spec.split(","):
        item = raw.strip()
        m = re.fullmatch(r"([A-Za-z_]+)\s*(>=|<=|<|=)\s*(.*)", item)
        if not m:
            raise InputError(
                f"expected NAME=VALUE, idle>=DURATION or util<PERCENT, got {item!r}",
                field="--policy",
            )
        name, op, value = m.group(1).lower(), m.group(2), m.group(3).strip()
        field = f"--policy {name}"
        if name not in _FIELDS:
            raise InputError(f"unknown field {name!r} (known: {', '.join(_FIELDS)})", field=field)
        if name in values:
            raise InputError(f"{name} given twice in {spec!r}", field=field)
        wanted = {"idle": (">=",), "util": ("<", "<=")}.get(name, ("=",))
        if op not in wanted:
            raise InputError(f"{name} takes {' or '.join(wanted)}, got {op!r}", field=field)
        if not value:
            raise InputError(f"{name} has no value", field=field)
        values[name] = f"{op}{value}" if name == "util" else value
    if "idle" not in values:
        raise InputError(
            f"a policy needs an idle length, e.g. idle>=2h: {spec!r}", field="--policy idle"
        )
    idle_ms = duration_ms(values["idle"], option="--policy idle")
    if idle_ms <= 0:
        raise InputError("the idle length must be positive", field="--policy idle")
    util_below: float | None = None
    if "util" in values:
        raw = values["util"]
        op, number = ("<=", raw[2:]) if raw.startswith("<=") else ("<", raw[1:])
        try:
            pct = float(number)
        except ValueError:
            raise InputError(f"not a percentage: {number!r}", field="--policy util") from None
        if not 0 < pct <= 100 or math.isnan(pct):
            raise InputError(f"a percentage in (0, 100], got {number!r}", field="--policy util")
        # util<=N is util<N+ε: both compare against the utilisation as stored
        util_below = pct + 2 * UTIL_EPSILON if op == "<=" else pct
    return Policy(
        text=spec,
        idle_ms=idle_ms,
        kind=values.get("kind"),
        team=values.get("team"),
        grace_ms=duration_ms(values["grace"], option="--policy grace") if "grace" in values else 0,
        util_below=util_below,
    )

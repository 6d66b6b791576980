"""The user's documentation stands on its own: every relative link in README.md and docs/
names a file of the repository (a clone has nothing beside it), and the metrics the fault
documentation names are ones the auditor exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_stay_inside_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to a missing file: {target}"


def test_the_metrics_the_fault_guide_names_exist() -> None:
    from prometheus_client import CollectorRegistry

    from auditor.agents.sample.metrics import SamplerMetrics
    from auditor.agents.watch.metrics import WatchMetrics

    registry = CollectorRegistry()
    WatchMetrics(("pods",), registry=registry)
    SamplerMetrics(registry)
    exported = {sample.name for family in registry.collect() for sample in family.samples} | {
        family.name + "_total" for family in registry.collect()
    }
    named = set(re.findall(r"`(auditor_[a-z_]+)", (ROOT / "docs" / "faults.md").read_text()))
    assert named, "the guide names no metric"
    assert named <= exported, named - exported

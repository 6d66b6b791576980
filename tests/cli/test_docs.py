"""The user's documentation stands on its own: every relative link in README.md and docs/
names a file of the repository (a clone has nothing beside it), README links every page of
docs/, and the metrics the documentation names are ones the auditor exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def test_readme_links_every_page_of_the_documentation() -> None:
    readme = ROOT / "README.md"
    linked = {(ROOT / t).resolve() for t in LINK.findall(readme.read_text(encoding="utf-8"))}

    pages = sorted((ROOT / "docs").glob("*.md"))

    assert pages
    assert [p.name for p in pages if p.resolve() not in linked] == []


@pytest.mark.parametrize("doc", [p for p in DOCS if p.parent.name == "docs"], ids=lambda p: p.name)
def test_the_metrics_the_documentation_names_exist(doc: Path) -> None:
    from prometheus_client import CollectorRegistry

    from auditor.agents.sample.metrics import SamplerMetrics
    from auditor.agents.watch.metrics import WatchMetrics
    from auditor.jobs.metrics import READ_METRIC_NAMES
    from auditor.report.audit_metrics import AUDIT_METRIC_NAMES

    registry = CollectorRegistry()
    WatchMetrics(("pods",), registry=registry)
    SamplerMetrics(registry)
    exported = (
        {sample.name for family in registry.collect() for sample in family.samples}
        | {family.name + "_total" for family in registry.collect() if family.type == "counter"}
        | {family.name for family in registry.collect() if family.type != "counter"}
        | AUDIT_METRIC_NAMES
        | READ_METRIC_NAMES
    )
    named = set(re.findall(r"`(auditor_[a-z_]+)", doc.read_text(encoding="utf-8")))
    assert named <= exported, named - exported

"""The HTML report: one self-contained page with every section a team lead reads, under 1 MB
for a 100-GPU week (a product requirement), and `report --format html` on a real audit."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from htmlweek import week_report
from sqlalchemy import Connection, Engine, event
from sqlalchemy.pool import QueuePool
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.report.html import render_report_html, slug
from auditor.report.summary import GroupBy
from auditor.settings import Thresholds

MB = 1_000_000


class Page(HTMLParser):
    """Tags, ids, links and text of a page; fails on a closing tag that closes nothing."""

    VOID = frozenset({"meta", "br", "hr", "img", "input", "link"})

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.text: list[str] = []
        self.tags: list[str] = []
        self.open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(str(a[key]))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open[-1:] == [tag], f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.mark.parametrize("by", [GroupBy.TEAM, GroupBy.JOB, GroupBy.POD])
def test_a_100_gpu_week_weighs_under_1_mb(by: GroupBy) -> None:
    report, util, timelines = week_report(by=by)
    html = render_report_html(report, card_util=util, timelines=timelines)
    assert len(timelines) == 8
    assert len(html.encode("utf-8")) < MB


def test_the_page_is_self_contained_and_shows_every_section() -> None:
    report, util, timelines = week_report()
    html = render_report_html(report, card_util=util, timelines=timelines)
    page = Page(html)
    assert page.open in (["html"], [])  # only </html> may be left by the parser
    text = " ".join(page.text)
    for heading in ("GPU waste audit", "GPU-hours by team", "Per-card utilisation",
                    "Top offenders and next steps", "Job timelines"):  # fmt: skip
        assert heading in text
    for team in ("vision", "nlp", "recsys", "(platform)"):
        assert team in text
    for category in ("busy", "reserved idle", "straggler wait", "compute idle", "unobserved"):
        assert category in text  # the legend
    assert "script" not in page.tags
    assert all(link.startswith("#") for link in page.links)  # nothing from the network
    assert {link[1:] for link in page.links} <= page.ids  # every offender link lands
    assert {slug(t.target) for t in timelines} <= page.ids
    # 100 cards, each held by another pod every day: the band chart counts cards, not pods
    assert len(util) == 100
    assert "(100 cards held by pods)" in text


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("small")
    jobs.demo(work, scenario="small", log=lambda _: None)
    return f"sqlite:///{work / 'auditor.db'}"


def test_the_band_chart_counts_each_physical_card_once(small_db: str) -> None:
    html = jobs.build_report_html(
        small_db, start_ms=None, end_ms=None, by=GroupBy.GPU, team=None, thresholds=Thresholds()
    )
    report = jobs.build_report(small_db, start_ms=None, end_ms=None, by=GroupBy.GPU, team=None)
    held = report.rows[report.rows["allocated_gpu_hours"] > 0]
    assert f"({len(held)} cards held by pods)" in html


def test_timelines_over_several_days_name_the_day_at_every_tick() -> None:
    from auditor.report.svg import time_axis

    day = 86_400_000
    three_days = time_axis(0, 3 * day)
    assert ">01-01 00:00<" in three_days or ">01-01<" in three_days
    labels = [t.split("<")[0] for t in three_days.split('">')[1:]]
    assert all("-" in label for label in labels if label), labels
    assert all("-" not in t.split("<")[0] for t in time_axis(0, day // 2).split('">')[1:])


def test_report_format_html_writes_one_page(small_db: str, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    res = CliRunner().invoke(
        app, ["--db", small_db, "report", "--format", "html", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert res.output == ""
    page = Page(out.read_text(encoding="utf-8"))
    text = " ".join(page.text)
    assert "GPU waste audit" in text
    assert "Job timelines" in text
    assert "vision/PyTorchJob/vit-h-pretrain" in text
    assert {link[1:] for link in page.links} <= page.ids
    res = CliRunner().invoke(app, ["--db", small_db, "report", "--format", "html"])
    assert res.exit_code == 0
    assert res.output.startswith("<!DOCTYPE html>")


def test_the_html_report_reads_the_store_once_on_one_engine_it_disposes(small_db: str) -> None:
    """Who held which card is read once for all the job timelines, the report's results once,
    and the one engine used is disposed (its pool holds no open connection afterwards)."""
    statements: list[str] = []
    engines: dict[int, Engine] = {}

    def seen(conn: Connection, cursor: object, statement: str, *_: object) -> None:
        statements.append(" ".join(statement.split()))
        engines[id(conn.engine)] = conn.engine

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        html = jobs.build_report_html(
            small_db, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None,
            thresholds=Thresholds(),
        )  # fmt: skip
    finally:
        event.remove(Engine, "before_cursor_execute", seen)

    assert html.count('class="strip"') >= 2  # timelines of several jobs were drawn
    reads = {
        "pods": "SELECT pods.uid, pods.namespace,",
        # the placement evidence: labels and annotations of the Run:ai pods alone
        "Run:ai pods": "SELECT pods.uid, pods.labels, pods.annotations",
        "gpus": "SELECT gpus.id,",
        "assignments": "SELECT gpu_assignments.pod_uid,",
        # hours summed per run
        "results": "SELECT hours.run_id, gpus.cluster, gpus.uuid AS gpu, coalesce(",
        "findings": "SELECT audit_findings.",
    }
    for what, head in reads.items():
        assert sum(s.startswith(head) for s in statements) == 1, what
    assert len(engines) == 1
    (engine,) = engines.values()
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    assert pool.checkedin() == 0
    assert pool.checkedout() == 0

"""Hostile names in every output: no terminal escape, bidi trick or live spreadsheet formula.

The simulator's `small` cluster is imported with its teams, namespaces, jobs, pods and a node
renamed to strings that retitle or clear a terminal, swallow the rest of a table (an
unterminated OSC), overwrite a line, reverse text, or run as spreadsheet formulas; then every
format of `report`, `explain` and `export finance` runs through the real CLI. JSON keeps the
exact names; everything else shows them as visible escapes (`auditor.report.text`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.model import PLATFORM_TEAM
from auditor.report.explain import render_explain_text
from auditor.report.finance import finance_rows, parse_week, render_finance_csv
from auditor.report.html import render_explain_html, render_report_html
from auditor.report.prometheus import render_prometheus
from auditor.report.render import render_csv, render_json, render_table
from auditor.report.summary import GroupBy
from auditor.report.text import csv_cell, html_text, neutralise, terminal_safe
from auditor.settings import Config, Prices, Thresholds
from auditor.simulate import SCENARIOS, simulate
from auditor.store import reads
from auditor.store.connection import make_engine

runner = CliRunner()

TEAMS = {"nlp": '=HYPERLINK("http://x")', "recsys": "+1", "research": "-2", "vision": "@SUM(A1)"}
NAMESPACES = {
    "nlp": "\tTAB",
    "research": "\x1b]0;pwned\x07",
    "vision": "\x1b[2J",
    "kubeflow-user-bob": "<img src=x onerror=alert(1)>",
}
JOBS = {"vit-h-pretrain": "\u202egnp.exe", "moe-ablation": "\u202egnp.exe", "llm-eval-70b": "\rCR"}
PODS = {
    "vit-h-pretrain-master-0": "\x1b]8;;master-0",
    "vit-h-pretrain-worker-0": "\x9b31mworker-0",
    "two-tower-7xpk-q4ssf": "[bold]x[/bold]:thumbs_up:",
}
NODES = {"gpu-h100-01": "node\u2066\u200b-01"}
CENTRES = {TEAMS["recsys"]: "=2+5", TEAMS["research"]: "\x1b[31mCC-9"}
HOSTILE = [*TEAMS.values(), *NAMESPACES.values(), *JOBS.values(), *PODS.values(), *NODES.values()]
JOB = f"{NAMESPACES['vision']}/PyTorchJob/{JOBS['vit-h-pretrain']}"
WEEK = ["--start", "2026-11-23T00:00:00Z", "--end", "2026-11-30T00:00:00Z"]

FORBIDDEN = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
    "\ud800-\udfff]"
)
"""C0 and C1 controls, DEL, bidi embeddings, overrides, isolates and marks, zero-width and
other invisible format characters, line/paragraph separators, lone surrogates."""
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def raw_controls(text: str, *, allowed: str = "\n") -> list[str]:
    return [m.group() for m in FORBIDDEN.finditer(text) if m.group() not in allowed]


def _rename(pods_json: Path) -> None:
    data = json.loads(pods_json.read_text())
    for item in data["items"]:
        meta = item["metadata"]
        meta["namespace"] = NAMESPACES.get(meta["namespace"], meta["namespace"])
        meta["name"] = PODS.get(meta["name"], meta["name"])
        labels = meta.get("labels", {})
        for key, value in labels.items():
            labels[key] = TEAMS.get(value, value) if key == "team" else JOBS.get(value, value)
        for owner in meta.get("ownerReferences", []):
            owner["name"] = JOBS.get(owner["name"], owner["name"])
        node = item["spec"].get("nodeName")
        item["spec"]["nodeName"] = NODES.get(node, node)
    pods_json.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("hostile")
    url = f"sqlite:///{tmp / 'auditor.db'}"
    sim = simulate(tmp / "cluster", scenario=SCENARIOS["small"])
    _rename(sim.pods_json)
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=NODES.get(node, node))
    jobs.import_pods(url, sim.pods_json, config=Config())
    assert runner.invoke(app, ["--db", url, "audit", *WEEK]).exit_code == 0
    return url


def stored_results(db: str) -> pd.DataFrame:
    """The audit results of every stored run (one run here: the week)."""
    with make_engine(db).connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=None, end_ms=None)
        return reads.read_results(conn, [int(i) for i in runs["id"]])


def cli(db: str, *args: str, code: int = 0) -> str:
    result = runner.invoke(app, ["--db", db, *args])
    assert result.exit_code == code, result.output
    return result.output


def test_the_store_holds_the_hostile_names(db: str) -> None:
    rows = json.loads(cli(db, "report", "--by", "pod", "--format", "json"))
    for key, names in (("team", TEAMS), ("namespace", NAMESPACES), ("pod", PODS)):
        assert set(names.values()) <= {r[key] for r in rows}, key
    by_job = json.loads(cli(db, "report", "--by", "job", "--format", "json"))
    assert {f"PyTorchJob/{JOBS['vit-h-pretrain']}", f"Job/{JOBS['llm-eval-70b']}"} <= {
        r["job"] for r in by_job
    }
    nodes = json.loads(cli(db, "report", "--by", "node", "--format", "json"))
    assert NODES["gpu-h100-01"] in {r["node"] for r in nodes}


@pytest.mark.parametrize("by", ["team", "namespace", "job", "pod", "node"])
def test_the_table_shows_names_as_visible_escapes(db: str, by: str) -> None:
    text = cli(db, "report", "--by", by)
    assert raw_controls(text) == []
    assert "GPU-hours by" in text
    assert "Top offenders" in text
    # the offenders table names the jobs in full
    assert "\\x1b[2J/PyTorchJob/\\u202egnp.exe" in text


def test_the_table_reads_no_markup_or_emoji_codes_in_names(db: str) -> None:
    rep = jobs.build_report(db, start_ms=None, end_ms=None, by=GroupBy.POD, team=None)
    text = render_table(rep, width=400)
    assert PODS["two-tower-7xpk-q4ssf"] in text
    assert "\\x1b]8;;master-0" in text
    assert "\\x9b31mworker-0" in text
    assert "\\tTAB" in text


@pytest.mark.parametrize("by", ["pod", "job"])
def test_report_csv_escapes_controls_and_neutralises_formulas(db: str, by: str) -> None:
    text = cli(db, "report", "--by", by, "--format", "csv")
    assert raw_controls(text.replace("\r\n", "\n")) == []
    header, *rows = list(csv.reader(io.StringIO(text, newline="")))
    text_columns = [c for c in header if c in ("team", "namespace", "job", "pod")]
    text_columns += [c for c in header if c.startswith("straggler_") and c != "straggler_rank"]
    numeric = [c for c in header if c.endswith(("_gpu_hours", "_share")) or c.startswith("util_")]
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        for col in text_columns:
            assert not cells[col].startswith(FORMULA), (col, cells[col])
        for col in numeric:
            if cells[col]:
                float(cells[col])  # a number, not a neutralised text
    assert {r[header.index("team")] for r in rows} >= {'\'=HYPERLINK("http://x")', "'+1", "'-2"}
    assert "'@SUM(A1)" in {r[header.index("team")] for r in rows}
    assert "\\tTAB" in {r[header.index("namespace")] for r in rows}
    if by == "job":
        jobs_shown = {r[header.index("job")] for r in rows}
        assert {"Job/\\rCR", "PyTorchJob/\\u202egnp.exe"} <= jobs_shown
        assert any(r[header.index("straggler_pod")] == "\\x9b31mworker-0" for r in rows)


def test_negative_numbers_stay_numbers_in_both_csvs(db: str) -> None:
    rep = jobs.build_report(db, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    rows = rep.rows.copy()
    rows.loc[0, "busy_gpu_hours"] = -1.5
    header, first, *_ = list(
        csv.reader(io.StringIO(render_csv(dataclasses.replace(rep, rows=rows))))
    )
    assert first[header.index("busy_gpu_hours")] == "-1.5"
    assert first[header.index("team")] == "'" + str(rows.loc[0, "team"])
    results = stored_results(db)
    fin = finance_rows(results, week=parse_week("2026-W48"), prices=Prices(), cost_centres={})
    fin.loc[0, "allocated_cost"] = -12.5
    header, first, *_ = list(csv.reader(io.StringIO(render_finance_csv(fin))))
    assert first[header.index("allocated_cost")] == "-12.50"


@pytest.mark.parametrize("by", ["team", "pod", "job", "node"])
def test_json_keeps_the_exact_names_and_prints_as_ascii(db: str, by: str) -> None:
    text = cli(db, "report", "--by", by, "--format", "json")
    assert text.isascii()
    assert raw_controls(text) == []
    rows = json.loads(text)
    names = {str(v) for r in rows for v in r.values()}
    expected = {"team": TEAMS, "pod": PODS, "node": NODES, "job": {}}[by]
    assert set(expected.values()) <= names
    if by == "job":
        assert f"PyTorchJob/{JOBS['vit-h-pretrain']}" in names


def test_html_escapes_markup_and_shows_controls(db: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    cli(db, "report", "--by", "namespace", "--format", "html", "--out", str(page))
    html = page.read_text(encoding="utf-8")
    assert raw_controls(html) == []
    assert "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "\\x1b]0;pwned\\x07" in html
    assert "\\u202egnp.exe" in html
    team_page = tmp_path / "teams.html"
    cli(db, "report", "--format", "html", "--out", str(team_page))
    teams = team_page.read_text(encoding="utf-8")
    assert "=HYPERLINK(&quot;http://x&quot;)" in teams
    assert 'HYPERLINK("' not in teams  # not even inside an SVG <title>


def test_prometheus_label_values_are_escaped_and_parse_back(db: str) -> None:
    text = cli(db, "report", "--by", "pod", "--format", "prometheus")
    assert raw_controls(text) == []
    assert 'team="=HYPERLINK(\\"http://x\\")"' in text
    (hours,) = [f for f in text_string_to_metric_families(text) if f.name == "gpu_waste_hours"]
    for key, names in (("team", TEAMS), ("namespace", NAMESPACES), ("pod", PODS)):
        seen = {s.labels[key] for s in hours.samples}
        assert {terminal_safe(n) for n in names.values()} <= seen, key
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        # lint findings (hours are not a base unit) are fine; a parsing error is not
        assert "error while linting" not in check.stdout + check.stderr, check.stderr


def test_explain_text_and_html_show_names_escaped(db: str, tmp_path: Path) -> None:
    page = tmp_path / "explain.html"
    text = cli(db, "explain", JOB, "--html", str(page))
    assert raw_controls(text) == []
    assert text.startswith(terminal_safe(JOB) + ": ")
    assert "\\x1b]8;;master-0 rank 0" in text
    assert "\\x9b31mworker-0 rank 1" in text
    assert "Next steps:" in text  # the unterminated OSC swallowed nothing
    html = page.read_text(encoding="utf-8")
    assert raw_controls(html) == []
    assert f"<title>GPU timeline of {html_text(JOB)}</title>" in html


def test_explain_of_a_pod_by_its_hostile_name(db: str) -> None:
    text = cli(db, "explain", PODS["vit-h-pretrain-worker-0"])
    assert raw_controls(text) == []
    assert text.startswith(f"{terminal_safe(NAMESPACES['vision'])}/\\x9b31mworker-0: ")


def test_errors_that_echo_names_are_one_escaped_line(db: str) -> None:
    # two namespaces run a PyTorchJob of that name: the error lists both, from the store
    out = runner.invoke(app, ["--db", db, "explain", f"PyTorchJob/{JOBS['vit-h-pretrain']}"])
    assert out.exit_code == 2
    assert out.stderr.count("\n") == 1
    assert raw_controls(out.stderr) == []
    assert "ambiguous" in out.stderr
    assert "\\x1b]0;pwned\\x07/PyTorchJob/\\u202egnp.exe" in out.stderr
    unknown = runner.invoke(app, ["--db", db, "explain", "\x1b]0;evil\x07"])
    assert unknown.exit_code == 2
    assert raw_controls(unknown.stderr) == []
    team = runner.invoke(app, ["--db", db, "report", "--team", "\u202eevil"])
    assert team.exit_code == 2
    assert raw_controls(team.stderr) == []


def test_finance_csv_escapes_and_neutralises_teams_and_cost_centres(
    db: str, tmp_path: Path
) -> None:
    config = tmp_path / "auditor.toml"
    lines = ["[prices]", "default = 2.0", "[cost_centres]"]  # priced: no warning on stderr
    lines += [f"{json.dumps(t)} = {json.dumps(c)}" for t, c in CENTRES.items()]
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    text = cli(db, "--config", str(config), "export", "finance", "--week", "2026-W48")
    assert raw_controls(text.replace("\r\n", "\n")) == []
    header, *rows = list(csv.reader(io.StringIO(text, newline="")))
    teams = {r[header.index("team")] for r in rows}
    assert {csv_cell(t) for t in TEAMS.values()} <= teams
    centres = {r[header.index("team")]: r[header.index("cost_centre")] for r in rows}
    assert centres["'+1"] == "'=2+5"
    assert centres["'-2"] == "\\x1b[31mCC-9"
    assert rows[-1][header.index("team")] == PLATFORM_TEAM
    for row in rows:
        for col, cell in zip(header, row, strict=True):
            assert not cell.startswith(FORMULA), (col, cell)
            if col.endswith(("_gpu_hours", "_cost")) or col == "price_per_gpu_hour":
                float(cell)


def test_a_lone_surrogate_renders_everywhere(db: str) -> None:
    """A name decoded from JSON may hold a lone surrogate: no renderer may fail to encode it."""
    rep = jobs.build_report(db, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    rows = rep.rows.copy()
    rows.loc[0, "team"] = "a\ud800b"
    offenders = rep.offenders.copy()
    offenders.loc[0, "offender"] = "ns/Job/\udc80"
    bad = dataclasses.replace(rep, rows=rows, offenders=offenders)
    for render in (render_table, render_csv, render_json, render_prometheus, render_report_html):
        out = render(bad)
        out.encode("utf-8")  # no UnicodeEncodeError when printed or written
        assert raw_controls(out.replace("\r\n", "\n")) == [], render.__name__
    assert json.loads(render_json(bad))[0]["team"] == "a\ud800b"
    assert "a\\ud800b" in render_table(bad)
    ex = jobs.explain(db, JOB, thresholds=Thresholds())
    odd = dataclasses.replace(ex, target="x/Job/\udfff")
    for text in (render_explain_text(odd), render_explain_html(odd)):
        text.encode("utf-8")
        assert "\\udfff" in text


# ------------------------------------------------------------------ the functions themselves


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("nlp", "nlp"),
        ("", ""),
        ("team a", "team a"),
        ("équipe-日本-ü", "équipe-日本-ü"),
        ("a\\x1b", "a\\x1b"),  # a backslash is left alone
        ("\u00a0nbsp", "\u00a0nbsp"),  # a visible (if blank) space separator
        ("\x1b[2J", "\\x1b[2J"),
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("\x1b]8;;", "\\x1b]8;;"),
        ("\tTAB", "\\tTAB"),
        ("a\nb", "a\\nb"),
        ("\rCR", "\\rCR"),
        ("\x00\x7f", "\\x00\\x7f"),
        ("\x9b31m", "\\x9b31m"),
        ("\x85", "\\x85"),
        ("\u202egnp.exe", "\\u202egnp.exe"),
        ("\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"),
        ("\u2066x\u2067\u2068\u2069", "\\u2066x\\u2067\\u2068\\u2069"),
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),
        ("a\u200bb\u200c\u200d", "a\\u200bb\\u200c\\u200d"),
        ("\ufeffbom", "\\ufeffbom"),
        ("soft\u00adhyphen", "soft\\xadhyphen"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\ud800", "\\ud800"),
        ("tag\U000e0041", "tag\\U000e0041"),
    ],
)
def test_terminal_safe(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("=1+2", "'=1+2"),
        ("+SUM(A1)", "'+SUM(A1)"),
        ("-2", "'-2"),
        ("@cmd", "'@cmd"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        (" =1+2", "' =1+2"),  # an importer may trim the space
        ("\u3000=1", "'\u3000=1"),
        ("＝1+1", "'＝1+1"),  # full-width, folded by NFKC
        ("﹢1", "'﹢1"),
        ("＠x", "'＠x"),
        ("nlp", "nlp"),
        ("a=b", "a=b"),
        ("'=1", "'=1"),  # already text: not prefixed twice
        ("", ""),
        ("   ", "   "),
    ],
)
def test_neutralise(cell: str, expected: str) -> None:
    assert neutralise(cell) == expected


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("\t=1", "\\t=1"),  # escaped first: it no longer starts with a tab
        ("=\x1b[2J", "'=\\x1b[2J"),
        ("\u202e=1", "\\u202e=1"),
        ("nlp", "nlp"),
    ],
)
def test_csv_cell(cell: str, expected: str) -> None:
    assert csv_cell(cell) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<a href="x">', "&lt;a href=&quot;x&quot;&gt;"),
        ("it's & co", "it&#x27;s &amp; co"),
        ("\u202egnp.exe", "\\u202egnp.exe"),
        ("\x1b]0;t\x07<b>", "\\x1b]0;t\\x07&lt;b&gt;"),
    ],
)
def test_html_text(text: str, expected: str) -> None:
    assert html_text(text) == expected


ANY_CHARACTER = st.characters(codec=None, exclude_categories=())  # surrogates included
ORDINARY = st.characters(categories=("L", "M", "N", "P", "S"), include_characters=" ")


@settings(max_examples=500)
@given(st.text(alphabet=ANY_CHARACTER))
def test_terminal_safe_leaves_no_control_and_encodes(text: str) -> None:
    shown = terminal_safe(text)
    assert raw_controls(shown, allowed="") == []
    shown.encode("utf-8")
    assert terminal_safe(shown) == shown


@settings(max_examples=300)
@given(st.text(alphabet=ORDINARY))
def test_terminal_safe_is_the_identity_on_ordinary_text(text: str) -> None:
    assert terminal_safe(text) == text


@settings(max_examples=300)
@given(st.text(alphabet=ANY_CHARACTER))
def test_a_csv_cell_is_never_a_formula_and_reads_back(text: str) -> None:
    cell = csv_cell(text)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow([cell])
    (row,) = list(csv.reader(io.StringIO(buf.getvalue(), newline="")))
    assert row == [cell]
    assert not cell.lstrip().startswith(FORMULA) or cell.startswith("'")
    assert not cell.startswith(FORMULA)

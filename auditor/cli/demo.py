"""`auditor simulate` and `auditor demo`: a simulated cluster as input files, and the whole
pipeline run over one on a throwaway database."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from auditor.cli.app import echo_err, user_errors


def simulate(
    out: Annotated[Path, typer.Argument(help="Directory to write the scenario's files into.")],
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="Preset: demo, small, large, or shared (MIG, time-slicing, HAMi and whole "
            "cards; also writes nodes.json and dcgm-exporter OpenMetrics for MIG).",
        ),
    ] = "demo",
    seed: Annotated[int | None, typer.Option("--seed", help="Override the preset's seed.")] = None,
) -> None:
    """Write a simulated cluster as real input files, with its ground truth.

    One nvidia-smi CSV per node, a kubectl pod list, and truth.csv per team and category."""
    from auditor import jobs

    with user_errors():
        result = jobs.simulate(out, scenario=scenario, seed=seed)
    typer.echo(f"wrote scenario {scenario!r} to {out} ({result.summary})")


def demo(
    keep: Annotated[
        Path | None, typer.Option("--keep", help="Keep the files and database here.")
    ] = None,
    scenario: Annotated[str, typer.Option("--scenario", help="Simulator preset.")] = "demo",
) -> None:
    """Simulate a cluster, import it, audit it and report, on a throwaway SQLite database."""
    from auditor import jobs

    with user_errors():
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            text = jobs.demo(keep, scenario=scenario, log=echo_err)
            typer.echo(
                f"files and database kept in {keep} "
                f"(auditor --db sqlite:///{keep / 'auditor.db'} report ...)",
                err=True,
            )
        else:
            with tempfile.TemporaryDirectory(prefix="auditor-demo-") as tmp:
                text = jobs.demo(Path(tmp), scenario=scenario, log=echo_err)
    typer.echo(text, nl=False)

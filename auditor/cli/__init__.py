"""The command line: parse, call one function of `auditor.jobs`, render; errors become one line.

One module per command group (`imports`, `audit`, `reports`, `services`, `demo`, `db`), on
the apps and helpers of `app`, with the options several commands share in `options`. This
face registers every command, in the order `auditor --help` lists them.

Heavy libraries (pandas, sqlalchemy, kubernetes, pynvml) are imported inside the commands,
so `auditor --help` stays fast.
"""

from __future__ import annotations

from auditor.cli import audit, db, demo, imports, reports, services
from auditor.cli.app import app, db_app, export_app, import_app

__all__ = ["app", "main"]


def main() -> None:
    """The `auditor` console script (and `python -m auditor`: its usage lines still say
    `auditor`, the command a user types)."""
    app(prog_name="auditor")


app.command()(audit.audit)
app.command()(reports.report)
app.command()(reports.explain)
app.command()(audit.whatif)
app.command()(audit.rollup)
app.command()(services.sample)
app.command()(services.watch)
app.command()(demo.simulate)
app.command()(demo.demo)
app.command()(reports.compare)

import_app.command("nvidia-smi")(imports.import_nvidia_smi)
import_app.command("pods")(imports.import_pods)
import_app.command("prometheus")(imports.import_prometheus)
import_app.command("outputs")(imports.import_outputs)
import_app.command("list")(imports.import_list)
import_app.command("undo")(imports.import_undo)

export_app.command("finance")(reports.export_finance)

db_app.command("upgrade")(db.db_upgrade)
db_app.command("current")(db.db_current)

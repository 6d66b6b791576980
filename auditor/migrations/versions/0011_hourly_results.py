"""Audit results, causes and SM activity stored per UTC hour (SPEC §11).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-10

`hour_ms` on `audit_results`, `audit_causes` and `audit_sm` is the start of a row's bucket,
`[max(hour, run start), min(hour + 1 h, run end))`, so a report of any whole-hour window
inside an audited run sums the buckets inside it. Rows stored before this revision get
their run's start: each of those runs stays one bucket, which a report of the whole run
still reads as before; `audit_runs.hourly` (false for them) says a window inside them is
not served. Downgrading sums each run's buckets back into one row per key and drops both.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = {
    "audit_results": (
        "ix_audit_results_run",
        ["gpu_id", "pod_uid", "category", "inferred", "estimated", "share"],
        ["seconds"],
    ),
    "audit_causes": (
        "ix_audit_causes_run",
        ["gpu_id", "pod_uid", "category", "cause"],
        ["seconds", "signalled_seconds"],
    ),
    "audit_sm": (
        "ix_audit_sm_run",
        ["gpu_id", "pod_uid"],
        ["sm_active_seconds", "sm_busy_seconds"],
    ),
}


def upgrade() -> None:
    # a plain ADD COLUMN: SQLite's batch copy would drop `audit_runs`, and with it, through
    # ON DELETE CASCADE, every stored result
    op.add_column(
        "audit_runs", sa.Column("hourly", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    for table, (index, _, _) in TABLES.items():
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("hour_ms", sa.BigInteger(), nullable=True))
        op.execute(
            f"UPDATE {table} SET hour_ms = (SELECT window_start_ms FROM audit_runs"
            f" WHERE audit_runs.id = {table}.run_id)"
        )
        op.drop_index(index, table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.alter_column("hour_ms", existing_type=sa.BigInteger(), nullable=False)
        op.create_index(f"{index}_hour", table, ["run_id", "hour_ms"])


def downgrade() -> None:
    for table, (index, keys, sums) in TABLES.items():
        # one row per (run, key) again: the hours of a run summed
        cols = ", ".join(["run_id", *keys])
        summed = ", ".join(f"SUM({c})" for c in sums)
        op.execute(f"CREATE TABLE {table}_hours AS SELECT * FROM {table}")
        op.execute(f"DELETE FROM {table}")
        op.execute(
            f"INSERT INTO {table} ({cols}, {', '.join(sums)}, hour_ms)"
            f" SELECT {cols}, {summed}, MIN(hour_ms) FROM {table}_hours GROUP BY {cols}"
        )
        op.execute(f"DROP TABLE {table}_hours")
        op.drop_index(f"{index}_hour", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("hour_ms")
        op.create_index(index, table, ["run_id"])
    if op.get_bind().dialect.name == "sqlite":  # SQLite 3.35+ drops a column in place
        op.execute("ALTER TABLE audit_runs DROP COLUMN hourly")
    else:
        op.drop_column("audit_runs", "hourly")

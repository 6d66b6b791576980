"""The imports ledger, and the import that wrote each sample (`auditor import list|undo`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

`imports` records each import (kind, source, the options that change its meaning, rows
written, cards, first and last sample time); `gpu_samples.import_id` names the import that
wrote a sample, NULL for the sampler's and for every sample stored before this revision
(those cannot be taken back by id). Adding a nullable column is in place on both databases
(SQLite's `ALTER TABLE ... ADD COLUMN`, no copy of the table; existing rows read NULL).
Downgrading drops both; on SQLite that rebuilds the samples table, kept clustered on its key
(`WITHOUT ROWID`, revision 0004).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "imports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("source", sa.String(length=1000), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("rows_written", sa.Integer(), nullable=False),
        sa.Column("gpu_ids", sa.JSON(), nullable=False),
        sa.Column("gpus_created", sa.JSON(), nullable=False),
        sa.Column("first_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_ms", sa.BigInteger(), nullable=True),
        sa.Column("undone_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_imports")),
    )
    op.add_column("gpu_samples", sa.Column("import_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table(
            "gpu_samples", recreate="always", table_kwargs={"sqlite_with_rowid": False}
        ) as batch:
            batch.drop_column("import_id")
    else:
        op.drop_column("gpu_samples", "import_id")
    op.drop_table("imports")

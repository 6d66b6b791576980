"""Signals behind the causes of compute idle and of free cards (SPEC §10).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

`pod_signals` holds each pod's CPU, pressure, network and serving-queue signals over time,
per source; `card_signals` each card's PCIe and NVLink traffic; `node_outages` the stretches
in which a node's cards could not be given; `audit_causes` each audit run's causes inside
`compute_idle` and `unallocated`. Pods gain why they waited to be scheduled (reason and
message) and the GPU model they asked for. Downgrading drops them and what they hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.add_column(sa.Column("wait_reason", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("wait_message", sa.String(length=300), nullable=True))
        batch.add_column(sa.Column("wanted_model", sa.String(length=128), nullable=True))
    op.create_table(
        "pod_signals",
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("cpu_limit_ratio", sa.Float(), nullable=True),
        sa.Column("throttled_ratio", sa.Float(), nullable=True),
        sa.Column("cpu_pressure", sa.Float(), nullable=True),
        sa.Column("io_pressure", sa.Float(), nullable=True),
        sa.Column("net_bytes_s", sa.Float(), nullable=True),
        sa.Column("requests_running", sa.Float(), nullable=True),
        sa.Column("requests_waiting", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("pod_uid", "source", "ts_ms", name=op.f("pk_pod_signals")),
    )
    op.create_index("ix_pod_signals_ts", "pod_signals", ["ts_ms"])
    op.create_table(
        "card_signals",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("pcie_bytes_s", sa.Float(), nullable=True),
        sa.Column("pcie_link_bytes_s", sa.Float(), nullable=True),
        sa.Column("nvlink_bytes_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_card_signals_gpu_id_gpus"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("gpu_id", "ts_ms", name=op.f("pk_card_signals")),
    )
    op.create_table(
        "node_outages",
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("node", "reason", "start_ms", name=op.f("pk_node_outages")),
    )
    op.create_table(
        "audit_causes",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=True),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("cause", sa.String(length=32), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("signalled_seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["audit_runs.id"],
            name=op.f("fk_audit_causes_run_id_audit_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_audit_causes_gpu_id_gpus"), ondelete="CASCADE"
        ),
    )
    op.create_index("ix_audit_causes_run", "audit_causes", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_causes_run", table_name="audit_causes")
    op.drop_table("audit_causes")
    op.drop_table("node_outages")
    op.drop_table("card_signals")
    op.drop_index("ix_pod_signals_ts", table_name="pod_signals")
    op.drop_table("pod_signals")
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("wanted_model")
        batch.drop_column("wait_message")
        batch.drop_column("wait_reason")

"""The initial schema: cards, samples, pods, GPU assignments, audit runs and their results.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

A frozen copy of `auditor/store/schema.py` as it stood then; later revisions change it
step by step. Constraint names follow the schema's naming convention, spelled out with
`op.f()` so every database gets the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("memory_total_mib", sa.Float(), nullable=True),
        sa.Column("parent_uuid", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("uuid", name=op.f("uq_gpus_uuid")),
    )
    op.create_index(op.f("ix_gpus_node_index"), "gpus", ["node", "gpu_index"])

    op.create_table(
        "gpu_samples",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("util", sa.Float(), nullable=True),
        sa.Column("memory_used_mib", sa.Float(), nullable=True),
        sa.Column("memory_total_mib", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("throttle_reasons", sa.String(length=64), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("sm_active", sa.Float(), nullable=True),
        sa.Column("tensor_active", sa.Float(), nullable=True),
        sa.Column("dram_active", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_gpu_samples_gpu_id_gpus"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("gpu_id", "ts_ms", name=op.f("pk_gpu_samples")),
    )

    op.create_table(
        "pods",
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("team", sa.String(length=253), nullable=False),
        sa.Column("job", sa.String(length=512), nullable=False),
        sa.Column("job_kind", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=32), nullable=False),
        sa.Column("gang", sa.String(length=600), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_resource", sa.String(length=128), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=True),
        sa.Column("bound_ms", sa.BigInteger(), nullable=True),
        sa.Column("started_ms", sa.BigInteger(), nullable=True),
        sa.Column("finished_ms", sa.BigInteger(), nullable=True),
        sa.Column("deleted_ms", sa.BigInteger(), nullable=True),
        sa.Column("phase", sa.String(length=32), nullable=True),
        sa.Column("resource_version", sa.String(length=64), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_pods")),
    )
    op.create_index(op.f("ix_pods_node_bound"), "pods", ["node", "bound_ms"])
    op.create_index(op.f("ix_pods_namespace_name"), "pods", ["namespace", "name"])

    op.create_table(
        "gpu_assignments",
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("first_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["pod_uid"],
            ["pods.uid"],
            name=op.f("fk_gpu_assignments_pod_uid_pods"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"],
            ["gpus.id"],
            name=op.f("fk_gpu_assignments_gpu_id_gpus"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pod_uid", "gpu_id", name=op.f("pk_gpu_assignments")),
    )

    op.create_table(
        "audit_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("window_start_ms", sa.BigInteger(), nullable=False),
        sa.Column("window_end_ms", sa.BigInteger(), nullable=False),
        sa.Column("shard", sa.String(length=32), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_runs")),
    )
    op.create_index(
        op.f("ix_audit_runs_window"),
        "audit_runs",
        ["window_start_ms", "window_end_ms", "shard"],
        unique=True,
    )

    op.create_table(
        "audit_results",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=True),
        sa.Column("category", sa.String(length=32), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("inferred", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["audit_runs.id"],
            name=op.f("fk_audit_results_run_id_audit_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_audit_results_gpu_id_gpus"), ondelete="CASCADE"
        ),
    )
    op.create_index(op.f("ix_audit_results_run"), "audit_results", ["run_id"])

    op.create_table(
        "audit_findings",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("gang", sa.String(length=600), nullable=True),
        sa.Column("gpu_id", sa.Integer(), nullable=True),
        sa.Column("pod_uid", sa.String(length=64), nullable=True),
        sa.Column("start_ms", sa.BigInteger(), nullable=True),
        sa.Column("end_ms", sa.BigInteger(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["audit_runs.id"],
            name=op.f("fk_audit_findings_run_id_audit_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_audit_findings_gpu_id_gpus"), ondelete="CASCADE"
        ),
    )
    op.create_index(op.f("ix_audit_findings_run"), "audit_findings", ["run_id"])


def downgrade() -> None:
    # Dependants first; each table takes its indexes with it.
    for table in (
        "audit_findings",
        "audit_results",
        "audit_runs",
        "gpu_assignments",
        "pods",
        "gpu_samples",
        "gpus",
    ):
        op.drop_table(table)

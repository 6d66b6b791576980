"""Several clusters in one store (SPEC §11): a `cluster` on cards, pods, nodes, node
outages and audit runs.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

Every row stored before this revision is of the cluster `default` (`auditor.model
.DEFAULT_CLUSTER`), the one a store of a single cluster keeps using. A node's name is unique
only inside its cluster, so `nodes` and `node_outages` take the cluster into their keys, and
an audit run's window is unique per cluster. Downgrading refuses a store holding more than
one cluster: the rows of the others would collide on their nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT = "default"
NAME_MAX = 253
KEYED = {"nodes": ["name"], "node_outages": ["node", "reason", "start_ms"]}
"""Tables whose primary key gains the cluster, and their keys before it."""


def _cluster() -> sa.Column[str]:
    return sa.Column("cluster", sa.String(NAME_MAX), nullable=False, server_default=DEFAULT)


def upgrade() -> None:
    # plain ADD COLUMNs: SQLite's batch copy of `gpus` or `audit_runs` would drop the table,
    # and with it, through ON DELETE CASCADE, every result that names it
    op.add_column("gpus", _cluster())
    op.create_index("ix_gpus_cluster_node", "gpus", ["cluster", "node"])
    op.add_column("pods", _cluster())
    op.add_column("audit_runs", _cluster())
    op.drop_index("ix_audit_runs_window", table_name="audit_runs")
    op.create_index(
        "ix_audit_runs_window",
        "audit_runs",
        ["cluster", "window_start_ms", "window_end_ms", "shard"],
        unique=True,
    )
    for table, keys in KEYED.items():  # nothing refers to these: a batch copy is safe
        with op.batch_alter_table(table, recreate="always") as batch:
            batch.add_column(_cluster(), insert_before=keys[0])
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.create_primary_key(f"pk_{table}", ["cluster", *keys])


def downgrade() -> None:
    bind = op.get_bind()
    for table in ("gpus", "pods", "nodes", "audit_runs"):
        found = bind.execute(sa.text(f"SELECT DISTINCT cluster FROM {table}")).scalars().all()
        if [c for c in found if c != DEFAULT]:
            raise RuntimeError(
                f"{table} holds clusters other than {DEFAULT!r} ({', '.join(sorted(found))}):"
                " a store of one cluster cannot keep them; export what you need first"
            )
    for table, keys in KEYED.items():
        with op.batch_alter_table(table, recreate="always") as batch:
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.create_primary_key(f"pk_{table}", keys)
            batch.drop_column("cluster")
    op.drop_index("ix_audit_runs_window", table_name="audit_runs")
    op.create_index(
        "ix_audit_runs_window",
        "audit_runs",
        ["window_start_ms", "window_end_ms", "shard"],
        unique=True,
    )
    # dropping a column of these is a batch copy on SQLite: `store.migrate` runs migrations
    # with foreign keys off, so the results that name them stay
    with op.batch_alter_table("audit_runs") as batch:
        batch.drop_column("cluster")
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("cluster")
    op.drop_index("ix_gpus_cluster_node", table_name="gpus")
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("cluster")

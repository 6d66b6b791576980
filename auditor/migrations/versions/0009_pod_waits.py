"""When a waiting pod was last seen still waiting (SPEC §10 `blocked`, queue waste).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

`pods.wait_seen_ms` is the latest time an observation showed the pod waiting to be
scheduled: a wait that no later observation ended (bound, finished, deleted) is taken to
end there, never later. Downgrading drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.add_column(sa.Column("wait_seen_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("wait_seen_ms")

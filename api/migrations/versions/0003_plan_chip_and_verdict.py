"""Plans list their chip and verdict: the dashboard's recent plans say which chip and whether it fits.

Rows stored before this revision keep both empty; their plan JSON still holds them.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plans") as plans:
        plans.add_column(sa.Column("chip", sa.Text))
        plans.add_column(sa.Column("verdict", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("plans") as plans:
        plans.drop_column("verdict")
        plans.drop_column("chip")

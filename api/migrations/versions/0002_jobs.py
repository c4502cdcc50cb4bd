"""Jobs: verify and search runs that outlive a request.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("progress", sa.Double, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("request_json", sa.Text, nullable=False),
        sa.Column("result_json", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("replica", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("heartbeat_at", sa.Double, nullable=False),
    )
    op.create_index("jobs_by_state", "jobs", ["state", "heartbeat_at"])


def downgrade() -> None:
    op.drop_index("jobs_by_state", "jobs")
    op.drop_table("jobs")

"""Plans and searches.

A database made before migrations existed already has both tables (same columns, SQLite's own
64-bit integers): it is adopted as it is.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    if "plans" not in existing:
        op.create_table(
            "plans",
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("created_at", sa.Double, nullable=False),
            sa.Column("module", sa.Text, nullable=False),
            sa.Column("mesh", sa.Text),
            sa.Column("capacity_bytes", sa.BigInteger),
            sa.Column("total_before", sa.BigInteger, nullable=False),
            sa.Column("total_after", sa.BigInteger, nullable=False),
            sa.Column("num_findings", sa.Integer, nullable=False),
            sa.Column("plan_json", sa.Text, nullable=False),
            sa.Column("patched_hlo_gz", sa.LargeBinary, nullable=False),
        )
        op.create_index("plans_by_time", "plans", [sa.text("created_at DESC")])
    if "searches" not in existing:
        op.create_table(
            "searches",
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("created_at", sa.Double, nullable=False),
            sa.Column("report_json", sa.Text, nullable=False),
        )


def downgrade() -> None:
    op.drop_table("searches")
    op.drop_index("plans_by_time", "plans")
    op.drop_table("plans")

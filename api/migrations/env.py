"""Alembic's entry: migrations run on the connection `api.store` hands over (never a URL of their own)."""

from __future__ import annotations

from alembic import context

from api.store_schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

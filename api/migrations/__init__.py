"""The store's schema history (Alembic). `api.store` brings a database to the newest revision on start."""

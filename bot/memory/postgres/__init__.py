"""The PostgreSQL storage backend (MUNINN_DATABASE_URL=postgresql://...): schema, connections, SQL."""

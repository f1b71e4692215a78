"""The SQLite wing of the memory layer: one file, WAL, FTS5 and sqlite-vec."""

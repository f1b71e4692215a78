"""Portable SQL that both backends run: memories, history, privacy, leases, settings."""

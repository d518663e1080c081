"""The store: every table of the control plane, and every read and write of them (SQLite or PostgreSQL)."""

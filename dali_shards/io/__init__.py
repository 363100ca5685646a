"""io: see docs/architecture.md."""

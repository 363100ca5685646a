"""catalog: see docs/architecture.md."""

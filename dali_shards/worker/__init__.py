"""worker: see docs/architecture.md."""

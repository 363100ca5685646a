"""testing: see docs/architecture.md."""

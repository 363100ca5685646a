"""tools: see docs/architecture.md."""

"""Where the offline tools run their tasks: local processes, or a Ray cluster (``engine="ray"``)."""

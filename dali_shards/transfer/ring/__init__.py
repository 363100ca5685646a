"""The ring transfer: the library's own worker processes write their mini-batches into rings of
shared-memory slots, and one external source in the main process hands DALI each step's batch.
See ``dali_shards.transfer``; ``graph.py`` is the only module here that imports DALI."""

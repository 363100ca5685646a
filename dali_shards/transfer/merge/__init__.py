"""The merge transfer: DALI's own worker pool and parallel external sources, one per worker, each
batch full-size and empty but for the worker's slice, merged with conditional execution (the
workaround of DALI issue 4892). See ``dali_shards.transfer``."""

"""From options and the world to what the workers need (pure: no DALI): the shards, the layout, the plan, the resume point, one ``WorkerConfig`` per worker, and ``pipe.dali_shards``."""

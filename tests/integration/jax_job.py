"""Run by tests/integration/test_jax_processes.py, once per JAX process: ``jax.distributed`` over a
local coordinator on the CPU backend, two CPU devices per process, one sharded pipeline per process
(its rank and world size from JAX). A mesh over this process's devices alone is refused; then two
epochs over a mesh of every process's devices (audited across the processes), and in the second a
checkpoint through Orbax after two steps. Each process writes what it saw, from its own shards of
the global arrays, to ``process-<i>.json``.

Usage: jax_job.py OUT_DIR SHARDS_DIR PORT PROCESS_ID NUM_PROCESSES
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import numpy as np  # noqa: E402


def local_rows(array):
    """This process's rows of a global array, in the order of the global batch."""
    shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.concatenate([np.asarray(s.data) for s in shards])


def main(out_dir, shards, port, index, count):
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=index)
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from nvidia.dali import fn, types

    from dali_shards import ConfigError, sharded_pipeline
    from dali_shards.jax import CheckpointSave, DALIShardedIterator

    @sharded_pipeline(os.path.join(shards, "sample-*.tar"), fields=("jpg", "__index__"), batch_size=4, py_num_workers=2,
                      shuffle=True, seed=5, device_id=None, num_threads=1)  # fmt: skip
    def pipe(jpg, idx):
        return fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(8, 8)), idx

    report = {"process": index, "devices": len(jax.devices()), "local": len(jax.local_devices())}
    try:
        DALIShardedIterator(pipe(), ["image", "index"], sharding=NamedSharding(Mesh(jax.local_devices(), ("data",)), PartitionSpec("data")))
    except ConfigError as exc:
        report["local_mesh_error"] = str(exc)
    it = DALIShardedIterator(pipe(), ["image", "index"], audit=True)  # the default: a mesh of jax.devices()
    report.update(rank=it.info.rank, world=it.info.spec.world_size, len=len(it), epochs=[], shapes={})
    manager = ocp.CheckpointManager(os.path.join(out_dir, "checkpoints"))
    for epoch in range(2):
        steps = []
        for step, batch in enumerate(it):
            mine = local_rows(batch["index"])[local_rows(batch["valid"])]
            steps.append(mine.tolist())
            report["shapes"] = {k: list(v.shape) for k, v in batch.items()}
            report["spec"] = list(batch["image"].sharding.spec)
            report["shard_rows"] = sorted(s.data.shape[0] for s in batch["image"].addressable_shards)
            if epoch == 1 and step == 1:  # two steps of the second epoch taken
                manager.save(2, args=ocp.args.Composite(loader=CheckpointSave(it)))
                manager.wait_until_finished()
        report["epochs"].append(steps)
    report["audits"] = it.audits
    with open(os.path.join(out_dir, f"process-{index}.json"), "w") as f:
        json.dump(report, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    out, data, port, process, processes = sys.argv[1:6]
    main(out, data, int(port), int(process), int(processes))

"""Two JAX processes (``jax.distributed`` with a local coordinator, the CPU backend, two CPU devices
each), one sharded pipeline each: every sample exactly once over both, the same steps on both, the
global arrays of the shape and sharding asked for; a mesh of one process's devices refused; and a
checkpoint the two saved through Orbax mid-epoch restored by one process (an elastic resume) gives
exactly the rest of that epoch."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SIZES = (11, 0, 14, 9, 13)  # 47 photos
TOTAL = sum(SIZES)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory, make_shards):
    out, data = tmp_path_factory.mktemp("jax_run"), tmp_path_factory.mktemp("jax_data")
    make_shards(SIZES, folder=data)
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)  # this tree's package
    env.pop("WORLD_SIZE", None), env.pop("RANK", None)
    cmd = [sys.executable, os.path.join(HERE, "jax_job.py"), str(out), str(data), str(port)]
    procs = [subprocess.Popen([*cmd, str(i), "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for i in range(2)]  # fmt: skip
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    reports = [json.loads((out / f"process-{i}.json").read_text()) for i in range(2)]
    return out, data, reports


def test_two_processes_get_every_sample_once_in_equal_steps_as_global_arrays(run):
    _, _, reports = run
    assert [(r["rank"], r["world"], r["devices"], r["local"]) for r in reports] == [(0, 2, 4, 2), (1, 2, 4, 2)]
    assert [r["len"] for r in reports] == [6, 6]  # 47 samples in global batches of 8
    for r in reports:
        assert r["shapes"] == {"image": [8, 8, 8, 3], "index": [8], "valid": [8]}  # global: 2 processes x 4
        assert r["spec"] == ["data"] and r["shard_rows"] == [2, 2]  # 2 rows on each local device
        assert "jax.devices()" in r["local_mesh_error"] and "processes [%d]" % r["process"] in r["local_mesh_error"]
    for epoch in range(2):
        steps = [r["epochs"][epoch] for r in reports]
        assert len(steps[0]) == len(steps[1]) == 6
        seen = [i for s in steps for batch in s for i in batch]
        assert sorted(seen) == list(range(TOTAL)), f"epoch {epoch}"
        for r in reports:  # audited across both processes
            assert r["audits"][epoch]["ranks"] == 2 and r["audits"][epoch]["exactly_once"]


def test_a_checkpoint_of_two_processes_restored_by_one_gives_the_rest_of_the_epoch(run):
    import jax
    from nvidia.dali import fn, types

    from dali_shards import sharded_pipeline
    from dali_shards.jax import CheckpointRestore, DALIShardedIterator

    out, data, reports = run
    before = [i for r in reports for batch in r["epochs"][1][:2] for i in batch]

    @sharded_pipeline(os.path.join(str(data), "sample-*.tar"), fields=("jpg", "__index__"), batch_size=4,
                      py_num_workers=2, shuffle=True, seed=5, device_id=None, num_threads=1)  # fmt: skip
    def pipe(jpg, idx):
        return fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(8, 8)), idx

    assert jax.process_count() == 1
    it = DALIShardedIterator(pipe(), ["image", "index"])
    ocp.CheckpointManager(str(out / "checkpoints")).restore(2, args=ocp.args.Composite(loader=CheckpointRestore(it)))
    assert it.epoch == 1 and it.step == 2  # two steps of the two-process layout taken
    after = [i for b in it for i in np.asarray(b["index"])[np.asarray(b["valid"])].tolist()]
    assert len(after) == TOTAL - len(before) and sorted(before + after) == list(range(TOTAL))

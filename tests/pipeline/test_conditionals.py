"""Pipelines are defined without AutoGraph unless the user's function needs it, and leave no
``__autograph_generated_file*.py`` behind, even when the process ends without cleaning up."""

import os
import textwrap

from dali_shards.testing.processes import run_script

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from nvidia.dali import fn
    from dali_shards import sharded_pipeline
    from dali_shards.sample_data import write_sample_shards

    paths = write_sample_shards(sys.argv[1], shard_sizes=(5, 6))

    @sharded_pipeline(paths, fields=("cls", "__index__"), batch_size=4, py_num_workers=2, num_threads=1, device_id=None)
    def plain(cls, index):
        return cls, index

    @sharded_pipeline(paths, fields=("cls", "__index__"), batch_size=4, py_num_workers=2, num_threads=1, device_id=None)
    def branchy(cls, index):
        if index < 5:  # the user's own conditional: AutoGraph is needed for this one
            cls = cls * 10
        return cls, index

    got = {}
    for name, make in (("plain", plain), ("branchy", branchy)):
        pipe = make()
        pipe.build()
        cls, index = pipe.run()
        got[name] = sorted((int(np.array(i)), int(np.array(c))) for c, i in zip(cls, index))
    assert got["branchy"] == [(i, c * 10 if i < 5 else c) for i, c in got["plain"]], got
    print("ok", len(os.listdir(os.environ["TMPDIR"])))
    sys.stdout.flush()
    os._exit(0)  # no atexit handlers: as a killed process would end
    """
)


def test_no_autograph_files_are_left_behind(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # (run from a file: AutoGraph needs the source of the user's function)
    out = run_script(tmp_path / "job.py", SCRIPT, tmp_path / "data", env={"TMPDIR": str(tmp)}, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok" in out.stdout
    leftovers = [n for n in os.listdir(tmp) if n.startswith("__autograph_generated_file")]
    assert leftovers == []

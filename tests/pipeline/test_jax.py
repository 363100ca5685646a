"""``dali_shards.jax`` on JAX's CPU backend (two CPU devices in this process) with DALI CPU pipelines:
every sample once an epoch, static shapes (the last, padded batch at full shape with its mask; a
ragged output padded to its bound), the global arrays' sharding, a resume through Orbax, a mix, a
sample DALI fails on skipped, and each misuse a ConfigError saying what to do. Two processes, and
an elastic resume from two to one: ``tests/integration/test_jax_processes.py``."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # (before JAX starts)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")

from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from nvidia.dali import fn, types  # noqa: E402

from dali_shards import Stream  # noqa: E402
from dali_shards.errors import ConfigError, RaggedOutputError  # noqa: E402
from dali_shards.jax import CheckpointRestore, CheckpointSave, DALIShardedIterator  # noqa: E402
from dali_shards.testing.pipelines import identity_pipeline  # noqa: E402
from dali_shards.testing.shards import npy  # noqa: E402
from dali_shards.testing.tars import with_jpeg_frame  # noqa: E402

TOTAL = 47  # the photos


def decoding(source, **options):
    """Photos decoded and resized (CPU), their ``__index__`` and ``__key__``."""
    from dali_shards import sharded_pipeline

    keywords = dict(fields=("jpg", "__index__", "__key__"), batch_size=8, py_num_workers=2, shuffle=True, seed=7,
                    device_id=None, num_threads=2)  # fmt: skip

    @sharded_pipeline(source, **{**keywords, **options})
    def pipe(jpg, index, key):
        return fn.resize(fn.decoders.image(jpg, device="cpu", output_type=types.RGB), size=(16, 16)), index, key

    return pipe


def loader(pipe, **kw):
    return DALIShardedIterator(pipe, ["image", "index", "key"], pad_to={"key": (12,)}, **kw)


def valid(batch, name="index"):
    """The valid samples' values of ``name`` in a batch (the global array, gathered to the host)."""
    return np.asarray(batch[name])[np.asarray(batch["valid"])].tolist()


def rest(it):
    return [i for b in it for i in valid(b)]


@pytest.fixture(scope="module")
def photos(make_shards):
    return make_shards((11, 0, 14, 9, 13))


def test_every_sample_once_an_epoch_in_full_batches_sharded_over_the_devices(photos):
    assert len(jax.devices()) == 2, "XLA_FLAGS was set after JAX started: run this module on its own"
    it = loader(decoding(photos)(), audit=True)
    assert len(it) == 6  # 47 samples, batches of 8: the last one holds 7
    for epoch in range(2):
        batches = list(it)
        seen = [i for b in batches for i in valid(b)]
        assert sorted(seen) == list(range(TOTAL)), f"epoch {epoch}"
        assert len(batches) == 6 and it.audits[-1]["exactly_once"]
        last = batches[-1]
        assert {k: v.shape for k, v in last.items()} == {
            "image": (8, 16, 16, 3), "index": (8,), "key": (8, 12), "key_shape": (8, 1), "valid": (8,)}  # fmt: skip
        assert np.asarray(last["valid"]).sum() == 7 and last["valid"].dtype == bool
        assert last["image"].sharding.spec == PartitionSpec("data") and len(last["image"].sharding.device_set) == 2
        assert [s.data.shape for s in last["image"].addressable_shards] == [(4, 16, 16, 3)] * 2
    keys = np.asarray(last["key"])
    lengths = np.asarray(last["key_shape"])[:, 0]
    assert bytes(keys[0, : lengths[0]]).decode() == f"{np.asarray(last['index'])[0]:06d}" and not keys[0, lengths[0]:].any()


def test_a_resume_through_orbax_gives_exactly_the_rest_of_the_epoch(photos, tmp_path):
    factory = decoding(photos)
    it = loader(factory())
    first = [i for _, b in zip(range(2), it) for i in valid(b)]
    manager = ocp.CheckpointManager(str(tmp_path))
    manager.save(2, args=ocp.args.Composite(loader=CheckpointSave(it)))
    manager.wait_until_finished()
    expected = rest(it)
    again = loader(factory())
    manager.restore(2, args=ocp.args.Composite(loader=CheckpointRestore(again)))
    assert (again.epoch, again.step, len(again)) == (0, 2, 4)
    assert rest(again) == expected and sorted(first + expected) == list(range(TOTAL))
    assert sorted(rest(again)) == list(range(TOTAL))  # the next epoch: whole


def numbered(index, shard, position):
    return {"__key__": f"s{shard:03d}-{position:04d}", "ids": npy(np.array([index], np.int64))}


def test_a_mix_gives_each_stream_its_count_with_the_stream_of_each_sample(make_shards):
    big, small = make_shards((8, 9, 5), numbered, prefix="big"), make_shards((4, 3), numbered, prefix="small")
    pipe = identity_pipeline([Stream(big, proportion=2), Stream(small, repeat=2)], ("__index__", "__stream__"),
                             epoch_size=36, batch_size=4, py_num_workers=2, shuffle=True, seed=3)()  # fmt: skip
    it = DALIShardedIterator(pipe, ["index", "stream"], audit=True)
    drawn = [(i, s) for b in it for i, s in zip(valid(b), valid(b, "stream"))]
    per_stream = np.bincount([s for _, s in drawn], minlength=2).tolist()
    assert per_stream == list(pipe.dali_shards.mixture.counts) and sum(per_stream) == 36
    assert sorted(i for i, s in drawn if s == 1) == sorted(list(range(22, 29)) * 2)  # small, drawn twice each
    assert it.audits[0]["exactly_once"]


def test_a_sample_dali_fails_on_is_skipped_and_every_other_comes_once(make_shards):
    from PIL import Image
    import io

    buf = io.BytesIO()
    Image.new("RGB", (24, 20), (200, 10, 10)).save(buf, "JPEG")
    good = buf.getvalue()
    bad = with_jpeg_frame(good, 0, 0)  # passes the workers' check, DALI's decoder rejects it
    shards = make_shards((6, 7), lambda i, s, p: {"__key__": f"k{i:03d}", "jpg": bad if i == 5 else good})
    it = loader(decoding(shards, batch_size=4, on_error="skip")(), audit=True)
    seen = rest(it)
    assert sorted(seen) == [i for i in range(13) if i != 5]
    assert [s["index"] for inc in it.incidents for s in inc["samples"]] == [5]
    assert it.audits[0]["skipped"] == [5] and it.audits[0]["missing"] == 0


def test_what_jax_cannot_take_is_a_config_error_saying_what_to_do(photos):
    factory = decoding(photos)
    with pytest.raises(ConfigError, match=r"outputs \['key'\] may differ in shape .*pad_to=\{'key'"):
        DALIShardedIterator(factory(), ["image", "index", "key"])
    with pytest.raises(ConfigError, match="cannot be split into the 2 parts.*multiple of 2"):
        loader(decoding(photos, batch_size=3, py_num_workers=1)())
    with pytest.raises(ConfigError, match="rank 1 of world_size 2, but this is JAX process 0 of 1"):
        loader(factory(rank=1, world_size=2))
    with pytest.raises(ConfigError, match="must be a jax.sharding.NamedSharding"):
        loader(factory(), sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with pytest.raises(ConfigError, match=r"pad_to\['key'\] must be a tuple of positive integers"):
        DALIShardedIterator(factory(), ["image", "index", "key"], pad_to={"key": 12})
    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec(None))
    assert loader(factory(), sharding=replicated).sharding is replicated  # one process: every device holds all


def test_each_output_may_have_its_own_sharding(photos):
    mesh = Mesh(np.array(jax.devices()), ("data",))
    with pytest.raises(ConfigError, match=r"sharding names \['label'\], which are not outputs"):
        loader(decoding(photos)(), sharding={"label": NamedSharding(mesh, PartitionSpec())})
    it = loader(decoding(photos)(), sharding={"index": NamedSharding(mesh, PartitionSpec())})  # index: on every device
    batch = next(it)
    assert [s.data.shape for s in batch["index"].addressable_shards] == [(8,)] * 2
    assert [s.data.shape for s in batch["image"].addressable_shards] == [(4, 16, 16, 3)] * 2  # the default: split
    assert batch["valid"].sharding.spec == PartitionSpec("data") and it.sharding_of("index", 1).spec == PartitionSpec()


def test_a_sample_beyond_its_bound_or_a_shape_that_changes_is_a_ragged_output_error(photos):
    with pytest.raises(RaggedOutputError, match=r"beyond its bound pad_to\['key'\] = \(3,\): raise the bound"):
        list(DALIShardedIterator(decoding(photos)(), ["image", "index", "key"], pad_to={"key": (3,)}))
    from dali_shards import sharded_pipeline

    @sharded_pipeline(photos, fields=("jpg",), batch_size=8, py_num_workers=2, device_id=None, num_threads=2)
    def native_sizes(jpg):
        return fn.decoders.image(jpg, device="cpu", output_type=types.RGB)

    with pytest.raises(RaggedOutputError, match="JAX needs one shape per output.*fn.resize.*pad_to="):
        list(DALIShardedIterator(native_sizes(), ["image"]))


def test_64_bit_outputs_are_narrowed_only_where_every_value_fits(make_shards):
    shards = make_shards((5,), lambda i, s, p: {"__key__": f"k{i}", "npy": npy(np.array([i * 2**31], np.int64))})
    pipe = identity_pipeline(shards, ("npy",), batch_size=2, py_num_workers=1)()
    with pytest.raises(ConfigError, match="beyond int32.*jax_enable_x64"):  # 0 fits, 2**31 does not
        list(DALIShardedIterator(pipe, ["ids"]))
    small = make_shards((5,), lambda i, s, p: {"__key__": f"k{i}", "npy": npy(np.array([-i * 2**20], np.int64))})
    got = [v for b in DALIShardedIterator(identity_pipeline(small, ("npy",), batch_size=2, py_num_workers=1)(), ["ids"])
           for v in np.asarray(b["ids"])[np.asarray(b["valid"])].ravel().tolist()]  # fmt: skip
    assert sorted(got) == sorted(-i * 2**20 for i in range(5))

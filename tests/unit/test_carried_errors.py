"""A worker's error crosses DALI's worker pool (which passes only text on) as the object it was."""

import pickle

from dali_shards.errors import CarriedError, ShardMapError, WorkerError, carry, from_worker


def test_an_error_rides_in_the_text_and_comes_back_whole():
    exc = ShardMapError("s3://b/shard-0001.tar", "map (f) raised KeyError: 'x'", key="k7", hint="fix the map")
    carried = carry(exc)
    assert isinstance(carried, CarriedError) and str(carried).startswith("ShardMapError: shard")
    as_dali_says = RuntimeError(f"Critical error in worker 1:\nTraceback...\n{carried}\n")  # DALI's text of it
    back = from_worker(as_dali_says)
    assert type(back) is ShardMapError and (back.url, back.key, back.hint) == (exc.url, exc.key, exc.hint)
    assert str(back) == str(exc)


def test_unpicklable_errors_go_as_they_are_and_plain_text_carries_nothing():
    class Local(WorkerError):  # a class pickle cannot find
        pass

    exc = Local("x")
    assert carry(exc) is exc
    assert from_worker(RuntimeError("dali_shards.errors.ShardFormatError: shard 'a', sample 'b': bad")) is None
    assert from_worker(RuntimeError("[dali_shards error object: bm90IGEgcGlja2xl]")) is None  # damaged: DALI's stands
    assert pickle.loads(pickle.dumps(ShardMapError("u", "d", key="k"))).key == "k"

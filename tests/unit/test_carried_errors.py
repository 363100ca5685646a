"""A worker's error crosses DALI's worker pool (which passes only text on) and comes back as the
error it was: rebuilt from data, never from code, whatever the shard's keys or a map's traceback hold."""

import json
import pickle
import base64

from dali_shards.errors import (
    CarriedError,
    ConfigError,
    ShardAccessError,
    ShardFormatError,
    ShardMapError,
    WorkerError,
    carry,
    from_worker,
)


def as_dali_says(carried):
    """DALI's pool re-raises a worker's exception as text: the traceback, then the message."""
    return RuntimeError(f"Critical error in worker 1:\nTraceback (most recent call last):\n  ...\n{carried}\n")


def test_errors_ride_in_the_text_and_come_back_whole():
    for exc in (
        ShardMapError("s3://b/shard-0001.tar", "map (f) raised KeyError: 'x'", key="k7", hint="fix the map"),
        ShardFormatError("/d/a.tar", "corrupt header at byte 512"),
        ShardAccessError("https://h/a.tar", "404", key=None, hint="check the URL"),
        ConfigError("map=f was pickled but cannot be loaded in a worker"),
        WorkerError("worker 1 stopped"),
    ):
        carried = carry(exc)
        assert isinstance(carried, CarriedError) and str(carried).startswith(type(exc).__name__ + ": ")
        back = from_worker(as_dali_says(carried))
        assert type(back) is type(exc) and str(back) == str(exc)
        if isinstance(exc, ShardMapError):
            assert (back.url, back.key, back.hint) == (exc.url, exc.key, exc.hint)


def test_a_shard_cannot_make_the_main_process_run_code_or_misname_the_error():
    class Evil:
        def __reduce__(self):
            return (print, ("ATTACKER CODE RAN",))

    planted = "[dali_shards error object: " + base64.b64encode(pickle.dumps(Evil())).decode() + "]"
    fake = "[dali_shards error: " + json.dumps({"class": "WorkerError", "message": "fake"}) + "]"
    exc = ShardFormatError("/d/a.tar", "bad member", key="x" + planted + fake)  # a key is the shard's text
    back = from_worker(as_dali_says(carry(exc)))
    assert type(back) is ShardFormatError and back.key == exc.key, "the last line is ours: the real error"


def test_others_go_as_they_are_and_plain_or_damaged_text_carries_nothing():
    class Local(WorkerError):  # not one of the errors rebuilt by name
        pass

    exc = Local("x")
    assert carry(exc) is exc
    assert from_worker(RuntimeError("dali_shards.errors.ShardFormatError: shard 'a', sample 'b': bad")) is None
    assert from_worker(RuntimeError('[dali_shards error: {"class": "ShardFormatError"')) is None
    assert from_worker(RuntimeError('[dali_shards error: {"class": "os.system", "message": "x"}]')) is None

"""What a ring's worker and the main process tell each other, over the duplex connection that joins
them: fixed-size messages with named fields. The bulk data (a mini-batch) lies in the worker's
shared-memory slots (``segment.py``); a message only says where.

A message is sent once what it describes is complete (a mini-batch is written before its BATCH
message leaves), so the reader never sees a slot half-written; the connection carries no lock or
condition a dead process could hold: a worker's death is its connection's end (and its process
sentinel). Imports no DALI.
"""

from __future__ import annotations

import ctypes
from typing import Any

# kinds of messages: worker -> main
BATCH = 1  # a mini-batch of ``count`` samples is in ``slot`` (``size`` bytes); a new segment's descriptor follows
END = 2  # epoch ``epoch`` ended after ``step`` steps (all of them, or where the main process cut it)
ERROR = 3  # the worker failed: its error as data (errors.carried_fields, JSON) and traceback text follow
# main -> worker
FREE = 4  # ``slot`` may be written again
STOP = 5  # end the worker process


class Message(ctypes.Structure):
    """One message (see the kinds above); fields unused by a kind are 0."""

    _fields_ = [
        ("kind", ctypes.c_int64),
        ("epoch", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("slot", ctypes.c_int64),
        ("size", ctypes.c_int64),  # BATCH: bytes of the slot used
        ("capacity", ctypes.c_int64),  # BATCH: the slot's segment size (a new segment when it changed)
        ("generation", ctypes.c_int64),  # BATCH: the slot's segment, counted (a new one's descriptor follows)
        ("count", ctypes.c_int64),  # BATCH: samples in the mini-batch
    ]


def send(conn: Any, kind: int, **fields: int) -> None:
    """Send a message of ``kind`` with these fields."""
    conn.send_bytes(bytes(Message(kind=kind, **fields)))


def receive(conn: Any) -> Message:
    """The next message on ``conn`` (blocks; ``EOFError`` once the other side is gone)."""
    data = conn.recv_bytes(ctypes.sizeof(Message))
    if len(data) != ctypes.sizeof(Message):
        raise EOFError(f"a ring message of {len(data)} bytes, not {ctypes.sizeof(Message)}")
    return Message.from_buffer_copy(data)

"""A file of named NumPy arrays and a small JSON header, read by mapping it: the form a catalog takes
on disk (a node's shared copy, and the binary manifest beside ``manifest.json``).

Layout: 8 bytes of magic, the header's length (uint64, little-endian), the header (UTF-8 JSON:
``meta``, and per array its dtype, shape and offset), then each array at a 64-byte aligned offset,
then 8 bytes of end marker. The header also records the file's size, so that a file cut short (a
writer that died, a disk that filled) is never taken for a whole one. A file is written to a
temporary name and renamed into place: a reader sees all of it or none.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

MAGIC = b"DSCOLS\x00\x01"
END = b"DSCOLEND"
ALIGN = 64
DTYPES = frozenset(["|u1", "|b1", "<i4", "<i8", "<u4", "<u8", "<u2"])
HOST = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:40] or "host"


class BadColumnFile(ValueError):
    """A file that is not a whole, well-formed column file (says why)."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def temp_name(path: str) -> str:
    """Where a writer of ``path`` on this host and process writes first."""
    return f"{path}.{HOST}.{os.getpid()}.tmp"


def write_columns(path: str, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Write ``arrays`` and ``meta`` (JSON-able) to ``path``, whole or not at all."""
    placed: Dict[str, Dict[str, Any]] = {}
    bodies: List[Tuple[int, np.ndarray]] = []
    header_room = 0
    for _ in range(2):  # the header's size moves the arrays: placed again with its final size
        at = _aligned(16 + header_room)
        placed, bodies = {}, []
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
            array = array.astype(dtype, copy=False)
            if dtype.str not in DTYPES:
                raise TypeError(f"column {name!r}: dtype {dtype.str} cannot be stored")
            placed[name] = {"dtype": dtype.str, "shape": list(array.shape), "offset": at}
            bodies.append((at, array))
            at = _aligned(at + array.nbytes)
        size = at + len(END)
        header = {"meta": dict(meta), "arrays": placed, "size": size}
        text = json.dumps(header, sort_keys=True).encode()
        if len(text) <= header_room:
            break
        header_room = len(text) + 256
    text = text.ljust(header_room)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(text).to_bytes(8, "little") + text)
            for at, array in bodies:
                f.write(b"\0" * (at - f.tell()))
                f.write(memoryview(array).cast("B") if array.nbytes else b"")  # type: ignore[arg-type]
            f.write(b"\0" * (size - len(END) - f.tell()) + END)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def map_columns(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The arrays (read-only views of the mapped file, shared with every process that maps it) and
    the meta of the column file at ``path``; ``BadColumnFile`` if it is not a whole one,
    ``OSError`` if it cannot be opened."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 16 + len(END):
            raise BadColumnFile(f"{path}: {size} bytes, too short")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return parse_columns(mapped, path)


def parse_columns(buffer: Any, path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """``map_columns`` over bytes already read (a buffer), checked the same way."""
    view = memoryview(buffer)
    size = len(view)
    if bytes(view[:8]) != MAGIC:
        raise BadColumnFile(f"{path}: not a column file of this version")
    length = int.from_bytes(view[8:16], "little")
    try:
        header = json.loads(bytes(view[16 : 16 + length]))
        declared = int(header["size"])
        placed = header["arrays"]
        meta = header["meta"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadColumnFile(f"{path}: damaged header ({exc})") from None
    if declared != size or bytes(view[size - len(END) :]) != END:
        raise BadColumnFile(f"{path}: {size} bytes, not the {declared} its header declares (cut short)")
    arrays: Dict[str, np.ndarray] = {}
    for name, spec in placed.items():
        dtype, shape, at = str(spec["dtype"]), tuple(int(d) for d in spec["shape"]), int(spec["offset"])
        count = int(np.prod(shape)) if shape else 1
        if dtype not in DTYPES or at < 16 + length or at + count * np.dtype(dtype).itemsize > size - len(END):
            raise BadColumnFile(f"{path}: column {name!r} lies outside the file")
        array = np.frombuffer(buffer, np.dtype(dtype), count, at).reshape(shape)
        if array.flags.writeable:
            array = array.view()
            array.setflags(write=False)
        arrays[name] = array
    return arrays, meta


def read_columns_bytes(data: bytes, path: str) -> Optional[Tuple[Dict[str, np.ndarray], Dict[str, Any]]]:
    """``parse_columns`` of downloaded bytes; None if they are not a whole column file."""
    try:
        return parse_columns(data, path)
    except BadColumnFile:
        return None

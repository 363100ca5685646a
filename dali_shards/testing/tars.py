"""Tar archives for tests: any members (files, directories, links, long names), in any format."""

from __future__ import annotations

import io
import tarfile
from typing import Any, Dict, List, Sequence, Tuple


def read_samples(path: Any, **kw: Any) -> List[Tuple[str, Dict[str, bytes]]]:
    """(key, {extension: bytes}) of every sample our tar reader reads in ``path`` (any compression);
    ``kw`` go to ``TarReader.samples`` (``want``, ``start``, ``stop``)."""
    from dali_shards.io.storage import open_shard
    from dali_shards.tar.format import TarReader

    with open_shard(str(path)) as f:
        return [(s.key, dict(s.data)) for s in TarReader(f, str(path)).samples(**kw)]


def make_tar(path: Any, members: Sequence[Tuple[str, Any]], fmt: int = tarfile.GNU_FORMAT, mode: str = "w") -> str:
    """members: (name, bytes) for files, (name, None) for directories, (name, "->target") links."""
    with tarfile.open(path, mode, format=fmt) as tar:  # type: ignore[call-overload]  # typeshed: a literal mode
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, str):
                info.type = tarfile.SYMTYPE
                info.linkname = data[2:]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


# members webdataset and our reader must read alike: a directory, a link, an extension with a dot,
# names with no extension or starting with "__", a long name, upper case, a key seen again later
AWKWARD = [
    ("a/dir", None),
    ("a/dir/000.jpg", b"jpeg-0"),
    ("a/dir/000.cls", b"3"),
    ("a/dir/000.seg.PNG", b"mask-0"),
    ("__meta__", b"ignored"),
    ("README", b"no extension: ignored"),
    ("001.jpg", b"jpeg-1"),
    ("001.json", b"{}"),
    ("link.jpg", "->001.jpg"),
    ("x" * 120 + "/002.jpg", b"long name"),
    ("x" * 120 + "/002.cls", b"7"),
    ("003.JPG", b"upper"),
    ("001.txt", b"key seen again later: a new sample, as in webdataset"),
    ("empty.txt", b""),
]


def with_jpeg_frame(data: bytes, height: int, width: int) -> bytes:
    """JPEG ``data`` with its frame header (SOF) saying ``height`` x ``width`` pixels: still well
    formed (0x0 fails in DALI's decoder; over 2**28 pixels is a decompression bomb)."""
    b, i = bytearray(data), 2
    while i < len(b):
        marker, length = b[i + 1], int.from_bytes(b[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            b[i + 5 : i + 7], b[i + 7 : i + 9] = height.to_bytes(2, "big"), width.to_bytes(2, "big")
            return bytes(b)
        i += 2 + length
    raise ValueError("no frame header")

"""Tar members and WebDataset samples: a member's key and extension, and the sample its members
make (see ``format``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def split_key(name: str) -> tuple[Optional[str], Optional[str]]:
    """(key, extension) of a member name, or (None, None) if it has no extension."""
    m = KEY_EXT.match(name)
    if m is None:
        return None, None
    return m.group(1), m.group(2).lower()


def is_metadata(name: str) -> bool:
    """True for WebDataset metadata members, which are not part of any sample."""
    return bool(_META.match(name)) or ("/" not in name and name.startswith("__") and name.endswith("__"))


class Member:
    """One regular tar member: its name, the offset of its header, its data size, and ``start``:
    where reading must begin to reach it (before its long-name or pax headers, and before any
    non-sample member passed over on the way)."""

    __slots__ = ("name", "header_offset", "size", "start")

    def __init__(self, name: str, header_offset: int, size: int, start: Optional[int] = None):
        self.name = name
        self.header_offset = header_offset
        self.size = size
        self.start = header_offset if start is None else start

    def __repr__(self) -> str:
        return f"Member({self.name!r}, header_offset={self.header_offset}, size={self.size})"


@dataclass
class RawSample:
    """One sample of a shard: its key, position in the shard, and the data of selected members
    (bytes, or the buffer a ``Destination`` supplied). ``extra`` is free for a destination's
    bookkeeping."""

    key: str
    position: int
    url: str
    data: Dict[str, Any] = field(default_factory=dict)
    extensions: list = field(default_factory=list)
    extra: Any = None
    error: Optional[str] = None  # what is wrong with the sample, if anything (e.g. a duplicate member)
    hint: str = ""


# Where to read a member's data: given (sample, extension, size), a writable buffer of that size,
# or None for a new bytes object.
Destination = Callable[[RawSample, str, int], Optional[Any]]

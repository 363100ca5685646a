"""Parsing one tar header block and pax records, as Python's ``tarfile`` does, with every bad
field a ``ShardFormatError`` naming the shard and the byte it is at. Names are decoded as UTF-8
with surrogate escapes (``tarfile``'s and WebDataset's behaviour), so that names differing only in
invalid bytes stay different."""

from __future__ import annotations

import zlib
from typing import Dict

from dali_shards.errors import ShardFormatError

BLOCK = 512
CORRUPT_HINT = "the shard is damaged or is not a tar archive; re-create or re-download it"
SPARSE_HINT = "re-create the shard without --sparse (e.g. with `dali-shards write`, tarfile or GNU tar without -S)"
_PAX_SPARSE_KEYS = (
    "GNU.sparse.major",
    "GNU.sparse.map",
    "GNU.sparse.size",
    "GNU.sparse.numblocks",
    "GNU.sparse.realsize",
    "GNU.sparse.name",
)


def decode_name(raw: bytes) -> str:
    """A member name from its bytes: UTF-8, invalid bytes kept as surrogate escapes."""
    return raw.decode("utf-8", "surrogateescape")


def printable(name: str) -> str:
    """A name for messages (surrogate escapes shown as ``\\xNN``)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def parse_number(url: str, field: bytes, what: str, offset: int) -> int:
    """A numeric header field: octal text, or GNU base-256 for large values."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] & 0x40:
            value -= 1 << (8 * len(field) - 1)
        return value
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ShardFormatError(
            url, f"corrupt tar header at byte {offset}: the {what} field {field!r} is not a number", hint=CORRUPT_HINT
        ) from None


def check_header(url: str, hdr: bytes, offset: int) -> None:
    """ShardFormatError unless the header's checksum matches (unsigned, or signed as old tars)."""
    chk = hdr[148:156]
    stored = parse_number(url, chk, "checksum", offset)
    # The checksum is the byte sum with the checksum field read as spaces. Adler-32's low half
    # is that sum mod 65521 (computed in C); one damaged byte moves the sum by at most 255, so
    # it cannot hide. On a mismatch, check exactly (unsigned, or signed as old tars wrote it).
    if ((zlib.adler32(hdr) & 0xFFFF) - 1 - sum(chk) + 256 - stored) % 65521:
        unsigned = sum(hdr) - sum(chk) + 256
        signed = unsigned - 256 * sum(1 for b in hdr if b > 127) + 256 * sum(1 for b in chk if b > 127)
        if stored not in (unsigned, signed):
            raise ShardFormatError(
                url,
                f"corrupt tar header at byte {offset}: checksum mismatch (stored {stored}, computed {unsigned})",
                hint=CORRUPT_HINT,
            )


def header_name(hdr: bytes) -> str:
    """The name in a ustar header (with its prefix field)."""
    name = decode_name(hdr[0:100].split(b"\0", 1)[0])
    if hdr[257:263] == b"ustar\0" and hdr[345]:
        name = decode_name(hdr[345:500].split(b"\0", 1)[0]) + "/" + name
    return name


def parse_pax(url: str, raw: bytes, offset: int) -> Dict[str, str]:
    """The records of a pax extended header (``"<length> <key>=<value>\\n"`` each)."""
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(raw) and raw[pos:].strip(b"\0"):
        sp = raw.find(b" ", pos)
        try:
            length = int(raw[pos:sp]) if sp > pos else 0
        except ValueError:
            length = 0
        if length <= sp - pos or pos + length > len(raw) or raw[pos + length - 1 : pos + length] != b"\n":
            raise ShardFormatError(url, f"corrupt pax header at byte {offset}: bad record length", hint=CORRUPT_HINT)
        key, _, value = raw[sp + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def pax_size(url: str, pax: Dict[str, str], name: str, offset: int) -> int:
    """The member size a pax header gives, checked."""
    value = pax["size"]
    if not value.isdigit():
        raise ShardFormatError(
            url,
            f"corrupt pax header of member {printable(name)!r} at byte {offset}: size={value!r} is not a number",
            hint=CORRUPT_HINT,
        )
    return int(value)


def check_not_sparse(url: str, pax: Dict[str, str], name: str, offset: int) -> None:
    """ShardFormatError for a pax-format sparse member (GNU tar ``--format=posix --sparse``)."""
    if any(k in pax for k in _PAX_SPARSE_KEYS):
        real = pax.get("GNU.sparse.name", name)
        raise ShardFormatError(
            url, f"member {printable(real)!r} at byte {offset} is a sparse file, which is not supported", hint=SPARSE_HINT
        )


_OCTAL = frozenset(b"01234567 \0")


def header_start(partial: bytes) -> bool:
    """True if ``partial`` (less than a block) begins like a tar header: its numeric fields up to
    the checksum (mode, uid, gid, size, mtime) are there and read as numbers."""
    if len(partial) < 148:
        return False
    fields = (partial[100:108], partial[108:116], partial[116:124], partial[124:136], partial[136:148])
    return all(f[0] & 0x80 or set(f) <= _OCTAL for f in fields)

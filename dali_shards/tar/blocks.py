"""Tar headers of many samples at once, with NumPy: the members of samples whose spans lie in one
buffer, located and checked without a Python object per member.

For samples whose spans (see ``positioned.py``) were read into one buffer, ``walk_members`` visits
the members of every sample in rounds -- round ``r`` looks at the ``r``-th header of every sample
that has one left -- and parses each round's header blocks with array operations: the type flag,
the size and checksum fields (octal text), where the name's key ends and its extension begins.
Only plain members are accepted: a sample with a long name or pax header, a ustar name prefix, a
base-256 size, a link, a bad checksum, a member that runs past its span, a name without an
extension, a metadata member or a second key is reported as *irregular*, for the general reader
(``TarReader``) to accept or name exactly as a sequential read would. Imports no DALI.
"""

from __future__ import annotations

from typing import List, NamedTuple

import numpy as np

from dali_shards.tar.header import BLOCK

_COLS = np.arange(BLOCK)
_USTAR = np.frombuffer(b"ustar\0", dtype=np.uint8)


class MemberColumns(NamedTuple):
    """Round ``r``'s member of each sample of ``samples`` (indices into the walk's spans): the
    offset of its header in the buffer, where its data begins and its size, where its name's key ends
    (the first dot of its file name) and its name's length (the name is the header's first bytes)."""

    samples: np.ndarray
    header: np.ndarray
    data: np.ndarray
    size: np.ndarray
    key_end: np.ndarray
    name_end: np.ndarray
    name: np.ndarray  # the names' 100 bytes, a row each


class Walk(NamedTuple):
    """The members of every sample, round by round, and which samples are irregular (see the
    module): their members are not to be used."""

    rounds: List[MemberColumns]
    irregular: np.ndarray


def octal(fields: np.ndarray) -> np.ndarray:
    """Octal text fields (rows of bytes: optional spaces, digits, then NUL or space) as integers;
    -1 where a row is not such a number."""
    value = np.zeros(len(fields), dtype=np.int64)
    started = np.zeros(len(fields), dtype=bool)
    ended = np.zeros(len(fields), dtype=bool)
    bad = np.zeros(len(fields), dtype=bool)
    for col in fields.T:
        digit = (col >= 48) & (col <= 55)
        blank = (col == 32) | (col == 0)
        take = digit & ~ended
        value = np.where(take, value * 8 + (col.astype(np.int64) - 48), value)
        ended |= started & blank
        started |= digit
        bad |= ~digit & ~blank | (digit & ended)
    return np.where(bad, -1, value)


def octal_fast(fields: np.ndarray, digits: int) -> np.ndarray:
    """``octal``, fast for rows written as writers do (``digits`` octal digits, then NUL or a
    space): a dot product; the other rows through ``octal``."""
    head = fields[:, :digits].astype(np.int64) - 48
    common = ((head >= 0) & (head <= 7)).all(axis=1) & ((fields[:, digits] == 0) | (fields[:, digits] == 32))
    value = head @ (8 ** np.arange(digits - 1, -1, -1, dtype=np.int64))
    if not common.all():
        value[~common] = octal(fields[~common])
    return value


def header_blocks(buf: np.ndarray, headers: np.ndarray) -> np.ndarray:
    """The 512-byte blocks at ``headers`` in ``buf`` (rows copied at once where they are
    block-aligned, as in a tar and in the ring's slots)."""
    if len(headers) and not (headers % BLOCK).any():
        top = (int(headers.max()) // BLOCK + 1) * BLOCK
        return buf[:top].reshape(-1, BLOCK)[headers // BLOCK]
    return buf[headers[:, None] + _COLS]


_LANES = np.uint64(0x00FF00FF00FF00FF)


def byte_sums(blocks: np.ndarray) -> np.ndarray:
    """The sum of each row's bytes (rows of 512 uint8), as int64: the words of a row added as four
    16-bit lanes (no lane can overflow in 512 bytes), then the lanes."""
    words = np.ascontiguousarray(blocks).view(np.uint64)
    lanes = ((words & _LANES) + ((words >> np.uint64(8)) & _LANES)).sum(axis=1, dtype=np.uint64)
    mask = np.uint64(0xFFFF)
    total = (lanes & mask) + ((lanes >> np.uint64(16)) & mask)
    total += ((lanes >> np.uint64(32)) & mask) + (lanes >> np.uint64(48))
    return total.astype(np.int64)


def parse_round(buf: np.ndarray, headers: np.ndarray) -> tuple:
    """For header blocks at ``headers`` in ``buf``: (plain and checked, size, key end, name end,
    the names' bytes)."""
    blocks = header_blocks(buf, headers)
    flag = blocks[:, 156]
    plain = ((flag == 48) | (flag == 0) | (flag == 55)) & (blocks[:, 124] < 0x80)  # "0", NUL, "7"
    size = octal_fast(blocks[:, 124:136], 11)
    stored = octal_fast(blocks[:, 148:156], 6)
    computed = byte_sums(blocks) - blocks[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * 32
    prefixed = blocks[:, 345] != 0
    if prefixed.any():  # a ustar name prefix (rare): such a member is irregular
        prefixed &= (blocks[:, 257:263] == _USTAR).all(axis=1)
    name = blocks[:, :100]
    zero = name == 0
    nul = np.where(zero.any(axis=1), zero.argmax(axis=1), 100)
    width = int(nul.max(initial=1))  # no column past it lies inside a name
    used, cols = name[:, :width], _COLS[:width]
    inside = cols < nul[:, None]
    slashes = (used == 47) & inside
    slash = np.where(slashes, cols, -1).max(axis=1) if slashes.any() else np.full(len(name), -1)
    dots = (used == 46) & inside & (cols > slash[:, None])
    key_end = np.where(dots.any(axis=1), dots.argmax(axis=1), -1)
    rows = np.arange(len(headers))
    base = np.minimum(slash + 1, 98)
    meta = (name[rows, base] == 95) & (name[rows, base + 1] == 95)  # a "__...__" member (or a key like one)
    ok = plain & (size >= 0) & (stored == computed) & ~prefixed & (key_end > slash + 1) & ~meta
    return ok, size, key_end, nul, name


def walk_members(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Walk:
    """The members of the samples whose spans are ``[starts[i], ends[i])`` in ``buf`` (see the
    module)."""
    irregular = np.zeros(len(starts), dtype=bool)
    rounds: List[MemberColumns] = []
    samples = np.arange(len(starts))
    at = starts.astype(np.int64)
    first_name = np.zeros((len(starts), 100), dtype=np.uint8)  # each sample's first member's name
    first_key = np.zeros(len(starts), dtype=np.int64)
    while len(samples):
        fits = at + BLOCK <= ends[samples]
        irregular[samples[~fits]] = True
        samples, at = samples[fits], at[fits]
        if not len(samples):
            break
        ok, size, key_end, name_end, name = parse_round(buf, at)
        if not rounds:
            first_name[samples], first_key[samples] = name, key_end
        width = int(key_end.max()) + 1 if len(key_end) else 0
        same_key = (key_end == first_key[samples]) & (
            (name[:, :width] == first_name[samples, :width]) | (_COLS[:width] >= key_end[:, None])
        ).all(axis=1)
        data = at + BLOCK
        after = data + ((size + BLOCK - 1) // BLOCK) * BLOCK
        ok &= (data + size <= ends[samples]) & same_key
        irregular[samples[~ok]] = True
        rounds.append(MemberColumns(samples, at, data, size, key_end, name_end, name))
        more = ok & (after < ends[samples])
        samples, at = samples[more], after[more]
    return Walk(rounds, irregular)

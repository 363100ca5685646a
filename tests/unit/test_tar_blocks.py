"""The vectorized header parse (``tar/blocks.py``) against a plain per-header reading: checksums
and where a member's name, key and extension lie."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.tar.blocks import byte_sums, parse_round

NAME_BYTES = st.sampled_from([0, ord("a"), ord("b"), ord("."), ord("/"), ord("_"), 0xFF])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=512, max_size=512), min_size=0, max_size=8), st.integers(0, 255))
def test_byte_sums_are_the_sums_of_the_rows(rows, fill):
    blocks = np.frombuffer(b"".join(rows), np.uint8).reshape(-1, 512)
    full = np.full((3, 512), fill, np.uint8)  # (the largest sums: every byte 255)
    for b in (blocks, full):
        assert byte_sums(b).tolist() == b.sum(axis=1, dtype=np.int64).tolist()


def _name_parts(name: bytes):
    """(name end, key end) as a sequential reader finds them: the name ends at its first NUL; the
    key ends at the first dot after the last slash (-1: none)."""
    end = name.find(b"\0") if b"\0" in name else 100
    text = name[:end]
    slash = text.rfind(b"/")
    dot = text.find(b".", slash + 1)
    return end, dot


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(NAME_BYTES, min_size=0, max_size=100), min_size=0, max_size=6), st.integers(0, 4095))
def test_names_keys_and_sizes_are_found_as_a_sequential_reader_finds_them(names, size):
    buf = np.zeros(512 * (len(names) + 1), np.uint8)
    for i, name in enumerate(names):
        header = bytearray(512)
        header[: len(name)] = bytes(name)
        header[124:136] = b"%011o\0" % size
        header[156] = ord("0")
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        buf[i * 512 : (i + 1) * 512] = np.frombuffer(bytes(header), np.uint8)
    ok, sizes, key_end, name_end, _ = parse_round(buf, np.arange(len(names), dtype=np.int64) * 512)
    for i, name in enumerate(names):
        end, dot = _name_parts(bytes(name).ljust(100, b"\0"))
        assert (int(name_end[i]), int(key_end[i]), int(sizes[i])) == (end, dot, size)
        text = bytes(name)[:end]
        base = text[text.rfind(b"/") + 1 :]
        assert bool(ok[i]) == (dot > text.rfind(b"/") + 1 and not base.startswith(b"__"))

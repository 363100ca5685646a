"""Built-in decoders: a member's bytes as the value a ``map`` receives, chosen by extension as
WebDataset does. Runs in the worker processes; imports no DALI.

========================  ==================================================================
extension                 value
========================  ==================================================================
``cls``, ``index``,       a Python ``int`` (the whole member: decimal text, see ``decode_int``;
``label``                 a ``ShardFormatError`` otherwise)
``json``                  the parsed object (``json.loads``)
``npy``                   an ``np.ndarray``, dtype and shape kept (``np.load``, ``allow_pickle=False``)
``txt``                   a ``str`` (UTF-8)
anything else             ``bytes`` (images stay encoded, for DALI's decoders)
========================  ==================================================================

Without ``map``, fields reach the pipeline as integers (the first row), ``.npy`` arrays, and bytes
(everything else, ``.json`` and ``.txt`` included). ``decoders={field: callable}`` replaces the
decoder of a field (``callable(bytes) -> value``); ``decoders={field: "bytes"}`` keeps its bytes.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any, Dict, Optional

import numpy as np

from dali_shards.fields import INT_EXTENSIONS, Decoder


INT_TEXT_BYTES = 64  # an integer member's most bytes: an int64 takes 20, the rest is room for whitespace
_INT_TEXT = re.compile(rb"[ \t\n\r\f\v]*([+-]?[0-9]+)[ \t\n\r\f\v]*")


def decode_int(data: bytes | memoryview | np.ndarray) -> int:
    """The whole of ``data`` as a decimal text integer that fits in 64 bits: ASCII digits, an
    optional sign, optional ASCII whitespace around them, at most ``INT_TEXT_BYTES`` bytes in all
    (``ValueError`` saying what is wrong otherwise; a long member is refused unread)."""
    if len(data) > INT_TEXT_BYTES:
        raise ValueError(f"{len(data)} bytes long, more than the {INT_TEXT_BYTES} an integer's text may take")
    match = _INT_TEXT.fullmatch(bytes(data))
    if match is None:
        raise ValueError("not a text integer (ASCII digits, an optional sign, whitespace around them)")
    value = int(match.group(1))
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{value} does not fit in 64 bits")
    return value


_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\n\r\f\v")] = True
_POWERS = 10 ** np.arange(19, dtype=np.int64)  # up to 18 digits add up without overflow; longer: decode_int


def decode_ints(buf: np.ndarray, at: np.ndarray, size: np.ndarray) -> tuple:
    """``decode_int`` of each of the texts ``buf[at : at + size]`` at once: their values (int64)
    and whether each is one (False where ``decode_int`` would raise)."""
    count = len(at)
    if not count:
        return np.zeros(0, np.int64), np.ones(0, bool)
    width = int(min(max(int(size.max()), 1), INT_TEXT_BYTES))
    cols = np.arange(width)
    inside = cols < size[:, None]
    text = np.where(inside, buf[np.minimum(at[:, None] + cols, len(buf) - 1)], ord(" "))  # trailing spaces are allowed
    blank = _WHITESPACE[text]
    first = np.argmax(~blank, axis=1)  # the text without the whitespace around it: [first, last]
    last = width - 1 - np.argmax(~blank[:, ::-1], axis=1)
    signed = (text[np.arange(count), first] == ord("+")) | (text[np.arange(count), first] == ord("-"))
    start = first + signed
    span = (cols >= start[:, None]) & (cols <= last[:, None])
    digit = (text >= ord("0")) & (text <= ord("9"))
    ok = (size <= INT_TEXT_BYTES) & (~blank).any(axis=1) & (start <= last) & (digit | ~span).all(axis=1)
    short = ok & (last - start < 18)
    power = _POWERS[np.clip(last[:, None] - cols, 0, 18)]
    values = np.where(span & short[:, None], (text.astype(np.int64) - ord("0")) * power, 0).sum(axis=1)
    values = np.where(text[np.arange(count), first] == ord("-"), -values, values)
    for i in np.flatnonzero(ok & ~short).tolist():  # 19 digits or more: in 64 bits or not
        try:
            values[i] = decode_int(buf[int(at[i]) : int(at[i]) + int(size[i])])
        except ValueError:
            ok[i] = False
    return values, ok


def decode_npy(data: bytes) -> np.ndarray:
    """An ``.npy`` member as its array (no pickled objects), in the machine's byte order."""
    return native(np.load(io.BytesIO(bytes(data)), allow_pickle=False))


def native(array: np.ndarray) -> np.ndarray:
    """``array`` with its values in the machine's byte order (DALI takes no other)."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def decode_json(data: bytes) -> Any:
    return json.loads(bytes(data))


def decode_txt(data: bytes) -> str:
    return bytes(data).decode("utf-8")


_WITH_MAP: Dict[str, Decoder] = {"json": decode_json, "npy": decode_npy, "txt": decode_txt}
_WITHOUT_MAP: Dict[str, Decoder] = {"npy": decode_npy}


def builtin_decoder(ext: str, mapped: bool) -> Optional[Decoder]:
    """The decoder of a member with extension ``ext`` (None: its bytes as they are), with a
    ``map`` (``mapped``) or without."""
    if ext in INT_EXTENSIONS:
        return decode_int
    return (_WITH_MAP if mapped else _WITHOUT_MAP).get(ext)

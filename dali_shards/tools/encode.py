"""Sample values as the bytes of tar members, as webdataset's ``ShardWriter`` encodes them, so that
the reader's decoders (by extension) give them back.

Bytes as they are and ``str`` as UTF-8, whatever the extension (a JSON text under ``.json`` stays
as it is); other values by the member's extension first: ``json``/``jsn`` -> JSON, ``npy`` ->
NumPy's ``.npy`` format, ``pyd``/``pickle`` -> pickle; then by their type: ``int`` (and NumPy
integers; ``bool`` as 1 or 0) and ``float`` -> their text, ``dict``/``list``/``tuple`` -> JSON,
``np.ndarray`` -> ``.npy``.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any, Union

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS

Value = Union[bytes, bytearray, memoryview, str, int, float, dict, list, tuple, np.ndarray, np.generic]
JSON_EXTENSIONS = ("json", "jsn")
NPY_EXTENSIONS = ("npy",)
PICKLE_EXTENSIONS = ("pyd", "pickle")


def encode(ext: str, value: Any, key: str = "?") -> bytes:
    """The bytes of member ``<key>.<ext>`` holding ``value``; a ConfigError naming the sample and
    the extension for a value with no encoding."""
    last = ext.rsplit(".", 1)[-1].lower()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):  # already encoded, whatever the extension (a JSON text under .json)
        return value.encode("utf-8")
    if last in PICKLE_EXTENSIONS:
        return pickle.dumps(value)
    if last in JSON_EXTENSIONS or isinstance(value, (dict, list, tuple)):
        return _json(value, key, ext)
    if isinstance(value, np.ndarray) and last in IMAGE_EXTENSIONS:
        raise ConfigError(
            f"sample {key!r}: a numpy array under .{ext} would be stored as .npy bytes, not as an image: encode "
            "the image yourself (e.g. PIL's Image.save or cv2.imencode) and pass the bytes, or store it as .npy"
        )
    if last in NPY_EXTENSIONS or isinstance(value, np.ndarray):
        return _npy(value)
    if isinstance(value, (bool, np.bool_)):
        return b"1" if value else b"0"
    if isinstance(value, (int, np.integer)):
        return str(int(value)).encode("ascii")
    if isinstance(value, (float, np.floating)):
        return repr(float(value)).encode("ascii")
    raise ConfigError(
        f"sample {key!r}: cannot store a {type(value).__name__} as .{ext}: give bytes, str, int, float, a dict or "
        "list (stored as JSON), a numpy array (stored as .npy), or encode it to bytes yourself"
    )


def _json(value: Any, key: str, ext: str) -> bytes:
    try:
        return json.dumps(value, default=_plain, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"sample {key!r}: .{ext} cannot be stored as JSON: {exc}") from None


def _plain(value: Any) -> Any:
    """NumPy values inside JSON, as the Python values they hold."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _npy(value: Any) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(value), allow_pickle=False)
    return out.getvalue()

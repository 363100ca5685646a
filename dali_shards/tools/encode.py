"""Sample values as the bytes of tar members, as webdataset's ``ShardWriter`` encodes them, so that
the reader's decoders (by extension) give them back; and the member names a sample's key and
fields make (``check_names``), refused unless readers read them back as written.

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
from typing import Any, Iterable, List, Union

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.tar.members import is_metadata, split_key
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
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"sample {key!r}: .{ext} is not valid UTF-8 text ({exc.reason} at character "
                              f"{exc.start}): fix the text, or give bytes") from None  # fmt: skip
    if last in PICKLE_EXTENSIONS:
        try:
            return pickle.dumps(value)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigError(f"sample {key!r}: .{ext} cannot be pickled: {exc}") from None
    if last in JSON_EXTENSIONS:
        return _json(value, key, ext)
    if last in NPY_EXTENSIONS:
        return _npy(value, key, ext)
    if isinstance(value, (dict, list, tuple)):
        return _json(value, key, ext)
    if isinstance(value, np.ndarray) and last in IMAGE_EXTENSIONS:
        raise ConfigError(
            f"sample {key!r}: a numpy array under .{ext} would be stored as .npy bytes, not as an image: encode "
            "the image yourself (e.g. PIL's Image.save or cv2.imencode) and pass the bytes, or store it as .npy"
        )
    if isinstance(value, np.ndarray):
        return _npy(value, key, ext)
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


def _npy(value: Any, key: str, ext: str) -> bytes:
    out = io.BytesIO()
    try:
        np.save(out, np.asarray(value), allow_pickle=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"sample {key!r}: .{ext} cannot be stored as .npy: {exc} (give an array of numbers, strings or "
            "records; store Python objects under .pyd / .pickle)"
        ) from None
    return out.getvalue()


def check_names(key: Any, fields: Iterable[str]) -> List[str]:
    """The member extensions of a sample's ``fields`` (leading dots dropped); a ConfigError naming
    the key or field unless each ``<key>.<ext>`` is read back (``split_key``) as that key and
    extension, the extensions distinct as readers compare them (lower-cased)."""
    if not isinstance(key, str) or split_key(f"{key}.x") != (key, "x"):
        raise ConfigError(f"each sample needs a '__key__' string without dots, got {key!r}")
    _check_text(key, f"sample {key!r}: the key")
    if is_metadata(f"{key}.x"):
        raise ConfigError(f"sample {key!r}: the key names WebDataset metadata (__name__/...), which readers skip")
    names: List[str] = []
    seen: dict = {}
    for field_ in fields:
        where = f"sample {key!r}: field {field_!r}"
        if not isinstance(field_, str):
            raise ConfigError(f"{where}: a field's name must be a str (its member's extension)")
        ext = field_.lstrip(".")
        _check_text(field_, where)
        if "/" in ext:
            raise ConfigError(f"{where} holds a '/': a member's extension cannot, readers would not find it")
        if not ext:
            raise ConfigError(f"{where} has no extension to name member {key!r}.<ext> by")
        if ext.lower() in seen:
            raise ConfigError(f"sample {key!r}: fields {seen[ext.lower()]!r} and {field_!r} both name member "
                              f"{key + '.' + ext.lower()!r} (readers lower-case extensions): keep one")  # fmt: skip
        seen[ext.lower()] = field_
        names.append(ext)
    return names


def _check_text(text: str, where: str) -> None:
    """A ConfigError unless ``text`` can be part of a tar member's name (UTF-8, no NUL)."""
    if "\0" in text:
        raise ConfigError(f"{where} holds a NUL character, which ends a tar member's name")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{where} is not valid UTF-8 ({exc.reason} at character {exc.start})") from None

"""The fsspec filesystem of a remote URL (one per process, protocol and options), and which URLs
are remote. Imports nothing of the package above the options."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Tuple

from dali_shards.errors import ShardAccessError
from dali_shards.options import StorageOptions

DEFAULT_STORAGE = StorageOptions()


def is_remote(url: str) -> bool:
    """True for URLs that fsspec must open (anything with a scheme but ``file://``)."""
    return "://" in url and not url.startswith("file://")


_filesystems: Dict[Tuple[int, str, str], Tuple[Any, str]] = {}
_fs_lock = threading.Lock()


def filesystem(url: str, config: StorageOptions = DEFAULT_STORAGE) -> Tuple[Any, str]:
    """The fsspec filesystem for ``url`` (one per process, protocol and options) and the path in it."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is a dependency
        raise ShardAccessError(url, "remote URLs need fsspec", hint="pip install fsspec") from None
    protocol = url.split("://", 1)[0]
    opts = config.options_for(protocol)
    key = (os.getpid(), protocol, repr(sorted(opts.items())))
    with _fs_lock:
        cached = _filesystems.get(key)
    if cached is None:
        try:
            fs, _ = fsspec.core.url_to_fs(url, **opts)
        except ImportError as exc:
            extra = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}
            pkg = extra.get(protocol, "the fsspec implementation")
            raise ShardAccessError(
                url, f"no filesystem for {protocol}:// ({exc})", hint=f"pip install {pkg} (or dali-shards[remote])"
            ) from None
        except ValueError as exc:
            raise ShardAccessError(url, f"unsupported URL: {exc}", hint="check the URL scheme") from None
        if protocol in ("s3", "s3a") and hasattr(fs, "retries"):
            fs.retries = 1  # s3fs's own retry loop: ours (with backoff and timeouts) replaces it
        with _fs_lock:
            cached = _filesystems.setdefault(key, (fs, protocol))
    fs = cached[0]
    return fs, (url if protocol in ("http", "https") else fs._strip_protocol(url))

"""Which HTTP servers ignore ``Range``: they answer a ranged GET with 200 and the whole object (as
``python -m http.server`` does), so every ranged read downloads the object from its first byte.

A process remembers each such server (``scheme://host:port``) from the first answer that shows it
(:func:`note_ignores_range`), names it once in a warning, and from then on reads its shards whole,
one streamed GET each (see ``io.remote``). :func:`probe_ignores_range` asks a server once before
reading (one GET of 1 byte, closed after the headers) so that the plan can avoid ranged reads of
its shards altogether; worker processes forked after it inherit what it learned.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Dict, Optional
from urllib.parse import urlparse

from dali_shards.io.filesystems import filesystem

if TYPE_CHECKING:
    from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")

_ignoring: Dict[str, bool] = {}  # server -> warned about in this process
_lock = threading.Lock()


def server_of(url: str) -> str:
    """``scheme://host:port`` of an HTTP(S) URL (the port filled in for the default ones)."""
    parts = urlparse(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return f"{parts.scheme}://{parts.hostname}:{port}"


def ignores_range(url: str) -> bool:
    """Whether the server of ``url`` is known, in this process, to ignore ``Range``."""
    return server_of(url) in _ignoring


def note_ignores_range(url: str, consequence: str = "") -> None:
    """The server of ``url`` answered a ranged GET with 200 and the whole object: remember it, and
    warn once per server and process (``consequence``: what else that changes, said in the warning)."""
    server = server_of(url)
    with _lock:
        warned = _ignoring.get(server, False)
        _ignoring[server] = True
    if warned:
        return
    log.warning(
        "dali_shards: the server %s ignores HTTP Range requests (it answered a ranged GET of %s with 200 and the "
        "whole object): every ranged read of one of its shards downloads the shard from its first byte, so its "
        "shards are read whole from now on, one GET each%s. Serve the shards from a server that answers ranges "
        "(206 with Content-Range: nginx, S3, GCS...) to read pieces of them.",
        server, url, f"; {consequence}" if consequence else "",
    )  # fmt: skip


def forget() -> None:
    """Forget every server (tests: a port may be reused by another server)."""
    with _lock:
        _ignoring.clear()


async def _probe(fs, url: str, timeout: float, size: Optional[int]) -> bool:
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers.update({"Range": "bytes=0-0", "Accept-Encoding": "identity"})
    r = await asyncio.wait_for(session.get(fs.encode_url(url), headers=headers, **kw), timeout)
    try:
        length = r.headers.get("Content-Length")
        only_the_byte = length is not None and length.isdigit() and int(length) == 1 and size != 1
        return r.status == 200 and not only_the_byte  # 200 with 1 byte: a broken server, the reads say so
    finally:
        r.close()  # the body is not wanted: drop the connection rather than read it


def probe_ignores_range(url: str, config: "StorageOptions", size: Optional[int] = None) -> bool:
    """Whether the server of ``url`` ignores ``Range``, asked with one GET of byte 0 of ``url``
    (an object of ``size`` bytes, if known) within ``config.request_timeout``; remembered (see
    :func:`note_ignores_range`, without its warning: the caller says it). No request for a server
    already known to ignore it; False when the server cannot be asked (the reads then report what
    is wrong)."""
    if ignores_range(url):
        return True
    from fsspec.asyn import sync

    try:
        fs, path = filesystem(url, config)
        ignoring = sync(fs.loop, _probe, fs, path, config.request_timeout, size, timeout=config.request_timeout + 1)
    except Exception as exc:  # noqa: BLE001 - a failed probe must not fail the start
        log.debug("dali_shards: could not ask %s whether it answers ranges (%s)", server_of(url), exc)
        return False
    if ignoring:
        with _lock:
            _ignoring.setdefault(server_of(url), False)
    return ignoring

"""One request to an fsspec filesystem: bounded in time (:func:`timed`), and what its failure
means (retry or not, the server unreachable, the shard not the size its manifest says); a range
asked of a store without streaming reads in pieces that complete in time (:func:`read_pieces`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional
from urllib.parse import urlparse

from dali_shards.errors import ShardAccessError, ShardFormatError

log = logging.getLogger("dali_shards")


class Cancelled(Exception):
    """The caller no longer needs the bytes being fetched."""


_NOT_RETRIED = (400, 401, 403, 404, 405, 410, 416)
MIN_PIECE = 64 << 10
_pieces: Dict[int, int] = {}  # per filesystem: the request size that completes within the timeout


def http_status(exc: Optional[BaseException]) -> Optional[int]:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def answer_status(exc: BaseException) -> Optional[int]:
    """The HTTP status of the server's answer behind ``exc`` (its own ``status``/``code``, or a
    botocore ``ClientError``'s that an fsspec backend wrapped, as s3fs does in an ``OSError``);
    None if there was none."""
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int):
        return status
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        status = ((getattr(e, "response", None) or {}).get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
        e = e.__cause__
    return None


def permanent(exc: BaseException) -> bool:
    """Errors that retrying cannot fix."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return True
    return answer_status(exc) in _NOT_RETRIED


def _host_port(url: str) -> str:
    parts = urlparse(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return f"{parts.hostname}:{port}" if port else str(parts.hostname)


def unreachable(exc: BaseException, url: str) -> Optional[str]:
    """``host:port`` of the server if ``exc`` says it could not be reached (connection refused,
    unknown host, no connection within the time allowed); None otherwise."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = type(e).__name__
        if name.startswith("ClientConnector") and "SSL" not in name and "Certificate" not in name:
            return f"{getattr(e, 'host', '?')}:{getattr(e, 'port', '?')}"  # aiohttp
        endpoint = (getattr(e, "kwargs", None) or {}).get("endpoint_url") if hasattr(e, "kwargs") else None
        if name in ("EndpointConnectionError", "ConnectTimeoutError") and endpoint:  # botocore
            return _host_port(endpoint)
        if isinstance(e, (ConnectionRefusedError, socket.gaierror)) and url.startswith(("http://", "https://")):
            return _host_port(url)
        e = e.__cause__ or e.__context__
    return None


def _endpoint(fs: Any, url: str) -> Optional[str]:
    """The URL of the server behind ``url`` when it can be told (HTTP; s3fs's endpoint)."""
    if url.startswith(("http://", "https://")):
        return url
    meta = getattr(getattr(fs, "_s3", None), "meta", None)  # s3fs once connected (environment included)
    for candidate in (
        getattr(meta, "endpoint_url", None),
        getattr(fs, "endpoint_url", None),
        (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url"),
    ):
        if isinstance(candidate, str) and "://" in candidate:
            return candidate
    return None


def probe(fs: Any, url: str, exc: BaseException) -> Optional[str]:
    """``host:port`` of the server behind ``url`` if a request failed without an answer
    (``exc``) and a plain connection to the server fails too; None otherwise."""
    endpoint = _endpoint(fs, url) if http_status(exc) is None else None
    if endpoint is None:
        return None
    server = _host_port(endpoint)
    host, _, port = server.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError):
        return server
    return None


def access_error(
    url: str, what: str, exc: BaseException, attempts: int, fs: Any = None
) -> ShardAccessError:
    """The error after the last failed attempt of ``what``."""
    server = unreachable(exc, url) or probe(fs, url, exc)
    if server is not None:
        return ShardAccessError(
            url,
            f"{what} failed after {attempts} attempts: the server {server} could not be reached "
            f"({type(exc).__name__}: {exc})",
            hint="check that the server is up and reachable at that address (the URL, endpoint_url=); "
            "raise retries=/request_timeout= for a flaky link",
        )
    return ShardAccessError(
        url,
        f"{what} failed after {attempts} attempts: {type(exc).__name__}: {exc}",
        hint="check that the server is up and reachable; raise retries=/request_timeout= for a flaky link",
    )


def stale_error(url: str, actual: int, expected: int) -> ShardFormatError:
    """The shard's size differs from the one its manifest recorded."""
    return ShardFormatError(
        url,
        f"the server has {actual} bytes of it, but its manifest says {expected}: the shard changed after it "
        "was indexed, so its sample count cannot be trusted",
        hint="run `dali-shards index` on the shards again (it rewrites the manifest)",
    )


def call_with_timeout(func: Callable[[], Any], timeout: float) -> Any:
    """``func()`` in a helper thread; ``TimeoutError`` if it takes longer than ``timeout``."""
    box: list = []

    def run() -> None:
        try:
            box.append((True, func()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.append((False, exc))

    t = threading.Thread(target=run, daemon=True, name="dali_shards-request")
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"no answer within {timeout:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def timed(fs: Any, method: str, timeout: float, *args: Any, **kwargs: Any) -> Any:
    """``fs.<method>(...)`` failing with ``TimeoutError`` after ``timeout`` s: an async filesystem's
    coroutine runs on its loop and is cancelled then; other filesystems' calls run in a thread."""
    coro = getattr(fs, "_" + method, None) if getattr(fs, "async_impl", False) else None
    if coro is None:
        return call_with_timeout(lambda: getattr(fs, method)(*args, **kwargs), timeout)
    from fsspec.asyn import sync

    try:
        return sync(fs.loop, coro, *args, timeout=timeout, **kwargs)
    except (TimeoutError, asyncio.TimeoutError):  # fsspec's FSTimeoutError (one class since Python 3.11)
        raise TimeoutError(f"no answer within {timeout:g} s") from None


def read_pieces(
    fs: Any, path: str, pos: int, stop: int, sink: Any, config: Any, url: str, cancelled: Callable[[], bool]
) -> Optional[bytes]:
    """Bytes ``[pos, stop)`` of ``path`` from a store with no streaming range read (``cat_file``,
    each within ``config.request_timeout``), added to ``sink`` (``sink.add(data)``) piece by piece,
    fewer where an answer is short; returned instead where ``sink`` is empty (``sink.filled``) and
    one answer holds them all. A piece that times out is asked again as half (down to
    ``MIN_PIECE``, the size remembered per filesystem; the ``TimeoutError`` goes to the caller, a
    failed attempt), and the size doubles again, up to ``chunk_size``, after pieces done within a
    quarter of the timeout. ``Cancelled`` when ``cancelled()`` says so."""
    chunk_size, timeout = config.chunk_size, config.request_timeout
    while pos < stop:
        if cancelled():
            raise Cancelled()
        piece = _pieces.get(id(fs), chunk_size)
        hi = min(stop, pos + piece)
        began = time.monotonic()
        try:
            data = timed(fs, "cat_file", timeout, path, start=pos, end=hi)
        except TimeoutError:
            if hi - pos > MIN_PIECE:
                _pieces[id(fs)] = max(MIN_PIECE, (hi - pos) // 2)
                log.warning("dali_shards: %s: asking for %d bytes at a time", url, _pieces[id(fs)])
            raise
        if time.monotonic() - began < timeout / 4 and hi - pos == piece < chunk_size:
            _pieces[id(fs)] = min(chunk_size, piece * 2)
        if len(data) > hi - pos:
            raise OSError(f"asked for {hi - pos} bytes at {pos}, got {len(data)}")
        if not sink.filled and hi == stop and len(data) == stop - pos:
            return data
        sink.add(data)
        if len(data) < hi - pos:
            return None
        pos = hi
    return None

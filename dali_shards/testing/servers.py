"""Local servers for tests and benchmarks of remote reading: an HTTP file server with range
requests and fault injection, a TCP proxy that delays or cuts connections, and moto's S3 server
(``moto`` imported only by :func:`start_s3_server`; nothing here is used by the loader itself)."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Sequence

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass
class Faults:
    """What an :class:`HTTPShardServer` does wrong: the next ``fail`` GETs answer ``status``;
    the next ``cut`` GETs send ``cut_after`` bytes of their body and drop the connection;
    ``stall`` GETs never answer; the next ``stall_body`` GETs send ``stall_after`` bytes of their
    body, then nothing more (the connection stays open); the next ``short`` GETs send
    ``short_after`` bytes of their body without a ``Content-Length`` and close the connection, so
    that the cut body looks complete. ``rate`` (bytes/s, 0: full speed) trickles every body.
    ``sizeless`` answers every GET with the whole file and no size (no ``Content-Length``, no
    ``Content-Range``, ``Range`` ignored, the end marked by closing the connection) and HEAD without
    a size. ``ignore_range`` answers every GET with the whole file (200, its ``Content-Length``),
    as ``python -m http.server`` does; ``range_200`` answers a ranged GET with 200 and only the
    range's bytes (and their ``Content-Length``), breaking the Range protocol. ``requests`` logs
    (path, Range header) of every GET."""

    fail: int = 0
    status: int = 503
    cut: int = 0
    cut_after: int = 1000
    stall: int = 0
    stall_body: int = 0
    stall_after: int = 1000
    short: int = 0
    short_after: int = 1000
    rate: float = 0.0
    sizeless: bool = False
    ignore_range: bool = False
    range_200: bool = False
    requests: List[tuple] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def take(self, what: str) -> bool:
        with self.lock:
            left = getattr(self, what)
            if left > 0:
                setattr(self, what, left - 1)
                return True
            return False


class _Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        faults: Faults = self.server.faults  # type: ignore[attr-defined]
        with faults.lock:
            faults.requests.append((self.path, self.headers.get("Range")))
        if faults.take("stall"):
            faults.stopped.wait(3600)
            return
        if faults.take("fail"):
            self.send_response(faults.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        if faults.sizeless:
            self._send_sizeless(path, faults)
            return
        size = os.path.getsize(path)
        start, end = 0, size - 1
        m = None if faults.ignore_range else _RANGE.match(self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        length = end - start + 1
        short = faults.take("short")
        ranged = m is not None and not faults.range_200  # answered as a range: 206 and Content-Range
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Accept-Ranges", "bytes")
        if short:
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(length))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(length)
        self._send_faulty_body(body, faults, short)

    def _send_faulty_body(self, body: bytes, faults: Faults, short: bool) -> None:
        """The body, cut short, cut off, stalled or whole as the faults say."""
        if short:
            self._send_body(body[: faults.short_after], faults)
            self.close_connection = True
            return
        if faults.take("cut"):
            self.wfile.write(body[: faults.cut_after])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if faults.take("stall_body"):
            self._send_body(body[: faults.stall_after], faults)
            faults.stopped.wait(3600)
            self.close_connection = True
            return
        self._send_body(body, faults)

    def _send_sizeless(self, path: str, faults: Faults) -> None:
        """The whole file, its end marked by closing the connection, with no size anywhere."""
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        with open(path, "rb") as f:
            self._send_body(f.read(), faults)
        self.close_connection = True

    def _send_body(self, body: bytes, faults: Faults) -> None:
        """Send ``body``, at ``faults.rate`` bytes per second if set."""
        if not faults.rate:
            self.wfile.write(body)
            self.wfile.flush()
            return
        piece = max(1024, int(faults.rate / 20))
        for i in range(0, len(body), piece):
            if faults.stopped.is_set():
                return
            self.wfile.write(body[i : i + piece])
            self.wfile.flush()
            time.sleep(len(body[i : i + piece]) / faults.rate)

    def do_HEAD(self) -> None:  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        self.send_response(200)
        if not self.server.faults.sizeless:  # type: ignore[attr-defined]
            self.send_header("Content-Length", str(os.path.getsize(path)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()


class HTTPShardServer:
    """Serves ``directory`` at ``http://127.0.0.1:<port>/`` (GET with Range, HEAD) in a thread."""

    def __init__(self, directory: str):
        handler = lambda *a, **k: _Handler(*a, directory=directory, **k)  # noqa: E731
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.faults = Faults()  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def faults(self) -> Faults:
        return self.httpd.faults  # type: ignore[attr-defined]

    def stop(self) -> None:
        self.faults.stopped.set()  # stalled handlers return
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "HTTPShardServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class DelayProxy:
    """A TCP proxy to ``upstream`` (host, port) adding ``delay`` seconds before each chunk the
    client sends (about one request), on its own port; ``down`` refuses new and drops open
    connections."""

    def __init__(self, upstream: tuple, delay: float = 0.0):
        self.upstream = upstream
        self.delay = delay
        self.down = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.down:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delayed: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data or self.down:
                    break
                if delayed and self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def set_down(self) -> None:
        self.down = True
        with self._lock:
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.set_down()
        self.sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's standalone S3 server on localhost (``pip install "moto[server]"``), with
    ``endpoint_url``, test credentials, and ``storage_options`` for dali_shards."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.credentials = {"key": "testing", "secret": "testing"}

    def storage_options(self, endpoint_url: Optional[str] = None) -> Dict[str, object]:
        return {
            **self.credentials,
            "endpoint_url": endpoint_url or self.endpoint_url,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def upload(self, bucket: str, paths: Sequence[str], prefix: str = "") -> List[str]:
        """Create ``bucket`` and put the files there; their ``s3://`` URLs."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        urls = []
        for p in paths:
            key = prefix + os.path.basename(p)
            client.upload_file(p, bucket, key)
            urls.append(f"s3://{bucket}/{key}")
        return urls

    def stop(self) -> None:
        self.server.stop()


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m dali_shards.testing.servers s3 | http DIR | proxy HOST:PORT [--delay S]``: run a
    server until killed, printing its port on the first line (for benchmarks that keep servers out
    of the measured process)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("what", choices=("s3", "http", "proxy"))
    ap.add_argument("upstream", nargs="?", help="HOST:PORT (proxy) or the directory to serve (http)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds added to each request (proxy)")
    args = ap.parse_args(argv)
    if args.what == "s3":
        server = S3Server()
        print(server.port, flush=True)
    elif args.what == "http":
        http = HTTPShardServer(args.upstream)
        print(http.port, flush=True)
    else:
        host, port = args.upstream.rsplit(":", 1)
        proxy = DelayProxy((host, int(port)), delay=args.delay)
        print(proxy.port, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

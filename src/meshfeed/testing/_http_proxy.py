"""An HTTP proxy in front of a store that counts its requests by kind, for tests and benchmarks.

``CountingProxy`` listens on 127.0.0.1 and forwards each HTTP request to a store (the
``S3Server``, say), one upstream connection per client connection, and counts what it
forwarded: ``HEAD``, ``GET`` with a ``Range`` (``range``), ``GET`` of a whole object
(``get``), ``GET`` of a bucket's listing (``list``), ``PUT``, ``POST`` and ``DELETE``.
Point a reader's ``endpoint_url`` at ``proxy.endpoint`` and every request it makes is
seen -- the ones a reader's own counters miss too (a HEAD behind ``fs.size``, a LIST
behind a glob) -- so a host's start-up can be counted, and a pod's is that count times
the number of hosts.

``hold`` delays a share of the requests of one kind (each chosen at random, with a seed)
by some seconds before forwarding them: a store's slow tail (a hedged read's duplicate
is a request like any other: held or not by the same draw), or, with a share of 1, an
outage that answers nothing in time.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import random
import sys
import threading
import time
import urllib.parse
from typing import Any

from meshfeed.cluster._launch import free_port

KINDS = ("head", "range", "get", "list", "put", "post", "delete")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


def request_kind(method: str, path: str, headers: Any) -> str:
    """The kind a request is counted as (one of ``KINDS``)."""
    method = method.upper()
    if method == "GET":
        if headers.get("Range"):
            return "range"
        parts = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(parts.query)
        bucket_only = parts.path.strip("/").count("/") == 0
        return "list" if bucket_only or "list-type" in query or "prefix" in query else "get"
    return method.lower()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet when a client hung up first (a hedged read's loser, cancelled)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CountingProxy:
    """An HTTP proxy on 127.0.0.1 to ``target_port`` that counts requests by kind."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self.paths: list[tuple[str, str]] = []  # (kind, path) of each request, in order
        self._holds: dict[str, tuple[float, float, random.Random]] = {}
        self.held = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _forward(self) -> None:
                proxy._forward(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def counts(self) -> dict[str, int]:
        """Requests forwarded so far, by kind, and their ``total``."""
        with self._lock:
            out = {kind: self._counts[kind] for kind in KINDS}
        out["total"] = sum(out.values())
        return out

    def reset(self) -> None:
        """Counts from zero again."""
        with self._lock:
            self._counts.clear()
            self.paths = []
            self.held = 0

    def hold(self, kind: str, share: float, seconds: float, *, seed: int = 0) -> None:
        """Delays ``share`` of the requests of ``kind`` by ``seconds`` (0 stops it)."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not one of {KINDS}.")
        with self._lock:
            if share <= 0:
                self._holds.pop(kind, None)
            else:
                self._holds[kind] = (share, seconds, random.Random(seed))

    def _forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        kind = request_kind(handler.command, handler.path, handler.headers)
        delay = 0.0
        with self._lock:
            self._counts[kind] += 1
            self.paths.append((kind, urllib.parse.urlsplit(handler.path).path))
            if kind in self._holds:
                share, seconds, rng = self._holds[kind]
                if rng.random() < share:
                    delay, self.held = seconds, self.held + 1
        if delay:
            time.sleep(delay)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        upstream = http.client.HTTPConnection("127.0.0.1", self.target, timeout=60)
        try:
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            handler.send_response_only(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP and key.lower() != "content-length":
                    handler.send_header(key, value)
            length = (
                str(len(data))
                if handler.command != "HEAD"
                else response.getheader("Content-Length")
            )
            if length is not None:  # a HEAD's is the object's size
                handler.send_header("Content-Length", length)
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(data)
        finally:
            upstream.close()

    def close(self) -> None:
        """Stops the proxy."""
        self._server.shutdown()
        self._server.server_close()

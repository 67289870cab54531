"""An S3-compatible server on 127.0.0.1, for tests and benchmarks: moto's server mode.

``S3Server`` starts moto's server as a process on a free port, waits until it answers,
and stops it on ``close``; ``storage_options`` is what s3fs needs to reach it (and
nothing else). ``Proxy`` forwards a port to it and can be stopped and started: a store
that goes away and comes back. Needs ``moto[server]`` (the ``dev`` extra).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from meshfeed.cluster._launch import free_port


class S3Server:
    """A moto S3 server on 127.0.0.1, started at once."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(self.endpoint, timeout=1).close()
                break
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"moto_server did not start on {self.endpoint}")
            time.sleep(0.1)

    @property
    def storage_options(self) -> dict[str, Any]:
        """What ``storage_options=`` needs to reach this server (endpoint and keys)."""
        return {
            "endpoint_url": self.endpoint,
            "key": "test",
            "secret": "test",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def make_bucket(self, name: str) -> None:
        """Creates the bucket ``name`` on the server."""
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)

    def close(self) -> None:
        """Stops the server."""
        self._process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


class Proxy:
    """A TCP forwarder on 127.0.0.1 to ``port``, that can be stopped and started again on
    its own port: a store that goes away and comes back, with its data kept."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.start()

    def start(self) -> None:
        """Starts forwarding again (after ``stop``): the store is back."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._sockets = [listener]
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # stopped
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the server behind went away: so does this connection
                client.close()
                continue
            with self._lock:
                live = listener in self._sockets
                if live:
                    self._sockets += [client, upstream]
            if not live:  # stopped between the accept and here: close what it let in
                client.close()
                upstream.close()
                return
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        for s in (source, target):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Closes the port and every connection through it."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

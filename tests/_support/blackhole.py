"""A TCP proxy on 127.0.0.1 that relays to a real server until told to hang.

Once hanging, it still *accepts* connections (so a client's connect succeeds) but never
sends a byte back, on new and existing connections alike: the failure mode of a tracking
host whose process is stuck or whose disk is full, which a refused connection does not show.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from _support.raycluster import free_port


class BlackholeProxy:
    def __init__(self, target_port: int, *, hang_after_requests: int | None = None) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.hang_after_requests = hang_after_requests
        self.requests = 0
        self.hanging = threading.Event()
        self.hung_at: float | None = None
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hang(self) -> None:
        if not self.hanging.is_set():
            self.hung_at = time.time()
            self.hanging.set()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(client)
            if self.hanging.is_set():
                continue  # accepted, never answered
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                continue
            self._held.append(upstream)
            threading.Thread(target=self._relay, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, client, False), daemon=True).start()

    def _relay(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        src.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            if from_client:
                self.requests += data.count(b" HTTP/1.1\r\n")
                if self.hang_after_requests is not None and self.requests > self.hang_after_requests:
                    self.hang()
            if self.hanging.is_set():
                continue  # swallow: the peer waits forever
            try:
                dst.sendall(data)
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        for sock in [self._server, *self._held]:
            with contextlib.suppress(OSError):
                sock.close()

"""A TCP proxy on 127.0.0.1 that delays every byte by a fixed one-way latency, in both directions:
SSH through it behaves like SSH to a login node `2 * delay_s` round trip away (bandwidth is not
limited). For measurements only; ordering is kept (one queue per direction)."""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Optional


class LatencyProxy:
    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for a, b in ((client, upstream), (upstream, client)):
                q: "queue.Queue[Optional[tuple[float, bytes]]]" = queue.Queue()
                threading.Thread(target=self._read, args=(a, q), daemon=True).start()
                threading.Thread(target=self._write, args=(b, q), daemon=True).start()

    def _read(self, sock: socket.socket, q: "queue.Queue[Optional[tuple[float, bytes]]]") -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                q.put((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        q.put(None)

    @staticmethod
    def _write(sock: socket.socket, q: "queue.Queue[Optional[tuple[float, bytes]]]") -> None:
        try:
            while True:
                item = q.get()
                if item is None:
                    break
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

"""A collector that is blackholed: connections are accepted and never answered."""

from __future__ import annotations

import socket
import threading


class Blackhole:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:  # closed
                return
            self._held.append(connection)

    def close(self) -> None:
        self._server.close()
        for connection in self._held:
            connection.close()

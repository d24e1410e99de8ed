"""A TCP relay on 127.0.0.1 for tests: it forwards every connection to a port of this machine until stopped; then
it closes its listening socket and every connection it relays, so what stands behind it seems gone to whoever
used the relay's address (a cluster's head that stops answering), while the server itself runs on."""

from __future__ import annotations

import socket
import threading

CHUNK = 2**16


class Relay:
    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stopped = False

    def start(self) -> Relay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for sock in [self.listener, *self.open]:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            with self.lock:
                if self.stopped:
                    client.close()
                    server.close()
                    return
                self.open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            return

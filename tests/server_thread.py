"""A real uvicorn server on a free loopback port, in a thread, for the HTTP tests and benchmark (a helper, no tests)."""

import socket
import threading

import uvicorn

from scheduler.service.http import uvicorn_config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    def __init__(self, service, port: int | None = None):
        self.service = service
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(service, host="127.0.0.1", port=self.port, log_level="error", backlog=2048,
                                timeout_keep_alive=60)  # the service's own protocol and group commit, as `serve`
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        from waiting import wait_until

        wait_until(lambda: self.server.started, "the server to start", every=0.02)  # not 10 s, then on regardless
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

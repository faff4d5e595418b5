"""The lifecycle every loopback server shares: a stdlib `ThreadingHTTPServer` on 127.0.0.1 (a free port), served
from a daemon thread, used as a context manager. Request handlers reach the server object as `self.server.app`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LoopbackHTTPServer:
    """Base of the loopback servers: subclasses pass their request handler class and keep their state on `self`.

    Example:
        >>> from http.server import BaseHTTPRequestHandler
        >>> with LoopbackHTTPServer(BaseHTTPRequestHandler) as server:
        ...     server.url.startswith("http://127.0.0.1:")
        True
    """

    def __init__(self, handler_class: type[BaseHTTPRequestHandler]):
        self.handler_class = handler_class
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError(f"The server is not running: use `with {type(self).__name__}(...) as server:`")
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self.handler_class)
        self._http.daemon_threads = True
        self._http.app = self
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._thread.join()
            self._http = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""What every loopback server shares: a stdlib `ThreadingHTTPServer` on 127.0.0.1 (a free port), served from a
daemon thread and used as a context manager, and one request handler that reads the body, asks the server's `handle`
for the answer and writes it. A server subclasses `LoopbackHTTPServer`, implements `handle`, and raises
`RequestError` for error answers (`error_answer` gives them the server's error format)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

Answer = tuple[int, dict[str, str], Any]
"""(HTTP status, extra headers, body): JSON-able (sent as JSON), bytes (sent as they are) or None (empty)."""


class RequestError(Exception):
    """An error answer: HTTP status and message, and what the server's error format may use: `code` (the Hub's
    `X-Error-Code`, vLLM's error type), extra headers and extra keys of the JSON body."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None,
                 body: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.body = headers or {}, body or {}


class _Server(ThreadingHTTPServer):
    # Real servers queue hundreds of pending connections (uvicorn: 2048); the standard library's 5 would reset the
    # connections of a client that opens many at once (one request per episode).
    request_queue_size = 1024


class LoopbackHTTPServer:
    """Base of the loopback servers: subclasses implement `handle` and keep their state on `self`.

    Example:
        >>> import json, urllib.error, urllib.request
        >>> class Echo(LoopbackHTTPServer):
        ...     def handle(self, method, target, headers, body):
        ...         if target == "/missing":
        ...             raise RequestError(404, "nothing here", headers={"X-Reason": "demo"})
        ...         return 200, {}, {"method": method, "path": target, "body": body.decode(), "bug": 1 / len(body)}
        >>> def error_of(url):
        ...     try:
        ...         urllib.request.urlopen(url)
        ...     except urllib.error.HTTPError as err:
        ...         return err.code, err.headers.get("X-Reason"), json.load(err)
        >>> with Echo() as server:
        ...     echoed = json.load(urllib.request.urlopen(urllib.request.Request(f"{server.url}/echo", data=b"hi")))
        ...     errors = error_of(f"{server.url}/missing"), error_of(f"{server.url}/empty")
        >>> echoed
        {'method': 'POST', 'path': '/echo', 'body': 'hi', 'bug': 0.5}
        >>> errors[0]  # a RequestError, in the server's error format
        (404, 'demo', {'error': 'nothing here'})
        >>> errors[1]  # a bug in the server: 500 with the exception, not a dropped connection
        (500, None, {'error': 'Echo: ZeroDivisionError: division by zero'})
    """

    def __init__(self):
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError(f"The server is not running: use `with {type(self).__name__}(...) as server:`")
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._http = _Server(("127.0.0.1", 0), _Handler)
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

    def handle(self, method: str, target: str, headers, body: bytes) -> Answer:
        """Answer one request (called from the server's threads): `target` is the path with its query, `headers`
        the request's (`email.message.Message`), `body` its raw bytes. Raise `RequestError` for an error answer."""
        raise NotImplementedError(f"{type(self).__name__} must implement handle()")

    def error_answer(self, error: RequestError) -> Answer:
        """The answer to a `RequestError`: by default `{"error": message, **error.body}` with `error.headers`."""
        return error.status, dict(error.headers), {"error": error.message, **error.body}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real services; every answer has a Content-Length

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()  # the blank line after the last chunk
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self, method: str) -> None:
        app: LoopbackHTTPServer = self.server.app
        body = self._read_body()
        try:
            status, headers, answer = app.handle(method, self.path, self.headers, body)
        except RequestError as err:
            status, headers, answer = app.error_answer(err)
        except Exception as err:  # a bug in the server: say so instead of dropping the connection
            status, headers, answer = 500, {}, {"error": f"{type(app).__name__}: {type(err).__name__}: {err}"}
        if isinstance(answer, bytes):
            raw = answer
        else:
            raw = b"" if answer is None else json.dumps(answer).encode()
            headers = {"Content-Type": "application/json", **headers}
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(raw)

    def do_GET(self) -> None:  # http.server's naming
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

"""A local HTTP server that serves files the way the Hugging Face hub's resolve endpoint does (HEAD with
X-Repo-Commit, ETag and size; GET with Range), so the real download code runs up to the network boundary."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, files: dict[str, bytes]):
        """files: '<org>/<repo>/<filename>' -> bytes."""
        self.files = files
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _lookup(self):
                hub.requests.append(f"{self.command} {self.path}")
                parts = self.path.split("?")[0].strip("/").split("/")
                # <org>/<repo>/resolve/<revision>/<file...>
                if len(parts) < 5 or parts[2] != "resolve":
                    return None
                return hub.files.get("/".join(parts[:2] + parts[4:]))

            def _headers(self, data: bytes, status: int = 200, extra: dict | None = None):
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Accept-Ranges", "bytes")
                for k, v in (extra or {}).items():
                    self.send_header(k, v)

            def _not_found(self):
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):
                data = self._lookup()
                if data is None:
                    self._not_found()
                    return
                self._headers(data, extra={"Content-Length": str(len(data))})
                self.end_headers()

            def do_GET(self):
                data = self._lookup()
                if data is None:
                    self._not_found()
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                body = data[start:]
                status = 206 if start else 200
                extra = {"Content-Length": str(len(body))}
                if start:
                    extra["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                self._headers(data, status, extra)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

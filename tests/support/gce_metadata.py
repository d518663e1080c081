"""A local HTTP server that answers as a GCE VM's metadata server does for the notice keys
(https://cloud.google.com/compute/docs/metadata/querying-metadata and
.../metadata/predefined-metadata-keys): ``GET /computeMetadata/v1/instance/preempted`` (``FALSE`` /
``TRUE``) and ``instance/maintenance-event`` (``NONE``, ``TERMINATE_ON_HOST_MAINTENANCE``,
``MIGRATE_ON_HOST_MAINTENANCE``).

Its rules are the real server's: a request without ``Metadata-Flavor: Google`` is answered 403;
every answer carries ``Metadata-Flavor: Google`` and the value's ``ETag``; ``?wait_for_change=true``
holds the request until the value's ETag differs from ``last_etag`` (at once when it already does;
with no ``last_etag``, until the next change), at most ``timeout_sec`` seconds. ``impostor=True``
answers without the ``Metadata-Flavor`` header, as a server that is not the metadata server would.
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"


class MetadataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0, *, impostor: bool = False) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.impostor = impostor
        self.values = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}
        self._versions = dict.fromkeys(self.values, 0)
        self.changed = threading.Condition()
        self.closing = False
        self.answered = 0  # 200s
        self.refused = 0  # 403s
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        """What ``GCE_METADATA_HOST`` holds: ``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.server_address[1]}"

    def etag(self, key: str) -> str:
        return hashlib.sha1(f"{key}:{self._versions[key]}".encode()).hexdigest()[:16]

    def set(self, key: str, value: str) -> None:
        with self.changed:
            self.values[key] = value
            self._versions[key] += 1
            self.changed.notify_all()

    def close(self) -> None:
        """Answer every held request, stop serving and free the port."""
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: MetadataServer

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: str, etag: str = "") -> None:
        raw = body.encode()
        self.send_response(code)
        if not self.server.impostor:
            self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        srv = self.server
        url = urlsplit(self.path)
        if self.headers.get("Metadata-Flavor") != "Google":
            srv.refused += 1
            self._reply(403, "Missing required header: Metadata-Flavor")
            return
        key = url.path.removeprefix(PREFIX)
        if not url.path.startswith(PREFIX) or key not in srv.values:
            self._reply(404, "not found")
            return
        query = parse_qs(url.query)
        with srv.changed:
            if query.get("wait_for_change") == ["true"]:
                seen = (query.get("last_etag") or [srv.etag(key)])[0]
                timeout = float((query.get("timeout_sec") or ["60"])[0])
                srv.changed.wait_for(lambda: srv.closing or srv.etag(key) != seen, timeout=timeout)
            value, etag = srv.values[key], srv.etag(key)
        srv.answered += 1
        self._reply(200, value, etag)

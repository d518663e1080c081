"""``BodyLimit``: refuse a request body over its cap with 413 before it is read whole.

A pure ASGI middleware: a ``Content-Length`` over the cap is refused before any byte of the body
is read; a body without one (chunked) is counted while it streams and refused as soon as it passes
the cap. The cap is ``Limits.max_body_bytes`` (JSON bodies), on the package upload routes (ours,
and Ray's under ``/ray/api/packages/``) ``Limits.max_package_bytes``, and on the batch submission
route ``MAX_BATCH_BODY_BYTES`` (up to ``MAX_BATCH_JOBS`` job bodies in one request).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tpufleet.control.store.values import Limits, MiB

MAX_BATCH_JOBS = 10_000  # job bodies in one POST /api/v1/jobs/batch
MAX_BATCH_BODY_BYTES = 32 * MiB  # its body: about 3 KiB a job at the full count


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: Limits,
        upload_path: str,
        upload_prefixes: tuple[str, ...] = (),
        batch_path: str | None = None,
        batch_bytes: int = MAX_BATCH_BODY_BYTES,
    ) -> None:
        self.app = app
        self.limits = limits
        self.upload_path = upload_path
        self.upload_prefixes = upload_prefixes  # more upload routes: Ray's package API, one path per package
        self.batch_path = batch_path
        self.batch_bytes = batch_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].rstrip("/")
        cap = self.limits.max_body_bytes
        if path == self.upload_path or path.startswith(self.upload_prefixes):
            cap = self.limits.max_package_bytes
        elif path == self.batch_path:
            cap = max(self.batch_bytes, cap)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _answer(send, 400, "Content-Length must be a whole number of bytes")
                return
            if int(declared) > cap:
                await _answer(send, 413, _too_large(int(declared), cap))
                return
        chunks: list[bytes] = []
        size = 0
        while True:  # read the body here, counting, so an undeclared size cannot pass the cap
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                await _answer(send, 413, _too_large(size, cap, counted=True))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        await self.app(
            scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send
        )


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _too_large(size: int, cap: int, *, counted: bool = False) -> str:
    what = "over" if counted else ""
    return f"the request body has {what} {size:,} bytes; at most {cap:,}".replace("  ", " ")


async def _answer(send: Send, status: int, error: str) -> None:
    body = json.dumps({"error": error}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

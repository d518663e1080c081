"""The page cursor of ``GET /api/v1/jobs`` and ``GET /api/v1/events``: opaque to a client.

A page's ``next`` is the last listed row's ``seq`` (the store pages by it: ``seq > after``),
written as URL-safe base64 of ``seq:<n>``; a client passes it back as ``?after=`` and never reads
it. Anything else given as ``after`` is a 400 naming the field.
"""

from __future__ import annotations

import base64
import binascii
import re

from tpufleet.errors import SpecError

__all__ = ["decode_cursor", "encode_cursor"]

_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,40}")
_CURSOR_BODY = re.compile(r"seq:(0|[1-9][0-9]{0,17})")


def encode_cursor(seq: int) -> str:
    """An opaque page cursor: the last listed job's seq."""
    return base64.urlsafe_b64encode(f"seq:{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    found = None
    if _CURSOR.fullmatch(cursor):
        try:
            found = _CURSOR_BODY.fullmatch(
                base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            )
        except (binascii.Error, UnicodeDecodeError, ValueError):
            found = None
    if found is None:
        raise SpecError("not a cursor; pass the `next` of an earlier page", field="after")
    return int(found.group(1))

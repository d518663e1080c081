"""Errors a user (or the world) can cause, and how the CLI and API report them.

Every error carries a message that says what was wrong, where (file, field, line when known) and
what would be right. The CLI prints ``str(error)`` on one or two lines and exits with
``error.exit_code``; the API maps ``error.http_status`` to the response. Nothing that a user can
cause prints a traceback.

The tree::

    TpufleetError                 exit 2, HTTP 400 - base; never raised itself
    ├── SpecError                 bad input: catalog lookups, fleet specs, CLI values
    ├── InputError                unreadable input: missing file, bad YAML
    ├── NotFoundError             HTTP 404 - a job, tenant or slice that does not exist
    ├── AuthError                 HTTP 401 - missing or unknown token
    ├── ForbiddenError            HTTP 403 - a token that may not see or change the object
    ├── ConflictError             HTTP 409 - the object exists, or is in a state that forbids the change
    └── ClusterError              exit 1, HTTP 503 - Ray or the emulator is not reachable or broke;
                                  ``retry_after`` says whether trying again later may help
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from difflib import get_close_matches


class TpufleetError(Exception):
    """Base of every error tpufleet raises on purpose."""

    exit_code: int = 2
    http_status: int = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SpecError(TpufleetError):
    """Input that is well-formed but wrong: an unknown slice type, a field out of range."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        value: object = None,
        choices: Sequence[str] = (),
        locate: bool = True,
    ) -> None:
        """``field`` names what was wrong (``accelerator_type``, ``topology``...), ``value`` the
        value given and ``choices`` the closest valid ones, so callers need not parse the message.
        ``locate=False`` keeps ``field`` out of the message (a lookup that does not know where its
        input came from: the caller adds the place)."""
        self.file = file
        self.line = line
        self.field = field
        self.value = value
        self.choices = tuple(choices)
        super().__init__(_locate(message, file, line, field if locate else None))


class InputError(TpufleetError):
    """Input that cannot be read at all: a missing file, YAML that does not parse."""


class NotFoundError(TpufleetError):
    http_status = 404


class AuthError(TpufleetError):
    """A missing, malformed, unknown or revoked bearer token. ``reason`` names which, from the closed
    set ``missing``, ``invalid``, ``revoked`` (the ``reason`` label of ``tpufleet_auth_failures_total``)."""

    http_status = 401

    def __init__(self, message: str, *, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class ForbiddenError(TpufleetError):
    http_status = 403


class ConflictError(TpufleetError):
    http_status = 409


class ClusterError(TpufleetError):
    """Ray, the emulator or the control plane is unreachable or misbehaved; not the user's input."""

    exit_code = 1
    http_status = 503

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _locate(message: str, file: str | None, line: int | None, field: str | None) -> str:
    where = ""
    if file:
        where = file + (f":{line}" if line else "")
    if field:
        where = f"{where}: {field}" if where else field
    return f"{where}: {message}" if where else message


def closest(value: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The valid values that look most like ``value``, best first (for "did you mean")."""
    pool = list(dict.fromkeys(choices))
    return get_close_matches(value, pool, n=n, cutoff=0.5)


def unknown_field(name: object, valid: Iterable[str], what: str = "field") -> str:
    """``"unknown field 'num_slice'; did you mean num_slices?"`` (or ``"; valid: a, b"`` when none is
    close): what a typo'd key gets, in a fleet spec, a job body or a slice config alike."""
    names = sorted(valid)
    near = closest(str(name), names)
    hint = f"; did you mean {' or '.join(near)}?" if near else f"; valid: {', '.join(names)}"
    return f"unknown {what} {str(name)[:40]!r}{hint}"


def suggest(choices: Sequence[str]) -> str:
    """``"; closest: a, b"`` or ``""`` when there is nothing to suggest."""
    return f"; closest: {', '.join(choices)}" if choices else ""

"""``Client``: the REST API from Python (the CLI uses it), over httpx.

The one I/O seam is the ``httpx.Client`` it is given: a real one by default, or any other
(``fastapi.testclient.TestClient(app)`` runs the whole API in-process, no sockets). Errors come
back as the :class:`~tpufleet.errors.TpufleetError` the server raised (same message, same exit
code); an unreachable server is a :class:`~tpufleet.errors.ClusterError` (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from tpufleet.control.store import packages
from tpufleet.control.store.values import DEFAULT_LIMITS, PAGE_MAX, Limits
from tpufleet.errors import (
    AuthError,
    ClusterError,
    ConflictError,
    ForbiddenError,
    InputError,
    NotFoundError,
    SpecError,
    TpufleetError,
)

DEFAULT_SERVER = "http://127.0.0.1:8600"
API = "/api/v1"
_BY_STATUS: dict[int, type[TpufleetError]] = {
    400: SpecError,
    401: AuthError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: SpecError,
    415: SpecError,
    422: SpecError,
}


def server_url(text: str, field: str = "--server") -> str:
    """The control plane's base URL from what a user gave: ``http://`` added when there is no
    scheme (``127.0.0.1:8600``); a SpecError naming ``field`` for anything but
    ``http(s)://host[:port]`` (a path such as ``/api/v1``, a query, another scheme, a bad port)."""
    given = text.strip()
    url = given if "://" in given else f"http://{given}"
    expected = f"give http(s)://host:port, e.g. {DEFAULT_SERVER}"
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket (http://[::1)
        raise SpecError(f"{given!r} is not a control plane URL: {expected}", field=field) from None
    try:
        port_ok = parts.port is not None or ":" not in parts.netloc.rpartition("@")[2].rpartition("]")[2]
    except ValueError:
        port_ok = False
    if parts.scheme.lower() in ("http", "https") and parts.hostname and port_ok:
        base = f"{parts.scheme}://{parts.netloc}"
        if parts.path in ("", "/") and not parts.query and not parts.fragment:
            return base
        expected = f"give {base} (scheme://host:port, no path)"
    raise SpecError(f"{given!r} is not a control plane URL: {expected}", field=field)


class Client:
    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        token: str | None = None,
        *,
        http: httpx.Client | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self._http = http or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call; the decoded JSON answer, or the server's error raised as a TpufleetError."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(kwargs.pop("headers", None) or {})
        url = self.server + path
        try:
            resp = self._http.request(method, url, headers=headers, **kwargs)
        except httpx.TransportError as err:
            raise ClusterError(
                f"cannot reach the tpufleet server at {self.server} ({type(err).__name__}: {err}); "
                "is `tpufleet serve` running? set --server or TPUFLEET_SERVER",
                retry_after=5,
            ) from err
        if resp.status_code >= 400:
            raise _error(resp)
        return resp.json() if resp.content else None

    # -- the API --------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return dict(self.request("GET", "/healthz"))

    def status(self) -> dict[str, Any]:
        """The scheduling loop's figures and the fleet's counts (admin)."""
        return dict(self.request("GET", f"{API}/status"))

    def whoami(self) -> dict[str, Any]:
        return dict(self.request("GET", f"{API}/whoami"))

    def create_tenant(
        self, name: str, quota: Mapping[str, int], weight: float = 1.0, preemption: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "quota": dict(quota), "weight": weight}
        if preemption is not None:
            body["preemption"] = preemption
        return dict(self.request("POST", f"{API}/tenants", json=body))

    def tenants(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        params = {"include_deleted": "true"} if include_deleted else None
        return list(self.request("GET", f"{API}/tenants", params=params))

    def tenant(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"{API}/tenants/{_seg(name)}"))

    def update_tenant(
        self,
        name: str,
        *,
        quota: Mapping[str, int] | None = None,
        weight: float | None = None,
        preemption: str | None = None,
    ) -> dict[str, Any]:
        """Change a tenant (admin): ``quota`` merged per generation (0 removes one)."""
        body: dict[str, Any] = {}
        if quota is not None:
            body["quota"] = dict(quota)
        if weight is not None:
            body["weight"] = weight
        if preemption is not None:
            body["preemption"] = preemption
        return dict(self.request("PATCH", f"{API}/tenants/{_seg(name)}", json=body))

    def delete_tenant(self, name: str, *, force: bool = False) -> dict[str, Any]:
        """Delete a tenant (admin); ``force`` cancels its jobs first. ``state``: deleting or deleted."""
        params = {"force": "true"} if force else None
        return dict(self.request("DELETE", f"{API}/tenants/{_seg(name)}", params=params))

    def create_token(self, tenant: str, scope: str = "jobs") -> dict[str, Any]:
        """A new token (admin): ``{"id", "tenant", "scope", ..., "token"}``, the secret shown once."""
        return dict(self.request("POST", f"{API}/tokens", json={"tenant": tenant, "scope": scope}))

    def tokens(self, tenant: str | None = None) -> list[dict[str, Any]]:
        params = {"tenant": tenant} if tenant else None
        return list(self.request("GET", f"{API}/tokens", params=params))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return dict(self.request("POST", f"{API}/tokens/{_seg(token_id)}/revoke"))

    def rotate_admin(self) -> dict[str, Any]:
        """A new admin token, the old ones revoked: ``{"id", "token", "revoked", "path"}``."""
        return dict(self.request("POST", f"{API}/tokens/rotate-admin"))

    def audit_page(
        self, tenant: str | None = None, limit: int | None = None, after: str | None = None
    ) -> dict[str, Any]:
        """One page of the audit log: ``{"items": [...], "next": cursor or None}``."""
        given = {"tenant": tenant, "limit": limit, "after": after}
        params = {k: v for k, v in given.items() if v is not None}
        return dict(self.request("GET", f"{API}/events", params=params or None))

    def audit(self, tenant: str | None = None, *, last: int | None = None) -> list[dict[str, Any]]:
        """The audit log, oldest first, every page; ``last``: only the newest that many."""
        out: list[dict[str, Any]] = []
        after = None
        while True:
            page = self.audit_page(tenant, PAGE_MAX, after)
            out.extend(page["items"])
            if last is not None:
                del out[:-last]
            after = page["next"]
            if after is None:
                return out

    def slices(self) -> list[dict[str, Any]]:
        return list(self.request("GET", f"{API}/slices"))

    def fleet(self) -> dict[str, Any]:
        """The fleet page's view (``GET /api/v1/fleet``): slices with hosts and chips, the queue
        head, running and recent jobs, tenants' chips against quota (a tenant sees its own)."""
        return dict(self.request("GET", f"{API}/fleet"))

    def drain(self, name: str, drain: bool = True) -> dict[str, Any]:
        return dict(self.request("POST", f"{API}/slices/{_seg(name)}/{'drain' if drain else 'undrain'}"))

    def submit(
        self,
        command: Sequence[str],
        accelerator_type: str,
        *,
        num_slices: int = 1,
        priority: int = 0,
        max_retries: int | None = None,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        working_dir: str | None = None,
        tenant: str | None = None,
        kind: str = "spmd",
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "command": list(command),
            "accelerator_type": accelerator_type,
            "num_slices": num_slices,
            "priority": priority,
            "name": name,
            "env": dict(env or {}),
            "working_dir": working_dir,
            "tenant": tenant,
        }
        if max_retries is not None:
            body["max_retries"] = max_retries
        if kind != "spmd":  # older servers know no kind
            body["kind"] = kind
        return dict(self.request("POST", f"{API}/jobs", json=body))

    def submit_batch(self, bodies: Sequence[Mapping[str, Any]]) -> list[str]:
        """Queue many jobs in one request, all or none (``POST /api/v1/jobs/batch``): each body has
        the fields of :meth:`submit` (``command``, ``accelerator_type``, ...); returns their ids in
        order. One bad body raises the server's error, which names it (``jobs[3].num_slices: ...``)."""
        return [str(i) for i in self.submit_batch_answer(bodies)["ids"]]

    def submit_batch_answer(self, bodies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """:meth:`submit_batch`'s whole answer: ``ids`` and ``warnings`` (each ``{"jobs": [indices
        in the batch], "message": ...}``, the warnings :meth:`submit` answers with)."""
        body = {"jobs": [dict(b) for b in bodies]}
        answer: dict[str, Any] = self.request("POST", f"{API}/jobs/batch", json=body)
        return answer

    def upload_package(
        self,
        source: str | Path | bytes,
        *,
        tenant: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
        progress: Callable[[int, int], None] | None = None,
    ) -> str:
        """Upload a working directory (packed here, see :func:`packages.pack`) or a zip's bytes;
        returns the package id to pass as a job's ``working_dir``."""
        data = source if isinstance(source, bytes) else packages.pack(Path(source), limits, progress=progress)
        params = {"tenant": tenant} if tenant else None
        headers = {"Content-Type": "application/zip"}
        return str(
            self.request("POST", f"{API}/packages", content=data, headers=headers, params=params)["id"]
        )

    def jobs_page(
        self, limit: int | None = None, after: str | None = None, states: Sequence[str] = ()
    ) -> dict[str, Any]:
        """One page: ``{"items": [...], "next": cursor or None}``."""
        params: dict[str, Any] = {"state": list(states)} if states else {}
        if limit is not None:
            params["limit"] = limit
        if after is not None:
            params["after"] = after
        return dict(self.request("GET", f"{API}/jobs", params=params or None))

    def jobs(
        self, states: Sequence[str] = (), *, limit: int | None = None, page_size: int = PAGE_MAX
    ) -> list[dict[str, Any]]:
        """Every job (following ``next`` page after page), or the first ``limit``."""
        out: list[dict[str, Any]] = []
        after = None
        while limit is None or len(out) < limit:
            size = page_size if limit is None else min(page_size, limit - len(out))
            page = self.jobs_page(size, after, states)
            out.extend(page["items"])
            after = page["next"]
            if after is None:
                break
        return out

    def job(
        self, job_id: str, *, while_state: str | Sequence[str] | None = None, wait_s: float = 0
    ) -> dict[str, Any]:
        """The job. With ``while_state`` (a state or several): the server answers once the job is
        in none of them, or after ``wait_s`` seconds (at most 30) with the job as it is (a long
        poll)."""
        if while_state is None:
            return dict(self.request("GET", f"{API}/jobs/{_seg(job_id)}"))
        states = [while_state] if isinstance(while_state, str) else list(while_state)
        params = {"while_state": states, "wait_s": wait_s}
        timeout = httpx.Timeout(wait_s + 30.0)  # the server's wait, then an ordinary read's time
        return dict(self.request("GET", f"{API}/jobs/{_seg(job_id)}", params=params, timeout=timeout))

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"{API}/jobs/{_seg(job_id)}/events"))

    def logs(
        self, job_id: str, *, attempt: int | None = None, host: int | None = None, offset: int = 0
    ) -> dict[str, Any]:
        params = {
            k: v for k, v in {"attempt": attempt, "host": host, "offset": offset}.items() if v is not None
        }
        return dict(self.request("GET", f"{API}/jobs/{_seg(job_id)}/logs", params=params))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("POST", f"{API}/jobs/{_seg(job_id)}/cancel"))


def _seg(value: str) -> str:
    """A path segment, so an id like ``../tenants`` cannot reach another route. No id or name has a
    ``/`` (the server decodes ``%2F`` before it routes: ``a/cancel`` would be job ``a``'s cancel)."""
    if "/" in value:
        raise InputError(f"{value[:80]!r} is not an id or a name: none has a '/' in it")
    return quote(value, safe="")


def _error(resp: httpx.Response) -> TpufleetError:
    try:
        message = str(resp.json().get("error") or resp.text)
    except (ValueError, AttributeError):
        message = resp.text.strip()[:300] or resp.reason_phrase
    if resp.status_code >= 500:
        return ClusterError(f"server error {resp.status_code}: {message}")
    if resp.status_code == 429:  # too many failed authentications from this address: wait
        wait = resp.headers.get("retry-after", "")
        return ClusterError(message, retry_after=float(wait) if wait.isdigit() else None)
    return _BY_STATUS.get(resp.status_code, TpufleetError)(message)

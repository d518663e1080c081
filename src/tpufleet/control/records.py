"""The values the store hands out (frozen dataclasses), and validation of what users submit.

Validation lives here, below the API, so that every way into the store (REST, in-process demo,
tests) gets the same one-line :class:`~tpufleet.errors.SpecError` naming the bad field and value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from tpufleet import catalog
from tpufleet.errors import SpecError

# Job and slice states as stored (the names of scheduler.model's JobState / SliceState members).
QUEUED, ADMITTED, STARTING, RUNNING = "QUEUED", "ADMITTED", "STARTING", "RUNNING"
SUCCEEDED, FAILED, CANCELLED = "SUCCEEDED", "FAILED", "CANCELLED"
ACTIVE = (ADMITTED, STARTING, RUNNING)  # holding slices
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)
FREE, HELD, BROKEN, DRAINING = "FREE", "HELD", "BROKEN", "DRAINING"

TENANT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("TPU_", "MEGASCALE_", "TPUFLEET_")
MAX_PRIORITY = 1_000_000
DEFAULT_MAX_RETRIES = 2


@dataclass(frozen=True)
class Principal:
    """Who a bearer token belongs to: a tenant, or the admin when ``tenant`` is None."""

    tenant: str | None

    @property
    def admin(self) -> bool:
        return self.tenant is None


@dataclass(frozen=True)
class TenantRecord:
    name: str
    quota: dict[str, int]
    weight: float
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SliceRecord:
    name: str
    accelerator_type: str
    topology: str
    state: str
    holder: str | None
    hosts: tuple[dict[str, Any], ...]
    problems: tuple[str, ...]
    draining: bool

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hosts"], d["problems"] = list(self.hosts), list(self.problems)
        return d


@dataclass(frozen=True)
class AttemptRecord:
    attempt: int
    slices: tuple[str, ...]
    state: str
    message: str | None
    exit_codes: tuple[dict[str, Any], ...]
    admitted_at: float
    started_at: float | None
    ended_at: float | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slices"], d["exit_codes"] = list(self.slices), list(self.exit_codes)
        return d


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    tenant: str
    state: str
    attempt: int
    slices: tuple[str, ...]
    reason: str | None
    reason_code: str | None
    accelerator_type: str
    num_slices: int
    priority: int
    max_retries: int
    failures: int
    command: tuple[str, ...]
    env: dict[str, str]
    working_dir: str | None
    borrowing: bool
    preempting: bool
    cancel_requested: bool
    exit_code: int | None
    seq: int
    submitted_at: float
    admitted_at: float | None
    started_at: float | None
    finished_at: float | None
    attempts: tuple[AttemptRecord, ...] = ()  # filled in by Store.job(), not by listings

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slices"], d["command"] = list(self.slices), list(self.command)
        d["attempts"] = [a.to_dict() for a in self.attempts]
        return d


@dataclass(frozen=True)
class HostLog:
    host: int
    slice: str
    worker_id: int
    data: str
    next_offset: int
    complete: bool


@dataclass(frozen=True)
class LogRead:
    job_id: str
    attempt: int
    job_state: str
    hosts: tuple[HostLog, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "job_state": self.job_state,
            "hosts": [asdict(h) for h in self.hosts],
        }


@dataclass(frozen=True)
class JobRequest:
    """A validated submission; build it with :meth:`build`."""

    command: tuple[str, ...]
    accelerator_type: str  # canonical GCE name, e.g. v5litepod-16 for "v5e-16"
    num_slices: int = 1
    priority: int = 0
    max_retries: int = DEFAULT_MAX_RETRIES
    name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None

    @classmethod
    def build(
        cls,
        *,
        command: Sequence[str],
        accelerator_type: str,
        num_slices: int = 1,
        priority: int = 0,
        max_retries: int = DEFAULT_MAX_RETRIES,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        working_dir: str | None = None,
    ) -> JobRequest:
        cmd = tuple(str(c) for c in command)
        if not cmd or not cmd[0].strip():
            raise SpecError("a job needs a command, e.g. -- python train.py", field="command")
        st = catalog.slice_type(accelerator_type)  # SpecError with the closest sizes
        _check_range("num_slices", num_slices, 1, 4096)
        _check_range("priority", priority, -MAX_PRIORITY, MAX_PRIORITY)
        _check_range("max_retries", max_retries, 0, 100)
        if name is not None and not 0 < len(name) <= 128:
            raise SpecError(f"name must have 1 to 128 characters, got {len(name)}", field="name")
        return cls(
            command=cmd,
            accelerator_type=st.accelerator_type,
            num_slices=num_slices,
            priority=priority,
            max_retries=max_retries,
            name=name or default_name(cmd),
            env=_check_env(env or {}),
            working_dir=working_dir or None,
        )


def _check_range(what: str, value: int, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(f"must be an integer from {lo} to {hi}, got {value!r}", field=what)


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key):
            raise SpecError(f"{key!r} is not a valid variable name", field="env")
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise SpecError(
                f"{key} is set by tpufleet (host contract); variables starting with "
                f"{', '.join(RESERVED_ENV_PREFIXES)} cannot be overridden",
                field="env",
            )
        out[key] = str(value)
    return out


def default_name(command: Sequence[str]) -> str:
    """``python train.py --lr 1`` -> ``train``: the first word that is not an interpreter or flag."""
    interpreters = ("python", "python3", "bash", "sh", "uv", "env")
    for word in command:
        base = PurePath(word).name
        if word.startswith("-") or base in interpreters or base.startswith("python3."):
            continue
        return (PurePath(base).stem or base)[:128]
    return PurePath(command[0]).name[:128] or "job"


def validate_tenant(name: str, quota: Mapping[str, int], weight: float) -> dict[str, int]:
    """Check a tenant's name, quota and weight; returns the quota keyed by canonical generation."""
    if not TENANT_NAME.fullmatch(name or ""):
        raise SpecError(
            f"{name!r} is not a valid tenant name; use lowercase letters, digits and '-', "
            "1 to 63 characters, e.g. team-a",
            field="name",
        )
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1000:
        raise SpecError(f"weight must be a number above 0 and at most 1000, got {weight!r}", field="weight")
    out: dict[str, int] = {}
    for gen_name, chips in quota.items():
        gen = catalog.generation(gen_name)  # SpecError listing the generations
        if isinstance(chips, bool) or not isinstance(chips, int) or chips < 0:
            raise SpecError(f"{gen_name}={chips!r}: chips must be an integer >= 0", field="quota")
        out[gen.name] = out.get(gen.name, 0) + chips
    return out

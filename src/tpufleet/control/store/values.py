"""The values the store hands out (frozen dataclasses), and validation of what users submit.

Validation lives here, below the API, so that every way into the store (REST, in-process demo,
tests) gets the same one-line :class:`~tpufleet.errors.SpecError` naming the bad field and value.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from tpufleet import catalog
from tpufleet.contract import RAY_TRAIN_POLL_MIN_S, RAY_TRAIN_POLL_VAR
from tpufleet.errors import SpecError
from tpufleet.scheduler.lifecycle import TERMINAL_STATES, JobKind, JobState, SliceState

Clock = Callable[[], float]  # seconds since the epoch; the store and the loop take one (tests: a fake)

# Job and slice states as stored (the names of scheduler.model's JobState / SliceState members).
# Job and slice states: the lifecycle's enums (scheduler/lifecycle.py), named here for the store's queries.
QUEUED, ADMITTED, STARTING, RUNNING = JobState.QUEUED, JobState.ADMITTED, JobState.STARTING, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED
ACTIVE = (ADMITTED, STARTING, RUNNING)  # holding slices
TERMINAL = tuple(s for s in JobState if s in TERMINAL_STATES)  # the lifecycle's, in its order
FREE, HELD, BROKEN, DRAINING = SliceState.FREE, SliceState.HELD, SliceState.BROKEN, SliceState.DRAINING

TENANT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("TPU_", "MEGASCALE_", "TPUFLEET_")
# What a job may set although it starts with a reserved prefix: the sandbox's per-job settings.
JOB_SETTABLE_ENV = frozenset({"TPUFLEET_SANDBOX_SECONDS", "TPUFLEET_SANDBOX_EXIT"})
MAX_PRIORITY = 1_000_000
MAX_QUOTA_CHIPS = 1_000_000  # per generation: far above any fleet, far below what breaks a column
DEFAULT_MAX_RETRIES = 2
JOB_KINDS = tuple(JobKind)  # the lifecycle's, in its order: spmd, ray
PACKAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
PAGE_DEFAULT, PAGE_MAX = 100, 1000  # GET /jobs ?limit=
LIST_COMMAND_CHARS = 256  # a listed job's command (GET /jobs, the fleet view): cut past this many
LIST_TEXT_CHARS = 512  # a listed job's reason and working_dir: cut past this many characters
CUT_MARK = "\u2026"  # ends a value a listing cut ("..."): GET /jobs/{id} has the whole of it
KiB, MiB, GiB = 1024, 1024**2, 1024**3


@dataclass(frozen=True)
class Limits:
    """Every cap on what a caller may send, in one place (``tpufleet serve`` flags set some).

    ``working_dir_url_prefixes``: the URLs a job's ``working_dir`` may name (none by default: only
    packages uploaded with ``POST /api/v1/packages``).
    """

    max_body_bytes: int = 1 * MiB  # a JSON request body
    max_package_bytes: int = 100 * MiB  # an uploaded zip
    max_package_entries: int = 20_000
    max_package_unpacked_bytes: int = 1 * GiB
    package_quota_bytes: int = 1 * GiB  # all of a tenant's stored packages (serve --package-quota-mib)
    max_queued_per_tenant: int = 100_000
    max_queued_bytes_per_tenant: int = 256 * MiB  # JobRequest.body_bytes summed over its queued jobs
    working_dir_url_prefixes: tuple[str, ...] = ()
    max_command_args: int = 256
    max_arg_bytes: int = 8 * KiB
    max_command_bytes: int = 64 * KiB
    max_env_vars: int = 256
    max_env_key: int = 256
    max_env_value_bytes: int = 32 * KiB
    max_env_bytes: int = 256 * KiB
    max_name: int = 128
    ray_jobs: bool = False  # serve --allow-ray-jobs: a Ray job has the Ray cluster's power (docs/ray-jobs.md)
    # bytes a tenant's checkpoint directory may hold (serve --checkpoint-quota-gib); None: no limit
    checkpoint_quota_bytes: int | None = None


DEFAULT_LIMITS = Limits()


ADMIN_SCOPE, JOBS_SCOPE, METRICS_SCOPE = "admin", "jobs", "metrics"
TOKEN_SCOPES = (JOBS_SCOPE, METRICS_SCOPE)  # what `token create --scope` accepts
PREEMPTION_MODES = ("lower_priority", "never")  # a tenant's `preemption` setting; the first is the default


@dataclass(frozen=True)
class Principal:
    """Who a bearer token belongs to: a tenant, or the admin when ``tenant`` is None.

    ``scope``: ``admin`` (tenants, slices, every job), ``jobs`` (the tenant's jobs) or ``metrics``
    (only ``GET /metrics``); left empty it is ``admin`` without a tenant and ``jobs`` with one.
    ``token_id``: the token's id, the actor of what it does (None where no stored token is behind it).
    """

    tenant: str | None
    scope: str = ""
    token_id: str | None = None

    def __post_init__(self) -> None:
        if not self.scope:
            object.__setattr__(self, "scope", ADMIN_SCOPE if self.tenant is None else JOBS_SCOPE)

    @property
    def admin(self) -> bool:
        return self.tenant is None and self.scope == ADMIN_SCOPE

    @property
    def actor(self) -> str:
        """How events name who did something: ``admin``, or the tenant token's id."""
        return "admin" if self.admin else (self.token_id or f"tenant:{self.tenant}")


@dataclass(frozen=True)
class CheckpointUsage:
    """A tenant's checkpoint directory: what a host last measured (``used_bytes`` None: no run has
    reported yet; ``complete`` False: the walk stopped at its bound, ``used_bytes`` is a lower
    bound), when (``measured_at``, the host's clock), and the quota (None: no limit)."""

    used_bytes: int | None = None
    measured_at: float | None = None
    complete: bool = True
    quota_bytes: int | None = None


@dataclass(frozen=True)
class TenantRecord:
    """A tenant. ``state``: ``active``; ``deleting`` after ``tenant delete --force`` while its
    cancelled jobs still stop; ``deleted`` (``deleted_at`` set) once none holds slices."""

    name: str
    quota: dict[str, int]
    weight: float
    created_at: float
    preemption: str = PREEMPTION_MODES[0]
    deleted_at: float | None = None
    state: str = "active"
    checkpoints: CheckpointUsage = field(default_factory=CheckpointUsage)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TokenRecord:
    """A token as listings show it: never the secret."""

    id: str
    tenant: str | None
    scope: str
    created_at: float
    last_used_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EventRecord:
    """One event of the audit log (``GET /api/v1/events``)."""

    id: int
    at: float
    kind: str
    tenant: str | None
    actor: str | None
    job_id: str | None
    slice: str | None
    message: str

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
    first_step: int | None = None  # the first and the newest step process 0 reported, and when
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at: float | None = None

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
    attempts: tuple[AttemptRecord, ...] = ()  # filled in by store.jobs.get(), not by listings
    kind: JobKind = JobKind.SPMD
    # its current attempt is being ended (a failure, a preemption, a cancel): the job keeps its
    # active state until every process has ended; ``reason`` says why and what comes next
    stopping: bool = False

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
    truncated: bool = False  # the per-host cap was reached; the rest of the output was not kept
    note: str | None = None  # why the stored log is not the whole output, when it is not


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
    kind: JobKind = JobKind.SPMD

    @property
    def body_bytes(self) -> int:
        """What the job stores (UTF-8 bytes of its command, env names and values, name and working_dir):
        counted against ``Limits.max_queued_bytes_per_tenant`` while it is queued."""
        words = (*self.command, *self.env, *self.env.values(), self.name, self.working_dir or "")
        return sum(_utf8_len(w) for w in words)

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
        kind: str = JobKind.SPMD,
        limits: Limits = DEFAULT_LIMITS,
    ) -> JobRequest:
        """The one validation path into the store (REST, in-process callers, tests)."""
        cmd = _check_command(command, limits)
        check_kind(kind, limits)
        if not isinstance(accelerator_type, str):
            raise SpecError(f"must be a string, got {accelerator_type!r}", field="accelerator_type")
        st = catalog.slice_type(accelerator_type)  # SpecError with the closest sizes
        _check_range("num_slices", num_slices, 1, 4096)
        _check_range("priority", priority, -MAX_PRIORITY, MAX_PRIORITY)
        _check_range("max_retries", max_retries, 0, 100)
        if name is not None:
            _check_name(name, limits)
        return cls(
            command=cmd,
            accelerator_type=st.accelerator_type,
            num_slices=num_slices,
            priority=priority,
            max_retries=max_retries,
            name=name or clean_name(default_name(cmd), limits),
            env=_check_env(env or {}, limits),
            working_dir=check_working_dir(working_dir, limits),
            kind=JobKind(kind),
        )


def check_kind(kind: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """``spmd`` or ``ray``; a Ray job only where the operator enabled them (``serve --allow-ray-jobs``)."""
    if kind not in JOB_KINDS:
        shown = str(kind)[:40]
        raise SpecError(f"{shown!r} is not a job kind; use {' or '.join(JOB_KINDS)}", field="kind")
    if kind == JobKind.RAY and not limits.ray_jobs:
        raise SpecError(
            "Ray jobs are not enabled on this control plane; the operator enables them with "
            "serve --allow-ray-jobs (a Ray job holds the Ray cluster's power: see docs/ray-jobs.md)",
            field="kind",
        )


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _check_command(command: Sequence[str], limits: Limits) -> tuple[str, ...]:
    if isinstance(command, str | bytes) or not all(isinstance(c, str) for c in command):
        raise SpecError("must be a list of strings, e.g. ['python', 'train.py']", field="command")
    cmd = tuple(command)
    if not cmd or not cmd[0].strip():
        raise SpecError("a job needs a command, e.g. -- python train.py", field="command")
    if len(cmd) > limits.max_command_args:
        raise SpecError(f"{len(cmd)} arguments; at most {limits.max_command_args}", field="command")
    total = 0
    for i, arg in enumerate(cmd):
        size = _utf8_len(arg)
        total += size
        if "\0" in arg:
            raise SpecError(
                f"argument {i} contains a NUL byte, which no program can receive", field="command"
            )
        if size > limits.max_arg_bytes:
            raise SpecError(f"argument {i} has {size} bytes; at most {limits.max_arg_bytes}", field="command")
    if total > limits.max_command_bytes:
        raise SpecError(f"{total} bytes in all; at most {limits.max_command_bytes}", field="command")
    return cmd


NAME_BANNED = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})  # control, format (RLO, ZWJ, BOM), ...
MAX_MARKS = 3  # combining marks on one character: enough for any script, not for a tower of them


def _check_name(name: str, limits: Limits) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= limits.max_name:
        size = len(name) if isinstance(name, str) else name
        raise SpecError(f"name must have 1 to {limits.max_name} characters, got {size!r}", field="name")
    bad = next((c for c in name if unicodedata.category(c) in NAME_BANNED), None)
    if bad is not None:
        raise SpecError(
            f"control or format character {bad!r} in the name; use printable characters", field="name"
        )
    if _marks_past(name) is not None:
        raise SpecError(
            f"more than {MAX_MARKS} combining marks on one character in the name (or a name that "
            "starts with one); use plain text",
            field="name",
        )


def _marks_past(name: str) -> int | None:
    """The index of the first combining mark past ``MAX_MARKS`` in a row (or with no character
    before it to sit on), None when there is none."""
    run = MAX_MARKS  # a mark at the start has no base character
    for i, c in enumerate(name):
        run = run + 1 if unicodedata.category(c).startswith("M") else 0
        if run > MAX_MARKS:
            return i
    return None


def clean_name(text: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """``text`` made a valid job name: control and format characters and combining marks past the
    rule of :func:`_check_name` dropped, surrounding blanks stripped, cut to ``max_name``; ``job``
    when nothing is left. What a default name (derived from the command) goes through."""
    kept: list[str] = []
    run = MAX_MARKS
    for c in text:
        category = unicodedata.category(c)
        if category in NAME_BANNED:
            continue
        if category.startswith("M"):
            if run >= MAX_MARKS:
                continue
            run += 1
        else:
            run = 0
        kept.append(c)
    return "".join(kept).strip()[: limits.max_name].strip() or "job"


def check_working_dir(working_dir: str | None, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """A package id (``sha256:<64 hex>``, from ``POST /api/v1/packages``) or a URL under one of the
    operator's prefixes; never a path (the control plane does not read its own disk for a job)."""
    if working_dir is None or working_dir == "":
        return None
    if not isinstance(working_dir, str):
        raise SpecError(f"must be a string, got {working_dir!r}", field="working_dir")
    if PACKAGE_ID.fullmatch(working_dir):
        return working_dir
    allowed = [p for p in limits.working_dir_url_prefixes if p]
    clean = "\0" not in working_dir and not any(c.isspace() for c in working_dir)
    if clean and "://" in working_dir and any(working_dir.startswith(p) for p in allowed):
        return working_dir
    accepted = "a package id sha256:<64 hex> from POST /api/v1/packages (tpufleet submit --working-dir DIR)"
    if allowed:
        accepted += " or a URL starting with " + " or ".join(allowed)
    shown = working_dir if len(working_dir) <= 80 else working_dir[:77] + "..."
    raise SpecError(f"{shown!r} is not accepted; give {accepted}", field="working_dir")


def _check_range(what: str, value: int, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(f"must be an integer from {lo} to {hi}, got {value!r}", field=what)


def _check_env(env: Mapping[str, str], limits: Limits) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise SpecError("must be an object of NAME: value strings", field="env")
    if len(env) > limits.max_env_vars:
        raise SpecError(f"{len(env)} variables; at most {limits.max_env_vars}", field="env")
    out: dict[str, str] = {}
    total = 0
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SpecError(f"{key!r}: names and values must be strings", field="env")
        if len(key) > limits.max_env_key:
            raise SpecError(f"a name of {len(key)} characters; at most {limits.max_env_key}", field="env")
        if not ENV_NAME.fullmatch(key):
            raise SpecError(f"{key!r} is not a valid variable name (letters, digits, _)", field="env")
        if key.startswith(RESERVED_ENV_PREFIXES) and key not in JOB_SETTABLE_ENV:
            raise SpecError(
                f"{key} is set by tpufleet (host contract); variables starting with "
                f"{', '.join(RESERVED_ENV_PREFIXES)} cannot be overridden",
                field="env",
            )
        if "\0" in value:
            raise SpecError(f"{key} contains a NUL byte, which no program can receive", field="env")
        if key == RAY_TRAIN_POLL_VAR:
            _check_train_poll(value)
        size = _utf8_len(value)
        if size > limits.max_env_value_bytes:
            raise SpecError(f"{key} has {size} bytes; at most {limits.max_env_value_bytes}", field="env")
        total += size + len(key)
        out[key] = value
    if total > limits.max_env_bytes:
        raise SpecError(f"{total} bytes in all; at most {limits.max_env_bytes}", field="env")
    return out


def _check_train_poll(value: str) -> None:
    """A job may slow its Ray Train controller's polling, not speed it past the floor: the
    controller runs on the head, beside every other Ray job's driver and the control plane."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= RAY_TRAIN_POLL_MIN_S):
        raise SpecError(
            f"{RAY_TRAIN_POLL_VAR}={value!r}: must be a number of seconds, at least {RAY_TRAIN_POLL_MIN_S} "
            "(Ray Train's controller polls from the head node, which every job shares)",
            field="env",
        )


def cut_text(text: str | None, limit: int = LIST_TEXT_CHARS) -> str | None:
    """``text`` whole when it has at most ``limit`` characters, else its first ``limit`` and ``CUT_MARK``."""
    return text if text is None or len(text) <= limit else text[:limit] + CUT_MARK


def command_line(command: Sequence[str], limit: int = LIST_COMMAND_CHARS) -> str:
    """The command joined with spaces, cut to ``limit`` characters (and ``CUT_MARK``): for events."""
    return cut_text(" ".join(command), limit) or ""


def cut_command(command: Sequence[str], limit: int = LIST_COMMAND_CHARS) -> tuple[list[str], bool]:
    """A listing's command: the arguments while their characters (and one space between each) stay
    within ``limit``; the one that passes it cut, ending in ``CUT_MARK``, the rest left out.
    Returns it and whether anything was cut."""
    out: list[str] = []
    left = limit
    for arg in command:
        if len(arg) > left:
            out.append(arg[: max(0, left)] + CUT_MARK)
            return out, True
        out.append(arg)
        left -= len(arg) + 1
    return out, False


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
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name or ""):
        raise SpecError(
            f"{name!r} is not a valid tenant name; use lowercase letters, digits and '-', "
            "1 to 63 characters, e.g. team-a",
            field="name",
        )
    check_weight(weight)
    return check_quota(quota)


def check_weight(weight: float) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1000:
        raise SpecError(f"weight must be a number above 0 and at most 1000, got {weight!r}", field="weight")


def check_preemption(preemption: str) -> str:
    if preemption not in PREEMPTION_MODES:
        raise SpecError(
            f"{str(preemption)[:40]!r} is not a preemption setting; use {' or '.join(PREEMPTION_MODES)}",
            field="preemption",
        )
    return preemption


def check_quota(quota: Mapping[str, int]) -> dict[str, int]:
    """The quota keyed by canonical generation (``v5litepod`` -> ``v5e``); a SpecError naming a bad
    generation or chip count."""
    out: dict[str, int] = {}
    for gen_name, chips in quota.items():
        gen = catalog.generation(gen_name)  # SpecError listing the generations
        if isinstance(chips, bool) or not isinstance(chips, int) or not 0 <= chips <= MAX_QUOTA_CHIPS:
            shown = chips if not isinstance(chips, int) or chips < 10**12 else f"{chips:.3g}"
            raise SpecError(
                f"{gen_name}={shown}: chips must be an integer from 0 to {MAX_QUOTA_CHIPS:,}", field="quota"
            )
        out[gen.name] = out.get(gen.name, 0) + chips
    return out


# -- database URLs -------------------------------------------------------------------------------
_DB_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg")  # the drivers shipped
_DB_FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql+psycopg://USER@HOST/DB"


def check_db_url(url: str) -> str:
    """``url`` as ``--db`` takes it, or a SpecError that says which forms it takes: SQLite
    (``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``sqlite://`` in memory) or PostgreSQL
    through psycopg (the drivers tpufleet ships). The error names the scheme only, never the rest
    of the URL, which may hold a password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise SpecError(
            f"--db takes a URL such as {_DB_FORMS}; this one has no scheme://", field="--db", locate=False
        )
    if scheme not in _DB_SCHEMES:
        raise SpecError(
            f"--db takes SQLite or PostgreSQL through psycopg ({_DB_FORMS}), not {scheme}://",
            field="--db",
            locate=False,
        )
    if scheme.startswith("sqlite") and rest and not rest.startswith("/"):
        raise SpecError(
            "a SQLite --db is sqlite:///relative/path.db, sqlite:////absolute/path.db or "
            "sqlite:// (in memory): three slashes before a path",
            field="--db",
            locate=False,
        )
    return url


# -- SQLite URLs ---------------------------------------------------------------------------------
def sqlite_target(url: str) -> str:
    """What a ``sqlite://`` URL names, its query left out: "" or ``:memory:`` for an in-memory
    database, a ``file:`` URI, or a file's path (``sqlite:///rel.db`` -> ``rel.db``,
    ``sqlite:////abs.db`` -> ``/abs.db``). The one reading of these URLs that the engine, the
    database's lock and serve's checks share."""
    return url.partition("://")[2].removeprefix("/").split("?", 1)[0]


def sqlite_in_memory(url: str) -> bool:
    """Whether ``url`` is an in-memory SQLite database: one process's own, which no other process
    (an API process, another serve) can open, and which every connection of the process shares."""
    return url.startswith("sqlite") and "://" in url and sqlite_target(url) in ("", ":memory:")


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite ``url``, to create private and to lock; None for an in-memory database
    and for a ``file:`` URI (SQLite resolves its path by rules of its own) and for any other
    database."""
    if not url.startswith("sqlite") or "://" not in url or sqlite_in_memory(url):
        return None
    target = sqlite_target(url)
    return None if target.startswith("file:") else target

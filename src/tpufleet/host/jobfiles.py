"""A job's files on a host: its checkpoint directory, its scratch and its unpacked code.

Layout under the host's job root (``ServiceConfig.checkpoint_root``; on the emulator every host
shares one, on real clusters it is a shared filesystem such as a Filestore or GCS FUSE mount)::

    <root>/                                          0711: traversable, not listable
    <root>/<tenant>/                                 0700; the only part a jailed job sees
    <root>/<tenant>/<job>/                           TPUFLEET_CHECKPOINT_DIR, kept across attempts
    <root>/<tenant>/.runs/<job>/<attempt>/<host>/wd    the uploaded package, unpacked: the cwd
    <root>/<tenant>/.runs/<job>/<attempt>/<host>/home  HOME

Only ``<root>`` and ``<root>/<tenant>`` are made by the runner; everything below the tenant
directory is made by the job's own process (``jobstart``), inside its jail, which shows it its own
tenant's directory and nothing else of the root (``contain.jail``). Paths come from the control plane
(validated tenant names and job ids), never from the job. The uploaded package (a zip the tenant
sent, ``POST /api/v1/packages``) is checked again before it is unpacked: no absolute names, no
``..``, no links or devices, at most ``max_unpacked`` bytes in all.

What a tenant keeps there is measured on the hosts (:func:`measure`: a bounded walk that never
follows a link, counting the bytes on disk as ``du`` does) and held to ``serve --checkpoint-quota-gib``
(:func:`quota_problem`); a finished job's ``<job>`` directory is removed by a host when the
retention rule says so (:func:`remove_job_dir`), and a run's empty ``.runs/<job>/<attempt>``
directories go when the run ends (:func:`remove_run_dirs`).
"""

from __future__ import annotations

import errno
import io
import lzma
import os
import shutil
import stat
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MAX_UNPACKED = 1 << 30
MAX_WALK_ENTRIES = 1_000_000  # files and directories one measurement visits at most
QUOTA_FLAG = "serve --checkpoint-quota-gib"


class JobFilesError(ValueError):
    """A run's files cannot be set up safely (an unsafe package, an unreachable root); says why."""


@dataclass(frozen=True)
class RunPaths:
    tenant: Path
    checkpoint: Path
    run: Path  # the run's scratch, removed when the run ends
    workdir: Path
    home: Path


def run_paths(root: str, tenant: str, job_id: str, attempt: int, host: str) -> RunPaths:
    base = Path(root) / _name(tenant)
    run = base / ".runs" / _name(job_id) / str(int(attempt)) / _name(host)
    return RunPaths(base, base / _name(job_id), run, run / "wd", run / "home")


def prepare_tenant_dir(paths: RunPaths) -> None:
    """Create the job root (0711: traversable, not listable) and the tenant's directory (0700)."""
    root = paths.tenant.parent
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    paths.tenant.mkdir(mode=0o700, exist_ok=True)
    if paths.tenant.is_symlink() or not paths.tenant.is_dir():
        raise JobFilesError(f"{paths.tenant} is not a directory")


def make_run_dirs(paths: RunPaths) -> None:
    """Run by the job's own process (already the tenant's identity): checkpoint and scratch dirs."""
    for path in (paths.checkpoint, paths.workdir, paths.home):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)


# What reading a damaged or lying archive raises (a bad CRC, a truncated or corrupt stream, an
# unsupported or encrypted entry): each is a JobFilesError here, never a traceback on the host.
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, EOFError, RuntimeError)


def unpack(package: bytes, dest: Path, max_unpacked: int = MAX_UNPACKED) -> int:
    """Unpack a zip into ``dest`` after checking every entry; returns the bytes written. Whatever
    goes wrong is a :class:`JobFilesError` whose message starts "the package" and names no host path."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(package))
    except (*_DAMAGED, ValueError, OSError) as err:
        raise JobFilesError(f"the package is not a zip file ({_said(err)})") from err
    try:
        return _extract(archive, dest, max_unpacked)
    except JobFilesError:
        raise
    except (*_DAMAGED, NotImplementedError, ValueError) as err:
        raise JobFilesError(f"the package is damaged: {_said(err)}") from err
    except OSError as err:  # the host's disk: full, over a quota; strerror names no path
        raise JobFilesError(
            f"the package could not be unpacked: {err.strerror or type(err).__name__}"
        ) from err


def _said(err: BaseException) -> str:
    """One line of what ``err`` says, at most 200 characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _extract(archive: zipfile.ZipFile, dest: Path, max_unpacked: int) -> int:
    with archive:
        total = 0
        for info in archive.infolist():
            check_entry(info)
            total += info.file_size
            if total > max_unpacked:
                raise JobFilesError(f"the package unpacks to more than {max_unpacked} bytes")
        written = 0
        for info in archive.infolist():
            target = dest / PurePosixPath(info.filename)
            if info.is_dir():
                target.mkdir(mode=0o700, parents=True, exist_ok=True)
                continue
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as out:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > max_unpacked:  # a header that lied about its size
                        raise JobFilesError(f"the package unpacks to more than {max_unpacked} bytes")
                    out.write(chunk)
            mode = (info.external_attr >> 16) & 0o700
            os.chmod(target, mode | 0o600)
    return written


def check_entry(info: zipfile.ZipInfo) -> None:
    """Refuse, on the host, what the upload check refuses (``entry_problem``): the same rules twice."""
    why = entry_problem(info.filename, info.external_attr)
    if why is not None:
        raise JobFilesError(f"the package holds an unsafe name or file: {why}")


def entry_problem(name: str, external_attr: int) -> str | None:
    """Why a zip entry could land outside the directory it is unpacked into, or is not a plain file
    or directory (a link, a device); None when it is safe. The one rule for uploads
    (``packages.check_zip``) and for unpacking on a host (``check_entry``)."""
    shown = name if len(name) <= 120 else name[:117] + "..."
    if not name or "\0" in name or "\\" in name:
        return f"entry {shown!r}: empty, NUL or backslash in the name"
    path = PurePosixPath(name)
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return f"entry {shown!r} is an absolute path; entries are relative"
    if ".." in path.parts:
        return f"entry {shown!r} has a '..' component; entries stay inside the package"
    kind = stat.S_IFMT(external_attr >> 16)
    if kind == stat.S_IFLNK:
        return f"entry {shown!r} is a symbolic link, not a plain file or directory"
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        return f"entry {shown!r} is not a plain file or directory"
    return None


@dataclass(frozen=True)
class DiskUsage:
    """A tenant directory's size as one host measured it: ``bytes`` on disk (allocated blocks, as
    ``du``; a file with several hard links counted once), ``entries`` visited, ``complete`` False
    when the walk stopped at its bound (``bytes`` is then a lower bound), ``at`` the host's clock."""

    bytes: int
    entries: int
    complete: bool = True
    at: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {"bytes": self.bytes, "entries": self.entries, "complete": self.complete, "at": self.at}

    @classmethod
    def from_dict(cls, raw: object) -> DiskUsage | None:
        """Read back what a host sent (checked: it crossed a boundary); None when malformed."""
        if not isinstance(raw, dict):
            return None
        size, entries, complete, at = (raw.get(k) for k in ("bytes", "entries", "complete", "at"))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (size, entries)):
            return None
        if not isinstance(complete, bool) or not isinstance(at, int | float):
            return None
        return cls(int(size), int(entries), complete, float(at))  # type: ignore[arg-type]


def measure(
    path: Path, max_entries: int = MAX_WALK_ENTRIES, clock: Callable[[], float] = time.time
) -> DiskUsage:
    """The bytes on disk under ``path`` (itself included), walking with ``os.scandir`` and never
    following a link (a link counts as itself); stops after ``max_entries`` entries. A path that is
    missing is empty; an entry that vanishes or cannot be read while walking is skipped."""
    seen: set[tuple[int, int]] = set()
    try:
        top = os.lstat(path)
    except OSError:
        return DiskUsage(0, 0, True, clock())
    if not stat.S_ISDIR(top.st_mode):
        return DiskUsage(_on_disk(top), 1, True, clock())
    total, entries = _on_disk(top), 1
    stack = [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entries >= max_entries:
                        return DiskUsage(total, entries, False, clock())
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    total += _on_disk(info)
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return DiskUsage(total, entries, True, clock())


def _on_disk(info: os.stat_result) -> int:
    blocks = getattr(info, "st_blocks", None)
    return int(blocks) * 512 if blocks is not None else int(info.st_size)


def quota_problem(tenant: str, usage: DiskUsage, quota_bytes: int | None) -> str | None:
    """Why a run of ``tenant`` must end, its checkpoint directory being over the quota; None when
    it is within it (or there is no quota). A walk that stopped at its bound is over: the tenant
    keeps more files than one measurement may visit."""
    if quota_bytes is None:
        return None
    of = f"of its {size_text(quota_bytes)} ({QUOTA_FLAG})"
    fix = "delete old checkpoints or ask the operator"
    if not usage.complete:
        return (
            f"checkpoint quota exceeded: tenant {tenant!r} keeps more than {usage.entries:,} files and "
            f"directories (at least {size_text(usage.bytes)} {of}); {fix}"
        )
    if usage.bytes > quota_bytes:
        return f"checkpoint quota exceeded: tenant {tenant!r} uses {size_text(usage.bytes)} {of}; {fix}"
    return None


def size_text(n: int) -> str:
    """``1288490189`` -> ``1.2 GiB``; MiB, KiB and bytes below."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def remove_job_dir(root: str, tenant: str, job_id: str) -> int:
    """Remove ``<root>/<tenant>/<job>`` (a finished job's files); returns the bytes it held on disk.

    Never follows a link: a link where the directory was is removed as a link, and the tree is
    removed through directory descriptors (``shutil.rmtree``'s fd-based walk), so a link inside it
    is unlinked, never entered. A tenant directory that is itself a link is left alone (0)."""
    tenant_dir = Path(root) / _name(tenant)
    target = tenant_dir / _name(job_id)
    try:
        if not stat.S_ISDIR(os.lstat(tenant_dir).st_mode):
            return 0
        info = os.lstat(target)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(target)
        return _on_disk(info)
    freed = measure(target).bytes
    fd = os.open(tenant_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        shutil.rmtree(target.name, dir_fd=fd)
    finally:
        os.close(fd)
    return freed


def remove_run_dirs(paths: RunPaths) -> None:
    """After a run's scratch is gone: remove ``.runs/<job>/<attempt>`` and ``.runs/<job>`` when
    they are empty (another host of the attempt that shares the root may still use them)."""
    attempt_dir = paths.run.parent
    for path in (attempt_dir, attempt_dir.parent):
        try:
            os.rmdir(path)
        except OSError as err:
            if err.errno != errno.ENOENT:
                return


def remove_jobs(root: str, tenant: str, job_ids: Iterable[str], busy: Iterable[str] = ()) -> dict[str, int]:
    """:func:`remove_job_dir` for each job not in ``busy``; the bytes each held."""
    skip = set(busy)
    return {job: remove_job_dir(root, tenant, job) for job in job_ids if job not in skip}


def check_name(part: str) -> str:
    """``part`` when it can name one directory (no ``/``, NUL, ``.`` or ``..``); else JobFilesError."""
    return _name(part)


def _name(part: str) -> str:
    if not part or part in (".", "..") or "/" in part or "\x00" in part:
        raise JobFilesError(f"{part!r} cannot name a directory")
    return part

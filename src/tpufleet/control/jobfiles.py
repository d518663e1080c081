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
"""

from __future__ import annotations

import io
import lzma
import os
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MAX_UNPACKED = 1 << 30


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


def _name(part: str) -> str:
    if not part or part in (".", "..") or "/" in part or "\x00" in part:
        raise JobFilesError(f"{part!r} cannot name a directory")
    return part

"""Working-directory packages: a zip the client packs from its own directory and uploads.

The control plane never reads its own disk on a tenant's behalf; a job's ``working_dir`` is either
the id of a package its tenant uploaded (``sha256:<64 hex>``, the digest of the zip) or a URL the
operator allow-listed. :func:`check_zip` is what the store runs on every upload, before storing it:
a size cap; the entry count, directory size and unpacked size read from the archive's own
end-of-central-directory record and directory (:func:`measure`, constant memory) before zipfile
parses anything; no entry that could land outside the directory it is unpacked into or is not a
plain file (``jobfiles.entry_problem``, the rule the hosts apply again when they unpack); and every
entry read in full, so one whose header lies about its size or CRC-32 is refused here, not on the
hosts. A tenant's packages count against its package quota (``Limits.package_quota_bytes``); one
that no live job uses is deleted ``UNUSED_KEEP_S`` after its upload or its last job's end
(``PackageStore.collect``). :func:`pack` is the client's side (``tpufleet submit --working-dir DIR``).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

from tpufleet.control.store.values import DEFAULT_LIMITS, Limits
from tpufleet.errors import SpecError
from tpufleet.host.jobfiles import entry_problem

SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
FIELD = "working_dir"
# The most bytes of central directory per allowed entry: a 46-byte record, its name, extra fields
# and comment (real archives use 60-250); past it the directory is refused before it is parsed.
MAX_RECORD_BYTES = 1024
UNUSED_KEEP_S = 3600.0  # a package no queued or running job names is kept this long after its last use
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory
_LOC64 = struct.Struct("<4sLQL")  # zip64 end of central directory locator
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record
_CDIR = struct.Struct("<4s4B4HL2L5H2L")  # a central directory file header


def package_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_zip(data: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise a one-line SpecError unless ``data`` is a zip that unpacks safely within the caps.

    First the archive's own directory is measured (:func:`measure`: constant memory, at most
    ``max_package_entries`` records looked at), so zipfile never parses more than the caps allow;
    then every entry is read in full (streamed), which checks its CRC-32, its declared size and
    that its local header names the same file as the directory."""
    if len(data) > limits.max_package_bytes:
        raise SpecError(
            f"the package has {len(data):,} bytes; at most {limits.max_package_bytes:,}", field=FIELD
        )
    measure(data, limits)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
            for info in infos:
                why = entry_problem(info.filename, info.external_attr)
                if why is not None:
                    raise SpecError(why, field=FIELD)
            for info in infos:
                _verify(zf, info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, NotImplementedError) as err:
        raise SpecError(f"the package is not a readable zip file ({err})", field=FIELD) from err


def _verify(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """Read one entry to its end: zipfile checks the CRC-32 there, and the bytes must be as many
    as the directory declared (what the hosts' unpack would otherwise meet)."""
    if info.is_dir():
        return
    if info.flag_bits & 0x1:
        raise SpecError(
            f"entry {info.filename[:120]!r} is encrypted; pack it without a password", field=FIELD
        )
    got = 0
    with zf.open(info) as src:  # BadZipFile when the local header names another file
        while chunk := src.read(1 << 20):
            got += len(chunk)
    if got != info.file_size:
        raise SpecError(
            f"entry {info.filename[:120]!r} declares {info.file_size:,} bytes but holds {got:,}", field=FIELD
        )


def measure(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[int, int]:
    """The entry count and unpacked bytes of the zip ``data``, read from its end-of-central-directory
    record (zip64 too) and its directory's fixed-size records, without building anything per entry;
    SpecError when the directory claims or holds more than the caps. Returns (entries, bytes)."""
    start, size, claimed = _directory(data)
    if claimed > limits.max_package_entries:
        raise SpecError(f"{claimed:,} entries; at most {limits.max_package_entries:,}", field=FIELD)
    if size > limits.max_package_entries * MAX_RECORD_BYTES:
        raise SpecError(
            f"a directory of {size:,} bytes; at most {limits.max_package_entries * MAX_RECORD_BYTES:,} "
            f"for {limits.max_package_entries:,} entries",
            field=FIELD,
        )
    entries = total = 0
    pos, end = start, start + size
    while pos < end:
        if pos + _CDIR.size > len(data) or data[pos : pos + 4] != b"PK\x01\x02":
            raise SpecError("the package is not a readable zip file (a broken directory)", field=FIELD)
        rec = _CDIR.unpack_from(data, pos)
        entries += 1
        if entries > limits.max_package_entries:
            raise SpecError(f"over {limits.max_package_entries:,} entries (the cap)", field=FIELD)
        extra = pos + _CDIR.size + rec[12]
        total += _unpacked_size(data, rec[11], extra, rec[13])
        if total > limits.max_package_unpacked_bytes:
            raise SpecError(
                f"unpacked, the package has over {limits.max_package_unpacked_bytes:,} bytes (the cap)",
                field=FIELD,
            )
        pos = extra + rec[13] + rec[14]
    return entries, total


def _directory(data: bytes) -> tuple[int, int, int]:
    """(start, size, entries claimed) of the central directory, found as zipfile finds it."""
    bad = SpecError("the package is not a readable zip file (no end of central directory)", field=FIELD)
    at = len(data) - _EOCD.size
    if at < 0:
        raise bad
    if data[at : at + 4] != b"PK\x05\x06" or data[-2:] != b"\0\0":
        at = data.rfind(b"PK\x05\x06", max(0, len(data) - _EOCD.size - 0xFFFF))
        if at < 0 or at + _EOCD.size > len(data):
            raise bad
    _, _, _, _, claimed, size, _, _ = _EOCD.unpack_from(data, at)
    loc = at - _LOC64.size
    if loc >= 0 and data[loc : loc + 4] == b"PK\x06\x07":
        rec64 = loc - _EOCD64.size
        if rec64 < 0 or data[rec64 : rec64 + 4] != b"PK\x06\x06":
            raise bad
        fields = _EOCD64.unpack_from(data, rec64)
        claimed, size, at = fields[7], fields[8], rec64
    start = at - size
    if start < 0:
        raise SpecError("the package is not a readable zip file (a directory past its start)", field=FIELD)
    return start, size, claimed


def _unpacked_size(data: bytes, size: int, extra: int, extra_len: int) -> int:
    """A directory record's uncompressed size; 0xFFFFFFFF means it is in the zip64 extra field."""
    if size != 0xFFFFFFFF:
        return int(size)
    pos, end = extra, min(extra + extra_len, len(data))
    while pos + 4 <= end:
        tag, length = struct.unpack_from("<HH", data, pos)
        if tag == 1 and length >= 8 and pos + 12 <= end:
            return int(struct.unpack_from("<Q", data, pos + 4)[0])
        pos += 4 + length
    raise SpecError("the package is not a readable zip file (a zip64 size without its field)", field=FIELD)


def pack(
    directory: Path,
    limits: Limits = DEFAULT_LIMITS,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> bytes:
    """``directory`` as a zip (deflated), without ``.git``, ``__pycache__``, ``.venv`` and tool caches.

    Symbolic links are skipped (the server refuses them). Raises SpecError before compressing when
    the files add up to more than the package cap, and after when the zip does.
    """
    if not directory.is_dir():
        raise SpecError(f"{directory} is not a directory", field="--working-dir")
    files = list(_walk(directory))
    total = sum(size for _, size in files)
    if total > limits.max_package_unpacked_bytes or len(files) > limits.max_package_entries:
        raise SpecError(
            f"{directory} has {len(files):,} files and {total:,} bytes; a package holds at most "
            f"{limits.max_package_entries:,} files and {limits.max_package_unpacked_bytes:,} bytes",
            field="--working-dir",
        )
    buf = io.BytesIO()
    done = 0
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path, size in files:
            try:
                zf.write(path, path.relative_to(directory).as_posix())
            except OSError as err:  # gone since the walk, unreadable, or a file of /proc
                raise SpecError(
                    f"cannot pack {path}: {err.strerror or err}; make it a readable file or leave it out",
                    field="--working-dir",
                ) from None
            done += size
            if progress is not None:
                progress(done, total)
            if buf.tell() > limits.max_package_bytes:
                break
    data = buf.getvalue()
    if len(data) > limits.max_package_bytes:
        raise SpecError(
            f"{directory} packs to more than {limits.max_package_bytes:,} bytes, the package cap; "
            "leave data out of the working directory (read it from a bucket instead)",
            field="--working-dir",
        )
    return data


def _walk(directory: Path) -> list[tuple[Path, int]]:
    """The regular files under ``directory``, none skipped silently: a directory it cannot list is a
    SpecError (os.walk would leave it out of the package); one gone since it was listed is left out.
    """

    def unlisted(err: OSError) -> None:
        if isinstance(err, FileNotFoundError):
            return  # removed since its parent was listed
        raise SpecError(
            f"cannot list {err.filename}: {err.strerror or err}; make it readable or leave it out",
            field="--working-dir",
        )

    out: list[tuple[Path, int]] = []
    for root, dirs, names in os.walk(directory, onerror=unlisted):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIPPED_DIRS and not os.path.islink(os.path.join(root, d))
        )
        for name in sorted(names):
            path = Path(root, name)
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue  # removed since it was listed: nothing to pack
            if stat.S_ISREG(st.st_mode):
                out.append((path, st.st_size))
    return out

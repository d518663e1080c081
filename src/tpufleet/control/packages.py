"""Working-directory packages: a zip the client packs from its own directory and uploads.

The control plane never reads its own disk on a tenant's behalf; a job's ``working_dir`` is either
the id of a package its tenant uploaded (``sha256:<64 hex>``, the digest of the zip) or a URL the
operator allow-listed. :func:`check_zip` is what the store runs on every upload, before storing it:
a size cap, a real zip, an entry count cap, a cap on the unpacked size, and no entry that could
land outside the directory it is unpacked into or is not a plain file (``jobfiles.entry_problem``,
the rule the hosts apply again when they unpack). :func:`pack`
is the client's side (``tpufleet submit --working-dir DIR``).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path

from tpufleet.control.jobfiles import entry_problem
from tpufleet.control.records import DEFAULT_LIMITS, Limits
from tpufleet.errors import SpecError

SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
FIELD = "working_dir"


def package_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_zip(data: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise a one-line SpecError unless ``data`` is a zip that unpacks safely within the caps."""
    if len(data) > limits.max_package_bytes:
        raise SpecError(
            f"the package has {len(data):,} bytes; at most {limits.max_package_bytes:,}", field=FIELD
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, NotImplementedError) as err:
        raise SpecError(f"the package is not a readable zip file ({err})", field=FIELD) from err
    if len(infos) > limits.max_package_entries:
        raise SpecError(f"{len(infos):,} entries; at most {limits.max_package_entries:,}", field=FIELD)
    total = 0
    for info in infos:
        why = entry_problem(info.filename, info.external_attr)
        if why is not None:
            raise SpecError(why, field=FIELD)
        total += info.file_size
        if total > limits.max_package_unpacked_bytes:
            raise SpecError(
                f"unpacked, the package has over {limits.max_package_unpacked_bytes:,} bytes (the cap)",
                field=FIELD,
            )


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
            zf.write(path, path.relative_to(directory).as_posix())
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
    out: list[tuple[Path, int]] = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIPPED_DIRS and not os.path.islink(os.path.join(root, d))
        )
        for name in sorted(names):
            path = Path(root, name)
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                out.append((path, st.st_size))
    return out

"""Package uploads a hostile tenant cannot use against the control plane (issue 28): the archive's
directory is measured before zipfile parses it (bounded memory however many records it holds or
claims), an entry whose header lies about its size, CRC-32 or name is refused at upload, a tenant's
packages share a quota, and a package no live job uses is collected."""

from __future__ import annotations

import io
import os
import re
import struct
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_api import Api

from tpufleet.api.app import create_app
from tpufleet.control.cluster.memory import FakeClock
from tpufleet.control.store import packages
from tpufleet.control.store import values as r
from tpufleet.control.store.facade import Store
from tpufleet.control.store.values import Limits
from tpufleet.errors import ConflictError, NotFoundError, SpecError

ZIP = {"Content-Type": "application/zip"}
HOUR = 3600.0


def raw_zip(records: int, *, claim: int | None = None) -> bytes:
    """A zip64 archive of ``records`` empty entries, built record by record (zipfile takes seconds
    for this many), whose end-of-directory records claim ``claim`` entries (default: the truth)."""
    cdir = b"".join(
        struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0)
        + b"%07d" % i
        for i in range(records)
    )
    n = records if claim is None else claim
    eocd64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, len(cdir), 0)
    loc64 = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(cdir), 1)
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return cdir + eocd64 + loc64 + eocd


def peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
    except SpecError:
        pass
    else:
        raise AssertionError("the package was accepted")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (raw_zip(0, claim=2_000_000), "2,000,000 entries; at most 20,000"),  # a forged EOCD
        (raw_zip(200_000), "200,000 entries; at most 20,000"),
        (raw_zip(200_000, claim=1), "over 20,000 entries (the cap)"),  # a directory that lies about its count
    ],
    ids=["forged-2M", "200k-records", "200k-records-claiming-1"],
)
def test_a_huge_directory_is_refused_in_bounded_memory(data: bytes, says: str) -> None:
    """Today's check let zipfile build a ZipInfo per record first (the 1.9M-record upload: 1 GB
    of RSS); the 2M claim over an empty directory was even accepted."""
    with pytest.raises(SpecError, match=re.escape(says)):
        packages.check_zip(data)
    assert peak_bytes(lambda: packages.check_zip(data)) < 1 << 20


def test_a_directory_larger_than_its_entries_could_need_is_refused() -> None:
    data = raw_zip(400, claim=1)  # 400 records of 53 bytes; 10 allowed: at most 10 KiB of them
    with pytest.raises(SpecError, match="a directory of 21,200 bytes; at most 10,240"):
        packages.check_zip(data, Limits(max_package_entries=10))


def _stored(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _lie_about_size(data: bytes, size: int) -> bytes:
    """Set the one entry's uncompressed size, in its local header and the directory, to ``size``."""
    out = bytearray(data)
    local = out.index(b"PK\x03\x04")
    struct.pack_into("<L", out, local + 22, size)
    central = out.index(b"PK\x01\x02")
    struct.pack_into("<L", out, central + 24, size)
    return bytes(out)


def test_entries_that_lie_about_their_bytes_or_name_are_refused_at_upload() -> None:
    """Accepted today (only the directory was read): the hosts' unpack then died on them."""
    good = _stored({"train.py": b"print('hello')\n" * 20})
    packages.check_zip(good)
    flipped = good.replace(b"hello", b"HELLO", 1)  # the CRC-32 no longer matches
    with pytest.raises(SpecError, match="Bad CRC-32"):
        packages.check_zip(flipped)
    longer = _lie_about_size(good, 10_000)  # declares more bytes than it holds
    with pytest.raises(SpecError, match="declares 10,000 bytes but holds 300"):
        packages.check_zip(longer)
    renamed = bytearray(good)
    at = renamed.index(b"train.py")  # the local header's name, not the directory's
    renamed[at : at + 8] = b"../x.py\0"[:8]
    with pytest.raises(SpecError, match="differ"):
        packages.check_zip(bytes(renamed))


def test_an_encrypted_entry_is_a_clear_400_not_a_500() -> None:
    """Accepted today (the hosts could not unpack it); read without this check: a RuntimeError, a 500."""
    out = bytearray(_stored({"a.txt": b"secret"}))
    for sig, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        out[out.index(sig) + flag_at] |= 0x1
    with pytest.raises(SpecError, match="is encrypted"):
        packages.check_zip(bytes(out))


def test_a_deflated_entry_whose_crc_lies_is_refused() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", b"x" * 5000)
    out = bytearray(buf.getvalue())
    for sig, crc_at in ((b"PK\x03\x04", 14), (b"PK\x01\x02", 16)):
        at = out.index(sig) + crc_at
        out[at] ^= 0xFF
    with pytest.raises(SpecError, match=r"not a readable zip file .*CRC"):
        packages.check_zip(bytes(out))


def _store(store: Store, quota: int) -> Store:
    store.limits = Limits(package_quota_bytes=quota)
    store.tenants.create("team-a", {"v4": 16})
    return store


def test_a_tenants_packages_share_its_quota(store: Store) -> None:
    """No quota today: three 99 MiB uploads grew the database by 300 MB."""
    one, two, three = (_stored({"f.bin": bytes([i]) * 4000}) for i in range(3))
    _store(store, quota=len(one) + len(two) + 10)
    store.packages.put("team-a", one)
    store.packages.put("team-a", two)
    assert store.packages.put("team-a", one) == packages.package_id(one)  # the same bytes again: no-op
    with pytest.raises(ConflictError, match=r"over the package quota .*serve --package-quota-mib"):
        store.packages.put("team-a", three)
    store.tenants.create("team-b", {"v4": 16})
    store.packages.put("team-b", three)  # another tenant's quota is its own


def test_the_quota_is_a_409_on_the_api(store: Store) -> None:
    api = Api(store)
    api.http = TestClient(create_app(store, limits=Limits(package_quota_bytes=5000)))
    token = api.tenant("team-a", v4=16)
    first = api.call("POST", "/packages", token, content=_stored({"a": b"1" * 3000}), headers=ZIP)
    assert first.status_code == 201, first.text
    over = api.call("POST", "/packages", token, content=_stored({"b": b"2" * 3000}), headers=ZIP)
    assert over.status_code == 409 and "serve --package-quota-mib" in over.json()["error"]
    spec = api.http.get("/openapi.json").json()
    assert "409" in spec["paths"]["/api/v1/packages"]["post"]["responses"]


def test_a_package_no_live_job_uses_is_collected_an_hour_after_its_last_use(
    store: Store, clock: FakeClock
) -> None:
    """Packages were never deleted today."""
    _store(store, quota=1 << 30)
    used, unused = _stored({"train.py": b"1"}), _stored({"other.py": b"2"})
    used_id, unused_id = store.packages.put("team-a", used), store.packages.put("team-a", unused)
    req = r.JobRequest.build(command=["python", "train.py"], accelerator_type="v4-16", working_dir=used_id)
    job = store.jobs.submit("team-a", req)
    assert store.packages.collect() == 0  # both just uploaded
    clock.advance(2 * HOUR)
    assert store.packages.collect("team-a") == 1  # the unused one; the queued job's stays
    with pytest.raises(NotFoundError):
        store.packages.get("team-a", unused_id)
    store.jobs.request_cancel(job.id)
    clock.advance(HOUR / 2)
    assert store.packages.collect() == 0 and store.packages.get("team-a", used_id) == used  # ended 30 min ago
    clock.advance(HOUR)
    store.packages.put("team-a", _stored({"next.py": b"3"}))  # an upload collects the tenant's unused ones
    with pytest.raises(NotFoundError):
        store.packages.get("team-a", used_id)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
def test_a_directory_whose_files_cannot_be_read_is_one_line_naming_the_file() -> None:
    """`submit --working-dir /proc/self` ended in a FileNotFoundError traceback (an entry of /proc
    gone between the walk and the read); a file that lists but cannot be read is named instead."""
    with pytest.raises(
        SpecError, match=r"^--working-dir: cannot pack /proc/self/\S+: .+; make it a readable"
    ):
        packages.pack(Path("/proc/self"))


def test_symlinks_fifos_and_vanished_entries_are_left_out_of_the_package(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    os.mkfifo(tmp_path / "fifo")  # reading it would block the packer forever
    (tmp_path / "secret").symlink_to("/etc/hostname")  # outside the directory: never followed
    (tmp_path / "loop").symlink_to("..")
    with zipfile.ZipFile(io.BytesIO(packages.pack(tmp_path))) as zf:
        assert zf.namelist() == ["train.py"]

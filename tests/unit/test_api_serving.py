"""What one ``tpufleet serve`` holds (``api/serving.py``): the lock on its state dir, naming its holder,
and its port, bound before anything starts. In one process: two flocks on two open files of the same
lock conflict as two processes' would (tests/host/test_cli_context.py runs two real serves)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpufleet.api.serving import Holder, StateDirLock, holder, listen, lock_state_dir, url_of
from tpufleet.errors import ConflictError, SpecError


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[StateDirLock]:
    lock = lock_state_dir(tmp_path / "state")
    yield lock
    lock.release()


def test_a_second_lock_names_the_holder_in_one_line(locked: StateDirLock, tmp_path: Path) -> None:
    locked.note("http://127.0.0.1:8600")
    with pytest.raises(ConflictError) as err:
        lock_state_dir(tmp_path / "state")
    said = str(err.value)
    assert f"PID {os.getpid()}" in said and "http://127.0.0.1:8600" in said and "--state-dir" in said
    assert f"kill {os.getpid()}" in said and str(tmp_path / "state") in said and "\n" not in said
    assert err.value.exit_code == 2


def test_the_lock_is_released_with_its_descriptor_and_never_inherited(
    locked: StateDirLock, tmp_path: Path
) -> None:
    assert not os.get_inheritable(locked.fileno())  # a child (a Ray process, an exec) never keeps it
    assert holder(tmp_path / "state") == Holder(os.getpid(), None)
    locked.release()
    assert holder(tmp_path / "state") is None  # the file stays; it means nothing unless locked
    again = lock_state_dir(tmp_path / "state")
    again.release()


def test_no_holder_where_no_serve_ever_ran(tmp_path: Path) -> None:
    assert holder(tmp_path / "missing") is None


def test_a_taken_port_is_one_line_naming_the_port_and_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConflictError) as err:
            listen("127.0.0.1", port)
    said = str(err.value)
    assert f"port {port}" in said and "--port" in said and "\n" not in said


def test_an_address_not_of_this_machine_is_one_line() -> None:
    with pytest.raises(SpecError) as err:
        listen("192.0.2.1", 0)  # TEST-NET-1: never a local address
    assert "192.0.2.1" in str(err.value) and "--host" in str(err.value)


@pytest.mark.parametrize(("host", "shown"), [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1")])
def test_port_0_is_a_free_port_and_the_url_names_it(host: str, shown: str) -> None:
    sock = listen(host, 0)
    try:
        assert url_of(host, sock) == f"http://{shown}:{sock.getsockname()[1]}"
        assert sock.getsockname()[1] != 0
    finally:
        sock.close()

"""The emulated fleet's Ray auth token: how it is written, read and handed to processes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tpufleet.emulator import auth
from tpufleet.errors import ClusterError


def test_a_new_token_is_random_hex() -> None:
    a, b = auth.new_token(), auth.new_token()
    assert a != b and len(a) == 64 and int(a, 16) >= 0


def test_the_token_file_is_0600_whatever_the_umask_and_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "state" / auth.TOKEN_FILE
    old = os.umask(0)
    try:
        auth.write_token(path, "first")
        auth.write_token(path, "second")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.read_token(path) == "second"
    assert [p.name for p in path.parent.iterdir()] == [auth.TOKEN_FILE]  # no temp file left


def test_a_missing_or_empty_token_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no Ray auth token"):
        auth.read_token(tmp_path / "gone")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ClusterError, match="empty"):
        auth.read_token(tmp_path / "empty")


def test_processes_get_the_token_by_path_never_by_value(tmp_path: Path) -> None:
    path = tmp_path / auth.TOKEN_FILE
    expected = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}
    assert auth.client_env(path) == auth.server_env(path) == expected
    assert set(auth.WORKER_VARS) == set(expected)
    assert auth.TOKEN_VAR not in auth.server_env(path)

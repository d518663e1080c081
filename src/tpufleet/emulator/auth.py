"""Ray token authentication for an emulated fleet.

Without it anything that can reach the GCS port (a tenant's job on a host finds the address in
``ps``) could ``ray.init`` and run code as the fleet's user. Every process the emulator starts gets
``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH=<state_dir>/ray-auth-token``: Ray (2.52+) then
requires ``authorization: Bearer <token>`` on every gRPC call to the GCS, raylets, workers and the
Ray client server, and on the dashboard agents' HTTP APIs (job submission included). The token is
32 random bytes (hex), written 0600 at ``up``, and passed by *path* only: it is never on a command
line, and Ray's worker processes inherit only the two variables above (not the token itself).

A client connects with the same two variables (:func:`client_env`). Ray keeps one token per
process (``AuthenticationTokenLoader`` is a singleton) and a driver that is still connected aborts
the whole process if the token changes under it, so :func:`activate` refuses to switch tokens while
``ray.is_initialized()``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from tpufleet.errors import ClusterError

MODE_VAR = "RAY_AUTH_MODE"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
TOKEN_VAR = "RAY_AUTH_TOKEN"  # Ray reads it before the path; we never set it, and drop it on activate
TOKEN_FILE = "ray-auth-token"

# What every Ray process of an emulated host (raylet, agents, and the worker processes that run
# tasks and actors) has in its environment. A job process must get neither.
WORKER_VARS = (MODE_VAR, TOKEN_PATH_VAR)


def _raylet() -> Any:
    """``ray._raylet`` (untyped): the token loader, the auth mode and Ray's config."""
    import importlib

    return importlib.import_module("ray._raylet")


def new_token() -> str:
    return secrets.token_hex(32)


def write_token(path: Path, token: str) -> None:
    """Write ``token`` to ``path``, created 0600 (never briefly wider), replacing any old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, token.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise ClusterError(f"no Ray auth token at {path}: is the emulated fleet up?") from None
    if not token:
        raise ClusterError(f"the Ray auth token file {path} is empty")
    return token


def client_env(token_path: Path) -> dict[str, str]:
    """What a process needs in its environment, before ``ray.init``, to talk to the fleet."""
    return {MODE_VAR: "token", TOKEN_PATH_VAR: str(token_path)}


def server_env(token_path: Path) -> dict[str, str]:
    """What every ``ray start`` of the fleet (head and hosts) gets; their workers inherit it."""
    return client_env(token_path)


def active_token() -> str | None:
    """The token Ray in this process authenticates with now, or None when auth is off for it."""
    raylet = _raylet()
    if raylet.get_authentication_mode() != raylet.AuthenticationMode.TOKEN:
        return None
    loader = raylet.AuthenticationTokenLoader.instance()
    try:
        return str(loader.get_raw_token()) if loader.has_token() else None
    except Exception:  # ray.exceptions.AuthenticationError: a token path that is gone
        return None


def _env_token() -> str | None:
    """The token this process's environment names (what its subprocesses will use)."""
    if os.environ.get(MODE_VAR) != "token":
        return None
    if os.environ.get(TOKEN_VAR):
        return os.environ[TOKEN_VAR]
    path = os.environ.get(TOKEN_PATH_VAR)
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def activate(token_path: Path) -> None:
    """Make this process (its Ray client, and every process it starts from now on) authenticate
    with the token in ``token_path``.

    Raises :class:`ClusterError` when this process is connected to Ray (``ray.init``) with another
    token: Ray cannot hold two, and switching would crash the connected driver.
    """
    import ray

    from tpufleet.emulator import raynodes

    token = read_token(token_path)
    path = str(token_path.absolute())
    if active_token() == token and _env_token() == token:
        return  # already so, maybe through another fleet's file holding the same token
    connected = ray.is_initialized()
    if connected and active_token() != token:
        address = ray.get_runtime_context().gcs_address
        raise ClusterError(
            f"this process is connected to the Ray cluster at {address} with another auth token; "
            "Ray holds one token per process: call ray.shutdown() first, or use a subprocess"
        )
    os.environ.pop(TOKEN_VAR, None)
    os.environ[MODE_VAR] = "token"
    os.environ[TOKEN_PATH_VAR] = path
    if not connected:
        _raylet().Config.initialize("")  # Ray read RAY_AUTH_MODE when it was imported; read it again
    loader = _raylet().AuthenticationTokenLoader.instance()
    loader.reset_cache()
    raynodes.forget()


def deactivate(token_path: Path) -> None:
    """Undo :func:`activate` for ``token_path`` (whose fleet is gone) when this process is not
    connected to Ray; otherwise leave everything as it is."""
    import ray

    from tpufleet.emulator import raynodes

    if os.environ.get(TOKEN_PATH_VAR) != str(token_path.absolute()) or ray.is_initialized():
        return
    for var in WORKER_VARS:
        os.environ.pop(var, None)
    _raylet().Config.initialize("")
    loader = _raylet().AuthenticationTokenLoader.instance()
    loader.reset_cache()
    raynodes.forget()

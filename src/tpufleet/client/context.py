"""The CLI context file, read and written: where the last ``emulate up`` and ``serve`` run.

The file is ``$TPUFLEET_CONFIG``, else ``$XDG_CONFIG_HOME/tpufleet/config.yaml``, else
``~/.config/tpufleet/config.yaml``: YAML, mode 0600, written atomically. It holds paths and
addresses, never a secret: tokens stay in their own 0600 files. The CLI (``cli/context.py``) keeps
it; the Python client (``slicemanager.py``) finds its server and admin token in it as the CLI does.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

from tpufleet._yamlpos import read_yaml
from tpufleet.errors import InputError

__all__ = ["Context", "config_path", "load", "save"]


@dataclass(frozen=True)
class Context:
    """What the last ``emulate up`` and ``serve`` recorded; None where nothing was."""

    emulator_state_dir: str | None = None  # emulate up --state-dir
    ray_address: str | None = None  # the emulated fleet's GCS address (or serve's --ray-address)
    server: str | None = None  # serve's URL, e.g. http://127.0.0.1:8600
    server_state_dir: str | None = None  # serve's --state-dir (database, admin token)
    admin_token_path: str | None = None  # a 0600 file; the token itself is never stored here


def config_path() -> Path:
    env = os.environ.get("TPUFLEET_CONFIG")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path("~/.config").expanduser()
    return Path(base) / "tpufleet" / "config.yaml"


def load() -> Context:
    """The remembered context (empty when there is no file); an InputError when it is unreadable."""
    path = config_path()
    try:
        data = yaml.safe_load(read_yaml(path)) or {}  # bounded: TPUFLEET_CONFIG may name anything
    except FileNotFoundError:
        return Context()
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InputError(f"{path}: cannot read the tpufleet context: {err}; fix or delete it") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: the tpufleet context is not a mapping; fix or delete it")
    known = {f.name for f in fields(Context)}
    return Context(**{k: str(v) for k, v in data.items() if k in known and v is not None})


def save(ctx: Context) -> None:
    """Write ``ctx`` (mode 0600, by rename); an InputError naming the file when it cannot be."""
    path = config_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("# written by tpufleet (emulate up, serve); paths only, never a token\n")
            yaml.safe_dump({k: v for k, v in asdict(ctx).items() if v is not None}, fh, sort_keys=False)
        tmp.replace(path)
    except OSError as err:
        raise InputError(f"{path}: cannot write the tpufleet context: {err.strerror or err}") from None

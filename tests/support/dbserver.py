"""A throwaway PostgreSQL server for the store tests (tests/conftest.py's ``postgres_server``).

The PostgreSQL server is Debian's (``scripts/ensure-test-services.sh`` installs it; ``make test``
runs that first). One server per pytest session on a free port, its unix socket and data in a
temporary directory, run as the ``postgres`` user when the tests run as root (PostgreSQL refuses
root), stopped by PID at the end.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tpufleet.control.store.facade import Store
from tpufleet.emulator import procs

PG_HINT = "run scripts/ensure-test-services.sh as root (apt-get install postgresql)"


def pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


class PostgresServer:
    """A throwaway PostgreSQL cluster; ``new_database()`` returns a SQLAlchemy URL."""

    def __init__(self, bindir: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tpufleet-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise RuntimeError(
                    "running as root and runuser is missing; PostgreSQL refuses to run as root"
                )
            shutil.chown(self.root, "postgres")
            self.as_user = [runuser, "-u", "postgres", "--"]
        initdb = [str(bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
        self._run([*initdb, "-E", "UTF8", "--no-sync"])
        self.log = open(self.root / "server.log", "w")  # noqa: SIM115  closed in stop()
        opts = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        self.proc = subprocess.Popen(
            [
                *self.as_user,
                str(bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                *opts,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._counter = itertools.count()
        self._template: str | None = None
        self._wait_ready()

    def _run(self, cmd: list[str]) -> None:
        out = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {out.stderr.strip()[-500:]}")

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.root / 'server.log').read_text()[-800:]}")
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def dsn(self, db: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={db}"

    def new_database(self, *, migrated: bool = False) -> str:
        """A fresh database: empty, or (``migrated``) with the schema at head, copied from a
        template made once per server, since building the schema is most of a store's start-up
        (about 0.2 s a test here, against 30 ms for the copy)."""
        template = self._migrated_template() if migrated else "template1"
        return self._create(f"t{os.getpid()}_{next(self._counter)}", template)

    def _create(self, name: str, template: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def _migrated_template(self) -> str:
        if self._template is None:
            url = self._create(f"head{os.getpid()}", "template1")
            Store.open(url).close()  # no connection may stay open on a template
            self._template = url.rsplit("/", 1)[1]
        return self._template

    def stop(self) -> None:
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text().split()[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the cluster is thrown away
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

"""Database URLs (``--db``): what is not one tpufleet can use is refused in one line, exit 2, naming
the forms it takes and never the rest of the URL (it may hold a password), where a traceback came
before (``mysql://``, ``sqlite:/x.db``, ``?timeout=abc``, no URL at all); and one reading of SQLite
URLs (``values.sqlite_target``, ``sqlite_in_memory``, ``sqlite_file``) for every place that asks:
the engine (one shared connection for an in-memory database, a private file otherwise), the
database's serve lock, and serve's refusal of an in-memory database for its API processes. Before,
each read the URL its own way, so a query string (``?timeout=5``) made the same in-memory database
a file to one of them and memory to another."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from tpufleet.api.serving import lock_database
from tpufleet.cli import main
from tpufleet.control.store.database import make_engine
from tpufleet.control.store.values import check_db_url, sqlite_file, sqlite_in_memory, sqlite_target
from tpufleet.errors import SpecError

FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql+psycopg://USER@HOST/DB"
BAD = [
    (
        "mysql://root:hunter2@127.0.0.1/fleet",
        f"--db takes SQLite or PostgreSQL through psycopg ({FORMS}), not mysql://",
    ),
    ("postgresql+psycopg2://u:hunter2@h/d", "not postgresql+psycopg2://"),  # a driver not shipped
    ("fleet.db", f"--db takes a URL such as {FORMS}; this one has no scheme://"),
    ("sqlite:/fleet.db", "this one has no scheme://"),
    (
        "sqlite://fleet.db",
        "a SQLite --db is sqlite:///relative/path.db, sqlite:////absolute/path.db or sqlite://",
    ),
]


@pytest.mark.parametrize(("url", "says"), BAD)
def test_a_url_tpufleet_cannot_use_is_named_by_its_forms_not_echoed(url: str, says: str) -> None:
    with pytest.raises(SpecError) as err:
        check_db_url(url)
    assert says in str(err.value) and "hunter2" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecError):
        make_engine(url)  # the engine asks the same, whoever calls it


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite:///f.db?timeout=5", "sqlite:////srv/f.db", "postgresql://u@h/d",
            "postgresql+psycopg://u:p@h:5432/d", "sqlite+pysqlite:///f.db"],
)  # fmt: skip
def test_the_forms_tpufleet_uses_pass(url: str) -> None:
    assert check_db_url(url) == url


def _exit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    return int(exit_.value.code or 0), capsys.readouterr().err.strip()


@pytest.mark.parametrize(("url", "says"), [*BAD, ("sqlite:///{tmp}/f.db?timeout=abc", "settings are not")])
def test_serve_and_db_refuse_a_bad_url_in_one_line_exit_2(
    url: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url.format(tmp=tmp_path)
    state = str(tmp_path / "state")
    serve = ("serve", "--sandbox", "v4-16", "--port", "0", "--state-dir", state, "--db", url)
    for argv in (serve, ("db", "upgrade", "--db", url), ("db", "current", "--db", url)):
        code, err = _exit(capsys, *argv)
        assert code == 2 and err.startswith("error: ") and says in err, (argv, err)
        assert "\n" not in err and "Traceback" not in err and "hunter2" not in err
    assert not list(tmp_path.rglob("*.db*"))  # nothing was created or locked


def test_chaos_replicas_refuse_a_bad_url_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _exit(capsys, "chaos", "--replicas", "2", "--db", "mysql://u:hunter2@h/d")
    assert code == 2 and err.startswith("error: --db takes SQLite or PostgreSQL") and "not mysql://" in err
    assert "\n" not in err and "hunter2" not in err


@pytest.mark.parametrize(
    ("url", "target", "memory", "file"),
    [
        ("sqlite://", "", True, None),
        ("sqlite:///:memory:", ":memory:", True, None),
        ("sqlite:///:memory:?timeout=5", ":memory:", True, None),
        ("sqlite:///fleet.db", "fleet.db", False, "fleet.db"),
        ("sqlite:///fleet.db?timeout=5", "fleet.db", False, "fleet.db"),
        ("sqlite:////srv/fleet.db", "/srv/fleet.db", False, "/srv/fleet.db"),
        ("sqlite:///file:fleet.db?mode=ro&uri=true", "file:fleet.db", False, None),
        ("postgresql+psycopg://u@127.0.0.1/fleet", "u@127.0.0.1/fleet", False, None),
    ],
)
def test_one_reading_of_a_sqlite_url(url: str, target: str, memory: bool, file: str | None) -> None:
    assert sqlite_target(url) == target
    assert sqlite_in_memory(url) is memory
    assert sqlite_file(url) == file


def test_an_in_memory_database_with_a_query_is_one_database_for_every_connection() -> None:
    # make_engine took this for a file and gave SQLAlchemy's one-connection-per-thread pool of an
    # in-memory database a file's pool sizes: a TypeError (a traceback from serve --db)
    engine = make_engine("sqlite:///:memory:?timeout=5")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (7)"))
        seen: list[int] = []

        def read() -> None:  # another thread, as the API's and the loop's are
            with engine.connect() as conn:
                seen.append(conn.execute(text("SELECT x FROM t")).scalar_one())

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(10)
        assert seen == [7]
    finally:
        engine.dispose()


def test_a_database_file_is_made_private_and_locked_and_memory_is_neither(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    engine = make_engine(f"sqlite:///{path}?timeout=5")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lock = lock_database(f"sqlite:///{path}?timeout=5")
    assert lock is not None and (tmp_path / "fleet.db.serve.lock").exists()
    lock.release()
    assert lock_database("sqlite:///:memory:?timeout=5") is None
    assert lock_database("sqlite://") is None


def test_db_commands_refuse_a_state_dir_they_cannot_make_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / "state"  # under a file: no directory can be made there
    for command in ("current", "upgrade"):
        code, err = _exit(capsys, "db", command, "--state-dir", str(bad))
        # a traceback before; now what serve says of a state dir it cannot use
        assert (code, err) == (2, f"error: cannot use the state dir {bad}: Not a directory")

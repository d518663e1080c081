"""Schema migrations (``control/store/migrations``), on SQLite and PostgreSQL: every revision, the
upgrade of a database written before this round (with rows in it, read back through ``Store``),
one written before migrations existed, one from a newer tpufleet, ``serve`` and ``tpufleet db``."""

from __future__ import annotations

from pathlib import Path

import pytest
import schema_f6094b2 as old
from alembic.autogenerate import compare_metadata, produce_migrations, render_python_code
from alembic.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import Engine, MetaData, create_engine, inspect, text
from sqlalchemy.orm import Session

from tpufleet.api.server import ControlPlane
from tpufleet.cli import command, main
from tpufleet.control.cluster.memory import MemoryCluster
from tpufleet.control.store import migrations
from tpufleet.control.store.database import make_engine
from tpufleet.control.store.facade import Store
from tpufleet.control.store.tables import Base
from tpufleet.control.store.tokens import token_hash
from tpufleet.errors import ClusterError

HEAD = migrations.head()
NOW = 1_700_000_000.0


@pytest.fixture
def engine(empty_db_url: str):  # type: ignore[no-untyped-def]
    e = make_engine(empty_db_url)
    yield e
    e.dispose()


def schema_diffs(engine: Engine, metadata: MetaData) -> str:
    """What Alembic's autogenerate would still do to make the database match ``metadata`` (types
    and server defaults included), as the Python code of the missing operations; "" when none."""
    with engine.connect() as conn:
        opts = {"compare_type": True, "compare_server_default": True}
        ctx = MigrationContext.configure(conn, opts=opts)
        if not compare_metadata(ctx, metadata):
            return ""
        return render_python_code(produce_migrations(ctx, metadata).upgrade_ops)


def revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return migrations.current(conn)


def tables(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names())


# -- every revision gives exactly the schema it should ----------------------------------------
def test_the_revisions_are_one_line_from_the_baseline_to_head() -> None:
    script = migrations.script_directory()
    chain = [s.revision for s in script.walk_revisions()]
    assert chain[-1] == migrations.BASELINE and chain[0] == HEAD
    assert script.get_heads() == [HEAD] and len(set(chain)) == len(chain)


def test_the_baseline_revision_is_the_schema_before_this_round(engine: Engine, empty_db_url: str) -> None:
    done = migrations.upgrade(engine, empty_db_url, to=migrations.BASELINE)
    assert (done.before, done.after) == (None, migrations.BASELINE)
    assert schema_diffs(engine, old.Base.metadata) == ""
    missing = schema_diffs(engine, Base.metadata)  # the comparison does see this round's changes
    assert "'packages'" in missing and "'truncated'" in missing and "'note'" in missing


def test_every_revision_from_nothing_gives_the_schema_the_code_describes(
    engine: Engine, empty_db_url: str
) -> None:
    migrations.upgrade(engine, empty_db_url, to=HEAD)
    assert revision(engine) == HEAD
    assert schema_diffs(engine, Base.metadata) == ""


def test_a_fresh_database_is_created_at_head(engine: Engine, empty_db_url: str) -> None:
    done = migrations.upgrade(engine, empty_db_url)
    assert (done.before, done.after, done.how) == (None, HEAD, "created")
    assert revision(engine) == HEAD and schema_diffs(engine, Base.metadata) == ""
    again = migrations.upgrade(engine, empty_db_url)
    assert (again.before, again.after, again.how) == (HEAD, HEAD, "current")


# -- a database written before this round, with rows in it ------------------------------------
def fill_baseline(engine: Engine) -> dict[str, str]:
    """One tenant with a token, a job that failed its first attempt and runs its second (one
    slice of two hosts, logs stored for both attempts), events: what a fleet of f6094b2 stored."""
    token = "tf_old-token"
    with Session(engine) as s, s.begin():
        s.add(old.TenantRow(name="team-a", quota={"v4": 16}, weight=1.0, created_at=NOW))
        s.flush()
        s.add(old.TokenRow(token_hash=token_hash(token), tenant="team-a", created_at=NOW))
        s.add(
            old.JobRow(
                id="0000abcd", tenant="team-a", name="train", command=["python", "t.py"],
                accelerator_type="v4-16", num_slices=1, priority=0, max_retries=2, env={"A": "1"},
                working_dir=None, state="RUNNING", attempt=2, failures=1, slices=["tpu-v4-16-0"],
                submitted_at=NOW, admit_seq=2, admitted_at=NOW + 5, started_at=NOW + 6, updated_at=NOW + 6,
            )
        )  # fmt: skip
        s.add(
            old.SliceRow(
                name="tpu-v4-16-0", accelerator_type="v4-16", topology="2x2x2", expected_hosts=2,
                state="HELD", holder="0000abcd", hosts=[], problems=[], updated_at=NOW,
            )
        )  # fmt: skip
        for n, state in ((1, "FAILED"), (2, "RUNNING")):
            s.add(
                old.AttemptRow(
                    job_id="0000abcd", attempt=n, slices=["tpu-v4-16-0"], state=state,
                    exit_codes=[], admitted_at=NOW + n, started_at=NOW + n,
                )
            )  # fmt: skip
            for host in (0, 1):
                data = f"attempt {n} host {host}\n"
                s.add(
                    old.LogCursorRow(
                        job_id="0000abcd", attempt=n, host=host, slice="tpu-v4-16-0", worker_id=host,
                        cluster_offset=len(data), stored=len(data), complete=n == 1,
                    )
                )  # fmt: skip
                s.add(old.LogChunkRow(job_id="0000abcd", attempt=n, host=host, start=0, data=data))
        s.add(old.EventRow(job_id="0000abcd", at=NOW, kind="submit", message="submitted by team-a"))
    return {"token": token, "job": "0000abcd"}


def assert_readable(store: Store, made: dict[str, str]) -> None:
    assert store.tokens.authenticate(made["token"]).tenant == "team-a"
    assert [(t.name, t.quota) for t in store.tenants.all()] == [("team-a", {"v4": 16})]
    job = store.jobs.get(made["job"], tenant="team-a")
    assert (job.state, job.attempt, job.command, job.env) == ("RUNNING", 2, ("python", "t.py"), {"A": "1"})
    for n in (1, 2):
        got = store.jobs.read_logs(made["job"], attempt=n)
        assert [(h.host, h.data, h.complete, h.truncated, h.note) for h in got.hosts] == [
            (host, f"attempt {n} host {host}\n", n == 1, False, None) for host in (0, 1)
        ]
    assert [s.name for s in store.slices.all()] == ["tpu-v4-16-0"]
    assert [e["kind"] for e in store.events(made["job"])] == ["submit"]


@pytest.mark.parametrize("written", ["at-baseline-revision", "before-migrations"])
def test_a_baseline_database_with_rows_upgrades_and_every_row_stays_readable(
    written: str, engine: Engine, empty_db_url: str
) -> None:
    if written == "before-migrations":  # what f6094b2 did on start: create_all, no version table
        old.Base.metadata.create_all(engine)
    else:
        migrations.upgrade(engine, empty_db_url, to=migrations.BASELINE)
    made = fill_baseline(engine)

    store = Store(empty_db_url)
    try:
        done = store.upgrade()
        assert (done.before, done.after) == (migrations.BASELINE, HEAD)
        assert done.how == ("stamped" if written == "before-migrations" else "upgraded")
        assert revision(engine) == HEAD and schema_diffs(engine, Base.metadata) == ""
        assert_readable(store, made)
        package = store.packages.put("team-a", b"PK\x05\x06" + bytes(18))  # the new table works
        assert store.packages.get("team-a", package) == b"PK\x05\x06" + bytes(18)
    finally:
        store.close()


def test_a_database_written_by_this_round_before_migrations_is_adopted(
    engine: Engine, empty_db_url: str
) -> None:
    """Between f6094b2 and migrations, tpufleet's create_all already made ``packages`` and the new
    ``log_cursors`` columns; stamping such a database as the baseline must not trip over them."""
    Base.metadata.create_all(engine)
    done = migrations.upgrade(engine, empty_db_url)
    assert (done.before, done.after, done.how) == (migrations.BASELINE, HEAD, "stamped")
    assert schema_diffs(engine, Base.metadata) == ""


def test_a_database_with_only_some_of_the_tables_is_refused(engine: Engine, empty_db_url: str) -> None:
    old.Base.metadata.tables["tenants"].create(engine)
    with pytest.raises(migrations.SchemaError, match="not attempts, events, jobs, log_chunks") as err:
        migrations.upgrade(engine, empty_db_url)
    assert "\n" not in str(err.value) and tables(engine) == {"tenants"}


# -- a newer tpufleet's database ------------------------------------------------------------------
def newer(empty_db_url: str) -> None:
    Store.open(empty_db_url).close()
    with create_engine(empty_db_url).begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))


def test_a_revision_from_a_newer_tpufleet_is_refused_in_one_line(empty_db_url: str, engine: Engine) -> None:
    newer(empty_db_url)
    for upgrade in (True, False):
        with pytest.raises(migrations.SchemaError) as err:
            Store.open(empty_db_url, upgrade=upgrade)
        message = str(err.value)
        assert "\n" not in message
        assert f"schema revision 0999, which this tpufleet does not know (its newest is {HEAD})" in message
        assert "a newer tpufleet wrote it" in message
    assert revision(engine) == "0999"


def test_an_older_schema_is_refused_without_upgrade_and_names_the_command(
    empty_db_url: str, engine: Engine
) -> None:
    migrations.upgrade(engine, empty_db_url, to=migrations.BASELINE)
    with pytest.raises(migrations.SchemaError, match=r"revision 0001 .* run `tpufleet db upgrade`$"):
        Store.open(empty_db_url, upgrade=False)
    assert revision(engine) == migrations.BASELINE


# -- no I/O in the constructor -------------------------------------------------------------------
def test_the_store_constructor_touches_no_database(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    Store(f"sqlite:///{path}").close()
    assert not path.exists()
    Store("postgresql+psycopg://nobody@127.0.0.1:1/nothing").close()  # nothing listens there


def test_open_says_when_the_database_cannot_be_reached() -> None:
    with pytest.raises(ClusterError, match=r"^cannot open the database postgresql\+psycopg://nobody") as err:
        Store.open("postgresql+psycopg://nobody@127.0.0.1:1/nothing?connect_timeout=2")
    assert "\n" not in str(err.value) and "Connection refused" in str(err.value)


# -- serve and the CLI ---------------------------------------------------------------------------
def test_the_control_plane_upgrades_an_older_schema_on_start(
    tmp_path: Path, empty_db_url: str, engine: Engine
) -> None:
    old.Base.metadata.create_all(engine)
    made = fill_baseline(engine)
    with ControlPlane(MemoryCluster.of("v4-16"), state_dir=tmp_path, db_url=empty_db_url) as cp:
        assert cp.store.schema_revision() == HEAD
        assert_readable(cp.store, made)


def test_db_upgrade_prints_from_and_to(tmp_path: Path, empty_db_url: str, engine: Engine) -> None:
    old.Base.metadata.create_all(engine)
    runner = CliRunner()
    got = runner.invoke(command(), ["db", "upgrade", "--db", empty_db_url])
    assert got.exit_code == 0, got.output
    assert got.stdout.strip() == f"pre-migration schema stamped as revision 0001, upgraded to {HEAD}"
    got = runner.invoke(command(), ["db", "upgrade", "--db", empty_db_url, "--json"])
    assert got.exit_code == 0 and '"from": "' + HEAD in got.stdout
    got = runner.invoke(command(), ["db", "current", "--db", empty_db_url])
    assert got.stdout.strip() == f"revision {HEAD} (head {HEAD}): current"


def test_db_upgrade_uses_the_state_dir_database_as_serve_does(tmp_path: Path) -> None:
    got = CliRunner().invoke(command(), ["db", "upgrade", "--state-dir", str(tmp_path / "state")])
    assert got.exit_code == 0, got.output
    assert got.stdout.strip() == f"created the schema at revision {HEAD}"
    store = Store(f"sqlite:///{tmp_path / 'state' / 'tpufleet.db'}")
    assert store.schema_revision() == HEAD
    store.close()


def test_db_upgrade_of_a_newer_database_exits_2_with_one_line(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    newer(empty_db_url)
    with pytest.raises(SystemExit) as exit_:
        main(["db", "upgrade", "--db", empty_db_url])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the database ") and "revision 0999" in err
    assert "\n" not in err and "Traceback" not in err

"""The CLI as a hostile tenant's victim sees it (issues 8 and 15): user text never drives the
terminal, commands are shown as a shell would quote them, the jobs table stays readable at 100
columns, and `submit --working-dir` packs and uploads the client's own directory."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import func, select
from test_cli_control import Cli

from tpufleet.api.server import ControlPlane
from tpufleet.cli import serve
from tpufleet.cli.common import safe
from tpufleet.cli.jobs import jobs_table
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.control.store.tables import PackageRow
from tpufleet.control.store.values import Limits
from tpufleet.errors import SpecError

NASTY = "\x1b]0;pwned\x07\x1b[2Jstep\r done\u202e\n\tindented\n"


@pytest.fixture
def cli(
    tmp_path: Path, db_url: str, ids: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cli]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))
    script = Script(run_after=1, exit_after=None, output=NASTY)
    cluster = MemoryCluster.of("v4-16:2", script=lambda spec: script)
    cp = ControlPlane(
        cluster, state_dir=tmp_path / "state", db_url=db_url, new_id=ids, config=ServiceConfig(stop_threads=0)
    )
    c = Cli(cp)
    yield c
    c.http.close()
    cp.close()


def tenant(cli: Cli) -> str:
    return str(json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=32", "--json"))["token"])


def test_safe_escapes_control_and_bidi_characters_only() -> None:
    assert safe("a\x1b[31mb\x07") == "a\\x1b[31mb\\x07"
    assert safe("x\u202ey\u200bz") == "x\\u202ey\\u200bz"
    assert safe("line\n\tnext\r", keep="\n\t") == "line\n\tnext\\x0d"
    assert safe("naïve 東京 [bold]") == "naïve 東京 [bold]"


def test_job_shows_the_command_quoted_and_escaped(cli: Cli) -> None:
    token = tenant(cli)
    args = ["python", "-c", "print(1)", "\x1b[2J", "[bold red]x[/]", "[/]"]
    job_id = cli.run("submit", "--type", "v4-16", "--", *args, token=token).strip()
    shown = cli.run("job", job_id, token=token)
    assert "\x1b" not in shown
    assert "python -c 'print(1)' '\\x1b[2J' '[bold red]x[/]' '[/]'" in shown


def test_logs_are_escaped_unless_raw(cli: Cli) -> None:
    token = tenant(cli)
    job_id = cli.run("submit", "--type", "v4-16", "--", "python", "x.py", token=token).strip()
    cli.cycle(2)
    shown = cli.run("logs", job_id, "--host", "0", token=token)
    assert shown == "\\x1b]0;pwned\\x07\\x1b[2Jstep\\x0d done\\u202e\n\tindented\n"
    assert cli.run("logs", job_id, "--host", "0", "--raw", token=token) == NASTY


def test_the_jobs_table_is_one_line_per_job_at_100_columns() -> None:
    long_reason = "NO_SUCH_SLICES_IN_FLEET_AND_A_VERY_LONG_REASON_CODE"
    rows = [
        {
            "id": f"{i:08x}",
            "name": "a-really-long-job-name-" * 5,
            "tenant": "team-with-a-long-name",
            "state": state,
            "accelerator_type": "v5litepod-256",
            "slices": slices,
            "num_slices": 2,
            "attempt": 1,
            "reason": "a long human sentence about why this job waits, " * 4 if state == "QUEUED" else None,
            "reason_code": long_reason if state == "QUEUED" else None,
        }
        for i, (state, slices) in enumerate(
            [("QUEUED", []), ("RUNNING", ["tpu-v5litepod-256-10", "tpu-v5litepod-256-11"])]
        )
    ]
    out = io.StringIO()
    Console(file=out, width=100, force_terminal=False).print(jobs_table(rows))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    queued, running = (next(line for line in lines if f"{i:08x}" in line) for i in range(2))
    assert sum("00000000" in line for line in lines) == 1 and sum("00000001" in line for line in lines) == 1
    assert " - " in queued and "(2)" not in queued and "NO_SUCH_SLICES" in queued and "…" in queued
    assert "tpu-v5litepod" in running
    assert len(lines) == 5  # title, header, rule, one line per job


def test_jobs_limit_and_queued_slices_show_as_a_dash(cli: Cli) -> None:
    token = tenant(cli)
    ids = [cli.run("submit", "--type", "v4-16", "--", "x", token=token).strip() for _ in range(3)]
    assert [j["id"] for j in json.loads(cli.run("jobs", "--limit", "2", "--json", token=token))] == ids[:2]
    listed = cli.run("jobs", token=token)
    assert "(1)" not in listed and all(i in listed for i in ids)


def test_status_shows_the_loop_and_the_fleet(cli: Cli) -> None:
    token = tenant(cli)
    cli.run("submit", "--type", "v4-16", "--", "x", token=token)
    got = json.loads(cli.run("status", "--json"))
    assert (got["queued"], got["running"]) == (1, 0)
    assert {"cycles", "cycle_ms_last", "cycle_ms_p50", "slices"} <= set(got)
    assert got["leader"] is True and got["leader_replica"] == got["replica"]  # alone: it leads
    assert got["leader_since"] is not None and got["fenced_writes"] == 0
    shown = cli.run("status")
    assert "queued" in shown and f"this replica ({got['replica']}) since " in shown


def test_submit_packs_and_uploads_the_working_dir(cli: Cli, tmp_path: Path) -> None:
    token = tenant(cli)
    src = tmp_path / "proj"
    for rel in ("train.py", "pkg/util.py", ".git/config", "__pycache__/x.pyc", ".venv/bin/python"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    os.symlink("/etc", src / "etc-link")
    job_id = cli.run(
        "submit", "--type", "v4-16", "--working-dir", str(src), "--", "python", "train.py", token=token
    )
    job = cli.cp.store.jobs.get(job_id.strip())
    assert job.working_dir is not None and job.working_dir.startswith("sha256:")
    data = cli.cp.store.packages.get("team-a", job.working_dir)
    assert sorted(zipfile.ZipFile(io.BytesIO(data)).namelist()) == ["pkg/util.py", "train.py"]


@pytest.mark.parametrize(
    ("working_dir", "message"),
    [
        ("file:///etc", "is not accepted; give a package id"),
        ("https://evil.example/x.zip", "is not accepted; give a package id"),
        ("/no/such/dir", "not a directory"),
    ],
)
def test_submit_refuses_working_dirs_the_server_does_not_accept(
    cli: Cli, working_dir: str, message: str
) -> None:
    err = cli.fail("submit", "--type", "v4-16", "--working-dir", working_dir, "--", "x", token=tenant(cli))
    assert isinstance(err, SpecError) and message in str(err) and err.exit_code == 2


def test_submit_refuses_a_working_dir_over_the_cap_before_uploading(cli: Cli, tmp_path: Path) -> None:
    cli.seams = replace(cli.seams, limits=Limits(max_package_bytes=1000))  # the server keeps its own cap
    token = tenant(cli)
    (tmp_path / "big.bin").write_bytes(os.urandom(5000))
    err = cli.fail("submit", "--type", "v4-16", "--working-dir", str(tmp_path), "--", "x", token=token)
    assert isinstance(err, SpecError) and "packs to more than 1,000 bytes" in str(err)
    with cli.cp.store.tx() as s:
        assert s.scalar(select(func.count(PackageRow.sha256))) == 0


def test_serve_refuses_a_file_url_prefix() -> None:
    with pytest.raises(SpecError, match="give a URL prefix with a host and a path"):
        serve._url_prefix("file:///")
    assert serve._url_prefix("https://artifacts.example.com/pkgs/") == "https://artifacts.example.com/pkgs/"

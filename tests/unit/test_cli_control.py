"""The control-plane CLI against the API in-process: Click's ``obj`` carries the commands' seams (a
TestClient as the client's httpx client; the caps checked client-side), and the test runs the
scheduling loop's cycles itself."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cli_inproc import tpufleet
from click.testing import CliRunner
from fastapi.testclient import TestClient
from requeues import Ends

from tpufleet.api.server import ControlPlane
from tpufleet.cli import command
from tpufleet.cli.common import Seams
from tpufleet.cli.jobs import FOLLOW_EXIT_CODES
from tpufleet.control.cluster.memory import MemoryCluster, Script
from tpufleet.control.loop.service import ServiceConfig
from tpufleet.errors import AuthError, ForbiddenError, NotFoundError, SpecError, TpufleetError
from tpufleet.scheduler.lifecycle import TERMINAL_STATES


class Cli:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.http = TestClient(cp.app)
        self.seams = Seams(http=self.http)
        self.runner = CliRunner()

    def run(self, *args: str, token: str | None = None) -> str:
        """Run a command that must succeed; its stdout."""
        result = self.invoke(*args, token=token)
        assert result.exit_code == 0, (args, result.output, result.exception)
        return result.stdout

    def fail(self, *args: str, token: str | None = None) -> TpufleetError:
        """Run a command that must fail with a TpufleetError (main() prints it and exits 2)."""
        result = self.invoke(*args, token=token)
        assert isinstance(result.exception, TpufleetError), (result.output, result.exception)
        return result.exception

    def invoke(self, *args: str, token: str | None = None):  # type: ignore[no-untyped-def]
        extra = ["--token", token or self.cp.admin_token, "--server", "http://testserver"]
        return self.runner.invoke(
            command(), [*args, *extra] if "--" not in args else _before_dashes(args, extra), obj=self.seams
        )

    def cycle(self, n: int = 1) -> None:
        for _ in range(n):
            self.cp.service.run_once()


def _before_dashes(args: tuple[str, ...], extra: list[str]) -> list[str]:
    i = args.index("--")
    return [*args[:i], *extra, *args[i:]]


SCRIPT = Script(run_after=1, exit_after=None, output="step 1 on {TPU_NAME}/{TPU_WORKER_ID}\n")


@pytest.fixture
def cli(
    tmp_path: Path, db_url: str, ids: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cli]:
    monkeypatch.setenv("TPUFLEET_STATE_DIR", str(tmp_path / "nowhere"))  # no local admin-token fallback
    cluster = MemoryCluster.of("v4-16:2,v6e-16", script=lambda spec: SCRIPT)
    cp = ControlPlane(
        cluster,
        state_dir=tmp_path / "state",
        db_url=db_url,
        new_id=ids,
        # Launches and stops inline, and every cycle copies all of a running job's new output (as
        # test_service.py's loop does): with the loop's default 0.2 s a cycle for that, which starts
        # before the store's query of the log cursors, a loaded machine spent it all before the
        # first read, and a running job's log was still empty after two cycles (`logs` printed nothing).
        config=ServiceConfig(stop_threads=0, log_budget_s=60),
    )
    c = Cli(cp)
    yield c
    c.http.close()
    cp.close()


def test_tenant_create_prints_the_token_and_tenants_lists_it(cli: Cli) -> None:
    created = json.loads(
        cli.run(
            "tenant", "create", "team-a", "--quota", "v4=16", "--quota", "v6e=16", "--weight", "2", "--json"
        )
    )
    assert set(created) == {"name", "token"} and created["name"] == "team-a"
    plain = cli.run("tenant", "create", "team-b", "--quota", "v4=8").strip()
    assert plain.startswith("tf_") and "\n" not in plain
    rows = json.loads(cli.run("tenants", "--json"))
    assert [(t["name"], t["quota"], t["weight"]) for t in rows] == [
        ("team-a", {"v4": 16, "v6e": 16}, 2.0),
        ("team-b", {"v4": 8}, 1.0),
    ]
    assert "team-a" in cli.run("tenants")
    assert "whole number" in str(cli.fail("tenant", "create", "team-c", "--quota", "v4=lots"))


def test_submit_run_inspect_log_and_cancel_a_two_slice_job(cli: Cli) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    out = cli.run(
        "submit",
        "--type",
        "v4-16",
        "--num-slices",
        "2",
        "--env",
        "LR=0.1",
        "--name",
        "mlp",
        "--max-retries",
        "1",
        "--json",
        "--",
        "python",
        "train.py",
        "--steps",
        "3",
        token=token,
    )
    job_id = json.loads(out)["id"]
    cli.cycle(2)
    job = json.loads(cli.run("job", job_id, "--json", token=token))
    assert {k: job[k] for k in ("id", "name", "tenant", "state", "attempt", "slices", "reason")} == {
        "id": job_id,
        "name": "mlp",
        "tenant": "team-a",
        "state": "RUNNING",
        "attempt": 1,
        "slices": ["tpu-v4-16-0", "tpu-v4-16-1"],
        "reason": None,
    }
    assert job["command"] == ["python", "train.py", "--steps", "3"] and job["env"] == {"LR": "0.1"}
    assert job["max_retries"] == 1
    assert [j["id"] for j in json.loads(cli.run("jobs", "--json", token=token))] == [job_id]
    slices = json.loads(cli.run("slices", "--json", token=token))
    assert [(s["name"], s["accelerator_type"], s["state"], s["holder"]) for s in slices] == [
        ("tpu-v4-16-0", "v4-16", "HELD", job_id),
        ("tpu-v4-16-1", "v4-16", "HELD", job_id),
        ("tpu-v6e-16-0", "v6e-16", "FREE", None),
    ]
    logs = cli.run("logs", job_id, token=token).splitlines()
    assert logs[0] == "[tpu-v4-16-0/0] step 1 on tpu-v4-16-0/0" and len(logs) == 4
    assert cli.run("logs", job_id, "--host", "3", token=token) == "step 1 on tpu-v4-16-1/1\n"
    assert "cancelling" in cli.run("cancel", job_id, token=token)
    cli.cycle()
    assert "CANCELLED" in cli.run("job", job_id, token=token)
    followed = cli.invoke("logs", job_id, "--follow", token=token)  # ends: the job ended, cancelled
    assert followed.exit_code == 5 and followed.stdout.count("step 1") == 4


def test_a_waiting_job_shows_why(cli: Cli) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v6e=32", "--json"))["token"]
    job_id = cli.run(
        "submit", "--type", "v6e-16", "--num-slices", "2", "--", "python", "x.py", token=token
    ).strip()
    cli.cycle()
    shown = cli.run("job", job_id, token=token)
    assert "QUEUED" in shown and "NO_SUCH_SLICES_IN_FLEET" in shown
    listed = cli.run("jobs", token=token)
    assert job_id in listed and "QUEUED" in listed


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("submit", "--type", "v4-15", "--", "python", "x.py"), SpecError, "closest: v4-8, v4-16"),
        (("submit", "--type", "v4-16", "--num-slices", "0", "--", "x"), SpecError, "num_slices"),
        (("submit", "--type", "v4-16", "--env", "NOEQUALS", "--", "x"), SpecError, "not KEY=VALUE"),
        (
            ("submit", "--type", "v4-16", "--working-dir", "/no/such/dir", "--", "x"),
            SpecError,
            "not a directory",
        ),
        (("job", "deadbeef"), NotFoundError, "job 'deadbeef' not found"),
        (("logs", "deadbeef"), NotFoundError, "not found"),
        (("cancel", "deadbeef"), NotFoundError, "not found"),
        (("tenants",), ForbiddenError, "needs the admin token"),
    ],
)
def test_bad_input_is_a_tpufleet_error(cli: Cli, args: tuple[str, ...], error: type, message: str) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=8", "--json"))["token"]
    err = cli.fail(*args, token=token)
    assert isinstance(err, error) and message in str(err) and err.exit_code == 2


def test_a_bad_token_is_an_auth_error(cli: Cli) -> None:
    assert isinstance(cli.fail("jobs", token="tf_bogus"), AuthError)


def test_logs_of_a_finished_job_whose_output_was_cut_warn_and_exit_3(cli: Cli) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    job_id = json.loads(cli.run("submit", "--type", "v4-16", "--json", "--", "python", "t.py", token=token))[
        "id"
    ]
    cli.cycle(2)
    running = cli.run("logs", job_id, token=token)
    assert running.count("step 1") == 2, running  # running: no warning
    cluster = cli.cp.cluster
    assert isinstance(cluster, MemoryCluster)
    cluster.write(job_id, "x" * 2000, worker=1)
    cli.cp.service.config = replace(cli.cp.service.config, max_log_bytes=1000)  # a tiny per-host cap
    cluster.exit(job_id, 0)
    cli.cycle(2)
    result = cli.invoke("logs", job_id, token=token)
    assert result.exit_code == 3, result.output
    assert "warning: the log of tpu-v4-16-0/1 is incomplete: truncated at 1000 characters" in result.stderr
    assert "step 1 on tpu-v4-16-0/0" in result.stdout


def test_logs_follow_exits_with_how_the_job_ended(cli: Cli) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    cluster = cli.cp.cluster
    assert isinstance(cluster, MemoryCluster)
    codes = {}
    for state, code in (("SUCCEEDED", 0), ("FAILED", 1), ("CANCELLED", None)):
        job_id = cli.run("submit", "--type", "v4-16", "--max-retries", "0", "--", "x", token=token).strip()
        cli.cycle(2)
        if code is None:
            cli.run("cancel", job_id, token=token)
        else:
            cluster.exit(job_id, code)
        cli.cycle(2)
        assert cli.cp.store.jobs.get(job_id).state == state
        codes[state] = cli.invoke("logs", job_id, "--follow", token=token).exit_code
        assert cli.invoke("logs", job_id, token=token).exit_code == 0  # not followed: printed, that is all
    assert codes == {"SUCCEEDED": 0, "FAILED": 4, "CANCELLED": 5} == FOLLOW_EXIT_CODES
    assert set(FOLLOW_EXIT_CODES) == set(TERMINAL_STATES)


def test_logs_follow_prints_the_end_of_an_attempt_before_the_next_one(cli: Cli) -> None:
    """Output an attempt wrote after the follower's last read of it is printed when the follower
    finds the next attempt, before that attempt's output (it was dropped)."""
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    job_id = cli.run("submit", "--type", "v4-16", "--max-retries", "1", "--", "x", token=token).strip()
    cluster = cli.cp.cluster
    assert isinstance(cluster, MemoryCluster)
    cli.cycle(3)
    assert cli.cp.store.jobs.get(job_id).state == "RUNNING"

    def until(attempt: int, state: str) -> None:
        for _ in range(30):
            job = cli.cp.store.jobs.get(job_id)
            if (job.attempt, job.state) == (attempt, state):
                cli.cycle()  # and its output copied
                return
            cli.cycle()
        raise AssertionError(f"attempt {attempt} never {state}: {cli.cp.store.jobs.get(job_id)}")

    def end_attempt_1() -> None:
        cluster.write(job_id, "the end of attempt 1 on {TPU_WORKER_ID}\n")
        cluster.exit(job_id, 1)
        until(2, "RUNNING")

    def end_attempt_2() -> None:
        cluster.exit(job_id, 0)
        until(2, "SUCCEEDED")

    steps = [end_attempt_1, end_attempt_2]
    cli.seams = replace(cli.seams, pause=lambda _s: steps.pop(0)() if steps else None)
    result = cli.invoke("logs", job_id, "--follow", token=token)
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.stdout
    assert "the end of attempt 1 on 0" in out and "the end of attempt 1 on 1" in out, out
    assert out.rindex("the end of attempt 1") < out.rindex("step 1 on"), out  # then attempt 2's output
    assert out.count("step 1 on tpu-v4-16-") == 4, out  # both hosts' first line, of each attempt


def test_a_command_not_found_on_every_host_fails_at_once_and_says_so(cli: Cli) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    job_id = cli.run("submit", "--type", "v4-16", "--", "pyhton", "train.py", token=token).strip()
    cli.cycle(2)
    cluster = cli.cp.cluster
    assert isinstance(cluster, MemoryCluster)
    cluster.exit(job_id, 127)  # what host/jobstart.py exits with for a missing program
    cli.cycle()
    job = json.loads(cli.run("job", job_id, "--json", token=token))
    assert (job["state"], job["attempt"], job["failures"], job["max_retries"]) == ("FAILED", 1, 1, 2)
    assert (
        "pyhton: command not found or could not start (exit 127 on every host); not retried" in job["reason"]
    )
    assert "not retried" in cli.run("job", job_id, token=token)
    assert cli.invoke("logs", job_id, "--follow", token=token).exit_code == 4


@pytest.mark.parametrize(
    ("args", "fixed"),
    [
        (("python", "-c", "print(1)"), "tpufleet submit --type v4-16 -- python -c 'print(1)'"),
        (("python", "train.py", "--steps", "3"), "tpufleet submit --type v4-16 -- python train.py --steps 3"),
        (("python", "train.py", "--steps=3"), "tpufleet submit --type v4-16 -- python train.py --steps=3"),
    ],
)
def test_a_command_given_without_dashes_gets_the_corrected_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fixed: str
) -> None:
    code, out, err = tpufleet(capsys, "submit", "--type", "v4-16", *args)
    bad = args[2].partition("=")[0] if args[1] == "train.py" else args[1]
    assert (code, out) == (2, "")
    assert err == f"error: {bad} is not an option of submit: the command goes after --, as in {fixed}\n"


def test_the_corrected_line_never_repeats_the_token(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = tpufleet(capsys, "submit", "--token", "tf_secret", "--type", "v4-16", "python", "-c", "x")
    assert code == 2 and "tf_secret" not in err
    assert "as in tpufleet submit --token TOKEN --type v4-16 -- python -c x" in err


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "--tpye", "v4-16", "--", "python", "x.py"),  # misspelled, before any command word
        ("submit", "--tpye", "v4-16", "python", "-c", "x"),  # the first unknown option is submit's own
    ],
)
def test_a_misspelled_option_of_submit_keeps_clicks_message(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    code, out, err = tpufleet(capsys, *args)
    assert (code, out) == (2, "")
    assert "No such option: --tpye" in err and "goes after --" not in err


def test_submit_warns_when_the_fleet_has_no_slice_of_the_type(cli: Cli) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    cli.cycle()  # the loop has seen the fleet: v4-16 x2, v6e-16 x1
    result = cli.invoke("submit", "--type", "v5e-8", "--", "python", "x.py", token=token)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()  # queued all the same; stdout is just its id
    warning = (
        "the fleet has no v5litepod-8 slice and no pool makes them: the job waits (NO_SUCH_SLICES_IN_FLEET) "
        "until an operator adds some; the fleet has: v4-16 x2, v6e-16 x1. Submit with one of those types, "
        "or ask the operator for a pool of v5litepod-8 slices"
    )
    assert result.stderr == f"warning: {warning}\n"
    assert cli.cp.store.jobs.get(job_id).state == "QUEUED"
    assert json.loads(cli.run("job", job_id, "--json", token=token))["warnings"] == [warning]
    assert "ask the operator for a pool of v5litepod-8 slices" in cli.run("job", job_id, token=token)
    too_many = cli.invoke("submit", "--type", "v4-16", "--num-slices", "3", "--", "x", token=token)
    assert "the fleet has 2 v4-16 slices, the job needs 3 and no pool makes them" in too_many.stderr
    fits = cli.invoke("submit", "--type", "v4-16", "--", "x", token=token)
    assert (fits.exit_code, fits.stderr) == (0, "")
    got = cli.http.post(
        "/api/v1/jobs",
        json={"command": ["x"], "accelerator_type": "v6e-16"},
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    assert got["warnings"] == [] and got["state"] == "QUEUED"  # the API says it too (empty: it fits)


def test_a_job_whose_attempt_failed_says_it_is_being_stopped_not_just_running(cli: Cli) -> None:
    """Between a failure and the requeue (the other hosts get their grace period, ~5 s), the job is
    still RUNNING: `job` says the attempt is being stopped and what comes next, not a bare
    RUNNING with reason ATTEMPT_FAILED (issue 31)."""
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    job_id = cli.run("submit", "--type", "v4-16", "--", "python", "train.py", token=token).strip()
    cli.cycle(2)
    cluster = cli.cp.cluster
    assert isinstance(cluster, MemoryCluster)
    [held] = cli.cp.store.jobs.get(job_id).slices
    seen: list[tuple[dict[str, object], str, dict[str, object]]] = []

    def look() -> None:  # the stop is on record and being carried out: what a user sees now
        shown = json.loads(cli.run("job", job_id, "--json", token=token))
        listed = json.loads(cli.run("jobs", "--json", token=token))[0]
        seen.append((shown, cli.run("job", job_id, token=token), listed))

    cluster.fault("stop", look)
    ends = Ends.on(cli.cp.service, cli.cp.store)
    cluster.kill_host(held, 1)
    cli.cycle()
    cluster.fault("stop", None)
    [(shown, text, listed)] = seen
    assert (shown["state"], shown["reason_code"], shown["stopping"]) == ("RUNNING", "ATTEMPT_FAILED", True)
    reason = str(shown["reason"])
    assert reason.startswith("attempt 1 failed (") and reason.endswith(
        "); stopping its processes on every host, then the job is requeued (retry 1 of 2)"
    )
    assert listed["stopping"] is True
    assert "RUNNING, stopping attempt 1 (the reason says why and what comes next)" in text
    at_end = ends.at_end(job_id)  # the stop is done: requeued (and admitted again in the same cycle)
    assert (at_end.state, at_end.attempt, at_end.reason_code) == ("QUEUED", 2, "RETRYING")
    assert not at_end.stopping
    job = json.loads(cli.run("job", job_id, "--json", token=token))
    assert (job["attempt"], job["stopping"]) == (2, False)
    assert "stopping attempt" not in cli.run("job", job_id, token=token)


def test_submit_batch_warns_as_a_single_submit_does_naming_the_lines(cli: Cli, tmp_path: Path) -> None:
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    cli.cycle()  # the loop has seen the fleet: v4-16 x2, v6e-16 x1
    missing = (
        "the fleet has no v5litepod-8 slice and no pool makes them: the job waits (NO_SUCH_SLICES_IN_FLEET) "
        "until an operator adds some; the fleet has: v4-16 x2, v6e-16 x1. Submit with one of those types, "
        "or ask the operator for a pool of v5litepod-8 slices"
    )
    bodies = [
        {"command": ["x"], "accelerator_type": "v5e-8"},
        {"command": ["x"], "accelerator_type": "v4-16"},
        {"command": ["x"], "accelerator_type": "v5litepod-8"},  # the same type, named as GCE does
        {"command": ["x"], "accelerator_type": "v4-16", "num_slices": 3},
    ]
    path = tmp_path / "jobs.jsonl"
    lines = [json.dumps(b) for b in bodies]
    path.write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n")  # line 3 blank: items on 1, 2, 4, 5
    result = cli.invoke("submit", "--batch", str(path), token=token)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 4  # queued all the same; stdout is just the ids
    assert result.stderr.splitlines() == [
        f"warning: {path} lines 1, 4: {missing}",
        f"warning: {path}:5: the fleet has 2 v4-16 slices, the job needs 3 and no pool makes them: the job "
        "waits (NO_SUCH_SLICES_IN_FLEET) until an operator adds some; the fleet has: v4-16 x2, v6e-16 x1. "
        "Submit with one of those types, or ask the operator for a pool of v4-16 slices",
    ]
    answer = cli.http.post(
        "/api/v1/jobs/batch", json={"jobs": bodies}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert [w["jobs"] for w in answer["warnings"]] == [[0, 2], [3]]  # each once, with its items
    assert answer["warnings"][0]["message"] == missing
    path.write_text("\n".join([lines[0]] * 7) + "\n")
    many = cli.invoke("submit", "--batch", str(path), token=token)
    assert many.stderr == f"warning: {path} lines 1, 2, 3, 4, 5 and 2 more: {missing}\n"
    path.write_text(lines[1] + "\n")  # a job that fits: no warning
    quiet = cli.invoke("submit", "--batch", str(path), token=token)
    assert (quiet.exit_code, quiet.stderr) == (0, "")


def test_a_commands_options_may_come_before_its_name(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    """`tpufleet --json jobs` is `tpufleet jobs --json` (options after the name, `logs ID --follow`,
    are Click's own); a subcommand's too, and values that look like a command's name stay values."""
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=16", "--json"))["token"]
    cli.cycle()  # the store knows the fleet's slices
    job_id = cli.run("--name", "jobs", "--type", "v4-16", "submit", "--", "x", token=token).strip()
    listed = json.loads(cli.run("--json", "jobs", token=token))
    assert [(j["id"], j["name"]) for j in listed] == [(job_id, "jobs")]
    assert json.loads(cli.run("--json", "job", job_id, token=token))["state"] == "QUEUED"
    first = ["--server", "http://testserver", "--token", cli.cp.admin_token]
    drained = cli.runner.invoke(command(), [*first, "slice", "drain", "tpu-v6e-16-0"], obj=cli.seams)
    assert (drained.exit_code, drained.stdout) == (0, "tpu-v6e-16-0 DRAINING\n"), drained.output
    code, out, err = tpufleet(capsys, "--jsn", "jobs")  # an option of no command: Click's message
    assert (code, out) == (2, "") and "No such option: --jsn" in err

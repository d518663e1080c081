"""tpufleet tenant update/delete, token create/revoke/rotate-admin, tokens and events, in-process
against the API (the CLI helper and fixture of test_cli_control), and bad input: one line, exit 2."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from test_cli_control import Cli, cli  # noqa: F401  (the fixture)

from tpufleet.cli import main
from tpufleet.errors import AuthError, ConflictError, NotFoundError, SpecError


def test_tenant_update_changes_quota_weight_and_preemption(cli: Cli) -> None:  # noqa: F811
    cli.run("tenant", "create", "team-a", "--quota", "v4=32,v6e=16", "--preemption", "never")
    shown = json.loads(cli.run("tenants", "--json"))[0]
    assert (shown["quota"], shown["preemption"]) == ({"v4": 32, "v6e": 16}, "never")
    out = cli.run(
        "tenant",
        "update",
        "team-a",
        "--quota",
        "v4=16,v5e=8",
        "--weight",
        "2",
        "--preemption",
        "lower_priority",
    )
    assert out.strip() == (
        "tenant team-a: quota v4=16, v6e=16, v5e=8; weight 2; preemption lower_priority "
        "(from the next scheduling cycle)"
    )
    table = cli.run("tenants")
    assert "lower_priority" in table and "v5e=8" in table
    cli.cycle()
    views = cli.cp.service.state.snapshot()[0].tenants
    assert [(t.quota, t.weight, t.preemption) for t in views] == [
        ({"v4": 16, "v6e": 16, "v5e": 8}, 2.0, "lower_priority")
    ]


def test_tenant_delete_refuses_with_jobs_then_force_deletes(cli: Cli) -> None:  # noqa: F811
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=8", "--json"))["token"]
    for _ in range(2):
        cli.run("submit", "--type", "v6e-16", "--", "python", "t.py", token=token)  # v4 quota: they wait
    err = cli.fail("tenant", "delete", "team-a")
    assert isinstance(err, ConflictError) and "\n" not in str(err)
    assert str(err).startswith("tenant team-a has 2 queued and 0 running jobs")
    assert cli.run("tenant", "delete", "team-a", "--force").strip() == "tenant team-a deleted"
    assert isinstance(cli.fail("jobs", token=token), AuthError)
    assert json.loads(cli.run("tenants", "--json")) == []
    listed = json.loads(cli.run("tenants", "--all", "--json"))
    assert [(t["name"], t["state"]) for t in listed] == [("team-a", "deleted")]
    assert "deleted" in cli.run("tenants", "--all")
    assert [j["state"] for j in json.loads(cli.run("jobs", "--json"))] == ["CANCELLED", "CANCELLED"]


def test_tokens_create_list_and_revoke(cli: Cli) -> None:  # noqa: F811
    cli.run("tenant", "create", "team-a")
    made = json.loads(cli.run("token", "create", "--tenant", "team-a", "--scope", "metrics", "--json"))
    assert set(made) == {"id", "token"} and made["token"].startswith("tf_")
    plain = cli.run("token", "create", "--tenant", "team-a").strip()
    assert plain.startswith("tf_") and "\n" not in plain
    rows = json.loads(cli.run("tokens", "--tenant", "team-a", "--json"))
    assert sorted(t["scope"] for t in rows) == ["jobs", "jobs", "metrics"]
    assert made["token"] not in cli.run("tokens") and made["id"] in cli.run("tokens")
    assert cli.run("token", "revoke", made["id"]).strip() == f"token {made['id']} (metrics) revoked"
    assert made["id"] not in {t["id"] for t in json.loads(cli.run("tokens", "--json"))}
    assert isinstance(cli.fail("jobs", token=made["token"]), AuthError)


def test_rotate_admin_writes_the_new_token_and_the_old_one_stops(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    old = cli.cp.admin_token
    out = json.loads(cli.run("token", "rotate-admin", "--state-dir", str(tmp_path / "mine"), "--json"))
    mine = tmp_path / "mine" / "admin-token"
    new = mine.read_text().strip()
    assert new != old and stat.S_IMODE(mine.stat().st_mode) == 0o600
    assert out["revoked"] == 1 and out["path"] == str(mine)
    assert cli.cp.admin_token_path.read_text().strip() == new  # the server wrote its own state dir's
    assert isinstance(cli.fail("tenants", token=old), AuthError)
    assert cli.run("tenants", token=new).startswith("tenants (0)")


def test_events_show_who_changed_what(cli: Cli) -> None:  # noqa: F811
    token = json.loads(cli.run("tenant", "create", "team-a", "--json"))["token"]
    cli.run("tenant", "create", "team-b")
    cli.run("tenant", "update", "team-a", "--weight", "4")
    rows = json.loads(cli.run("events", "--json"))
    assert [(e["kind"], e["tenant"], e["actor"]) for e in rows] == [
        ("tenant", "team-a", "admin"),
        ("tenant", "team-b", "admin"),
        ("tenant", "team-a", "admin"),
    ]
    assert [e["tenant"] for e in json.loads(cli.run("events", "--tenant", "team-b", "--json"))] == ["team-b"]
    last = json.loads(cli.run("events", "--limit", "1", "--json"))
    assert [e["message"] for e in last] == ["tenant team-a updated: weight 1 -> 4"]
    assert {e["tenant"] for e in json.loads(cli.run("events", "--json", token=token))} == {"team-a"}
    assert "weight 1 -> 4" in cli.run("events")


def test_events_of_one_job_tell_its_story_to_its_tenant(cli: Cli) -> None:  # noqa: F811
    token = json.loads(cli.run("tenant", "create", "team-a", "--quota", "v4=8", "--json"))["token"]
    other = json.loads(cli.run("tenant", "create", "team-b", "--json"))["token"]
    job = cli.run("submit", "--type", "v4-16", "--", "python", "t.py", token=token).strip()
    cli.cycle(3)  # admitted, launched, running
    cli.run("cancel", job, token=token)
    cli.cycle(2)
    rows = json.loads(cli.run("events", "--job", job, "--json", token=token))
    kinds = [e["kind"] for e in rows]
    assert kinds[:3] == ["submit", "admit", "launch"] and {"run", "cancel", "end"} <= set(kinds)
    assert {e["job_id"] for e in rows} == {job}
    assert [
        e["kind"] for e in json.loads(cli.run("events", "--job", job, "--limit", "1", "--json"))
    ] == kinds[-1:]
    table = cli.run("events", "--job", job, token=token)
    assert f"events of job {job} ({len(rows)})" in table and "attempt 1 admitted on tpu-v4-16-0" in table
    assert isinstance(cli.fail("events", "--job", job, token=other), NotFoundError)  # another tenant's job
    err = cli.fail("events", "--job", job, "--tenant", "team-a")
    assert isinstance(err, SpecError) and "--job ID or --tenant NAME, not both" in str(err)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("tenant", "update", "team-a", "--quota", "v4:32"), SpecError, "'v4:32' is not GEN=CHIPS"),
        (("tenant", "update", "team-a", "--quota", "v4=32,v9=1"), SpecError, "'v9' is not a TPU generation"),
        (
            ("tenant", "update", "team-a", "--quota", "v4=-8"),
            SpecError,
            "--quota: v4=-8: chips must be >= 0, e.g.",
        ),
        (("tenant", "update", "team-a"), SpecError, "nothing to change"),
        (("tenant", "update", "team-a", "--preemption", "always"), SpecError, "'always' is not a preemption"),
        (("tenant", "update", "team-z", "--weight", "2"), NotFoundError, "tenant 'team-z' not found"),
        # nan and inf cannot be sent as JSON: they were a ValueError traceback in the client
        (("tenant", "update", "team-a", "--weight", "nan"), SpecError, "weight must be a number above 0"),
        (("tenant", "create", "team-b", "--weight", "inf"), SpecError, "at most 1000, got inf"),
        (("tenant", "delete", "team-z"), NotFoundError, "tenant 'team-z' not found"),
        (
            ("token", "create", "--tenant", "team-a", "--scope", "root"),
            SpecError,
            "'root' is not a token scope",
        ),
        (("token", "create", "--tenant", "team-z"), NotFoundError, "tenant 'team-z' not found"),
        (("token", "revoke", "0123abcd"), NotFoundError, "token '0123abcd' not found"),
    ],
)
def test_bad_input_is_one_line(cli: Cli, args: tuple[str, ...], error: type, message: str) -> None:  # noqa: F811
    cli.run("tenant", "create", "team-a")
    err = cli.fail(*args)
    assert isinstance(err, error) and message in str(err) and "\n" not in str(err)


@pytest.mark.parametrize(
    "args",
    [
        ["tenant", "update", "team-a", "--quota", "v4=many"],
        ["token", "create", "--tenant", "team-a", "--scope", "admin"],
        ["tenant", "update", "team-a", "--preemption", "sometimes"],
    ],
)
def test_bad_input_exits_2_before_calling_a_server(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--server", "http://127.0.0.1:9", "--token", "tf_x"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err

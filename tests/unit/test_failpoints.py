"""Failpoints (``TPUFLEET_FAILPOINTS``): what ``serve`` accepts, and a bad list refused in one line
before anything starts. Reaching one is tested where processes may be killed: tests/host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpufleet.cli import main
from tpufleet.control.loop import failpoints
from tpufleet.errors import SpecError


@pytest.mark.parametrize(
    ("text", "points"),
    [
        (None, frozenset()),
        ("", frozenset()),
        ("after-launch", frozenset({"after-launch"})),
        (" after-stop , after-write:admit,", frozenset({"after-stop", "after-write:admit"})),
        ("after-write:finish,after-write:finish", frozenset({"after-write:finish"})),
    ],
)
def test_the_points_a_list_names(text: str | None, points: frozenset[str]) -> None:
    assert failpoints.parse(text) == points


@pytest.mark.parametrize("text", ["after-lunch", "after-write:", "after-write:submit", "kill", "AFTER-STOP"])
def test_an_unknown_point_is_refused_naming_the_known_ones(text: str) -> None:
    with pytest.raises(SpecError) as err:
        failpoints.parse(f"after-stop,{text}")
    assert repr(text) in str(err.value) and "after-launch, after-stop, after-write:admit" in str(err.value)


def test_a_point_not_in_the_list_is_passed_without_asking_anything(tmp_path: Path) -> None:
    def never() -> bool:
        raise AssertionError("asked whether an unlisted point is ready")

    failpoints.reach(frozenset({"after-stop"}), "after-launch", ready=never)  # this process lives on
    failpoints.reach(frozenset(), "after-stop")


def test_serve_refuses_a_bad_list_in_one_line_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(failpoints.ENV, "after-launch,after-lunch")
    state = tmp_path / "state"
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--sandbox", "v4-16", "--port", "0", "--state-dir", str(state)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and "Traceback" not in err
    assert "TPUFLEET_FAILPOINTS: unknown failpoint 'after-lunch'" in err
    assert not state.exists()  # refused before the state dir was made

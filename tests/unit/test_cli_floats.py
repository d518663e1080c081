"""Every float option of every command refuses nan and inf (and -inf) with exit 2 and no traceback,
before the command does anything: Typer's ``min``/``max`` let inf through, and nan where an option
has no minimum, and a later ``int()`` or ``sleep()`` failed with a traceback (``serve --max-log-mb
inf``) or a deadline never came (``demo --timeout nan``). The options are found by walking the
command tree, so a new one is covered when it is added."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_inproc import tpufleet

from tpufleet.cli import command


def _float_options() -> Iterator[tuple[tuple[str, ...], str, tuple[str, ...]]]:
    """(command path, flag, what else it is given: a placeholder for each required argument, and a
    closed port for ``--server`` where it has one, so that nothing could reach a real server)."""

    def walk(cmd: object, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str, tuple[str, ...]]]:
        params = getattr(cmd, "params", [])
        given = tuple("x" for p in params if p.param_type_name == "argument" and p.required)
        if any("--server" in p.opts for p in params):
            given += ("--server", "http://127.0.0.1:9")
        for p in params:
            descriptor = getattr(p, "type_descriptor", None)
            if descriptor is not None and descriptor.annotation in (float, float | None):
                yield path, p.opts[0], given
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, (*path, name))

    return walk(command(), ())


OPTIONS = list(_float_options())


def test_the_walk_finds_the_float_options_of_the_commands_that_have_them() -> None:
    found = {(" ".join(path), flag) for path, flag, _ in OPTIONS}
    for expected in [("serve", "--max-log-mb"), ("top", "--interval"), ("demo", "--timeout")]:
        assert expected in found
    assert {
        ("emulate preempt", "--notice"),
        ("slice create", "--timeout"),
        ("tenant create", "--weight"),
    } <= found


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("path", "flag", "given"), OPTIONS, ids=[f"{' '.join(p)} {f}" for p, f, _ in OPTIONS]
)
def test_a_float_option_refuses_what_is_not_a_finite_number(
    capsys: pytest.CaptureFixture[str], path: tuple[str, ...], flag: str, given: tuple[str, ...], value: str
) -> None:
    code, out, err = tpufleet(capsys, *path, *given, flag, value)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == "", err
    assert flag in err or flag.lstrip("-") in err, err

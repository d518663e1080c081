"""The README's short tour and the docs' runnable examples, run as written, in order.

Every fenced block tagged ``sh test`` in README.md, then in docs/*.md (by name), runs as one bash
script (``set -eo pipefail``) in a temporary directory holding a copy of ``examples/``, with
``HOME`` and ``TPUFLEET_CONFIG`` pointed there and the venv's ``bin/`` first on ``PATH``; every block
must exit 0. A block tagged ``sh test background`` is started and left running (its process
session is stopped by PID at the next Markdown heading, or at the end of its file) once it has
recorded a server in the CLI context that answers ``/healthz``. Whatever the tour leaves running
is stopped at the end: background sessions by PID, the emulated fleet with ``EmulatedFleet.down``.
A README that drifts from the code fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tpufleet.emulator import EmulatedFleet, procs

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A heading, or any fenced block (so a `# comment` inside a block is never taken for a heading).
FENCE = re.compile(r"^(#{1,6} [^\n]*)$|^```([^\n]*)\n(.*?)^```", re.M | re.S)
NO_CLOUD = {"NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    script: str
    background: bool


def tour() -> list[Block | str]:
    """The runnable blocks of every page in order; a string marks a heading or the end of a page
    (where background processes stop)."""
    steps: list[Block | str] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1):
                steps.append(m.group(1))
            elif m.group(2).split()[:2] == ["sh", "test"]:
                line = text[: m.start()].count("\n") + 1
                steps.append(Block(page.name, line, m.group(3), m.group(2).split()[2:] == ["background"]))
        steps.append(f"end of {page.name}")
    return steps


def test_the_tour_has_the_commands_the_readme_promises() -> None:
    scripts = "\n".join(b.script for b in tour() if isinstance(b, Block))
    for command in ("catalog", "emulate up", "emulate kill-host", "doctor", "render", "lint", "serve"):
        assert f"tpufleet {command}" in scripts
    for command in ("tenant create", "submit", "logs", "jobs", "emulate down", "context"):
        assert f"tpufleet {command}" in scripts


RESEARCHERS = REPO / "docs" / "researchers.md"
# `tpufleet WORD` in a page's inline code (a command it tells the reader to run; not `tpufleet.runtime`)
INLINE_COMMAND = re.compile(r"`tpufleet ([a-z][a-z-]*)")


def test_the_researchers_page_is_linked_first_and_runs_every_command_it_names() -> None:
    """The researcher's page (issue 31): the README's first link to a page of docs/, above its
    first section; every shell block on it is run by the tour, and so is every `tpufleet` command
    its text names, and the job it writes is submitted, followed and debugged there."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    first_section = readme.index("\n## ")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links and links[0] == "docs/researchers.md", f"the README's first page link is {links[:1]}"
    assert readme.index("](docs/researchers.md)") < first_section, "link it above the README's first section"

    text = RESEARCHERS.read_text(encoding="utf-8")
    infos = [m.group(2).split() for m in FENCE.finditer(text) if m.group(2) is not None]
    untested = [info for info in infos if info[:1] == ["sh"] and info[:2] != ["sh", "test"]]
    assert untested == [], "every shell block of docs/researchers.md runs in the tour: tag it `sh test`"
    page = [b for b in tour() if isinstance(b, Block) and b.page == RESEARCHERS.name]
    scripts = "\n".join(b.script for b in page)
    named = set(INLINE_COMMAND.findall(text))
    assert sorted(c for c in named if f"tpufleet {c}" not in scripts) == [], "named on the page, never run"
    shown = "tpufleet submit", "--working-dir", "tpufleet logs", "--follow", "tpufleet job ", "tpufleet jobs"
    shown += (
        "tpufleet cancel",
        "tpufleet events --job",
        "initialize_jax()",
        "report_step(",
        "TPUFLEET_CHECKPOINT_DIR",
    )
    assert [what for what in shown if what not in scripts] == [], "the page's tested blocks must show these"


def _free_port() -> int:
    return procs.free_port()  # below the ephemeral range: nobody takes it meanwhile


def _env(tmp: Path) -> dict[str, str]:
    drop = ("TPUFLEET_", "RAY_", "XDG_", "GOOGLE_", "CLOUDSDK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {
        **env,
        **NO_CLOUD,
        "HOME": str(tmp / "home"),
        "TPUFLEET_CONFIG": str(tmp / "home" / "tpufleet-config.yaml"),
        "TPUFLEET_PORT": str(_free_port()),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    }


def _context(env: dict[str, str]) -> dict[str, str]:
    path = Path(env["TPUFLEET_CONFIG"])
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _wait_for_server(proc: subprocess.Popen[str], env: dict[str, str], where: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{where}: exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        url = _context(env).get("server")
        if url:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.3)
    pytest.fail(f"{where}: no server answered /healthz within 90 s")


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM each background session (its PID is the session id), SIGKILL what outlives 20 s."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    procs.clear()


def _stop_fleet(env: dict[str, str]) -> None:
    state_dir = _context(env).get("emulator_state_dir") or str(
        Path(env["HOME"]) / ".cache" / "tpufleet" / "emulator"
    )
    if (Path(state_dir) / "fleet.json").exists():
        EmulatedFleet("", state_dir=state_dir).down()


@pytest.mark.timeout(1200)  # ~105 s alone; seven times that beside the other fleet tests on 2 cores
def test_the_readme_and_docs_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = _env(tmp_path)
    background: list[subprocess.Popen[str]] = []
    outputs: list[str] = []
    try:
        for step in tour():
            if isinstance(step, str):
                _stop(background)
                continue
            where = f"{step.page}:{step.line}"
            script = f"set -eo pipefail\n{step.script}"
            if step.background:
                background.append(
                    subprocess.Popen(
                        ["bash", "-c", script],
                        cwd=tmp_path,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                        start_new_session=True,
                    )
                )
                _wait_for_server(background[-1], env, where)
                continue
            started = time.monotonic()
            run = subprocess.run(
                ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
            )
            assert run.returncode == 0, f"{where} exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
            print(f"{where}: {time.monotonic() - started:.1f} s")  # shown with -s or on failure
            outputs.append(run.stdout)
    finally:
        _stop(background)
        _stop_fleet(env)
    everything = "\n".join(outputs)
    assert "hello" in everything  # the job's output, through `tpufleet logs --follow`
    assert "SUCCEEDED" in everything  # `tpufleet jobs` after it ended
    assert "tpu-v4-16-0" in everything and "healthy" in everything
    assert not (tmp_path / ".tpufleet").exists()  # nothing written into the working directory

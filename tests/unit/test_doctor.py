"""doctor.findings_for: node-table problems and probe results, named by slice."""

from __future__ import annotations

import pytest

from tpufleet.control.cluster.protocol import HostInfo, SliceInfo
from tpufleet.doctor import HealthFinding, Probe, Report, findings_for


def v4(name: str = "s", problems: tuple[str, ...] = ()) -> SliceInfo:
    hosts = tuple(HostInfo(w, f"n{w}", "10.0.0.1", True) for w in range(2))
    return SliceInfo(name, "v4-16", "2x2x2", 2, hosts, problems)


def probe(worker: int = 0, **kw: object) -> Probe:
    env = {"TPU_WORKER_ID": str(worker), "TPU_WORKER_HOSTNAMES": "a,b"}
    return Probe("s", worker, f"n{worker}", **{"platform": "cpu", "devices": 4, "env": env, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("p", "message"),
    [
        (
            probe(env={"TPU_WORKER_HOSTNAMES": "a,b,c"}),
            "TPU_WORKER_HOSTNAMES lists 3 hosts, the slice (v4-16) has 2",
        ),
        (probe(1, env={"TPU_WORKER_ID": "0"}), "TPU_WORKER_ID is 0 but Ray labels the node worker 1"),
        (probe(devices=0), "JAX sees no devices"),
        (probe(devices=2), "JAX sees 2 devices, the host has 4 chips"),
        (probe(error="RuntimeError: boom"), "probe failed: RuntimeError: boom"),
    ],
)
def test_probe_findings(p: Probe, message: str) -> None:
    assert findings_for([v4()], [p]) == [HealthFinding("s", f"worker {p.worker_id}: {message}")]


def test_a_healthy_slice_and_probe_have_no_findings() -> None:
    assert findings_for([v4()], [probe(0), probe(1)]) == []
    assert findings_for([v4()], [probe(0, devices=8)]) == []  # tpu7x: two JAX devices per chip


def test_node_table_problems_come_first_and_count_per_type() -> None:
    broken = v4("b", ("worker 1 is dead",))
    report = Report("x:1", (v4("a"), broken), (), tuple(findings_for([v4("a"), broken], [])))
    assert report.findings == (HealthFinding("b", "worker 1 is dead"),)
    assert not report.healthy
    assert report.by_type() == {"v4-16": {"slices": 2, "intact": 1}}
    assert report.to_dict()["slices"][1]["problems"] == ["worker 1 is dead"]


def test_a_gone_slice_is_listed_with_why_and_leaves_the_report_healthy() -> None:
    report = Report("x:1", (v4("a"),), (), (), (("spot-0", "drained for a preemption: spot preemption"),))
    assert report.healthy and report.by_type() == {"v4-16": {"slices": 1, "intact": 1}}
    assert report.to_dict()["gone"] == [
        {"slice": "spot-0", "why": "drained for a preemption: spot preemption"}
    ]


def test_the_text_report_shows_what_the_cluster_wrote_and_obeys_none_of_it() -> None:
    """A node's labels and a drain's message are written by any client of the GCS: doctor's text
    report shows their escapes and markup as text, never drives the terminal with them."""
    from rich.console import Console

    from tpufleet.cli.emulate import print_report

    hostile = "[bold]x\x1b[2J"
    report = Report(
        "x:1",
        (v4(hostile, ("worker 1 is dead [/red]",)),),
        (),
        (HealthFinding(hostile, "worker 1 is dead [/red]"),),
        (("gone\x1b]0;title\x07", "drained as idle: [red]\u202eevil"),),
    )
    out = Console(record=True, width=400, force_terminal=True)
    print_report(report, out)
    shown = out.export_text()
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "[bold]x\\x1b[2J: worker 1 is dead [/red]" in shown
    assert "gone\\x1b]0;title\\x07: gone (drained as idle: [red]\\u202eevil); not checked" in shown
    assert "1 finding(s)" in shown

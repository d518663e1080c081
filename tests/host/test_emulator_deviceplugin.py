"""The emulated device plugin: its page reads back through the real device-plugin parser, and its
numbers are measured from real processes (a busy job process under a runner counts, an idle Ray
worker and the runner itself do not)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tpufleet import tpudevice
from tpufleet.emulator import deviceplugin
from tpufleet.emulator.deviceplugin import HostWork, _Proc
from tpufleet.host import devicepage
from tpufleet.observe import tpumetrics

ENV = {
    "TPU_NAME": "tpu-v4-16-0",
    "TPU_WORKER_ID": "1",
    "TPU_ACCELERATOR_TYPE": "v4-16",
    "TPU_TOPOLOGY": "2x2x2",
}


def test_page_reads_back_through_the_device_plugin_parser() -> None:
    text = deviceplugin.exposition(ENV, duty=37.5, rss_bytes=8 << 30)
    chips = tpumetrics.parse_device_plugin(text)
    assert [c.chip for c in chips] == [0, 1, 2, 3]  # global ids 4..7 of the slice, host ids 0..3
    assert {c.duty_cycle_percent for c in chips} == {37.5}
    assert {c.hbm_used_bytes for c in chips} == {2 << 30}  # 8 GiB over 4 chips
    assert {c.hbm_total_bytes for c in chips} == {32 << 30}  # v4: 32 GiB per chip
    assert {c.tensorcore_utilization_percent for c in chips} == {None}  # no honest stand-in on a CPU
    assert all(c.emulated for c in chips)
    assert {(c.model, c.topology) for c in chips} == {("tpu-v4-podslice", "2x2x2")}
    assert 'accelerator_id="' in text and "-7" in text


def _p(pid: int, ppid: int, argv0: str) -> _Proc:
    return _Proc(pid, ppid, 1, 0, 0, argv0, argv0)


def test_job_processes_are_what_workers_started_and_busy_actors() -> None:
    table = [
        _p(10, 1, "/usr/bin/raylet"),
        _p(11, 10, "python -m ray.dashboard.agent"),
        _p(12, 10, "ray::IDLE"),
        _p(13, 10, "ray::HostRunner.start"),
        _p(14, 13, "bwrap"),
        _p(15, 14, "python train.py"),
        _p(16, 10, "ray::RayTrainWorker.__execute"),
        _p(17, 16, "python data-loader"),
        _p(20, 1, "python train.py"),  # another host's job
        _p(21, 13, " ".join(tpudevice.spare_argv(sys.executable))),  # the next run's spare
        _p(22, 13, f"python -c work {tpudevice.SPARE_MARK}"),  # a job that ends its arguments with the mark
    ]
    assert sorted(p.pid for p in deviceplugin.job_processes(10, table)) == [14, 15, 16, 17, 22]


@pytest.fixture
def fake_host() -> Iterator[dict[str, int]]:
    """Children of this test process shaped like a host: an idle Ray worker, and a runner whose
    child burns CPU (the job)."""
    burn = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"
    runner_code = f"import subprocess\nsubprocess.run([{sys.executable!r}, '-c', {burn!r}])\n"
    idle = subprocess.Popen(["ray::IDLE", "-c", "import time; time.sleep(60)"], executable=sys.executable)
    runner = subprocess.Popen(["ray::HostRunner", "-c", runner_code], executable=sys.executable)
    job = None
    for _ in range(100):
        table = deviceplugin._table()
        job = next((p.pid for p in table if p.ppid == runner.pid), None)
        if job:
            break
        time.sleep(0.05)
    assert job is not None
    yield {"idle": idle.pid, "runner": runner.pid, "job": job}
    for proc in (idle, runner):
        proc.kill()
        proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.kill(job, 9)


def test_duty_cycle_and_memory_are_measured_from_the_job_processes(fake_host: dict[str, int]) -> None:
    work = HostWork(raylet=os.getpid())
    work.tick(time.monotonic())
    counted = {p.pid for p in deviceplugin.job_processes(os.getpid(), deviceplugin._table())}
    assert fake_host["job"] in counted
    assert fake_host["idle"] not in counted and fake_host["runner"] not in counted
    time.sleep(1.5)
    work.tick(time.monotonic())
    assert work.duty_cycle_percent() > 25  # one busy process; other agents share the 2 cores
    assert work.rss_bytes > 1 << 20


def test_served_over_http_when_the_host_is_emulated(fake_host: dict[str, int]) -> None:
    assert not deviceplugin.serve_from_env({**ENV})  # not emulated: nothing starts
    env = {**ENV, "TPUFLEET_EMULATED": "1", **deviceplugin.host_env("127.0.0.1")}
    deviceplugin.serve(env, raylet=os.getpid(), tick_s=0.2)  # this test process stands for the raylet
    url = f"http://{env['TPU_DEVICE_PLUGIN_ADDR']}/metrics"
    chips: list[tpumetrics.ChipReading] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            chips = tpumetrics.read_device_plugin(env["TPU_DEVICE_PLUGIN_ADDR"], timeout_s=2)
        except tpumetrics.DeviceReadError:
            chips = []
        if chips and (chips[0].duty_cycle_percent or 0) > 0:
            break
        time.sleep(0.3)
    assert len(chips) == 4 and all(c.emulated for c in chips)
    assert chips[0].duty_cycle_percent and chips[0].duty_cycle_percent > 0
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=2)


def test_an_emulated_host_names_the_plugin_its_runner_starts_without_importing_the_emulator() -> None:
    env = deviceplugin.host_env("127.0.0.1")
    assert env[tpudevice.ADDR_VAR].startswith("127.0.0.1:")
    assert devicepage.load_hook(env[tpudevice.PAGE_HOOK_VAR]) is deviceplugin.serve_from_env
    for bad in ("tpufleet.emulator.deviceplugin", "tpufleet.emulator.deviceplugin:TICK_S"):
        with pytest.raises(ValueError, match=tpudevice.PAGE_HOOK_VAR):
            devicepage.load_hook(bad)


def test_the_runner_publishes_the_hosts_page_and_calls_the_hook_its_environment_names() -> None:
    """``devicepage.serve_from_env`` (what the runner calls) on a host whose environment names a
    hook; a hook that fails or cannot be found leaves the runner running."""
    called.clear()
    hook = f"{__name__}:_record_hook"
    devicepage.serve_from_env({**ENV, tpudevice.ADDR_VAR: "127.0.0.1:1", tpudevice.PAGE_HOOK_VAR: hook})
    assert called == [{**ENV, tpudevice.ADDR_VAR: "127.0.0.1:1", tpudevice.PAGE_HOOK_VAR: hook}]
    for broken in (f"{__name__}:_failing_hook", "tpufleet.no_such_module:serve"):
        devicepage.serve_from_env({**ENV, tpudevice.ADDR_VAR: "127.0.0.1:1", tpudevice.PAGE_HOOK_VAR: broken})


called: list[dict[str, str]] = []


def _record_hook(env: dict[str, str]) -> None:
    called.append(dict(env))


def _failing_hook(env: dict[str, str]) -> None:
    raise RuntimeError("no page today")

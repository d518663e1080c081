"""The emulator's pure plan: slice names, each host's environment, the ray start command lines."""

from __future__ import annotations

import json

import pytest

from tpufleet import catalog
from tpufleet.emulator import plan
from tpufleet.errors import SpecError


@pytest.mark.parametrize(
    ("existing", "accel", "count", "expected"),
    [
        ([], "v4-16", 2, ["tpu-v4-16-0", "tpu-v4-16-1"]),
        (["tpu-v4-16-0", "tpu-v4-16-3", "tpu-v6e-4-7"], "v4-16", 1, ["tpu-v4-16-4"]),
        (["tpu-v4-16-0"], "v6e-4", 1, ["tpu-v6e-4-0"]),
        (["tpu-v4-16-x"], "v4-16", 1, ["tpu-v4-16-0"]),
    ],
)
def test_slice_names(existing: list[str], accel: str, count: int, expected: list[str]) -> None:
    assert plan.next_slice_names(existing, accel, count) == expected


def test_every_host_of_a_slice_gets_the_contract_and_the_emulator_variables() -> None:
    envs = plan.host_envs("tpu-v4-16-0", catalog.slice_type("v4-16"), "10.1.2.3")
    assert [e["TPU_WORKER_ID"] for e in envs] == ["0", "1"]
    assert envs[1] == {
        "TPU_NAME": "tpu-v4-16-0",
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "10.1.2.3,10.1.2.3",
        "TPU_ACCELERATOR_TYPE": "v4-16",
        "TPU_TOPOLOGY": "2x2x2",
        "TPU_HOST_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_SKIP_MDS_QUERY": "true",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "PJRT_DEVICE": "CPU",
        "TPUFLEET_EMULATED": "1",
    }


def test_the_hosts_sitecustomize_comes_first_on_the_callers_pythonpath() -> None:
    site = str(plan.HOST_SITE_DIR)
    assert (plan.HOST_SITE_DIR / "sitecustomize.py").is_file()
    assert plan.site_env(None) == {"PYTHONPATH": site}
    assert plan.site_env(f"/a:{site}::/b") == {"PYTHONPATH": f"{site}:/a:/b"}


def test_single_host_slices_have_no_hostnames_as_on_gke() -> None:
    (env,) = plan.host_envs("tpu-v6e-8-0", catalog.slice_type("v6e-8"), "10.1.2.3")
    assert "TPU_WORKER_HOSTNAMES" not in env
    assert env["XLA_FLAGS"].endswith("=8")


def test_the_callers_host_cluster_and_jax_variables_do_not_leak_into_a_host() -> None:
    caller = {
        "PATH": "/bin",
        "TPU_NAME": "x",
        "RAY_ADDRESS": "a:1",
        "JAX_PLATFORMS": "tpu",
        "PJRT_DEVICE": "TPU",
        "MEGASCALE_X": "1",
        "RAY_AUTH_TOKEN": "the caller's own cluster",
        "RAY_AUTH_TOKEN_PATH": "/elsewhere",
    }
    assert plan.clean_base_env(caller) == {"PATH": "/bin", "RAY_USAGE_STATS_ENABLED": "0"}


def test_a_host_passes_only_its_chip_count_to_ray_and_random_ports() -> None:
    argv = plan.host_argv(
        "ray", "10.1.2.3", "10.1.2.3:6379", catalog.slice_type("v4-16"), 2, "/tmp/t/h0", 1, False
    )
    assert json.loads(argv[argv.index("--resources") + 1]) == {"TPU": 4}
    assert argv[argv.index("--num-cpus") + 1] == "2"
    for flag in ("--min-worker-port", "--max-worker-port", "--dashboard-agent-listen-port"):
        assert argv[argv.index(flag) + 1] == "0"
    assert "--labels" not in argv  # Ray derives every ray.io/ label itself


def test_the_head_has_no_cpu_and_no_tpu() -> None:
    argv = plan.head_argv("ray", "10.1.2.3", 6000, 6001, 6002, "/tmp/t", 1)
    assert argv[argv.index("--num-cpus") + 1] == "0"
    assert "--resources" not in argv and "--head" in argv
    # a plain `ray start --head` gets its own client port (else 10001, shared by every fleet here)
    assert argv[argv.index("--ray-client-server-port") + 1] == "6002" and "--no-monitor" not in argv


def test_a_fleet_fits_the_machine_at_a_raylets_least_or_is_refused_naming_both() -> None:
    gib24 = 24 << 30
    plan.check_fits(2048, gib24, "v4-8:2048")  # 12 MiB each: exactly 24 GiB
    plan.check_fits(10**9, None, "v4-8:100000")  # memory unknown: not checked
    with pytest.raises(SpecError) as err:
        plan.check_fits(2049, gib24, "v4-8:2049")
    assert str(err.value) == (
        "'v4-8:2049' is 2,049 emulated hosts; this machine's 24 GiB holds at most 2,048 (each takes over "
        "12 MiB); give fewer slices"
    )
    with pytest.raises(SpecError) as err:  # one slice more than a running fleet has room for
        plan.check_fits(2049, gib24, "v4-8", adding=True)
    assert str(err.value) == (
        "one more v4-8 would make the fleet 2,049 emulated hosts; this machine's 24 GiB holds at most "
        "2,048 (each takes over 12 MiB); remove a slice first"
    )

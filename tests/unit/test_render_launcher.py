"""``render --target gce``: a Ray cluster-launcher config that Ray's own validation accepts."""

from __future__ import annotations

import copy
import importlib

import pytest
from spec_builders import EXAMPLE, GENERATION_CASES, all_generations, load_fleet, pool

from tpufleet.errors import SpecError
from tpufleet.render.launcher import render_launcher
from tpufleet.spec import read_spec

ray_util = importlib.import_module("ray.autoscaler._private.util")
ray_tpu = importlib.import_module("ray._private.accelerators.tpu")


def ray_up_validate(config):
    """What `ray up` does before it touches GCP: fill the provider defaults, then validate."""
    prepared = ray_util.prepare_config(copy.deepcopy(config))
    ray_util.validate_config(prepared)
    return prepared


@pytest.mark.parametrize("case", GENERATION_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("spot", [False, True])
def test_every_generation_passes_rays_validation(case, spot):
    spec = load_fleet(
        [pool("tpu", **case.pool, slices=1, min_slices=0, max_slices=3, spot=spot)],
        autoscaling={"enabled": True},
    )
    prepared = ray_up_validate(render_launcher(spec))
    node = prepared["available_node_types"]["tpu"]
    assert (node["min_workers"], node["max_workers"]) == (0, 3)
    assert node["resources"] == {"TPU": case.gce_chips_per_host}
    config = node["node_config"]
    assert config["acceleratorType"] == case.gce_type
    assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(config["acceleratorType"])
    assert config["runtimeVersion"] == case.runtime
    assert "machineType" not in config  # Ray tells a TPU node from a VM by this
    assert config.get("schedulingConfig") == ({"spot": True} if spot else None)


def test_the_example_and_a_multi_pool_fleet_pass():
    example = ray_up_validate(render_launcher(read_spec(EXAMPLE)))
    assert example["provider"] == {
        "type": "gcp",
        "region": "us-east5",
        "availability_zone": "us-east5-b",
        "project_id": "my-project",
    }
    assert example["max_workers"] == 5 and example["idle_timeout_minutes"] == 10
    assert example["upscaling_speed"] == 1.0  # Conservative, as KubeRay maps it
    head = example["available_node_types"]["ray_head"]["node_config"]
    assert head["serviceAccounts"][0]["email"] == "ray-tpu@my-project.iam.gserviceaccount.com"
    multi = ray_up_validate(render_launcher(all_generations()))
    assert len(multi["available_node_types"]) == len(GENERATION_CASES) + 1


def test_a_non_default_shape_uses_accelerator_config():
    spec = load_fleet([pool("tpu", generation="v4", topology="4x4x16")])
    config = ray_up_validate(render_launcher(spec))["available_node_types"]["tpu"]["node_config"]
    assert config["acceleratorConfig"] == {"type": "V4", "topology": "4x4x16"}
    assert "acceleratorType" not in config


def test_rays_validation_really_rejects():
    broken = render_launcher(read_spec(EXAMPLE))
    broken["available_node_types"]["v4-train"]["max_workers"] = "many"
    with pytest.raises(Exception, match="many"):
        ray_up_validate(broken)


def test_gce_needs_a_gce_section():
    with pytest.raises(SpecError, match="needs a gce section"):
        render_launcher(load_fleet(gce=None))

"""A fleet spec as a Ray cluster-launcher config for TPU VMs on GCE (``ray up`` / ``ray down``).

The head is a plain Compute Engine VM; each pool is a TPU node type whose one "node" is a whole
slice (the launcher's TPU command runner starts Ray on every host of it), so ``min_workers`` /
``max_workers`` count slices, as on KubeRay. A node type names its slice by ``acceleratorType``
(Google's default shape for that size) or by ``acceleratorConfig`` (type + topology, for the other
shapes), always with the TPU software ``runtimeVersion`` Google documents for the generation.
Spot pools set ``schedulingConfig.spot`` (TPU API v2alpha1, the API the launcher calls).
"""

from __future__ import annotations

import math
from typing import Any

from tpufleet import catalog as cat
from tpufleet.errors import SpecError
from tpufleet.spec import FleetSpec, PoolSpec

__all__ = ["RUNTIME_VERSIONS", "render_launcher", "tpu_node_config"]

Obj = dict[str, Any]

# TPU software (runtime) versions per generation: the catalog's table (it cites Google's docs).
RUNTIME_VERSIONS = cat.RUNTIME_VERSIONS

# acceleratorConfig.type values of the TPU API (AcceleratorConfig.Type) per generation.
_CONFIG_TYPES = {"v4": "V4", "v5e": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}

_HEAD_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"


def _gce_shape(pool: PoolSpec) -> cat.SliceType:
    """The slice as GCE offers it: TPU VMs come in Google's default host shape for a topology
    (a v6e 2x4 slice is one 8-chip VM there, even where GKE also runs it as two 4-chip hosts)."""
    st = pool.slice_type
    return cat.find(st.generation.name, st.topology)


def tpu_node_config(pool: PoolSpec) -> Obj:
    st = _gce_shape(pool)
    gen = st.generation.name
    config: Obj = {}
    default = cat.slice_type(st.accelerator_type)
    same_shape = sorted(default.topology.dims) == sorted(st.topology.dims)
    if same_shape and (st.topology.rank == 3 or default.topology == st.topology):
        config["acceleratorType"] = st.accelerator_type
    elif gen in _CONFIG_TYPES:
        config["acceleratorConfig"] = {"type": _CONFIG_TYPES[gen], "topology": str(st.topology)}
    else:
        raise SpecError(
            f"pool {pool.name}: GCE creates {st.accelerator_type} only as {default.topology}; "
            f"use topology {default.topology} for --target gce"
        )
    config["runtimeVersion"] = RUNTIME_VERSIONS[gen]
    if pool.spot:
        config["schedulingConfig"] = {"spot": True}
    return config


def _head_node(spec: FleetSpec) -> Obj:
    assert spec.gce is not None
    node: Obj = {
        "machineType": spec.gce.head_machine_type,
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "initializeParams": {"diskSizeGb": spec.gce.disk_size_gb, "sourceImage": _HEAD_IMAGE},
            }
        ],
    }
    sa = spec.service_account
    if sa and sa.gcp_service_account:
        node["serviceAccounts"] = [
            {"email": sa.gcp_service_account, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
        ]
    return node


def _node_types(spec: FleetSpec) -> Obj:
    types: Obj = {"ray_head": {"resources": {"CPU": 0}, "node_config": _head_node(spec)}}
    for pool in spec.pools:
        st = _gce_shape(pool)
        types[pool.name] = {
            "min_workers": pool.min_count,
            "max_workers": pool.max_count,
            # Per host: Ray itself adds TPU-<type>-head on worker 0 and the slice-name resource.
            "resources": {"TPU": st.chips_per_host},
            "node_config": tpu_node_config(pool),
        }
    return types


def render_launcher(spec: FleetSpec) -> Obj:
    """The ``ray up`` config; raises :class:`SpecError` when the spec has no ``gce`` section."""
    if spec.gce is None:
        raise SpecError(
            "--target gce needs a gce section, e.g. gce: {project_id: my-project, zone: us-east5-b}",
            field="gce",
        )
    pip = f'pip install -U "ray[default]=={spec.ray.version}" "google-api-python-client"'
    return {
        "cluster_name": spec.name,
        "max_workers": sum(p.max_count for p in spec.pools),
        "upscaling_speed": 1.0
        if spec.autoscaling.upscaling == "Conservative"
        else 1000.0,  # as KubeRay maps it
        "idle_timeout_minutes": max(1, math.ceil(spec.autoscaling.idle_timeout_s / 60)),
        "provider": {
            "type": "gcp",
            "region": spec.gce.region,
            "availability_zone": spec.gce.zone,
            "project_id": spec.gce.project_id,
        },
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": _node_types(spec),
        "head_node_type": "ray_head",
        "setup_commands": [pip],
        "worker_setup_commands": ['pip install -U "jax[tpu]"'],
        "head_start_ray_commands": [
            "ray stop",
            "ulimit -n 65536; ray start --head --port=6379 --num-cpus=0 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0",
        ],
        "worker_start_ray_commands": ["ray stop", "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379"],
    }

"""Every catalog entry against Ray 2.60's own TPU helpers (``ray._private.accelerators.tpu``).

Ray is imported here only as an oracle; the catalog itself never imports it (import-linter). Where
Ray and Google's documentation disagree we follow Google, and each disagreement is listed below
with its reason, so the check stays exact everywhere else.
"""

from __future__ import annotations

import importlib

import pytest

tpu = importlib.import_module("ray._private.accelerators.tpu")

from tpufleet import catalog as cat  # noqa: E402

Manager = tpu.TPUAcceleratorManager


def _known_to_ray(st: cat.SliceType) -> bool:
    """Topologies Google documents but Ray 2.60's VALID_TPU_TOPOLOGY table does not list.

    - v4: Ray stops at 12x12x16; Google's v4 pod is 4,096 chips, so 16x16x16 and friends exist.
    - v5p: Ray stops at 16x16x24; Google's v5p pod is 8,960 chips (16x20x28).
    - tpu7x: Ray lists only the doubling shapes up to 8x16x16 and no 1-chip slice; Google offers
      tpu7x-standard-1t (1x1x1) and cube-rule shapes up to the 9,216-chip superpod.
    """
    return Manager.is_valid_tpu_accelerator_topology(st.generation.ray_name, str(st.topology))


def _ray_chips_per_host(st: cat.SliceType) -> int:
    """Ray assumes the single-host machine for 2x4 on v5e/v6e; GKE also offers two 4-chip hosts."""
    return tpu.get_chips_per_host(str(st.topology), st.generation.ray_name)


ALL = cat.all_slice_types()


def test_catalog_is_not_empty_and_covers_every_generation():
    assert len({st.gen_name for st in ALL}) == 5


@pytest.mark.parametrize("st", ALL, ids=lambda st: f"{st.accelerator_type}-{st.topology}-{st.machine_type}")
def test_entry_agrees_with_ray(st: cat.SliceType):
    topo = str(st.topology)
    ray_gen = st.generation.ray_name
    assert tpu.get_num_chips_from_topology(topo) == st.chips
    assert Manager.is_valid_tpu_accelerator_type(st.accelerator_type)
    pod_type = tpu.infer_tpu_pod_type_from_topology(topo, st.generation.ray_accelerator_type)
    assert pod_type == tpu.normalize_tpu_accelerator_type(st.accelerator_type)
    assert tpu.get_tpu_cores_per_chip(ray_gen) == st.generation.cores_per_chip
    assert (
        tpu.get_total_chips_from_accelerator_type(tpu.normalize_tpu_accelerator_type(st.accelerator_type))
        == st.chips
    )

    two_host_2x4 = st.gen_name in ("v5e", "v6e") and topo == "2x4" and st.chips_per_host == 4
    one_chip_tpu7x = st.gen_name == "tpu7x" and st.chips == 1
    if two_host_2x4:
        assert _ray_chips_per_host(st) == 8  # the documented exception, still checked exactly
    elif one_chip_tpu7x:
        assert _ray_chips_per_host(st) == 4  # Ray has no 1-chip Ironwood host (tpu7x-standard-1t)
    else:
        assert _ray_chips_per_host(st) == st.chips_per_host

    if not _known_to_ray(st):
        assert _beyond_rays_tables(st), f"Ray rejects {st.gen_name} {topo} and no exception covers it"


def _beyond_rays_tables(st: cat.SliceType) -> bool:
    """True for exactly the shapes the _known_to_ray docstring lists."""
    _, b, c = sorted(st.topology.dims) if st.topology.rank == 3 else (0, 0, 0)
    if st.gen_name == "v4":
        return b > 12 or c > 16
    if st.gen_name == "v5p":
        return b > 16 or c > 24
    return st.gen_name == "tpu7x"


def test_exceptions_are_few_and_only_3d():
    """Ray agrees on every 2-D slice and on the bulk of the 3-D ones."""
    rejected = [st for st in ALL if not _known_to_ray(st)]
    assert not [st for st in rejected if st.gen_name in ("v5e", "v6e")]
    assert all(_known_to_ray(cat.slice_type(t)) for t in ("v4-16", "v4-2048", "v5p-128", "tpu7x-16"))
    assert len(rejected) < len(ALL) // 2

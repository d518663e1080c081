"""``/api/v1/slice-groups``: the slice manager's REST routes (admin token, every one).

A slice group is ``num_slices`` physical slices of one TPU type asked of the provider under one
name, shared or private to a tenant (only its jobs run there, counted against its quota). Creating
one stores it; the provisioning loop (``control/loop/provisioner.py``) asks the provider, and ``GET``
shows the provider's state and the physical slices with their scheduler state. ``DELETE`` drains
(waits for the holder to finish, or with ``?force=true`` preempts it) and then releases the slices.
Utilization is measured from the store's attempt records over a window. A control plane without a
provider (``serve`` without ``--provider``) refuses to create a group (409: nothing would ever make
it), and removes at once a group that no provider made when it is deleted.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from tpufleet.api.deps import API, AdminOnly, Db, changed
from tpufleet.api.errormap import responses
from tpufleet.control.store.facade import Store
from tpufleet.control.store.slicegroups import (
    CONFIG_KEYS,
    GroupRecord,
    SliceGroups,
    parse_window,
    slice_config,
)
from tpufleet.errors import ConflictError

__all__ = ["NO_PROVIDER", "GroupCreate", "group_view", "router"]

NO_PROVIDER = (
    "this control plane has no provider, so nothing would ever make slice group {name!r}: serve it "
    "with one, e.g. `tpufleet serve --provider emulator` (or --provider gce|kuberay --fleet SPEC; "
    "--sandbox SLICES --provider memory), see docs/provisioning.md"
)


class GroupCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(description="a lower-case letter, then letters, digits and '-', at most 40 characters")
    config: dict[str, Any] = Field(
        description=f"keys: {', '.join(CONFIG_KEYS)}; e.g. "
        '{"tpu_type": "v4-8", "num_slices": 2, "preemptible": true}'
    )
    tenant: str | None = Field(None, description="a private group: only this tenant's jobs run there")


router = APIRouter(prefix=API, tags=["slice groups"], dependencies=[AdminOnly])


def group_view(store: Store, group: GroupRecord) -> dict[str, Any]:
    """The group with each physical slice's scheduler state and holder."""
    rows = {s.name: s for s in store.slices.all()}
    out = group.to_dict()
    for s in out["slices"]:
        row = rows.get(s["name"])
        s["state"] = row.state if row else None
        s["holder"] = row.holder if row else None
    return out


@router.post("/slice-groups", status_code=201, responses=responses(400, 403, 404, 409, 413, 422))
def create_group(body: GroupCreate, store: Db, request: Request) -> dict[str, Any]:
    """Ask for a named slice group (admin); refused (409) where the control plane has no provider."""
    if request.app.state.provider is None:
        raise ConflictError(NO_PROVIDER.format(name=body.name[:40]))
    conf = slice_config(body.config)
    group = SliceGroups(store).create(
        body.name, conf.accelerator_type, conf.count, spot=conf.spot, tenant=body.tenant
    )
    changed(request)
    return group_view(store, group)


@router.get("/slice-groups", responses=responses(403))
def list_groups(store: Db) -> list[dict[str, Any]]:
    return [group_view(store, g) for g in SliceGroups(store).all()]


@router.get("/slice-groups/{name}", responses=responses(403, 404, 422))
def get_group(name: str, store: Db) -> dict[str, Any]:
    return group_view(store, SliceGroups(store).get(name))


@router.delete("/slice-groups/{name}", responses=responses(403, 404, 422))
def delete_group(name: str, store: Db, request: Request, force: bool = False) -> dict[str, Any]:
    """Drain and delete (admin): waits for the holder to finish, or with ``force`` preempts it
    (checkpoint signal and grace, requeued without using a retry), then releases the slices. On a
    control plane without a provider, a group no provider made is removed at once (``DELETED``)."""
    group = SliceGroups(store).request_delete(
        name, force=force, provider=request.app.state.provider is not None
    )
    changed(request)
    return group_view(store, group)


@router.get("/slice-groups/{name}/utilization", responses=responses(400, 403, 404, 422))
def utilization(
    name: str,
    store: Db,
    request: Request,
    window: Annotated[str, Query(description="e.g. 90s, 10m, 2h, 1d, or seconds")] = "10m",
) -> dict[str, Any]:
    """Held fraction of the group's slices over the window and who held them, measured from the
    attempts the store recorded; ``device_metrics``: each slice's latest measured TPU duty cycle
    (mean over its chips) where the device sampler measured it, else null."""
    groups = SliceGroups(store)
    used = groups.utilization(name, parse_window(window))
    used["device_metrics"] = _duty(request, groups.get(name).slice_names)
    return used


def _duty(request: Request, names: list[str]) -> dict[str, Any] | None:
    """``{"duty_cycle_percent": {slice: mean over its measured chips}}``; None when none is measured."""
    readings: dict[tuple[str, int], dict[int, float]] = (
        getattr(request.app.state, "duty_cycles", dict)() or {}
    )
    per: dict[str, list[float]] = {}
    for (slice_name, _worker), chips in readings.items():
        if slice_name in names:
            per.setdefault(slice_name, []).extend(chips.values())
    if not per:
        return None
    return {"duty_cycle_percent": {n: round(sum(v) / len(v), 2) for n, v in sorted(per.items()) if v}}

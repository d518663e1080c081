"""Slices from the command line: ``tpufleet slices`` (the fleet's slices and, with the admin token,
the named slice groups under them) and ``tpufleet slice drain|undrain|create|delete|utilization``
(admin token); and, for ``serve --fleet SPEC --provider KIND``, the provider that makes slices.

``slice drain NAME`` places no new job on a slice (``undrain`` undoes it). ``slice create NAME
--type v4-8 [--count 2] [--spot] [--tenant T] [--wait] [--json]`` asks the control plane for a named
slice group (``--tenant``: private to that tenant), ``slice delete NAME [--force]`` drains and deletes
it, ``slice utilization NAME [--window 10m] [--json]`` shows the held fraction over the window and
who held it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from tpufleet.client.http import DEFAULT_SERVER, Client

if TYPE_CHECKING:
    from tpufleet.client.slicemanager import SliceManager
    from tpufleet.control.loop.provisioner import ProvisionConfig
    from tpufleet.provision.base import Provider
    from tpufleet.spec import FleetSpec

from tpufleet.cli._app import app, console, console_err, print_json
from tpufleet.cli.common import (
    ERRORS,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    cell,
    finite,
    make_client,
    safe,
)

__all__ = ["Provisioning", "check_provider", "groups_table", "provisioning"]

slice_app = typer.Typer(
    help="Create, delete and measure slice groups; drain or undrain a slice (admin token).",
    no_args_is_help=True,
)
app.add_typer(slice_app, name="slice")


def _manager(ctx: typer.Context, server: str, token: str | None) -> SliceManager:
    from tpufleet.client.slicemanager import SliceManager  # the store's modules: only when used

    return SliceManager(client=make_client(ctx, server, token))  # the server and token rules of every command


@app.command("slices", epilog=ERRORS)
def slices_cmd(
    ctx: typer.Context, as_json: JsonOpt = False, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """List the fleet's slices: type, state (FREE, HELD, BROKEN, DRAINING), holder; with the admin
    token also the named slice groups: provider state and physical slices (`tpufleet slice create`)."""
    client = make_client(ctx, server, token)
    rows = client.slices()
    groups = _slice_groups(client)
    group_of = {s["name"]: g["name"] for g in groups for s in g["slices"]}
    if as_json:
        print_json(
            [
                {k: s[k] for k in ("name", "accelerator_type", "state", "holder", "topology", "problems")}
                | {"group": group_of.get(s["name"])}
                for s in rows
            ]
        )
        return
    table = Table(
        "name",
        "type",
        "topology",
        "hosts",
        "state",
        "holder",
        "problems",
        title=f"slices ({len(rows)})",
        title_justify="left",
    )
    for s in rows:
        table.add_row(
            cell(s["name"]),
            cell(s["accelerator_type"]),
            cell(s["topology"]),
            str(len(s["hosts"])),
            cell(s["state"]),
            cell(s["holder"] or "-"),
            cell("; ".join(s["problems"])),
        )
    console.print(table)
    if groups:
        console.print(groups_table(groups))


def _slice_groups(client: Client) -> list[dict[str, Any]]:
    """The named slice groups (admin token); none for a tenant's token."""
    from tpufleet.errors import ForbiddenError

    try:
        return list(client.request("GET", "/api/v1/slice-groups"))
    except ForbiddenError:
        return []


@slice_app.command("drain")
def drain_cmd(
    ctx: typer.Context, name: str, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """Place no new job on the slice; its current holder runs to the end."""
    s = make_client(ctx, server, token).drain(name, True)
    typer.echo(safe(f"{s['name']} {s['state']}"))


@slice_app.command("undrain")
def undrain_cmd(
    ctx: typer.Context, name: str, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = None
) -> None:
    """Let the scheduler place jobs on the slice again."""
    s = make_client(ctx, server, token).drain(name, False)
    typer.echo(safe(f"{s['name']} {s['state']}"))


@slice_app.command("create", epilog=ERRORS)
def create_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name: a lower-case letter, then letters, digits, '-'.")],
    tpu_type: Annotated[str, typer.Option("--type", help="TPU type, e.g. v4-8, v6e-16.", show_default=False)],
    count: Annotated[int, typer.Option("--count", help="Physical slices in the group.")] = 1,
    spot: Annotated[bool, typer.Option("--spot", help="Spot (preemptible) slices.")] = False,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Private to this tenant: only its jobs run there.")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Return once the provider says ACTIVE or FAILED.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", callback=finite, min=0, help="With --wait: seconds to wait at most.")
    ] = 600.0,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Ask the provider for a named slice group (admin token; the control plane must run with a
    provider: `tpufleet serve --provider ...`)."""
    from tpufleet.control.store.slicegroups import MAX_COUNT
    from tpufleet.errors import SpecError

    if not 1 <= count <= MAX_COUNT:  # the CLI's name for it, not the API's num_slices
        raise SpecError(f"must be a whole number from 1 to {MAX_COUNT}, got {count}", field="--count")
    sm = _manager(ctx, server, token)
    config = {"tpu_type": tpu_type, "num_slices": count, "preemptible": spot}
    group = sm.create_slice(name, config, tenant=tenant, wait=wait, timeout_s=timeout)
    if as_json:
        print_json(group)
        return
    typer.echo(safe(_line(group)))
    if wait and group["state"] != "ACTIVE":
        raise typer.Exit(1)


def _line(g: dict[str, Any]) -> str:
    slices = ", ".join(s["name"] for s in g["slices"]) or "-"
    owner = f" (private to {g['tenant']})" if g.get("tenant") else ""
    message = f": {g['message']}" if g.get("message") and g["state"] != "ACTIVE" else ""
    spot = " spot" if g["spot"] else ""
    return f"{g['name']} {g['count']} x {g['accelerator_type']}{spot}{owner} {g['state']}{message} [{slices}]"


@slice_app.command("delete", epilog=ERRORS)
def delete_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Preempt the holder (checkpoint signal and grace, requeued) instead of waiting."
        ),
    ] = False,
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Drain and delete a slice group: its holder finishes first (or, --force, is preempted)."""
    group = _manager(ctx, server, token).delete_slice(name, force=force)
    if as_json:
        print_json(group)
        return
    held = [s["name"] for s in group["slices"] if s.get("holder")]
    what = f"draining (held: {', '.join(held)})" if held and not force else "deleting"
    if group["state"] == "DELETED":  # no provider had made it: gone at once
        what = f"deleted ({group.get('message') or 'at once'})"
    typer.echo(safe(f"{group['name']} {what}"))


@slice_app.command("utilization", epilog=ERRORS)
def utilization_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Group name.")],
    window: Annotated[str, typer.Option("--window", help="How far back: 90s, 10m, 2h, 1d.")] = "10m",
    as_json: JsonOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = None,
) -> None:
    """Held fraction of a slice group over the window, and who held it (from the store's records)."""
    from tpufleet.control.store.slicegroups import parse_window

    parse_window(window)  # a bad window exits 2 here, before any request
    got = _manager(ctx, server, token).get_slice_utilization(name, window)
    if as_json:
        print_json(got)
        return
    console.print(
        f"[bold]{safe(got['name'])}[/]: {got['utilization'] * 100:.1f}% held over {window} "
        f"({got['held_seconds']:.0f} of {got['slice_seconds']:.0f} slice-seconds)",
        highlight=False,
    )
    table = Table("tenant", "job", "seconds", "share", title="holders", title_justify="left")
    for h in got["holders"]:
        table.add_row(cell(h["tenant"]), cell(h["job"]), f"{h['seconds']:.0f}", f"{h['fraction'] * 100:.1f}%")
    if got["holders"]:
        console.print(table)
    else:
        console_err.print("nobody held it in the window", highlight=False)


def groups_table(rows: list[dict[str, Any]]) -> Table:
    """The named slice groups: provider state, physical slices and their scheduler state."""
    table = Table(
        "group", "type", "count", "spot", "tenant", "state", "slices", "message",
        title=f"slice groups ({len(rows)})", title_justify="left",
    )  # fmt: skip
    for g in rows:
        slices = ", ".join(f"{s['name']} {s.get('state') or '-'}" for s in g["slices"]) or "-"
        state = g["state"] + (" (deleting)" if g.get("deleting") and g["state"] != "DELETING" else "")
        table.add_row(
            cell(g["name"]),
            cell(g["accelerator_type"]),
            str(g["count"]),
            "yes" if g["spot"] else "no",
            cell(g.get("tenant") or "shared"),
            cell(state),
            cell(slices),
            cell(g.get("message") or "", 40),
        )
    return table


# -- serve --fleet SPEC --provider KIND ------------------------------------------------------------
PROVIDERS = ("memory", "emulator", "gce", "kuberay")
MEMORY_DELAY_S = 2.0  # serve --sandbox --provider memory: how long a slice takes to provision


class Provisioning:
    """What ``serve --fleet/--provider`` adds to a control plane: the provider and the provisioning
    loop's configuration (``ControlPlane(provider=, provision=)`` builds the loop from them) and, for
    ``--provider emulator``, the emulated fleet it started."""

    def __init__(
        self, provider: Provider, config: ProvisionConfig, spec: FleetSpec | None, fleet: Any = None
    ) -> None:
        self.provider, self.config, self.spec, self.fleet = provider, config, spec, fleet

    def create_tenants(self, cp: Any) -> None:
        """The fleet spec's tenants, on the control plane built with this provider."""
        if self.spec is not None:
            _tenants(cp, self.spec)

    def close(self) -> None:
        try:
            self.provider.close()
        finally:
            if self.fleet is not None:
                self.fleet.down()


def _tenants(cp: Any, spec: Any) -> None:
    """The fleet spec's tenants that the store lacks, each token in ``<state-dir>/tenant-tokens``."""
    import os

    have = {t.name for t in cp.store.tenants.all()}
    folder = cp.state_dir / "tenant-tokens"
    for t in spec.tenants:
        if t.name in have:
            continue
        _, token = cp.store.tenants.create(t.name, dict(t.quota), t.weight)
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / t.name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        console_err.print(f"tenant {t.name} created from the fleet spec; token in {path}", highlight=False)


def check_provider(fleet_path: Any, provider: str | None, sandboxed: bool) -> str | None:
    """The provider ``serve`` uses (None: none), or a SpecError before anything starts."""
    from tpufleet.errors import SpecError

    if fleet_path is None and provider is None:
        return None
    kind = provider or ("memory" if sandboxed else None)
    if kind is None:
        raise SpecError("--fleet needs --provider emulator|gce|kuberay (or --sandbox, which uses memory)")
    if kind not in PROVIDERS:
        raise SpecError(f"{kind!r} is not a provider; use one of {', '.join(PROVIDERS)}", field="--provider")
    if (kind == "memory") != sandboxed:
        raise SpecError("--provider memory goes with --sandbox, and --sandbox only with --provider memory")
    if kind in ("gce", "kuberay") and fleet_path is None:
        raise SpecError(f"--provider {kind} needs --fleet SPEC (its project and zone, or its RayCluster)")
    return kind


def provisioning(
    fleet_path: Any, provider: str | None, sandbox: Any, state_dir: Any, ray_address: str | None = None
) -> tuple[Provisioning | None, Any]:
    """The provisioning of ``serve --fleet SPEC --provider KIND`` (None without either) and, for
    ``--provider emulator``, the Ray address of the emulated fleet it started in ``<state-dir>/fleet``.
    ``ray_address``: the cluster the control plane serves (GCE TPU VMs join its head)."""
    from tpufleet.control.loop.provisioner import ProvisionConfig
    from tpufleet.errors import SpecError
    from tpufleet.scheduler.autoscale import PoolView
    from tpufleet.spec import read_spec

    kind = check_provider(fleet_path, provider, sandbox is not None)
    if kind is None:
        return None, None
    spec = read_spec(fleet_path) if fleet_path is not None else None
    pools = tuple(
        PoolView(p.name, p.slice_type.accelerator_type, p.min_count, p.max_count, p.spot, p.spare_slices)
        for p in (spec.pools if spec else ())
    )
    config = ProvisionConfig(
        pools=pools,
        initial=tuple((p.name, p.slices) for p in (spec.pools if spec else ())),
        idle_timeout_s=float(spec.autoscaling.idle_timeout_s) if spec else 60.0,
        borrowing=spec.autoscaling.borrowing if spec else True,
    )
    if kind == "memory":
        from tpufleet.provision.memory import MemoryProvider

        memory = MemoryProvider(
            delay_s=MEMORY_DELAY_S, on_up=sandbox.add_slices, on_down=sandbox.remove_slices
        )
        return Provisioning(memory, config, spec), None
    if kind == "emulator":
        from tpufleet.emulator import EmulatedFleet
        from tpufleet.provision.emulator import EmulatorProvider

        fleet = EmulatedFleet("", state_dir=state_dir / "fleet").up()
        try:
            emulated = EmulatorProvider(state_dir / "fleet")
        except BaseException:
            fleet.down()
            raise
        return Provisioning(emulated, config, spec, fleet), fleet.ray_address
    if spec is None:
        raise SpecError(f"--provider {kind} needs --fleet SPEC (its project and zone, or its RayCluster)")
    if kind == "gce":
        from tpufleet.provision import gce

        return Provisioning(gce.GceProvider(gce.config_from_spec(spec, str(ray_address))), config, spec), None
    from tpufleet.provision import kuberay

    return Provisioning(kuberay.KubeRayProvider(kuberay.config_from_spec(spec)), config, spec), None

"""``tpufleet serve``: run the control plane (store, scheduling loop, cluster client, REST API).

Flags are parsed here into what ``ControlPlane`` builds from (``control.plane.PlaneOptions``: the
store, the loop's config and limits, the provider and provisioner), then it runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from tpufleet.cli._app import app, console_err
from tpufleet.cli.common import finite
from tpufleet.control.cluster.protocol import ClusterClient
from tpufleet.control.store.values import DEFAULT_LIMITS, Limits, sqlite_in_memory
from tpufleet.errors import SpecError
from tpufleet.host.runlimits import DEFAULT_OPEN_FILES, DEFAULT_PROCESSES


@app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            envvar="RAY_ADDRESS",
            help="Ray GCS address host:port (default: the local emulated fleet, as --emulator).",
        ),
    ] = None,
    emulator: Annotated[
        bool,
        typer.Option(
            "--emulator",
            help="Serve the emulated fleet `tpufleet emulate up` started (its state dir: --emulator-dir, "
            "$TPUFLEET_EMULATOR_DIR, the remembered one, or ~/.cache/tpufleet/emulator).",
        ),
    ] = False,
    emulator_dir: Annotated[
        Path | None,
        typer.Option(
            "--emulator-dir",
            envvar="TPUFLEET_EMULATOR_DIR",
            metavar="STATE_DIR",
            help="The emulated fleet's state dir (implies --emulator).",
            show_default=False,
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="The database: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB (default: SQLite "
            "in the state dir).",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(envvar="TPUFLEET_PORT", min=0, max=65535, help="Port to listen on (0: a free one)."),
    ] = 8600,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="Database, admin token, checkpoints (default ~/.tpufleet)."),
    ] = None,
    allow_working_dir_url: Annotated[
        list[str],
        typer.Option(
            "--allow-working-dir-url",
            metavar="PREFIX",
            help="A URL prefix a job's working_dir may name (e.g. https://artifacts.example.com/pkgs/); "
            "repeatable; none by default (only uploaded packages).",
        ),
    ] = [],  # noqa: B006
    allow_ray_jobs: Annotated[
        bool,
        typer.Option(
            "--allow-ray-jobs",
            help="Accept Ray jobs (submit --ray, and Ray's own job API under /ray: ray job submit "
            "--address http://HOST:PORT/ray): a Ray driver holds the Ray cluster's power, so enable "
            "them only for tenants you trust with it (docs/ray-jobs.md). Off by default.",
        ),
    ] = False,
    max_queued_per_tenant: Annotated[
        int, typer.Option("--max-queued-per-tenant", min=1, help="Queued jobs a tenant may have.")
    ] = DEFAULT_LIMITS.max_queued_per_tenant,
    max_queued_mib_per_tenant: Annotated[
        float,
        typer.Option(
            "--max-queued-mib-per-tenant",
            callback=finite,
            min=0.001,
            help="MiB of queued job bodies (commands, env, names) a tenant may have; past it a submit "
            "is refused (409).",
        ),
    ] = DEFAULT_LIMITS.max_queued_bytes_per_tenant / (1 << 20),
    max_package_bytes: Annotated[
        int, typer.Option("--max-package-bytes", min=1, help="Largest working_dir package upload.")
    ] = DEFAULT_LIMITS.max_package_bytes,
    package_quota_mib: Annotated[
        int,
        typer.Option(
            "--package-quota-mib",
            min=1,
            help="MiB of uploaded packages a tenant may store; a package no queued or running job "
            "names is deleted an hour after its upload or its last job's end.",
        ),
    ] = DEFAULT_LIMITS.package_quota_bytes // (1 << 20),
    checkpoint_root: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint-root",
            help="Where jobs' files live on the hosts: <root>/<tenant>/<job> is TPUFLEET_CHECKPOINT_DIR "
            "(default <state-dir>/checkpoints; on real clusters a shared filesystem).",
        ),
    ] = None,
    checkpoint_quota_gib: Annotated[
        float | None,
        typer.Option(
            "--checkpoint-quota-gib",
            metavar="G",
            help="What <checkpoint-root>/<tenant> (all of a tenant's jobs' files) may hold, in GiB, checked "
            "on the hosts at a run's start and every few seconds: a run over it fails its attempt, saying "
            "so. Shown in `tpufleet tenants`. Default: no limit (usage is still measured and shown).",
            show_default=False,
        ),
    ] = None,
    checkpoint_retention_days: Annotated[
        float | None,
        typer.Option(
            "--checkpoint-retention-days",
            metavar="D",
            help="Remove a finished (SUCCEEDED, FAILED, CANCELLED) job's <checkpoint-root>/<tenant>/<job> "
            "D days after it ended, through a host (an event says so). Default: kept (a finished job's "
            "checkpoints are often its trained model).",
            show_default=False,
        ),
    ] = None,
    max_log_mb: Annotated[
        float,
        typer.Option(
            "--max-log-mb",
            callback=finite,
            min=0.001,
            help="Stored output per host and attempt; past it a log is truncated and says so (the "
            "host's own copy stops there too).",
        ),
    ] = 64.0,
    job_process_limit: Annotated[
        int,
        typer.Option(
            "--job-process-limit",
            min=16,
            help="Processes and threads one job may have at once on each host (a pids cgroup, v2 or "
            "v1, where the host has one; else counted by the runner's scan). A job that reaches it is "
            "ended at once and its attempt fails, saying so.",
        ),
    ] = DEFAULT_PROCESSES,
    job_open_files_limit: Annotated[
        int,
        typer.Option(
            "--job-open-files-limit",
            min=64,
            help="Open files one job may hold on each host, over all its processes (counted about "
            "once a second; no process may hold more either). Past it the job is ended and its "
            "attempt fails, saying so.",
        ),
    ] = DEFAULT_OPEN_FILES,
    start_timeout: Annotated[
        float,
        typer.Option(
            "--start-timeout",
            callback=finite,
            min=1,
            help="Seconds from admission to every host running; longer fails the attempt.",
        ),
    ] = 600.0,
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox",
            metavar="SLICES",
            help="Run over an in-memory fleet instead of Ray, e.g. v4-16:64,v4-32:16: nothing is "
            "executed, every host of a job runs --job-seconds and exits 0 (a job's env may set "
            "TPUFLEET_SANDBOX_SECONDS, TPUFLEET_SANDBOX_EXIT). Its own state dir by default "
            "(<state-dir>/sandbox). Not with --ray-address or --emulator.",
            show_default=False,
        ),
    ] = None,
    job_seconds: Annotated[
        float,
        typer.Option(
            "--job-seconds", callback=finite, min=0, help="With --sandbox: how long every host of a job runs."
        ),
    ] = 1.0,
    pricing_file: Annotated[
        Path | None,
        typer.Option(
            "--pricing",
            metavar="FILE",
            help="Prices for cost (USD per chip-hour) over the shipped table: a fleet spec's pricing: "
            "section, or a file of just that mapping (default: --fleet's; docs/observability.md). "
            "Unknown prices stay unknown.",
            show_default=False,
        ),
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option(
            "--fleet",
            metavar="SPEC",
            help="A fleet spec (the one `render` reads): its pools (slices, min_slices, max_slices, spot), "
            "autoscaling.idle_timeout_s and tenants; slices are made and removed through --provider.",
            show_default=False,
        ),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(
            "--provider",
            metavar="KIND",
            help="Who makes slices: emulator (starts an emulated fleet in <state-dir>/fleet and tears it "
            "down on exit), gce, kuberay, or memory (with --sandbox; --sandbox none starts with no "
            "slices). Enables the slice manager (`tpufleet slice create`) and autoscaling.",
            show_default=False,
        ),
    ] = None,
    lease_seconds: Annotated[
        float,
        typer.Option(
            "--lease-seconds",
            callback=finite,
            min=0.5,
            max=600,
            help="With a PostgreSQL --db (replicas): the leader lease's length; a standby takes over at "
            "most this long plus a fifth of it after the leader died (docs/replicas.md).",
        ),
    ] = 5.0,
    api_processes: Annotated[
        int,
        typer.Option(
            "--api-processes",
            min=0,
            max=64,
            metavar="N",
            help="Serve the API from N processes of their own, so that no request takes the "
            "scheduling loop's interpreter (a stream of submits otherwise lengthens its cycles); "
            "0: the API in this process. Not with an in-memory SQLite --db (docs/control-plane.md).",
        ),
    ] = 0,
) -> None:
    """Run the control plane: store, scheduling loop, Ray executor and REST API (/api/v1, /healthz).

    With --sandbox SLICES, the same control plane over an in-memory fleet (no Ray): try quotas and
    priorities, or load-test the loop. One serve per state dir (a second one is refused, naming the
    first); once its port is bound it records its URL and admin token path in the CLI context
    (`tpufleet context`), so client commands on this machine need neither --server nor --token."""
    from tpufleet.api.server import ControlPlane
    from tpufleet.api.serving import default_state_dir, listen, lock_database, lock_state_dir, url_of
    from tpufleet.cli import context
    from tpufleet.control.loop import failpoints
    from tpufleet.control.loop.service import ServiceConfig
    from tpufleet.control.plane import Replicas
    from tpufleet.pricing import load_file as load_prices

    # --pricing FILE, else the --fleet spec's pricing: section, over the shipped table; a bad file: exit 2
    price_file = pricing_file or fleet
    prices = load_prices(price_file) if price_file else None
    quota_bytes, retention_s = checkpoint_rules(checkpoint_quota_gib, checkpoint_retention_days)

    given = {
        name
        for name in ("ray_address", "emulator", "emulator_dir")
        if (src := ctx.get_parameter_source(name)) is not None and src.name == "COMMANDLINE"
    }
    if sandbox is not None and given:
        raise SpecError("--sandbox runs without Ray: give --sandbox or --ray-address/--emulator, not both")
    if sandbox is None and ctx.get_parameter_source("job_seconds").name == "COMMANDLINE":  # type: ignore[union-attr]
        raise SpecError("--job-seconds goes with --sandbox SLICES")
    if db is not None:
        from tpufleet.control.store.database import make_engine

        # the URL's form and its settings (?timeout=abc), before anything is locked: no I/O
        make_engine(db).dispose()
    shared = db is not None and db.startswith("postgresql")
    if not shared and ctx.get_parameter_source("lease_seconds").name == "COMMANDLINE":  # type: ignore[union-attr]
        raise SpecError(
            "--lease-seconds goes with a PostgreSQL --db (replicas); SQLite serves one replica only"
        )
    if api_processes and db is not None and sqlite_in_memory(db):
        raise SpecError(
            "--api-processes needs a database the API processes can open too: a SQLite file "
            "(the default) or PostgreSQL, not an in-memory SQLite --db"
        )
    if emulator and "ray_address" in given:
        raise SpecError("give --ray-address or --emulator, not both")
    from tpufleet.cli.slices import check_provider, provisioning

    check_provider(fleet, provider, sandbox is not None)
    if provider == "emulator" and given:
        raise SpecError(
            "--provider emulator starts its own emulated fleet: not with --ray-address/--emulator"
        )
    limits = Limits(
        checkpoint_quota_bytes=quota_bytes,
        working_dir_url_prefixes=tuple(_url_prefix(p) for p in allow_working_dir_url),
        max_queued_per_tenant=max_queued_per_tenant,
        max_queued_bytes_per_tenant=int(max_queued_mib_per_tenant * (1 << 20)),
        max_package_bytes=max_package_bytes,
        package_quota_bytes=package_quota_mib << 20,
        ray_jobs=allow_ray_jobs,
    )
    config = ServiceConfig(
        checkpoint_root=str(checkpoint_root.resolve()) if checkpoint_root else None,
        max_log_bytes=int(max_log_mb * (1 << 20)),
        job_process_limit=job_process_limit,
        job_open_files_limit=job_open_files_limit,
        start_timeout_s=start_timeout,
        checkpoint_retention_s=retention_s,
        failpoints=failpoints.parse(os.environ.get(failpoints.ENV)),
    )
    sandboxed = None
    if sandbox is not None:
        from tpufleet.control.cluster.memory import MemoryCluster, fleet_slices

        empty = sandbox.strip().lower() in ("", "none")
        sandboxed = MemoryCluster.sandbox([] if empty else fleet_slices(sandbox), job_seconds=job_seconds)
        cluster: ClusterClient = sandboxed
        # Its launches and stops return at once (nothing is started or waited for), so the loop makes
        # them on its own thread: a launch is marked and polled, and a stop ends its attempt, in the
        # turn that issued it, instead of a turn later once a pool thread has run it.
        config = replace(config, stop_threads=0)
        state_dir = state_dir or default_state_dir() / "sandbox"  # never the real fleet's database
        shown = "none: no slice yet" if empty else sandbox
        where = f"a sandbox fleet ({shown}; jobs run {job_seconds:g} s, nothing is executed)"
    state_dir = state_dir or default_state_dir()
    # One serve per state dir, checked first (before Ray, the port or the store): a second one is
    # refused naming the first, and changes nothing.
    lock = lock_state_dir(state_dir)
    if sandbox is None and provider != "emulator":
        from tpufleet.control.ray.headwatch import AWAIT_ENV

        lost = os.environ.get(AWAIT_ENV)  # a fresh start after a lost head (raywatch): wait for Ray
        if lost:
            console_err.print(
                f"Ray's head at {lost} was lost: waiting for Ray to answer again", highlight=False
            )
        ray_address, cluster = _ray(ray_address, emulator, emulator_dir)
        os.environ.pop(AWAIT_ENV, None)
        where = f"Ray at {ray_address}"
    # The port before anything is started or recorded: a taken one is one line, exit 2.
    sock = listen(host, port)
    url = url_of(host, sock)
    lock.note(url)
    # SQLite takes one serve, whichever state dir: a second one on the file is refused here, before
    # the store is opened (after the port, like everything a refused serve would leave behind)
    db_lock = lock_database(db or f"sqlite:///{state_dir / 'tpufleet.db'}")
    if db_lock is not None:
        db_lock.note(url)
    prov, started = provisioning(fleet, provider, sandboxed, state_dir, None if sandbox else ray_address)
    if started is not None:
        from tpufleet.api.server import ray_cluster

        ray_address, where = started, f"the emulated fleet in {state_dir}/fleet (Ray at {started})"
        try:
            cluster = ray_cluster(started)
        except BaseException:
            prov.close() if prov else None
            raise
    cp = ControlPlane(
        cluster,
        state_dir=state_dir,
        db_url=db,
        limits=limits,
        config=config,
        prices=prices,
        provider=None if prov is None else prov.provider,
        provision=None if prov is None else prov.config,
        replicas=Replicas(lease_s=lease_seconds, renew_s=lease_seconds / 5) if shared else None,
    )
    if prov is not None:
        prov.create_tenants(cp)
    note = "created" if cp.admin_token_created else "kept"
    context.remember(
        server=url,
        server_state_dir=str(cp.state_dir.resolve()),
        admin_token_path=str(cp.admin_token_path.resolve()),
        ray_address=None if sandbox else ray_address,
    )
    console_err.print(f"admin token ({note}): {cp.admin_token_path} (mode 0600)", highlight=False)
    console_err.print(f"tpufleet control plane on {url} for {where} (API /api/v1)", highlight=False)
    if shared:
        console_err.print(
            f"replica {cp.replica}: the replica holding the lease (PostgreSQL) runs the loop "
            f"(lease {lease_seconds:g} s; docs/replicas.md)",
            highlight=False,
        )
    if api_processes:
        console_err.print(
            f"the API runs in {api_processes} processes of its own; this one ({os.getpid()}) runs the loop",
            highlight=False,
        )
    if config.failpoints:  # for crash tests only: said loudly, so nobody runs with one by mistake
        console_err.print(
            f"{failpoints.ENV} is set: this process kills itself (SIGKILL) at "
            f"{', '.join(sorted(config.failpoints))}; unset it for a real fleet",
            highlight=False,
        )
    if (
        sandbox is None and started is None and ray_address
    ):  # a Ray cluster someone else runs: follow its head
        from tpufleet.control.ray.headwatch import HeadWatch

        HeadWatch(ray_address).start()
    try:
        cp.serve(sock, api_processes=api_processes)
    finally:
        if prov is not None:
            prov.close()  # --provider emulator: the emulated fleet goes down with the control plane
    # Ray's exit handler (ray.shutdown) can hang for minutes when the cluster is gone; everything of
    # ours is closed and committed by now, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _ray(address: str | None, emulator: bool, emulator_dir: Path | None) -> tuple[str, ClusterClient]:
    """The Ray address to serve (the local emulated fleet's unless given) and its executor."""
    from tpufleet.api.server import ray_cluster
    from tpufleet.cli.emulate import running_fleet_address
    from tpufleet.control.ray.headwatch import AWAIT_ENV

    if not address or emulator or emulator_dir:
        _, address = running_fleet_address(emulator_dir, wait=bool(os.environ.get(AWAIT_ENV)))
    return address, ray_cluster(address)  # fails within seconds, naming the address, if nothing is there


def _url_prefix(prefix: str) -> str:
    scheme, sep, rest = prefix.partition("://")
    if not sep or not scheme or "/" not in rest or scheme.lower() == "file":
        raise SpecError(
            f"{prefix!r}: give a URL prefix with a host and a path, e.g. https://artifacts.example.com/pkgs/",
            field="--allow-working-dir-url",
        )
    return prefix


def checkpoint_rules(
    quota_gib: float | None, retention_days: float | None
) -> tuple[int | None, float | None]:
    """``serve --checkpoint-quota-gib`` in bytes and ``--checkpoint-retention-days`` in seconds
    (None: not given); a SpecError for a value that is not a number > 0."""
    given = (("--checkpoint-quota-gib", quota_gib), ("--checkpoint-retention-days", retention_days))
    for flag, value in given:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError(f"must be a number > 0, got {value:g}", field=flag)
    quota = None if quota_gib is None else max(1, int(quota_gib * (1 << 30)))
    return quota, None if retention_days is None else retention_days * 86400.0

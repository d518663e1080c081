"""``tpufleet catalog``: the TPU slice types tpufleet knows, as a table or JSON."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from tpufleet import catalog as cat
from tpufleet.cli._app import app, console, print_json
from tpufleet.errors import SpecError


@app.command("catalog")
def catalog_cmd(
    accelerator_type: Annotated[
        str | None, typer.Argument(help="One accelerator type, e.g. v4-16 or v6e-16.")
    ] = None,
    generation: Annotated[
        str | None, typer.Option("--generation", "-g", help="Only this generation: v4, v5e, v5p, v6e, tpu7x.")
    ] = None,
    topology: Annotated[str | None, typer.Option(help="With --generation: one topology, e.g. 4x4.")] = None,
    machine_type: Annotated[
        str | None, typer.Option("--machine-type", help="With --topology, where a shape has two host sizes.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
) -> None:
    """List TPU slice types: chips, hosts, GKE labels and machine types, per generation."""
    if accelerator_type and (generation or topology):
        raise SpecError("give either an accelerator type (v4-16) or --generation/--topology, not both")
    if topology and not generation:
        raise SpecError("--topology needs --generation, e.g. --generation v6e --topology 4x4")
    if accelerator_type:
        rows = [cat.slice_type(accelerator_type)]
    elif generation and topology:
        rows = [cat.find(generation, topology, machine_type)]
    elif generation:
        gen = cat.generation(generation)
        rows = [st for st in cat.all_slice_types() if st.generation.name == gen.name]
    else:
        rows = list(cat.all_slice_types())
    if as_json:
        print_json([st.to_dict() for st in rows])
        return
    table = Table(title=f"TPU slice types ({len(rows)})", title_justify="left")
    for col in (
        "type",
        "generation",
        "topology",
        "chips",
        "hosts",
        "chips/host",
        "GKE accelerator",
        "machine type",
        "HBM GiB",
        "bf16 TFLOP/s",
    ):
        table.add_column(col, justify="right" if col[0].isdigit() or col in ("chips", "hosts") else "left")
    for st in rows:
        table.add_row(
            st.accelerator_type,
            st.generation.name,
            str(st.topology),
            str(st.chips),
            str(st.hosts),
            str(st.chips_per_host),
            st.gke_accelerator,
            st.machine_type,
            f"{st.hbm_gib:,}",
            f"{st.peak_bf16_tflops:,.0f}",
        )
    console.print(table)

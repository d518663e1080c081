"""TPU prices per generation, on-demand and spot, in USD per chip-hour: shipped, overridable, never guessed.

``shipped()`` is the table in ``prices.yaml`` (each row with its source and date; see that file).
An operator overrides rows with a fleet spec's ``pricing:`` section or a file of the same shape
(``serve --pricing FILE``)::

    pricing:
      v5e: {on_demand: 1.56, spot: 0.51}        # e.g. europe-west4
      tpu7x: {on_demand: 12.0, source: "our contract, 2026-10"}

A field not given keeps the shipped value. A price nobody gave is **unknown**: ``price()`` returns
None and cost shows "unknown"; it is never taken as zero. Pure: no I/O beyond reading the data file
and a YAML file the caller names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tpufleet import catalog
from tpufleet._yamlpos import read_yaml
from tpufleet.errors import InputError, SpecError

__all__ = [
    "ON_DEMAND",
    "PRICINGS",
    "SPOT",
    "Price",
    "PriceTable",
    "dollars",
    "load_file",
    "parse_overrides",
    "shipped",
]

ON_DEMAND, SPOT = "on_demand", "spot"
PRICINGS = (ON_DEMAND, SPOT)  # the `pricing` label of the cost metrics
_FIELDS = (ON_DEMAND, SPOT, "source", "date", "region")


@dataclass(frozen=True)
class Price:
    """One generation's prices (USD per chip-hour; None: unknown) and where they come from."""

    generation: str
    on_demand: float | None = None
    spot: float | None = None
    region: str | None = None
    source: str | None = None
    date: str | None = None

    def of(self, pricing: str) -> float | None:
        return self.spot if pricing == SPOT else self.on_demand

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("generation", ON_DEMAND, SPOT, "region", "source", "date")}


@dataclass(frozen=True)
class PriceTable:
    """Prices by canonical generation name (``v5e``, not ``v5litepod``)."""

    rows: tuple[Price, ...]

    def row(self, generation: str) -> Price | None:
        key = _generation(generation)
        return next((p for p in self.rows if p.generation == key), None)

    def price(self, generation: str, pricing: str = ON_DEMAND) -> float | None:
        """USD per chip-hour, or None when unknown (an unknown generation included)."""
        try:
            row = self.row(generation)
        except SpecError:
            return None
        return row.of(pricing) if row is not None else None

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]], source: str) -> PriceTable:
        """This table with ``overrides`` (already checked by :func:`parse_overrides`) on top; a row
        changed here says ``source`` unless the override names its own."""
        rows = {p.generation: p for p in self.rows}
        for gen, fields in overrides.items():
            old = rows.get(gen, Price(gen))
            given = {k: v for k, v in fields.items() if k in _FIELDS}
            prices = [k for k in PRICINGS if k in given]
            if "source" not in given:
                kept = [k for k in PRICINGS if k not in given and old.of(k) is not None]
                given["source"] = f"{source} ({', '.join(prices) or 'no price'})" + (
                    f"; {', '.join(kept)}: {old.source}" if kept and old.source else ""
                )
            if prices:
                given.setdefault("date", None)
                given.setdefault("region", None)
            rows[gen] = replace(old, **given)
        return PriceTable(tuple(sorted(rows.values(), key=lambda p: _order(p.generation))))

    def to_list(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self.rows]


def dollars(chip_seconds: float, price_per_chip_hour: float | None) -> float | None:
    """Cost of ``chip_seconds`` at a price; None when the price is unknown (never zero)."""
    if price_per_chip_hour is None:
        return None
    return chip_seconds / 3600.0 * price_per_chip_hour


@cache
def shipped() -> PriceTable:
    """The table shipped with tpufleet (``prices.yaml``)."""
    text = resources.files("tpufleet").joinpath("prices.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    rows = []
    for item in data["prices"]:
        gen = _generation(item["generation"])
        rows.append(
            Price(
                gen,
                _price(item.get(ON_DEMAND), f"{gen}.{ON_DEMAND}"),
                _price(item.get(SPOT), f"{gen}.{SPOT}"),
                item.get("region"),
                item.get("source"),
                str(item["date"]) if item.get("date") else None,
            )
        )
    return PriceTable(tuple(rows))


def parse_overrides(data: Any, file: str = "<pricing>") -> dict[str, dict[str, Any]]:
    """Check a ``pricing:`` mapping (generation -> {on_demand, spot, source, date, region}); returns
    it keyed by canonical generation. A SpecError names the bad field and what would be right."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SpecError(
            "pricing is a mapping of generation to prices, e.g. {v5e: {on_demand: 1.2, spot: 0.3}}",
            file=file,
            field="pricing",
        )
    out: dict[str, dict[str, Any]] = {}
    for name, fields in data.items():
        try:
            gen = _generation(str(name))
        except SpecError as err:
            raise SpecError(err.message, file=file, field=f"pricing.{name}") from None
        if not isinstance(fields, Mapping):
            raise SpecError(
                f"give prices as {{on_demand: USD per chip-hour, spot: ...}}, got {fields!r}",
                file=file,
                field=f"pricing.{name}",
            )
        row: dict[str, Any] = {}
        for key, value in fields.items():
            where = f"pricing.{name}.{key}"
            if key not in _FIELDS:
                raise SpecError(f"unknown field {key!r}; valid: {', '.join(_FIELDS)}", file=file, field=where)
            if key in (ON_DEMAND, SPOT):
                row[key] = _price(value, where, file)
            elif value is not None:
                row[key] = str(value)
        out[gen] = row
    return out


def load_file(path: str | Path, base: PriceTable | None = None) -> PriceTable:
    """``base`` (default: the shipped table) with the prices of a YAML file on top: a fleet spec
    (its ``pricing:`` section) or a file holding just that mapping (optionally under ``pricing:``)."""
    try:
        text = read_yaml(path)  # bounded: --pricing /dev/zero was read until memory ran out
    except OSError as err:
        raise InputError(f"{path}: cannot read the prices: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: cannot read the prices: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(f"not YAML: {' '.join(str(err).split())}", file=str(path)) from None
    if isinstance(data, Mapping) and ("pricing" in data or "pools" in data):
        data = data.get("pricing")
    overrides = parse_overrides(data, str(path))
    return (base or shipped()).with_overrides(overrides, f"{path}")


def _price(value: Any, where: str, file: str | None = None) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0:
        raise SpecError(
            f"a price is USD per chip-hour, a number >= 0 (or null for unknown); got {value!r}",
            file=file,
            field=where,
        )
    return float(value)


@cache
def _generation(name: str) -> str:
    return catalog.generation(name).name


def _order(generation: str) -> int:
    names = [g.name for g in catalog.GENERATIONS]
    return names.index(generation) if generation in names else len(names)

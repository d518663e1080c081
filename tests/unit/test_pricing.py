"""The shipped price table, overrides from a fleet spec or a file, and unknown prices staying unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpufleet import pricing
from tpufleet.errors import InputError, SpecError
from tpufleet.spec import load_spec


def test_every_shipped_row_has_both_prices_a_source_and_a_date() -> None:
    table = pricing.shipped()
    assert {p.generation for p in table.rows} >= {"v4", "v5e", "v5p", "v6e"}
    for row in table.rows:
        assert row.on_demand is not None and row.on_demand > 0, row
        assert row.spot is not None and 0 < row.spot < row.on_demand, row
        assert row.source and "skypilot-catalog" in row.source and row.date and row.region, row


@pytest.mark.parametrize(
    ("generation", "kind", "expected"),
    [
        ("v4", "on_demand", 3.22),  # 12.88 per 4-chip tpu-v4-8
        ("v4", "spot", 0.9215),  # 3.686 / 4
        ("v5e", "on_demand", 1.2),
        ("v5litepod", "spot", 0.29771),  # any of the generation's names
        ("v5p", "on_demand", 4.2),  # 16.8 per 4-chip tpu-v5p-8
        ("v6e", "spot", 0.59266),
    ],
)
def test_shipped_prices_are_the_catalog_rows_per_chip(generation: str, kind: str, expected: float) -> None:
    assert pricing.shipped().price(generation, kind) == pytest.approx(expected)


def test_an_unknown_price_is_none_never_zero() -> None:
    table = pricing.shipped()
    assert table.price("tpu7x") is None and table.price("tpu7x", "spot") is None
    assert table.price("not-a-generation") is None
    assert pricing.dollars(3600, None) is None
    assert pricing.dollars(7200, 2.5) == pytest.approx(5.0)


def test_overrides_change_only_what_they_name_and_say_where_from() -> None:
    table = pricing.shipped().with_overrides(
        pricing.parse_overrides({"v5litepod": {"spot": 0.5}, "tpu7x": {"on_demand": 12}}), "fleet.yaml"
    )
    v5e = table.row("v5e")
    assert v5e is not None and (v5e.on_demand, v5e.spot) == (1.2, 0.5)
    assert v5e.source is not None and v5e.source.startswith("fleet.yaml (spot)")
    assert (table.price("tpu7x"), table.price("tpu7x", "spot")) == (12.0, None)
    assert table.price("v4") == pricing.shipped().price("v4")


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"v9": {"on_demand": 1}}, "pricing.v9", "not a TPU generation"),
        ({"v4": {"on_demand": -1}}, "pricing.v4.on_demand", "number >= 0"),
        ({"v4": {"on_demand": "cheap"}}, "pricing.v4.on_demand", "number >= 0"),
        ({"v4": {"ondemand": 1}}, "pricing.v4.ondemand", "unknown field"),
        ({"v4": 3}, "pricing.v4", "on_demand"),
        ([1, 2], "pricing", "mapping"),
    ],
)
def test_bad_overrides_name_the_field(data: object, field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        pricing.parse_overrides(data, "p.yaml")
    assert err.value.field == field and words in str(err.value) and "p.yaml" in str(err.value)


def test_a_prices_file_or_a_fleet_spec_overrides_the_shipped_table(tmp_path: Path) -> None:
    plain = tmp_path / "prices.yaml"
    plain.write_text("v6e: {on_demand: 3.0}\n")
    assert pricing.load_file(plain).price("v6e") == 3.0
    spec = tmp_path / "fleet.yaml"
    spec.write_text(Path("examples/fleet.yaml").read_text() + "pricing:\n  v4: {spot: 1.0}\n")
    assert load_spec(spec.read_text()).pricing["v4"].spot == 1.0  # the spec accepts the section
    table = pricing.load_file(spec)
    assert (table.price("v4", "spot"), table.price("v4")) == (1.0, 3.22)
    with pytest.raises(InputError):
        pricing.load_file(tmp_path / "missing.yaml")


def test_the_spec_checks_its_pricing_section() -> None:
    base = Path("examples/fleet.yaml").read_text()
    with pytest.raises(SpecError, match=r"pricing\.v4\.ondemand: unknown field 'ondemand'; did you mean"):
        load_spec(base + "pricing:\n  v4: {ondemand: 1}\n")
    with pytest.raises(SpecError, match=r"pricing\.v9: 'v9' is not a TPU generation"):
        load_spec(base + "pricing:\n  v9: {on_demand: 1}\n")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_prices_file_is_read_only_up_to_the_yaml_limit_and_must_be_text(tmp_path: Path) -> None:
    """`serve --pricing /dev/zero` read until memory ran out; bytes that are not UTF-8 were a traceback."""
    with pytest.raises(InputError, match=r"^/dev/zero: over [\d,]+ characters \(the limit for a YAML file\)"):
        pricing.load_file("/dev/zero")
    binary = tmp_path / "prices.bin"
    binary.write_bytes(b"\xd0\x00\xff" * 100)
    with pytest.raises(InputError, match="cannot read the prices: not UTF-8 text"):
        pricing.load_file(binary)

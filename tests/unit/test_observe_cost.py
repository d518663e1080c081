"""Cost arithmetic, table-driven: chip-seconds x price per slice's pricing, multi-slice jobs, spot,
unknown prices, badput dollars and a time window; durations for --since."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpufleet import pricing
from tpufleet.control.store.usage import UsageAttempt
from tpufleet.errors import SpecError
from tpufleet.observe import cost

PRICES = pricing.PriceTable(
    (
        pricing.Price("v4", on_demand=3.6, spot=1.8),  # 1 $/chip-hour = 1/3600 $/chip-second, x3.6 / x1.8
        pricing.Price("v6e", on_demand=None, spot=0.36),
    )
)


def attempt(**kw: object) -> UsageAttempt:
    base = UsageAttempt(
        job_id="j1", attempt=1, tenant="team-a", job_name="train", job_state="SUCCEEDED",
        accelerator_type="v4-16", num_slices=1, slices=("s0",), state="SUCCEEDED", message=None,
        exit_codes=(), admitted_at=0.0, ended_at=100.0, first_step=None, first_step_at=None,
        last_step=None, last_step_at=None, waited_from=None,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


CASES = [
    # name, attempts, slice pricing, since, expected (chip_s, dollars, badput_dollars)
    ("one v4-16 (8 chips) for 100 s on demand", [attempt()], {}, None, (800, 0.8, None)),
    ("spot halves it", [attempt()], {"s0": "spot"}, None, (800, 0.4, None)),
    (
        "two slices, one of them spot",
        [attempt(num_slices=2, slices=("s0", "s1"))],
        {"s1": "spot"},
        None,
        (1600, 0.8 + 0.4, None),
    ),
    (
        "two attempts add up",
        [attempt(ended_at=50.0, state="FAILED"), attempt(attempt=2, admitted_at=60.0, ended_at=110.0)],
        {},
        None,
        (800, 0.8, None),
    ),
    (
        "steps reported: badput is start-up (10 s) and idle (10 s)",
        [attempt(first_step=1, first_step_at=10.0, last_step=81, last_step_at=90.0)],
        {},
        None,
        (800, 0.8, 0.16),
    ),
    (
        "a window keeps the chip time inside it",
        [attempt(first_step=1, first_step_at=10.0, last_step=81, last_step_at=90.0)],
        {},
        75.0,
        (200, 0.2, 0.08),  # 25 s: 15 productive, 10 idle
    ),
    (
        "an unknown on-demand price is unknown, not zero",
        [attempt(accelerator_type="v6e-16")],
        {},
        None,
        (1600, None, None),
    ),
    (
        "the same generation's spot price is known",
        [attempt(accelerator_type="v6e-16")],
        {"s0": "spot"},
        None,
        (1600, 0.16, None),
    ),
]


@pytest.mark.parametrize(("name", "attempts", "kinds", "since", "expected"), CASES, ids=[c[0] for c in CASES])
def test_cost_table(
    name: str,
    attempts: list[UsageAttempt],
    kinds: dict[str, str],
    since: float | None,
    expected: tuple[float, float | None, float | None],
) -> None:
    got = cost.report(attempts, PRICES, kinds, now=200.0, since=since)
    (job,) = got.jobs
    chip_s, dollars, badput = expected
    assert job.chip_seconds == pytest.approx(chip_s)
    assert job.dollars == (None if dollars is None else pytest.approx(dollars))
    assert job.badput_dollars == (None if badput is None else pytest.approx(badput))
    (tenant,) = got.tenants
    assert (tenant.chip_seconds, tenant.dollars) == (job.chip_seconds, job.dollars)


def test_tenants_sum_their_jobs_and_count_unpriced_chip_time() -> None:
    rows = [
        attempt(job_id="a"),
        attempt(job_id="b", accelerator_type="v6e-16"),
        attempt(job_id="c", tenant="team-b", ended_at=None),
    ]
    got = cost.report(rows, PRICES, {}, now=200.0)
    a, b = got.tenants
    assert (a.tenant, a.jobs, a.chip_seconds, a.dollars) == ("team-a", 2, 2400, pytest.approx(0.8))
    assert a.unpriced_chip_seconds == 1600 and a.to_dict()["unpriced_chip_hours"] == pytest.approx(
        1600 / 3600
    )
    assert (b.tenant, b.chip_seconds) == ("team-b", 1600)  # running: to now
    assert (a.unreported_jobs, a.badput_dollars) == (2, None)  # no job reports steps: badput unknown
    assert got.to_dict()["currency"] == "USD" and got.to_dict()["prices"][0]["generation"] == "v4"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("12h", 43200), ("30m", 1800), ("90s", 90), ("3600", 3600), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert cost.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1d", "0", "7y", "d7"])
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(SpecError, match="7d, 12h, 30m"):
        cost.parse_duration(text)

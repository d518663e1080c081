"""Job names a hostile tenant cannot use to fool a reader (issue 28): a name derived from the
command follows the rule a given name follows (no control or format characters, at most 128
characters), and the rule refuses towers of combining marks that draw over the rows above."""

from __future__ import annotations

import unicodedata

import pytest
from test_api import Api

from tpufleet.control.store import values as r
from tpufleet.control.store.facade import Store
from tpufleet.errors import SpecError

RLO, ZWJ, BOM, ESC = "\u202e", "\u200d", "\ufeff", "\x1b"
ACUTE = "\u0301"  # COMBINING ACUTE ACCENT


def build(command: list[str], name: str | None = None) -> r.JobRequest:
    return r.JobRequest.build(command=command, accelerator_type="v4-16", name=name)


def assert_plain(name: str) -> None:
    assert 0 < len(name) <= 128
    assert not [c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")], ascii(name)
    build(["true"], name=name)  # what is stored is what a given name may be


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([f"./tenant alpha [close] {RLO}enilEKAF.sh"], "tenant alpha [close] enilEKAF"),
        (["python", f"tr{ZWJ}ain{BOM}.py"], "train"),
        (["bash", f"run\n== tpu-v4-8-1 worker 0 ==\n{ESC}[31m.sh"], "run== tpu-v4-8-1 worker 0 ==[31m"),
        ([f"x{ACUTE * 200}.py"], "x" + ACUTE * 3),
        ([ACUTE * 128], "job"),
        (["./\u2028\u2029.sh"], "job"),
        (["a" * 300], "a" * 128),
    ],
    ids=["rlo", "zwj-bom", "newline-esc", "marks", "only-marks", "separators", "long"],
)
def test_a_default_name_follows_the_rule_of_given_names(command: list[str], expected: str) -> None:
    """Today the name derived from the command went in unchecked: RLO, newline, ESC, ZWJ, BOM."""
    name = build(command).name
    assert name == expected
    assert_plain(name)


@pytest.mark.parametrize(
    "name",
    [ACUTE * 128, "e" + ACUTE * 4, "ok" + "\u0489" * 10, ACUTE + "abc", "a\u2028b"],
    ids=["128-marks", "four-on-one", "enclosing-marks", "leading-mark", "line-separator"],
)
def test_a_given_name_with_a_tower_of_marks_is_refused(name: str) -> None:
    with pytest.raises(SpecError, match=r"^name: (more than 3 combining marks|control or format)"):
        build(["true"], name=name)


@pytest.mark.parametrize("name", ["Việt-run", "नमस्ते", "e" + ACUTE * 3, "résumé 2"])
def test_names_in_real_scripts_still_pass(name: str) -> None:
    assert build(["true"], name=name).name == name


def test_the_api_says_why_in_a_400(store: Store) -> None:
    api = Api(store)
    token = api.tenant("team-a", v4=16)
    resp = api.call(
        "POST", "/jobs", token, json={"command": ["true"], "accelerator_type": "v4-16", "name": ACUTE * 128}
    )
    assert resp.status_code == 400
    assert resp.json()["error"].startswith("name: more than 3 combining marks on one character")
    job = api.submit(token, command=[f"{RLO}evil\n.sh"])
    assert api.call("GET", f"/jobs/{job}", token).json()["name"] == "evil"

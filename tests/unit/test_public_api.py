"""The public API is pinned: changing it is a decision, not an accident."""

import tpufleet


def test_all_is_pinned():
    assert sorted(tpufleet.__all__) == [
        "SliceManager",
        "SliceType",
        "Topology",
        "TpufleetError",
        "__version__",
        "find",
        "from_gke",
        "generation",
        "slice_type",
    ]
    for name in tpufleet.__all__:
        assert hasattr(tpufleet, name), name

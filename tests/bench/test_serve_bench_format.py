"""``smartsched bench serve``'s report: every measured path gets a row with its ratio to
the echo measured in the same run, the edge entry both interleaved and alone."""

from __future__ import annotations

from smartsched.bench.serve import format_serve_bench


def _row(p50: float, p99: float) -> dict[str, float]:
    return {"p50_ms": p50, "p99_ms": p99}


def test_every_path_is_a_row_with_its_ratio_to_echo() -> None:
    paths = {"echo": _row(10, 20), "region": _row(15, 30), "edge": _row(14, 28),
             "escalated": _row(22, 40), "edge_entry": _row(4, 9),
             "edge_entry_alone": _row(3, 5)}
    row = {**paths,
           "ratio_to_echo": {k: {"p50": v["p50_ms"] / 10, "p99": v["p99_ms"] / 20}
                             for k, v in paths.items() if k != "echo"},
           "hops_added_ms_p50": {"edge_minus_echo": 4, "region_minus_echo": 5,
                                 "escalated_minus_edge": 8},
           "batch_placements_per_s": 1234.0}
    text = format_serve_bench({"nodes_per_region": 20, "profiles": {"k8s-default": row},
                               "edge_compute": _row(0.1, 0.3)})
    assert "| k8s-default | edge entry, nothing between requests | 3.00 | 5.00 | 0.30 | " \
           "0.25 |" in text
    assert "| k8s-default | edge entry (mec-0's own port), interleaved | 4.00 | 9.00 |" in text
    assert "batch 1,234 placements/s" in text

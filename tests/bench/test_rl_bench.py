"""bench rl's in-process measurements (figures only, no timing assertions)."""

from __future__ import annotations

from pathlib import Path

from smartsched.bench.rl import env_and_model_split, inference_latency


def test_env_and_model_split() -> None:
    r = env_and_model_split(None, steps=40)
    assert r["steps"] == 40 and r["steps_per_second"] > 0
    assert abs(r["twin_share"] + r["model_share"] - 1.0) < 1e-9


def test_inference_latency_untrained(data_dir: Path) -> None:
    r = inference_latency(None, nodes=1600, decisions=20)
    assert r["decisions"] == 19 and r["p99_ms"] >= r["p50_ms"] > 0

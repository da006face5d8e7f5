"""Resource-use audit (issue 19, part 3): the twin's and Prometheus's collectors give each
running pod's use, and the samples land in the signed log as ``resource.use`` records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.log import AuditLog
from smartsched.audit.store import read_segment, segment_files
from smartsched.audit.usage import UsageCollector, audit_usage
from smartsched.audit.verify import verify_log


def _log_rows(root: Path) -> dict:
    return pa.concat_tables([read_segment(p) for p in segment_files(root / "log")]).to_pydict()


def test_the_twin_collector_agrees_with_the_twins_node_totals(tmp_path: Path) -> None:
    from smartsched.scheduling.run import build_run
    from smartsched.twin.sampling import running_use
    from smartsched.twin.usage_audit import TwinUsageCollector

    run = build_run("small", "mixed", "k8s-default", hours=2)
    run.drive()
    e = run.engine
    col = TwinUsageCollector(e, epoch_s=1.7e9)
    assert isinstance(col, UsageCollector)
    got = col.sample()
    assert got, "no pod running at the end of the run"
    use = running_use(e.table, e.state.capacity, e.now, e.config.seed)
    per_node = np.zeros((e.state.num_nodes, 3))
    for s in got:
        per_node[e.state.index[s.node]] += (s.cpu_milli, s.memory_mib, s.gpu_milli)
    # What the pods used adds up to what the twin reports per node (best-effort included).
    assert np.allclose(per_node[:, :2], use.usage[:, :2], rtol=1e-9, atol=1e-6)
    assert np.allclose(per_node[:, 2], use.hp[:, 2], rtol=1e-9, atol=1e-6)
    ids = {e.table.pods[p].id for p in use.pods}
    assert {s.pod for s in got} == ids and all(s.ts >= 1.7e9 for s in got)
    key = Ed25519PrivateKey.generate()
    with AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, fsync=False) as log:
        assert audit_usage(log, col) == len(got)
    assert verify_log(tmp_path / "log", tmp_path / "heads.jsonl", key.public_key()).ok
    rows = _log_rows(tmp_path)
    assert set(rows["kind"]) == {"resource.use"} and set(rows["principal"]) == {
        "collector:twin"}
    first = json.loads(rows["payload"][0])
    assert set(first) == {"pod", "tenant", "node", "cpu_milli", "memory_mib", "gpu_milli"}
    assert rows["tenant"][0] == first["tenant"]

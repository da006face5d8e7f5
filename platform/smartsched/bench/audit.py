"""``smartsched bench audit``: how fast the audit log appends, verifies and proves.

Appends decision records like the service's (a placement with its pod, node,
resources and scores; now and then a rejection with its statuses), from several
principals and tenants, through the real writer with its defaults (blocks of
4,096, fsync on, segments rolled to Parquet), then verifies the whole log and
proves a sample of records. Three rates: to the last record appended (sealed blocks
queued for fsync), to every record signed and fsync'd (``flush``), and to the log
closed (its last segment rewritten as Parquet, which a running log does in a child
process beside the appends).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def decision_payloads(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct decision payloads (made before timing: the service has them anyway)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        placed = rng.random() > 0.05
        doc: dict[str, Any] = {
            "pod": f"pod-{i:08d}", "request_id": f"req-{rng.getrandbits(48):012x}",
            "cpu_milli": rng.choice([500, 1000, 4000, 16000]),
            "memory_mib": rng.choice([1024, 4096, 32768]), "gpu": rng.choice([0, 0, 1, 8]),
            "profile": "rl:store/versions/v0007", "tier": "region"}
        if placed:
            doc.update(node=f"node-{rng.randrange(1500):04d}", region="region-a",
                       zone=f"zone-{rng.randrange(4)}", score=round(rng.random() * 100, 2))
        else:
            doc["statuses"] = [{"plugin": "NodeResourcesFit", "code": "Unschedulable",
                                "reason": "Insufficient nvidia.com/gpu", "nodes": 1412}]
        out.append(doc)
    return out


def run_audit_bench(records: int = 1_000_000, proofs: int = 100, fsync: bool = True,
                    work_dir: str | Path | None = None, seed: int = 0,
                    echo: Any = print) -> dict[str, Any]:
    from smartsched.audit.log import AuditLog
    from smartsched.audit.verify import check_proof, prove, verify_log
    from smartsched.bench.workdir import bench_dir

    root = (bench_dir(work_dir, "audit", "--work-dir") if work_dir  # never a real audit log
            else Path(tempfile.mkdtemp(prefix="smartsched-audit-")))
    shutil.rmtree(root / "log", ignore_errors=True)
    shutil.rmtree(root / "heads", ignore_errors=True)
    key = Ed25519PrivateKey.generate()
    pool = decision_payloads(min(records, 100_000), seed)
    principals = [f"tenant:{t}" for t in ("bank", "retail", "ml")] + ["operator"]
    tenants = ["bank", "retail", "ml", ""]
    kinds = ["placement" if "node" in d else "rejection" for d in pool]
    echo(f"appending {records:,} decision records (fsync {'on' if fsync else 'off'}) ...")
    t0 = time.perf_counter()
    log = AuditLog(root / "log", root / "heads" / "heads.jsonl", key, fsync=fsync)
    m = len(pool)
    for i in range(records):
        j = i % 4
        log.append(kinds[i % m], principals[j], pool[i % m], tenant=tenants[j])
    appended = time.perf_counter() - t0
    log.flush()
    durable = time.perf_counter() - t0
    log.close()
    closed = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (root / "log").rglob("*") if p.is_file())
    echo(f"  {records / appended:,.0f} records/s appended; {records / durable:,.0f}/s to "
         f"all signed and fsync'd ({durable:.1f} s); {records / closed:,.0f}/s with the last "
         f"segment rewritten as Parquet ({closed:.1f} s); {size / records:.0f} bytes a record")
    rep = verify_log(root / "log", root / "heads" / "heads.jsonl", key.public_key())
    echo(f"verify: {'OK' if rep.ok else 'FAILED: ' + str(rep.problem)}: {rep.records:,} "
         f"records, {rep.blocks:,} signed blocks in {rep.seconds:.1f} s "
         f"({rep.records / max(rep.seconds, 1e-9):,.0f} records/s)")
    rng = random.Random(seed)
    sizes, prove_ms, check_ms, ok = [], [], [], 0
    for _ in range(proofs):
        seq = rng.randrange(records)
        t1 = time.perf_counter()
        record, proof = prove(root / "log", root / "heads" / "heads.jsonl", seq)
        t2 = time.perf_counter()
        good, _ = check_proof(proof, record, key.public_key())
        t3 = time.perf_counter()
        ok += good
        sizes.append(len(proof))
        prove_ms.append(1e3 * (t2 - t1))
        check_ms.append(1e3 * (t3 - t2))
    echo(f"proofs: {ok}/{proofs} check; size {min(sizes)}-{max(sizes)} bytes; prove p50 "
         f"{statistics.median(prove_ms):.0f} ms, check p50 {statistics.median(check_ms):.2f} ms")
    if work_dir is None:
        shutil.rmtree(root, ignore_errors=True)
    return {"records": records, "fsync": fsync, "append_per_s": records / appended,
            "durable_per_s": records / durable, "closed_per_s": records / closed,
            "bytes_per_record": size / records,
            "verify_ok": rep.ok, "verify_s": rep.seconds, "blocks": rep.blocks,
            "proofs_ok": ok, "proofs": proofs, "proof_bytes_max": max(sizes),
            "prove_ms_p50": statistics.median(prove_ms),
            "check_ms_p50": statistics.median(check_ms)}

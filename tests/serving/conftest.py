"""One placement service on Ray Serve per test session, over real HTTP on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import free_port, wait_healthy
from tests.conftest import SERVICE_MAX_BODY_BYTES

TOKEN = "test-token-0123456789abcdef"
OPERATOR_TOKEN = "test-operator-0123456789abcdef"
TENANT_TOKENS = {"bank": "test-tenant-bank-0123456789", "retail": "test-tenant-retail-01234567"}


@pytest.fixture(scope="session")
def serve_args(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The service's config (medium cluster: 2 regions, 2 MEC sites)."""
    root = tmp_path_factory.mktemp("serve")
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    operator_file = root / "operator_token"
    operator_file.write_text(OPERATOR_TOKEN + "\n")
    models = root / "models"
    models.mkdir()
    tenants = {}
    for name, token in TENANT_TOKENS.items():
        (root / f"{name}_token").write_text(token + "\n")
        tenants[name] = {"token_file": str(root / f"{name}_token")}
    from smartsched.audit.keys import generate_key

    (root / "keys").mkdir()
    generate_key(root / "keys" / "audit.key")
    (root / "compliance.yaml").write_text(
        "compliance:\n  tenants: [bank, retail]\n  residency: {bank: [region-a]}\n"
        "  isolation:\n    - between: [tenant:bank, tenant:retail]\n")
    return {"cluster": "medium", "max_body_bytes": SERVICE_MAX_BODY_BYTES,
            "auth": {"token_file": str(token_file), "operator_token_file": str(operator_file),
                     "tenants": tenants},
            "journal_dir": str(Path(root) / "journal"), "models_dir": str(models),
            "audit": {"dir": str(root / "audit" / "log"),
                      "heads": str(root / "audit-heads" / "heads.jsonl"),
                      "key_file": str(root / "keys" / "audit.key"), "block_seconds": 0.2},
            "compliance": str(root / "compliance.yaml"),
            "edge_entry": {"ports": {"mec-0": free_port()}}}


@pytest.fixture(scope="session")
def service(ray_session, serve_args: dict):
    """Base URL of the running service."""
    from ray import serve

    from smartsched.serving.app import build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(serve_args), name="placement", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    yield url
    serve.delete("placement")
    serve.shutdown()


@pytest.fixture()
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture()
def operator() -> dict[str, str]:
    return {"Authorization": f"Bearer {OPERATOR_TOKEN}"}

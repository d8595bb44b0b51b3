"""The OpenAPI document is current, and generated requests never get a 5xx.

Schemathesis draws requests for every operation from docs/openapi.json, both
valid and invalid ones; each is sent twice: as it is (unsigned, so signed
routes must answer 401) and signed by the key the route's role needs (a
registered worker, the trainer or a validator; the operator's token for
/v1/admin). Every answer must be below 500, and a 2xx must be JSON or the
bytes a route serves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from swarmrl.orchestrator.app import openapi_spec
from swarmrl.protocol.signing import sign_request
from tests.unit.orch_util import Orch

ROOT = Path(__file__).resolve().parents[2]


def test_openapi_document_is_current():
    want = json.dumps(openapi_spec(), indent=1, sort_keys=True) + "\n"
    have = (ROOT / "docs" / "openapi.json").read_text()
    assert have == want, "docs/openapi.json is stale: swarmrl openapi > docs/openapi.json"


@pytest.fixture(scope="module")
def orch(tmp_path_factory):
    o = Orch(tmp_path_factory.mktemp("fuzz"), "trainer.batch_groups=100000")
    o.worker_key = o.worker("fuzzer")
    o.register(o.worker_key)
    o.open_step(1, 0)
    o.assignment(o.worker_key, 0)
    return o


schema = schemathesis.openapi.from_dict(json.loads((ROOT / "docs" / "openapi.json").read_text()))


def _signer(o: Orch, path: str):
    if path.startswith("/v1/trainer/"):
        return o.trainer
    if path.startswith("/v1/validation/"):
        return o.validator
    return o.worker_key


@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_never_get_a_5xx(case, orch):
    kw = case.as_transport_kwargs()
    body = b"" if case.body is None or "json" not in kw else json.dumps(kw["json"]).encode()
    req = orch.http.build_request(kw["method"], kw["url"], params=kw.get("params"), content=body)
    for k, v in (kw.get("headers") or {}).items():
        if k.lower() not in ("content-length", "host"):
            req.headers[k] = v
    if body:
        req.headers["content-type"] = "application/json"
    unsigned = orch.http.send(req)
    assert unsigned.status_code < 500, (case.method, case.path, unsigned.text[:300])
    path = req.url.path
    if path.startswith("/v1/admin/"):
        req.headers["authorization"] = f"Bearer {orch.token}"
    else:
        target = req.url.raw_path.decode()
        req.headers.update(
            sign_request(_signer(orch, path), orch.svc.run_id, req.method, target, body)
        )
    signed = orch.http.send(req)
    assert signed.status_code < 500, (case.method, case.path, signed.text[:300])
    if 200 <= signed.status_code < 300 and not path.startswith(
        ("/metrics", "/objects", "/v1/run/dataset")
    ):
        assert isinstance(signed.json(), dict)

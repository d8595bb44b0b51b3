"""The S3 object store, against moto's S3 server on loopback: the same flow as the
embedded store, and bytes other than the granted ones refused at submit even by a
server that does not enforce the signed checksum (moto does not)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from tests.unit.orch_util import Orch


@pytest.fixture(scope="module")
def s3_endpoint():
    mp = pytest.MonkeyPatch()
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        mp.setenv(k, v)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    mp.undo()


def _grant(o: Orch, w, data: bytes) -> dict:
    a = o.assignment(w, 0)["assignment"]
    sha = hashlib.sha256(data).hexdigest()
    body = {"counter": a["counter"], "size": len(data), "sha256": sha}
    return o.ok(w, "POST", "/v1/uploads", body) | {"sha256": sha}


def test_s3_store_uploads_downloads_and_refuses_other_bytes(tmp_path, s3_endpoint):
    o = Orch(tmp_path, 'orchestrator.store="s3"', f'orchestrator.s3_endpoint="{s3_endpoint}"',
             "trainer.batch_groups=1000")  # fmt: skip
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    data = b"rollout bytes in S3"
    g = _grant(o, w, data)
    assert g["url"].startswith(s3_endpoint) and "x-amz-checksum-sha256" in g["headers"]
    assert httpx.put(g["url"], content=data, headers=g["headers"]).status_code == 200
    assert (
        o.ok(w, "POST", "/v1/submit", {"key": g["key"], "sha256": g["sha256"]})["state"]
        == "pending"
    )
    f = o.ok(o.validator, "POST", "/v1/validation/claim", {"max_policy": 0})["file"]
    assert httpx.get(f["url"]).content == data
    # the URL of another grant, used for other bytes of the same size
    g2 = _grant(o, w, b"the honest second file")
    httpx.put(g2["url"], content=b"a forged second file!!", headers=g2["headers"])
    r = o.call(w, "POST", "/v1/submit", {"key": g2["key"], "sha256": g2["sha256"]})
    assert r.status_code == 409 and "sha256" in r.json()["detail"]
    assert o.ledger()[f["node"]]["pending"] == 2  # the first pending, the second still uploading

"""The embedded object store: a signed URL allows exactly one object, once, in time."""

from __future__ import annotations

import hashlib
import os
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from tests.unit.orch_util import Orch, pubhex


@pytest.fixture
def granted(tmp_path):
    o = Orch(tmp_path)
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    a = o.assignment(w, 0)["assignment"]
    data = b"rollout bytes"
    sha = hashlib.sha256(data).hexdigest()
    g = o.ok(w, "POST", "/v1/uploads", {"counter": a["counter"], "size": len(data), "sha256": sha})
    return o, w, g, data


def _stored(o: Orch) -> list[str]:
    root = o.svc.objects.root
    return [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]


def _url(g: dict, **change) -> str:
    parts = urlsplit(g["url"])
    q = {k: v[0] for k, v in parse_qs(parts.query).items()} | change
    return f"{parts.path}?{urlencode(q)}"


def test_refused_uploads_store_nothing(granted):
    o, w, g, data = granted
    cases = {
        "wrong hash": (_url(g), b"rollout bytez"),
        "longer body": (_url(g), data + b"!"),
        "size edited in the URL": (_url(g, size=str(len(data) + 1)), data + b"!"),
        "another node in the URL": (_url(g, node="ab" * 32), data),
        "expiry edited": (_url(g, expires=str(int(g["expires"]) + 3600)), data),
        "no signature": (_url(g, sig=""), data),
    }
    for what, (url, body) in cases.items():
        r = o.http.put(url, content=body)
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
    o.clock.t += o.cfg.orchestrator.upload_url_ttl_s + 1
    assert o.http.put(_url(g), content=data).status_code == 403  # expired
    assert _stored(o) == []


def test_a_url_granted_before_its_node_was_banned_stores_nothing(granted):
    o, w, g, data = granted
    auth = {"Authorization": f"Bearer {o.token}"}
    assert o.http.post(f"/v1/admin/nodes/{pubhex(w)}/ban", headers=auth).status_code == 200
    r = o.http.put(_url(g), content=data)
    assert r.status_code == 403 and "no longer upload" in r.json()["detail"]
    assert _stored(o) == []


def test_keys_cannot_leave_the_store(granted):
    o, w, g, data = granted
    store = o.svc.objects
    for key in ("../escape.parquet", "rollouts/../../escape", "/etc/passwd", "rollouts//x"):
        url = store.upload_url(key, "n", len(data), hashlib.sha256(data).hexdigest(), 2**40)
        path = urlsplit(url)
        r = o.http.put(f"{path.path}?{path.query}", content=data)
        assert 400 <= r.status_code < 500, (key, r.status_code, r.text)
    assert _stored(o) == [] and not (o.tmp / "escape.parquet").exists()


def test_a_good_upload_then_submit(granted):
    o, w, g, data = granted
    assert o.http.put(_url(g), content=data).status_code == 200
    assert _stored(o) == [g["key"]]
    other = o.worker("b")
    o.register(other)
    sha = hashlib.sha256(data).hexdigest()
    r = o.call(other, "POST", "/v1/submit", {"key": g["key"], "sha256": sha})
    assert r.status_code == 403  # another node cannot submit this file as its own
    assert o.ok(w, "POST", "/v1/submit", {"key": g["key"], "sha256": sha})["state"] == "pending"


def test_upload_urls_are_rate_limited(tmp_path):
    o = Orch(tmp_path, "orchestrator.uploads_per_minute=3")
    w = o.worker("a")
    o.register(w)
    o.open_step(1, 0)
    a = o.assignment(w, 0)["assignment"]
    body = {"counter": a["counter"], "size": 5, "sha256": hashlib.sha256(b"hello").hexdigest()}
    codes = []
    for _ in range(4):
        r = o.call(w, "POST", "/v1/uploads", body)
        codes.append(r.status_code)
        o.clock.t += 10
    assert codes == [200, 200, 200, 429]
    assert r.headers["Retry-After"] == "30"  # the first of the three frees 60 s after it
    big = body | {"size": o.cfg.orchestrator.max_file_bytes + 1}
    o.clock.t += 61
    assert o.call(w, "POST", "/v1/uploads", big).status_code == 413


def test_status_table_shows_states_contributions_and_stakes(granted):
    from swarmrl.protocol.status import ledger_table

    o, w, g, data = granted
    o.http.put(_url(g), content=data)
    o.ok(w, "POST", "/v1/submit", {"key": g["key"], "sha256": hashlib.sha256(data).hexdigest()})
    table = ledger_table(o.http.get("/v1/ledger").json(), now=o.clock())
    lines = table.splitlines()
    assert "trainer step 1, policy 0" in lines[0]
    assert lines[1].split() == ["node", "role", "state", "seen", "accepted", "pending",
                                "rejected", "void", "final", "stake", "slashed",
                                "kl-unchecked", "kl-checked", "suspect", "device"]  # fmt: skip
    row = lines[2].split()
    assert row[1:3] == ["worker", "healthy"] and row[-6:-1] == ["100.0", "0.0", "-", "-", "no"]
    assert row[6] == "1"

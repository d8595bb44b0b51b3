"""Hostile input against the real orchestrator app: roles enforced where the work is,
and no input, signed or not, gets a 5xx or changes the database when refused.

The fuzz tests draw requests with hypothesis (a fixed number of examples, derandomized
so CI sees the same ones) for every route of the app's OpenAPI document: raw bytes,
JSON with NaN, infinities, huge numbers and lone surrogates, headers with non-ASCII
digits; unsigned, and signed by a registered worker, a relay, a stranger, the
validator and the trainer.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmrl.protocol.signing import sign_request
from tests.unit.orch_util import Orch, pubhex

HOSTILE_JSON = [
    b'{"role": "worker", "hardware": {"cpus": 2, "memory_gb": NaN, "tokens_per_s": 1}}',
    b'{"policy_version": Infinity, "want_work": true}',
    b'{"policy_version": -Infinity}',
    b'{"counter": 1e400, "size": 1, "sha256": "00"}',
    b'{"unknown": NaN}',
    b'{"\\ud800": 1}',
    b'{"role": "relay", "url": "\\ud800"}',
    b'{"paused": true, "x": "\\udfff"}',
    b"\xff\xfe{}",
    b"[" * 5000,
]


def _signed_posts(orch: Orch) -> list[str]:
    doc = orch.http.get("/openapi.json").json()
    return [
        p
        for p, ops in doc["paths"].items()
        if "post" in ops and {"signed": []} in ops["post"].get("security", [])
    ]


def _relay(orch: Orch, name: str = "r"):
    k = orch.worker(name)
    orch.ok(k, "POST", "/v1/nodes/register", {"role": "relay", "url": "http://127.0.0.1:9"})
    return k


LOOPBACK_RELAYS = 'orchestrator.relay_networks=["127.0.0.0/8"]'


def test_a_relay_key_gets_no_work_no_upload_url_and_cannot_submit(orch):
    o = orch(LOOPBACK_RELAYS)
    o.open_step(0, 0)
    relay = _relay(o)
    hb = o.ok(relay, "POST", "/v1/nodes/heartbeat", {"policy_version": 0})  # relays beat too
    assert hb["assignment"] is None
    before = o.snapshot()
    r = o.call(relay, "POST", "/v1/nodes/heartbeat", {"policy_version": 0, "want_work": True})
    assert r.status_code == 403 and "relay" in r.json()["detail"]
    # a worker's assignment, asked for by the relay's key
    w = o.worker("w")
    o.register(w)
    counter = o.assignment(w, 0)["assignment"]["counter"]
    before = o.snapshot()
    r = o.call(relay, "POST", "/v1/uploads", {"counter": counter, "size": 10, "sha256": "0" * 64})
    assert r.status_code == 403 and "relay" in r.json()["detail"]
    r = o.call(relay, "POST", "/v1/submit", {"key": "x/y", "sha256": "0" * 64})
    assert r.status_code == 403 and "relay" in r.json()["detail"]
    assert o.snapshot() == before
    assert o.ledger()[pubhex(relay)]["stake"] == 0


def test_non_ascii_digits_in_a_header_or_query_are_refused_not_500(orch):
    o = orch()
    w = o.worker("a")
    for ts in ("²", "¹²³", "\xb9\xb2", " 12", "1_0", "+5"):
        signed = sign_request(w, o.svc.run_id, "POST", "/v1/nodes/register", b"{}")
        # the bytes a client can send: Starlette reads header bytes as latin-1
        signed["X-Swarm-Timestamp"] = ts.encode("latin-1")
        headers = [
            (k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in signed.items()
        ]
        r = o.http.post("/v1/nodes/register", content=b"{}", headers=headers)
        assert r.status_code == 401 and "Timestamp" in r.json()["detail"], (ts, r.text)
    for q in ("expires=%C2%B2&sig=00", "expires=%D9%A1&sig=%C3%A9", "expires=1&sig=%F0%9F%98%80"):
        assert o.http.get(f"/objects/a/b?{q}").status_code == 403
    q = "node=n&size=%C2%B2&sha256=00&expires=9999999999&sig=%C3%A9"
    assert o.http.put(f"/objects/a/b?{q}", content=b"x").status_code == 403
    assert o.ledger() == {}


@pytest.mark.parametrize("signer", ["worker", "stranger"])
def test_non_finite_numbers_and_lone_surrogates_are_400_on_every_signed_route(orch, signer):
    o = orch()
    w = o.worker("w")
    if signer == "worker":
        o.register(w)
    before = o.snapshot()
    routes = _signed_posts(o)
    assert len(routes) >= 12, routes
    for path in routes:
        key = {"/v1/validation": o.validator, "/v1/trainer": o.trainer}.get(
            path[: path.find("/", 4)], w
        )
        for raw in HOSTILE_JSON:
            r = o.call(key, "POST", path, raw=raw)
            assert r.status_code == 400, (path, raw[:50], r.status_code, r.text[:200])
            assert "strict JSON" in r.json()["detail"]
    auth = {"Authorization": f"Bearer {o.token}", "content-type": "application/json"}
    for raw in HOSTILE_JSON:
        assert o.http.post("/v1/admin/run", headers=auth, content=raw).status_code == 400
    assert o.snapshot() == before


def test_the_signature_is_checked_before_the_body_is_read(orch):
    o = orch()
    for raw in (b"not json", b"{", b'{"role": NaN}', b"\xff"):
        r = o.http.post("/v1/nodes/register", content=raw)
        assert r.status_code == 401, (raw, r.text)
        r = o.http.post("/v1/admin/run", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 401, (raw, r.text)
    # a node's key on the trainer's route: 403 whatever the body
    r = o.call(o.worker("a"), "POST", "/v1/trainer/step", raw=b"garbage")
    assert r.status_code == 403


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://169.254.169.254/latest", "link-local"),
        ("http://10.1.2.3:8000", "private"),
        ("http://192.168.0.7:8000", "private"),
        ("http://127.0.0.1:8000", "loopback"),
        ("http://[::1]:8000", "loopback"),
        ("http://[fe80::1]:8000", "link-local"),
        ("http://224.0.0.1:8000", "multicast"),
        ("http://0.0.0.0:8000", "unspecified"),
        ("http://localhost:8000", "loopback"),  # a name: what it resolves to counts
        ("http://[2002:a9fe:a9fe::1]:80", "link-local"),  # 6to4 around 169.254.169.254
        ("http://[64:ff9b::a9fe:a9fe]:80", "link-local"),  # NAT64 around it
        ("http://[::ffff:10.0.0.1]:80", "private"),  # IPv4-mapped
        ("http://a..b:8000", "does not resolve"),  # refused before any DNS query
    ],
)
def test_relay_urls_outside_public_addresses_are_refused_unless_allowed(url, why):
    from swarmrl.orchestrator.relays import refusal

    assert why in (refusal(url, []) or ""), (url, refusal(url, []))
    assert refusal("http://8.8.8.8:8000/x", []) is None  # public (never contacted)
    assert refusal("http://127.0.0.1:8000", ["127.0.0.0/8"]) is None
    assert refusal("http://10.1.2.3:8000", ["10.0.0.0/8"]) is None
    assert "private" in refusal("http://10.1.2.3:8000", ["127.0.0.0/8"])


def test_a_refused_relay_url_is_not_registered_nor_advertised(orch):
    o = orch()
    k = o.worker("r")
    r = o.call(k, "POST", "/v1/nodes/register", {"role": "relay", "url": "http://169.254.169.254"})
    assert r.status_code == 403 and "link-local" in r.json()["detail"]
    assert o.http.get("/v1/run/servers").json()["servers"] == o.cfg.shardcast.servers
    assert o.ledger() == {}


# -- fuzzing ---------------------------------------------------------------------------

NUMBERS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" * 400, "-0", "0.5", "1e-400", "2"]
)
WEIRD_TEXT = st.sampled_from(["\\ud800", "\\udfff", "\\u0000", "²", "١", "../..", "%00", "\u202e"])


@st.composite
def json_texts(draw) -> bytes:
    """JSON-like text: real JSON, JSON with Python's extensions and broken escapes."""
    leaf = st.one_of(
        NUMBERS,
        WEIRD_TEXT.map(lambda s: f'"{s}"'),
        st.text(max_size=20).map(json.dumps),
        st.sampled_from(["true", "false", "null", "[]", "{}"]),
        st.integers(-(2**70), 2**70).map(str),
    )
    field = st.sampled_from(
        ["role", "hardware", "url", "policy_version", "want_work", "counter", "size", "sha256",
         "key", "step", "version", "verdict", "keys", "reason", "nodes", "sampler", "paused",
         "max_policy", "what", "done", "\\ud800", "extra"]
    )  # fmt: skip
    pairs = draw(st.lists(st.tuples(field, leaf), max_size=6))
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"
    return body.encode("utf-8", "surrogatepass")


BODIES = st.one_of(json_texts(), st.binary(max_size=200))


@st.composite
def requests(draw, routes):
    method, path = draw(st.sampled_from(routes))
    path = re.sub(
        r"\{[^}]+\}",
        lambda _: draw(st.sampled_from(["a", "..", "%C2%B2", "a%2Fb", "x" * 300, "0" * 64])),
        path,
    )
    query = draw(st.sampled_from(["", "?step=²", "?step=-1", "?step=1e400", "?expires=²&sig=é",
                                  "?step=1"]))  # fmt: skip
    signer = draw(st.sampled_from(["none", "worker", "relay", "stranger", "validator", "trainer"]))
    return method, path + query, draw(BODIES), signer


def _routes(orch: Orch) -> list[tuple[str, str]]:
    doc = orch.http.get("/openapi.json").json()
    out = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]
    assert len(out) >= 20
    return out


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    """One orchestrator for the fuzz run: a step open, a worker and a relay registered."""
    o = Orch(tmp_path_factory.mktemp("fuzz"), LOOPBACK_RELAYS)
    o.open_step(0, 0)
    keys = {"worker": o.worker("w"), "relay": _relay(o), "stranger": o.worker("s")}
    o.register(keys["worker"])
    keys |= {"validator": o.validator, "trainer": o.trainer}
    yield o, keys
    o.svc.db.close()


COUNT = {"requests": 0, "5xx": 0}

SWEEP_BODIES = [*HOSTILE_JSON, b"", b"{}", b"null", b"[]", b'"x"', b"\x00\x01\x02", b"{" * 3]
SWEEP_QUERIES = [
    "",
    "?step=%C2%B2",
    "?step=-1",
    "?expires=%C2%B2&sig=%C3%A9",
    "?expires=1&sig=%F0%9F%98%80",
    "?node=n&size=%D9%A1&sha256=0&expires=9&sig=0",
]
WEIRD_TIMESTAMPS = [None, b"\xb2", b"\xb9\xb2\xb3", b"1e9", b"-1"]


def _send(o: Orch, method: str, target: str, body: bytes, signer, ts: bytes | None):
    if signer is None:
        return o.http.request(method, target, content=body)
    if ts is None:
        return o.call(signer, method, target, raw=body)
    signed = sign_request(signer, o.svc.run_id, method, target, body, now=o.clock())
    signed["X-Swarm-Timestamp"] = ts
    headers = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in signed.items()]
    return o.http.request(method, target, content=body, headers=headers)


def test_sweep_every_route_with_hostile_bodies_queries_and_headers(fuzz_target):
    """Every route of the OpenAPI document x every signer x hostile bodies, queries
    and timestamps: never a 5xx, and a refusal changes nothing."""
    o, keys = fuzz_target
    signers = [None, *keys.values()]
    params = ["a", "..", "%C2%B2", "a%2Fb", "x" * 300, "0" * 64]
    n = 0
    for i, (method, path) in enumerate(_routes(o)):
        for j, signer in enumerate(signers):
            filled = re.sub(r"\{[^}]+\}", params[(i + j) % len(params)], path)
            for k, body in enumerate(SWEEP_BODIES):
                query = SWEEP_QUERIES[(j + k) % len(SWEEP_QUERIES)]
                ts = WEIRD_TIMESTAMPS[(i + j + k) % len(WEIRD_TIMESTAMPS)]
                before = o.snapshot()
                r = _send(o, method, filled + query, body, signer, ts)
                n += 1
                COUNT["requests"] += 1
                COUNT["5xx"] += r.status_code >= 500
                what = (method, filled + query, body[:40], j, ts, r.status_code, r.text[:200])
                assert r.status_code < 500, what
                if r.status_code >= 400:
                    assert o.snapshot() == before, what
    assert n >= 20 * len(signers) * len(SWEEP_BODIES)


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_no_route_answers_5xx_and_a_refusal_changes_nothing(fuzz_target, data):
    o, keys = fuzz_target
    method, target, body, signer = data.draw(requests(_routes(o)))
    before = o.snapshot()
    if signer == "none":
        r = o.http.request(method, target, content=body)
    else:
        r = o.call(keys[signer], method, target, raw=body)
    COUNT["requests"] += 1
    COUNT["5xx"] += r.status_code >= 500
    assert r.status_code < 500, (method, target, body[:80], signer, r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert o.snapshot() == before, (method, target, body[:80], signer, r.status_code)


def test_fuzz_summary():
    """The fuzz run's totals (printed for the closing note; run after the fuzz test)."""
    if COUNT["requests"]:
        print(f"\nfuzz: {COUNT['requests']} requests, {COUNT['5xx']} answered 5xx")
    assert COUNT["5xx"] == 0

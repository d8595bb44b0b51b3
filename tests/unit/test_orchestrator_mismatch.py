"""Per-node log-prob mismatch: the rule on hand-computed figures, and the route
`POST /v1/trainer/mismatch` on a real orchestrator (SQLite and PostgreSQL):
refused callers and bodies change nothing, an outlier on unchecked files becomes
suspect and every file of it goes to a validator."""

from __future__ import annotations

import json

import pytest

from swarmrl.orchestrator.mismatch import NodeMismatch, outliers, reference_kl
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.status import ledger_table
from tests.unit.orch_util import Orch

ROUTE = "/v1/trainer/mismatch"
# the route tests hold their figures to a factor of 10 (the default, 50, is set by what
# the tiny swarm measured: orchestrator/mismatch.py)
SPOT = ("validator.sample_rate=0.01", "trainer.batch_groups=10000", "validator.mismatch_factor=10")


def test_reference_is_the_larger_of_the_checked_mean_and_the_node_median():
    window = [
        NodeMismatch("a", unchecked_tokens=100, unchecked_kl_sum=1.0,
                     checked_tokens=300, checked_kl_sum=3.0),  # 0.01 on all its files
        NodeMismatch("b", checked_tokens=100, checked_kl_sum=3.0),  # 0.03
        NodeMismatch("c", unchecked_tokens=64, unchecked_kl_sum=64 * 0.5),  # 0.5
    ]  # fmt: skip
    # checked mean (3 + 3) / 400 = 0.015, node median 0.03: the limit is 10 × 0.03 = 0.3
    assert reference_kl(window) == pytest.approx(0.03)
    assert [m.node for m in outliers(window, 10.0, 1e-3, 64)] == ["c"]
    assert outliers(window, 10.0, 1e-3, 65) == []  # c has 64 unchecked tokens: too few
    assert outliers(window, 20.0, 1e-3, 64) == []  # 0.5 is below 20 × 0.03 = 0.6
    assert outliers(window, 10.0, 0.06, 64) == []  # the floor: 0.5 is below 10 × 0.06
    # a checked mean above the nodes' median is the reference
    high = [NodeMismatch("a", checked_tokens=100, checked_kl_sum=10.0)] + [
        NodeMismatch(k, unchecked_tokens=100, unchecked_kl_sum=1.0) for k in "bc"
    ]
    assert reference_kl(high) == pytest.approx(0.1)


def test_an_honest_node_whose_checked_files_were_fresh_is_not_flagged():
    """Measured on the default run: its checked files (trained at the version that sampled
    them) had KL 5e-9, its unchecked ones (two versions old) 0.015."""
    alone = [NodeMismatch("a", unchecked_tokens=1089, unchecked_kl_sum=1089 * 0.01523,
                          checked_tokens=394, checked_kl_sum=394 * 4.9e-9)]  # fmt: skip
    assert reference_kl(alone) == pytest.approx(1089 * 0.01523 / (1089 + 394))
    assert outliers(alone, 10.0, 1e-3, 64) == []


def test_without_checked_files_the_reference_is_the_median_node():
    window = [
        NodeMismatch("a", unchecked_tokens=100, unchecked_kl_sum=1.0),  # 0.01
        NodeMismatch("b", unchecked_tokens=100, unchecked_kl_sum=2.0),  # 0.02
        NodeMismatch("c", unchecked_tokens=200, unchecked_kl_sum=100.0),  # 0.5
    ]
    assert reference_kl(window) == pytest.approx(0.02)
    assert [m.node for m in outliers(window, 10.0, 1e-3, 64)] == ["c"]  # 0.5 > 0.2
    assert reference_kl([]) is None and outliers([], 10.0, 1e-3, 1) == []


def test_each_staleness_is_held_to_its_own_reference():
    """The honest figures of the tiny swarm (orchestrator/mismatch.py): files one version
    old have KL 0, two versions old 0.002-0.06; a forger 3 nats low is at 16."""
    fresh = [NodeMismatch(k, unchecked_tokens=300, staleness=1) for k in "ab"]
    stale = NodeMismatch("c", unchecked_tokens=112, unchecked_kl_sum=112 * 0.38, staleness=2)
    # against the fresh files (KL 0) c's old file would stand 380x above the floor; at
    # staleness 2 it is alone, and a staleness one node has is not judged
    assert outliers([*fresh, stale], 50.0, 1e-3, 64) == []
    assert outliers(
        [NodeMismatch("c", unchecked_tokens=112, unchecked_kl_sum=112 * 0.38)]
        + [NodeMismatch(k, unchecked_tokens=300) for k in "ab"],
        50.0,
        1e-3,
        64,
    )
    # at staleness 2 beside an honest node (0.026): 15x, within the factor of 50
    honest = NodeMismatch("a", unchecked_tokens=700, unchecked_kl_sum=700 * 0.026, staleness=2)
    assert outliers([*fresh, stale, honest], 50.0, 1e-3, 64) == []
    # with a forger: the median_low of a, b, c, f at staleness 2 is b's 0.03, the limit 1.5
    other = NodeMismatch("b", unchecked_tokens=700, unchecked_kl_sum=700 * 0.03, staleness=2)
    forger = NodeMismatch("f", unchecked_tokens=350, unchecked_kl_sum=350 * 16.0, staleness=2)
    (out,) = outliers([*fresh, stale, honest, other, forger], 50.0, 1e-3, 64)
    assert out.node == "f" and out.tokens == 350 and out.kl == pytest.approx(16.0)
    assert out.limit == pytest.approx(1.5)
    # a node with tokens at two staleness values is held to the mean of their limits
    mixed = [
        NodeMismatch("a", unchecked_tokens=100, unchecked_kl_sum=100 * 0.02, staleness=2),
        NodeMismatch("b", unchecked_tokens=100, unchecked_kl_sum=100 * 0.01, staleness=2),
        NodeMismatch("a", unchecked_tokens=100, unchecked_kl_sum=100 * 0.002, staleness=1),
        NodeMismatch("b", unchecked_tokens=100, unchecked_kl_sum=100 * 0.001, staleness=1),
        NodeMismatch("f", unchecked_tokens=100, unchecked_kl_sum=100 * 0.05, staleness=1),
        NodeMismatch("f", unchecked_tokens=100, unchecked_kl_sum=100 * 0.9, staleness=2),
    ]
    # the medians: 0.002 at staleness 1, 0.02 at 2; the limits 10x those
    (out,) = outliers(mixed, 10.0, 1e-3, 64)
    assert (out.node, out.tokens, out.kl) == ("f", 200, pytest.approx(0.475))
    assert out.limit == pytest.approx((0.02 + 0.2) / 2)


def _figure(node: str, checked: bool, tokens: int, kl: float, staleness: int = 0) -> dict:
    return {"node": node, "checked": checked, "staleness": staleness, "tokens": tokens, "kl": kl,
            "truncated": 0.01, "files": 2}  # fmt: skip


def _mismatch_rows(o: Orch) -> list:
    with o.svc.db.tx() as cur:
        return cur.execute("SELECT * FROM mismatch ORDER BY step, node, checked").fetchall()


def _states(o: Orch, node: str) -> dict[str, str]:
    with o.svc.db.tx() as cur:
        return dict(cur.execute("SELECT key, state FROM files WHERE node = ?", (node,)).fetchall())


def _files(o: Orch, w, n: int, tag: bytes) -> list[str]:
    keys = []
    for i in range(n):
        a = o.assignment(w, 0)["assignment"]
        keys.append(o.upload(w, a["counter"], tag + b" file %d" % i)["key"])
    return keys


def test_only_the_trainer_may_report_and_bad_bodies_change_nothing(orch):
    o = orch()
    w = o.worker("a")
    o.register(w)
    me = public_key_hex(w)
    good = {"step": 1, "nodes": [_figure(me, False, 100, 0.01)]}
    assert o.call(w, "POST", ROUTE, good).status_code == 403
    assert o.call(o.validator, "POST", ROUTE, good).status_code == 403
    r = o.http.post(ROUTE, json=good)  # unsigned
    assert r.status_code == 401
    before = o.snapshot()
    nan = json.dumps(good).replace("0.01", "NaN").encode()
    inf = json.dumps(good).replace("0.01", "Infinity").encode()
    bad = [
        {"step": 1, "nodes": [_figure(me, False, -1, 0.01)]},  # negative tokens
        {"step": 1, "nodes": [_figure(me, False, 100, -0.5)]},  # a KL far below 0
        {"step": 1, "nodes": [_figure(me, False, 100, 0.01) | {"truncated": 1.5}]},
        {"step": 1, "nodes": [_figure(me.upper(), False, 100, 0.01)]},  # not lower-case hex
        {"step": 1, "nodes": [_figure("zz" * 32, False, 100, 0.01)]},
        {"step": -1, "nodes": []},
        {"step": 1, "nodes": [_figure(me, False, 100, 0.01)] * 2},  # the same pair twice
        {"step": 1, "nodes": [_figure(me, False, 100, 0.01) | {"extra": 1}]},
        {"step": 1},
    ]
    for body in bad:
        r = o.call(o.trainer, "POST", ROUTE, body)
        assert r.status_code == 422, (body, r.status_code, r.text[:200])
    for raw in (nan, inf):  # not JSON at all: refused before the schema (routing.py strict_json)
        r = o.call(o.trainer, "POST", ROUTE, raw=raw)
        assert r.status_code == 400, (raw, r.status_code, r.text[:200])
    huge = {"step": 1, "nodes": [_figure(f"{i:064x}", False, 1, 0.0) for i in range(10_001)]}
    assert o.call(o.trainer, "POST", ROUTE, huge).status_code == 413  # over the body limit
    assert o.snapshot() == before and _mismatch_rows(o) == []
    # unknown nodes are ignored; a known one is kept
    body = {"step": 1, "nodes": [_figure("ab" * 32, False, 100, 5.0), _figure(me, True, 100, 0.01)]}
    assert o.ok(o.trainer, "POST", ROUTE, body) == {"flagged": []}
    assert [(r[1], r[4]) for r in _mismatch_rows(o)] == [(me, 100)]  # node, tokens


def test_a_list_over_the_schema_limit_is_refused(orch):
    o = orch("orchestrator.max_request_bytes=4194304")
    huge = {"step": 1, "nodes": [_figure(f"{i:064x}", False, 1, 0.0) for i in range(10_001)]}
    assert o.call(o.trainer, "POST", ROUTE, huge).status_code == 422


def test_an_outlier_on_unchecked_files_becomes_suspect_and_is_validated(orch, caplog):
    o = orch(*SPOT)
    honest, cheat = o.worker("honest"), o.worker("cheat")
    h, c = public_key_hex(honest), public_key_hex(cheat)
    o.register(honest)
    o.register(cheat)
    o.open_step(1, 0)
    _files(o, honest, 3, b"h")
    mine = _files(o, cheat, 6, b"c")
    accepted = [k for k, s in _states(o, c).items() if s == "accepted"]
    assert len(accepted) >= 4  # each is drawn with probability 0.01
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": accepted[:2]})
    body = {"step": 1, "nodes": [
        _figure(h, True, 1000, 0.01),  # the reference: checked files, 0.01
        _figure(h, False, 1000, 0.011),  # honest and unchecked: at the reference
        _figure(c, False, 500, 0.2),  # 20 × the reference, unchecked
    ]}  # fmt: skip
    assert o.ok(o.trainer, "POST", ROUTE, body) == {"flagged": [c]}
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(c in m and "KL 0.2 over 500 tokens" in m for m in warned), warned
    states = _states(o, c)
    assert [states[k] for k in accepted[:2]] == ["consumed", "consumed"]
    assert all(states[k] == "pending" for k in accepted[2:])  # back to the validators
    listed = o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 1})["files"]
    assert {f["node"] for f in listed} <= {h}
    (later,) = _files(o, cheat, 1, b"c later")
    assert _states(o, c)[later] == "pending"  # drawn, at sample_rate 0.01
    assert len(mine) == 6
    led = o.ledger()
    assert led[c]["suspect"] and not led[h]["suspect"]
    assert led[c]["kl_unchecked"] == pytest.approx(0.2) and led[c]["kl_checked"] is None
    assert led[h]["kl_checked"] == pytest.approx(0.01)
    whole = o.http.get("/v1/ledger").json()
    # the larger of the checked mean (0.01) and the lower node median (h: 0.0105 on all files)
    assert whole["mismatch"] == {"steps": [0, 1], "reference": pytest.approx(0.0105)}
    events = o.svc.db.one("SELECT node, kind FROM events WHERE kind = 'suspect'")
    assert [tuple(e) for e in events] == [(c, "suspect")]
    # reported again: already suspect, not flagged anew; it stays suspect
    assert o.ok(o.trainer, "POST", ROUTE, body | {"step": 2}) == {"flagged": []}
    honest_body = {"step": 3, "nodes": [_figure(c, False, 500, 0.01)]}
    assert o.ok(o.trainer, "POST", ROUTE, honest_body) == {"flagged": []}
    assert o.ledger()[c]["suspect"]
    table = ledger_table(o.http.get("/v1/ledger").json(), now=o.clock())
    assert "mismatch KL over steps 0..3" in table.splitlines()[0]
    row = next(line.split() for line in table.splitlines() if line.startswith(c[:16]))
    # steps 1..3: (0.2 + 0.2 + 0.01) / 3, rounded; then the node's device ('-': none reported)
    assert row[-4:] == ["0.14", "-", "yes", "-"]


def test_files_of_a_suspect_returned_by_a_resume_go_to_validation(orch):
    o = orch(*SPOT)
    cheat, honest = o.worker("cheat"), o.worker("honest")
    c, h = public_key_hex(cheat), public_key_hex(honest)
    o.register(cheat)
    o.register(honest)
    o.open_step(1, 0)
    _files(o, cheat, 3, b"c")
    accepted = [k for k, s in _states(o, c).items() if s == "accepted"]
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": accepted})
    body = {"step": 1, "nodes": [_figure(c, False, 500, 0.5)]}  # median of one node: itself
    assert o.ok(o.trainer, "POST", ROUTE, body) == {"flagged": []}
    body = {"step": 1, "nodes": [_figure(h, True, 500, 0.01), _figure(c, False, 500, 0.5)]}
    assert o.ok(o.trainer, "POST", ROUTE, body) == {"flagged": [c]}
    assert o.ok(o.trainer, "POST", "/v1/trainer/resume", {"version": 0})["returned"] == len(
        accepted
    )
    assert all(_states(o, c)[k] == "pending" for k in accepted)


def test_honest_nodes_and_too_few_tokens_are_not_flagged(orch):
    o = orch(*SPOT, "validator.mismatch_window=4")
    keys = [o.worker(n) for n in ("a", "b", "c")]
    for k in keys:
        o.register(k)
    a, b, c = (public_key_hex(k) for k in keys)
    ref = [_figure(a, True, 1000, 0.02)]
    steps = [
        [_figure(a, False, 1000, 0.03), _figure(b, False, 1000, 0.19)],  # within 10 × 0.02
        [_figure(c, False, 40, 0.5)],  # 25 × but 40 tokens
        [_figure(c, False, 20, 0.5)],  # 60 in the window
    ]
    for step, figs in enumerate(steps, start=1):
        assert o.ok(o.trainer, "POST", ROUTE, {"step": step, "nodes": ref + figs}) == {
            "flagged": []
        }
    # steps 2..5 in the window: 40 + 20 + 40 = 100 tokens, all at 0.5
    assert o.ok(o.trainer, "POST", ROUTE, {"step": 5, "nodes": ref + steps[1]}) == {"flagged": [c]}
    # the window moved past step 1: its rows are gone
    assert {r[0] for r in _mismatch_rows(o)} == {2, 3, 5}
    led = o.ledger()
    assert not led[a]["suspect"] and not led[b]["suspect"] and led[c]["suspect"]


def test_every_file_validated_keeps_figures_but_flags_no_one(orch):
    o = orch()  # sample_rate 1
    w = o.worker("a")
    o.register(w)
    me = public_key_hex(w)
    body = {"step": 1, "nodes": [_figure(me, False, 1000, 5.0)]}
    assert o.ok(o.trainer, "POST", ROUTE, body) == {"flagged": []}
    assert o.ledger()[me]["kl_unchecked"] == pytest.approx(5.0)
    assert not o.ledger()[me]["suspect"]


def test_a_mismatch_table_from_before_staleness_is_rebuilt(tmp_path):
    import sqlite3

    from swarmrl.orchestrator.db import SQLiteDatabase

    path = tmp_path / "state.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE mismatch (step BIGINT NOT NULL, node TEXT NOT NULL,"
        " checked INTEGER NOT NULL, tokens BIGINT NOT NULL, kl DOUBLE PRECISION NOT NULL,"
        " truncated DOUBLE PRECISION NOT NULL, files BIGINT NOT NULL,"
        " PRIMARY KEY (step, node, checked))"
    )
    old.execute("INSERT INTO mismatch VALUES (1, 'a', 0, 10, 0.1, 0.0, 1)")
    old.commit()
    old.close()
    db = SQLiteDatabase(path)
    with db.tx() as cur:
        assert "staleness" in db._columns(cur, "mismatch")
        assert cur.execute("SELECT COUNT(*) FROM mismatch").fetchone() == (0,)
        cur.execute("INSERT INTO mismatch VALUES (1, 'a', 0, 2, 10, 0.1, 0.0, 1)")
    db.close()
    db = SQLiteDatabase(path)  # opened again: the new table stays with its rows
    assert db.one("SELECT staleness, tokens FROM mismatch") == [(2, 10)]
    db.close()

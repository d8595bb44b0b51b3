"""Node lifecycle: registration with a stake, heartbeats, and the states a node moves through.

    registered ──heartbeat──► healthy ──silence > unhealthy_after_s──► unhealthy
        │                        ▲                                       │
        │                        └────────────heartbeat──────────────────┘
        └──────── silence > dead_after_s (from any of the three) ─────► dead
    dead ──register again──► registered  (its stake is still held)
    any ──rejected file──► ejected  (stake slashed, unfinished work voided)
    any ──operator ban──► banned ──unban──► dead
    relay ──reported by enough nodes──► delisted ──its hold passed──► registered

An ejected or banned key gets 403 on every call and cannot register again; a
delisted relay's key gets 403 until its hold has passed (relaystanding.py).
A dead node's open assignments become `orphaned` and go to the next node
that asks for work (orchestrator/work.py). When the orchestrator starts, it
gives every live node a fresh `last_seen`: its own downtime is not the
nodes' silence.

Registration checks the hardware the node measured against the run's
requirements and derives the node's length budget from its speed: a node
that cannot produce `sampling.max_new_tokens` per sample within
`orchestrator.file_seconds` per file gets a shorter budget, never below
`orchestrator.min_new_tokens`.
"""

from __future__ import annotations

import json

from swarmrl.orchestrator import relaystanding
from swarmrl.orchestrator.admission import (
    admit,
    forget_full_faucets,
    record_claim,
    record_expiry,
    record_pace,
)
from swarmrl.orchestrator.auth import Caller, record_nonce
from swarmrl.orchestrator.ranges import address_range
from swarmrl.orchestrator.service import ApiError, Service

LIVE = ("registered", "healthy", "unhealthy")
STATES = (*LIVE, "dead", "ejected", "banned", "delisted")


def length_budget(svc: Service, tokens_per_s: float) -> int:
    cfg = svc.cfg
    full = cfg.sampling.max_new_tokens
    samples = cfg.worker.groups_per_file * cfg.worker.group_size
    if tokens_per_s <= 0:
        return full
    fits = int(tokens_per_s * cfg.orchestrator.file_seconds / samples)
    return max(min(cfg.orchestrator.min_new_tokens, full), min(full, fits))


def check_hardware(svc: Service, hw: dict) -> None:
    o = svc.cfg.orchestrator
    short = []
    if hw["cpus"] < o.min_cpus:
        short.append(f"{hw['cpus']} CPUs < {o.min_cpus}")
    if hw["memory_gb"] < o.min_memory_gb:
        short.append(f"{hw['memory_gb']:.1f} GB memory < {o.min_memory_gb}")
    if hw["tokens_per_s"] < o.min_tokens_per_s:
        short.append(f"{hw['tokens_per_s']:.1f} tokens/s < {o.min_tokens_per_s}")
    if short:
        raise ApiError(403, "hardware below the run's requirements: " + "; ".join(short))


def register(
    svc: Service, caller: Caller, role: str, hardware: dict, url: str, work: str = "",
    invite: str = "", places: list[str] = (),
) -> dict:  # fmt: skip
    """Admit a worker or relay (trainers and validators are known by config). A new key
    pays to enter and gets its stake from the operator (admission.admit); a known key
    registers again for nothing, but a relay's key after a delisting pays as a new one
    (relaystanding.py). The caller's nonce is recorded in the same transaction, and
    nothing is stored when the registration is refused. `places`: a relay URL's
    endpoints (relaystanding.endpoints)."""
    key = caller.key
    now = svc.clock()
    if role == "worker":
        check_hardware(svc, hardware)
    budget = length_budget(svc, hardware.get("tokens_per_s", 0.0)) if role == "worker" else 0
    net = address_range(caller.address)
    with svc.db.tx() as cur:
        record_nonce(svc, cur, caller)
        row = cur.execute("SELECT state, role FROM nodes WHERE key = ?", (key,)).fetchone()
        if row is not None and row[0] in ("ejected", "banned"):
            raise ApiError(403, f"this key is {row[0]}")
        if row is not None and row[1] != role:
            raise ApiError(409, f"this key is registered as a {row[1]}")
        if role == "relay":
            relaystanding.check_registration(svc, cur, key, list(places), net)
        hw = json.dumps(hardware, sort_keys=True)
        if row is None or row[0] == "delisted":
            stake = admit(svc, cur, key, role, work, invite, now, net)
            cur.execute("DELETE FROM nodes WHERE key = ? AND state = 'delisted'", (key,))
            cur.execute(
                "INSERT INTO nodes (key, role, state, registered, last_seen, hardware, budget,"
                " url, stake, slashed, reason, net, endpoints)"
                " VALUES (?, ?, 'registered', ?, ?, ?, ?, ?, ?, 0, '', ?, ?)",
                (key, role, now, now, hw, budget, url, stake, net, json.dumps(list(places))),
            )
            if stake:
                how = (
                    "invitation"
                    if invite
                    else "the operator"
                    if key in svc.cfg.orchestrator.trusted_workers
                    else "faucet"
                )
                event(cur, now, key, "stake", stake, f"locked on registration ({how})")
        else:
            cur.execute(
                "UPDATE nodes SET state = 'registered', last_seen = ?, hardware = ?,"
                " budget = ?, url = ?, net = ?, endpoints = ? WHERE key = ?",
                (now, hw, budget, url, net, json.dumps(list(places)), key),
            )
        if role == "worker":
            record_claim(svc, cur, key, float(hardware.get("tokens_per_s", 0.0)))
        stake = cur.execute("SELECT stake FROM nodes WHERE key = ?", (key,)).fetchone()[0]
    return {"state": "registered", "stake": stake, "max_new_tokens": budget}


def event(cur, now: float, node: str, kind: str, amount: float, detail: str) -> None:
    cur.execute(
        "INSERT INTO events (time, node, kind, amount, detail) VALUES (?, ?, ?, ?, ?)",
        (now, node, kind, amount, detail),
    )


def touch(svc: Service, cur, key: str) -> str:
    """Record a heartbeat; the node's state after it. Dead nodes must register again."""
    row = cur.execute("SELECT state FROM nodes WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise ApiError(403, "not registered: POST /v1/nodes/register first")
    if row[0] in ("ejected", "banned", "delisted"):
        raise ApiError(403, f"this key is {row[0]}")
    if row[0] == "dead":
        raise ApiError(409, "this node was declared dead: register again")
    cur.execute(
        "UPDATE nodes SET state = 'healthy', last_seen = ? WHERE key = ?", (svc.clock(), key)
    )
    return "healthy"


def require_worker(cur, key: str) -> None:
    """403 unless `key` is registered as a worker: assignments, upload URLs and
    submissions are a worker's, whatever else a key registered as."""
    row = cur.execute("SELECT role FROM nodes WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise ApiError(403, "not registered: POST /v1/nodes/register first")
    if row[0] != "worker":
        raise ApiError(403, f"this key is registered as a {row[0]}; work is for workers")


def sweep(svc: Service) -> dict:
    """Apply silence: healthy → unhealthy → dead; a dead node's open work is orphaned."""
    o = svc.cfg.orchestrator
    now = svc.clock()
    with svc.db.tx() as cur:
        cur.execute(
            "UPDATE nodes SET state = 'unhealthy' WHERE state = 'healthy' AND last_seen < ?",
            (now - o.unhealthy_after_s,),
        )
        dead = cur.execute(
            "UPDATE nodes SET state = 'dead' WHERE state IN ('registered', 'healthy', 'unhealthy')"
            " AND last_seen < ? RETURNING key",
            (now - o.dead_after_s,),
        ).fetchall()
        for (key,) in dead:
            held = cur.execute(
                "UPDATE assignments SET state = 'orphaned' WHERE node = ? AND state = 'open'"
                " RETURNING counter",
                (key,),
            ).fetchall()
            if held:  # silent while holding work: as good as letting it expire
                record_expiry(cur, key, now)
            for (counter,) in held:
                record_pace(cur, key, counter, now)  # it took at least this long
        expired = cur.execute(
            "UPDATE assignments SET state = 'orphaned' WHERE state = 'open' AND deadline < ?"
            " RETURNING counter, node",
            (now,),
        ).fetchall()
        for counter, node in expired:
            record_expiry(cur, node, now)  # admission.py: the node waits before more work
            record_pace(cur, node, counter, now)  # and it took at least this long
        relaystanding.purge(svc, cur, now)
        forget_full_faucets(svc, cur, now)
    since = now - 2.0 * o.heartbeat_s  # admission.yields_to_faster looks no further back
    for key in [k for k, t in svc.asked_work.copy().items() if t < since]:
        svc.asked_work.pop(key, None)
    for key in [k for k, t in svc.wanting.copy().items() if t < since]:
        svc.wanting.pop(key, None)
    return {"dead": [k for (k,) in dead], "expired": [c for c, _ in expired]}


def revive_after_restart(svc: Service) -> None:
    with svc.db.tx() as cur:
        cur.execute(
            "UPDATE nodes SET last_seen = ? WHERE state IN ('registered', 'healthy', 'unhealthy')",
            (svc.clock(),),
        )


def punish(svc: Service, cur, key: str, state: str, reason: str, slash: bool) -> None:
    """Eject (a rejected file) or ban (the operator): void the node's contributions
    that are not final, cancel its open work, and slash its stake if `slash`."""
    now = svc.clock()
    row = cur.execute("SELECT stake FROM nodes WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise ApiError(404, "no such node")
    cur.execute("UPDATE nodes SET state = ?, reason = ? WHERE key = ?", (state, reason[:500], key))
    cur.execute(
        "UPDATE assignments SET state = 'cancelled' WHERE node = ? AND state = 'open'", (key,)
    )
    voided = cur.execute(
        "UPDATE files SET void = 1 WHERE node = ? AND final = 0 AND void = 0"
        " AND state != 'rejected' RETURNING key",
        (key,),
    ).fetchall()
    event(cur, now, key, state, 0.0, f"{reason[:300]}; {len(voided)} contributions voided")
    if slash and row[0] > 0:
        amount = row[0] * svc.cfg.orchestrator.slash_fraction
        cur.execute(
            "UPDATE nodes SET stake = stake - ?, slashed = slashed + ? WHERE key = ?",
            (amount, amount, key),
        )
        event(cur, now, key, "slash", -amount, reason[:300])


def unban(svc: Service, key: str) -> None:
    with svc.db.tx() as cur:
        n = cur.execute(
            "UPDATE nodes SET state = 'dead', reason = '' WHERE key = ?"
            " AND state IN ('banned', 'ejected')",
            (key,),
        ).rowcount
        if not n:
            raise ApiError(404, "no banned or ejected node with this key")
        event(cur, svc.clock(), key, "unban", 0.0, "by the operator")

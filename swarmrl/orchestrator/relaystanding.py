"""A relay's standing: the reports against it, delisting, and what it takes to return.

Workers and validators report a relay that served them bad bytes or nothing
(`POST /v1/relays/report`, shardcast/client.py). A report names a URL, but it
counts against the key registered with that URL, and delisting holds off both the
key and the address: a relay cannot shed its reports by registering another URL,
nor come back under a new key at the same address.

- **Who counts**: validators, and workers with an accepted file that are live (a
  fresh key costs only its entry). A report of a URL that no live registered relay
  holds, or of one of the operator's `shardcast.servers` (which are never
  delisted), is answered and not kept.
- **Bounded**: a report counts for `relay_report_s`; a reporter's reports count for
  its REPORTS_PER_REPORTER most recent relays (reporting another drops its oldest).
- **Delisting**: reports by `relay_reports` distinct reporters within the window
  delist the relay. Its key goes to state `delisted` (not advertised; its check is
  dropped; its heartbeats are refused), the reports against it are cleared, and its
  key and its address (the URL's host and port, and each address the host resolved
  to when it registered) are held for `relay_hold_s`, doubled for each earlier
  delisting of the key (at most 2^20 times).
- **Returning**: a held key or address is refused at registration (403, saying until
  when). After its hold the key registers as a new key does: its proof of work is
  checked again (a proof is bound to the key and the run, so the same one passes:
  the hold is the price, not the proof), its address is vetted again, and it is
  advertised only once its relay check passes (relaycheck.py).
- **How many**: at most `max_relays` live relays, and `range_share` of them from
  one address range (ranges.py); one more is refused (429) until one dies or is
  delisted. A relay dead for RELAY_FORGET_S is forgotten (its row, holds and
  reports): it would register again as a new key.

What this does not stop: two colluding reporters with an accepted file each can
still delist any registered relay, for `relay_hold_s` (the operator's servers stay
listed); reports carry no evidence; a name that resolves elsewhere after the relay
registered is held by its name and its old addresses only.
"""

from __future__ import annotations

import ipaddress
import json
import math
from urllib.parse import urlsplit

from swarmrl.orchestrator.service import ApiError, Service

REPORTS_PER_REPORTER = 16
RELAY_FORGET_S = 86400.0
LIVE = ("registered", "healthy", "unhealthy")
MAX_DOUBLINGS = 20


def endpoints(url: str, addresses=()) -> list[str]:
    """Where a relay URL points, as `host:port` strings: its host as written
    (lowercase, an IP address in its standard form) and each of `addresses`, all
    with the URL's port (or its scheme's)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    names = {_host(parts.hostname or "")} | {_host(str(a)) for a in addresses}
    return sorted(f"{n}:{port}" for n in names if n)


def _host(host: str) -> str:
    host = host.lower().rstrip(".")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    return f"[{ip}]" if ip.version == 6 else str(ip)


def check_registration(svc: Service, cur, key: str, places: list[str], net: str) -> None:
    """403 if the relay's key or one of its `places` (endpoints) is held after a
    delisting; 429 if the run holds its most live relays, in all or from `net`."""
    o = svc.cfg.orchestrator
    now = svc.clock()
    held = [("key", key)] + [("address", p) for p in places]
    for kind, name in held:
        row = cur.execute(
            "SELECT until FROM relay_holds WHERE kind = ? AND name = ? AND until > ?",
            (kind, name, now),
        ).fetchone()
        if row is not None:
            what = "this key" if kind == "key" else f"the address {name}"
            raise ApiError(
                403,
                f"{what} was delisted after reports; it may register again in {row[0] - now:.0f} s",
            )
    svc.db.serialize(cur, "relays")  # counted, then inserted: one registration at a time
    marks = ", ".join("?" for _ in LIVE)
    live = f"role = 'relay' AND state IN ({marks}) AND key != ?"
    total = cur.execute(f"SELECT COUNT(*) FROM nodes WHERE {live}", (*LIVE, key)).fetchone()[0]
    if total >= o.max_relays:
        raise ApiError(429, f"the run holds its most relays ({o.max_relays})", retry_after_s=60.0)
    if o.range_share < 1.0:
        share = max(1, math.floor(o.range_share * o.max_relays))
        mine = cur.execute(
            f"SELECT COUNT(*) FROM nodes WHERE {live} AND net = ?", (*LIVE, key, net)
        ).fetchone()[0]
        if mine >= share:
            raise ApiError(
                429, f"address range {net} holds its share of relays ({share})", retry_after_s=60.0
            )


def report(svc: Service, reporter: str, url: str, what: str) -> dict:
    """Count a report of the relay registered with `url` (see the module's rules);
    delists it when enough distinct reporters agree."""
    o = svc.cfg.orchestrator
    now = svc.clock()
    url = url.rstrip("/")
    answer = {"reported": url, "counted": False}
    if url in {u.rstrip("/") for u in svc.cfg.shardcast.servers}:
        return answer | {"why": "the operator's own servers are not delisted by reports"}
    with svc.db.tx() as cur:
        if svc.role_of(reporter) != "validator":
            earned = cur.execute(
                "SELECT COUNT(*) FROM files WHERE node = ? AND void = 0 AND state IN"
                " ('accepted', 'consumed', 'trained')",
                (reporter,),
            ).fetchone()[0]
            if not earned:
                return answer | {"why": "reports count from nodes with an accepted file"}
        marks = ", ".join("?" for _ in LIVE)
        row = cur.execute(
            f"SELECT key FROM nodes WHERE role = 'relay' AND state IN ({marks})"
            " AND (url = ? OR url = ?)",
            (*LIVE, url, url + "/"),
        ).fetchone()
        if row is None:
            return answer | {"why": "no live registered relay has this URL"}
        relay = row[0]
        cur.execute(
            "INSERT INTO relay_reports VALUES (?, ?, ?, ?) ON CONFLICT (relay, reporter)"
            " DO UPDATE SET time = excluded.time, what = excluded.what",
            (relay, reporter, now, what[:300]),
        )
        cur.execute(
            "DELETE FROM relay_reports WHERE reporter = ? AND relay NOT IN (SELECT relay FROM"
            " relay_reports WHERE reporter = ? ORDER BY time DESC, relay LIMIT ?)",
            (reporter, reporter, REPORTS_PER_REPORTER),
        )
        reporters = cur.execute(
            "SELECT COUNT(*) FROM relay_reports WHERE relay = ? AND time >= ?",
            (relay, now - o.relay_report_s),
        ).fetchone()[0]
        if reporters >= o.relay_reports:
            _delist(svc, cur, relay, reporters, now)
            return answer | {"counted": True, "delisted": True}
    return answer | {"counted": True}


def _delist(svc: Service, cur, relay: str, reporters: int, now: float) -> None:
    o = svc.cfg.orchestrator
    row = cur.execute("SELECT times FROM relay_holds WHERE kind = 'key' AND name = ?", (relay,))
    times = (row.fetchone() or (0,))[0] + 1
    until = now + o.relay_hold_s * 2.0 ** min(times - 1, MAX_DOUBLINGS)
    places = cur.execute("SELECT endpoints FROM nodes WHERE key = ?", (relay,)).fetchone()[0]
    holds = [("key", relay, times)] + [("address", p, 1) for p in json.loads(places or "[]")]
    for kind, name, n in holds:
        cur.execute(
            "INSERT INTO relay_holds VALUES (?, ?, ?, ?) ON CONFLICT (kind, name) DO UPDATE"
            " SET until = excluded.until, times = excluded.times",
            (kind, name, until, n),
        )
    why = f"delisted: reported by {reporters} nodes"
    cur.execute("UPDATE nodes SET state = 'delisted', reason = ? WHERE key = ?", (why, relay))
    cur.execute("DELETE FROM relay_reports WHERE relay = ?", (relay,))
    cur.execute(
        "INSERT INTO events (time, node, kind, amount, detail) VALUES (?, ?, 'delisted', 0, ?)",
        (now, relay, f"{why}; key and address held {until - now:.0f} s"),
    )


def purge(svc: Service, cur, now: float) -> None:
    """Drop what no longer counts: expired reports and address holds, and relays dead
    (or delisted and past their hold) for RELAY_FORGET_S, with their holds and reports."""
    cur.execute(
        "DELETE FROM relay_reports WHERE time < ?", (now - svc.cfg.orchestrator.relay_report_s,)
    )
    cur.execute("DELETE FROM relay_holds WHERE kind = 'address' AND until < ?", (now,))
    gone = cur.execute(
        "DELETE FROM nodes WHERE role = 'relay' AND state IN ('dead', 'delisted')"
        " AND last_seen < ? AND key NOT IN (SELECT name FROM relay_holds WHERE kind = 'key'"
        " AND until >= ?) RETURNING key",
        (now - RELAY_FORGET_S, now),
    ).fetchall()
    for (key,) in gone:
        cur.execute("DELETE FROM relay_holds WHERE kind = 'key' AND name = ?", (key,))
        cur.execute("DELETE FROM relay_reports WHERE relay = ? OR reporter = ?", (key, key))

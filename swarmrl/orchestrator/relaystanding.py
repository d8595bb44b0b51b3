"""A relay's standing: the reports against it, delisting, and what it takes to return.

Workers and validators report a relay that served them bad bytes or nothing
(`POST /v1/relays/report`, shardcast/client.py). A relay's URL is kept without a
trailing slash, and a report's is read the same way. A report names a URL, but it
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
  delist the relay, and with it every other live relay key registered at one of its
  endpoints (the same server under other keys). A delisted key goes to state
  `delisted` (not advertised; its heartbeats are refused; its URL's check is dropped
  once no live key has that URL), the reports against it are cleared, and the key
  and its hosts (the URL's host and each address it resolved to when it registered,
  without the port; an IPv6 address as its /64) are held for `relay_hold_s`, doubled
  for each earlier delisting of the key (at most 2^20 times).
- **Returning**: a held key or address is refused at registration (403, saying until
  when). After its hold the key registers as a new key does: its proof of work is
  checked again (a proof is bound to the key and the run, so the same one passes:
  the hold is the price, not the proof), its address is vetted again, and it is
  advertised only once its relay check passes (relaycheck.py).
- **How many**: at most `max_relays` live relays, and `range_share` of them from
  one address range (ranges.py); one more is refused (429) until one dies or is
  delisted. A relay counts while it is advertised, or for its first
  `relay_check_s` x (`relay_check_failures` + 1) after registering: a URL that never
  verifies does not hold a place. A relay dead for RELAY_FORGET_S is forgotten (its row, holds and
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


def held_hosts(places) -> list[str]:
    """What a delisting holds of a relay's endpoints: each host without its port (a
    server answers on every port it likes), an IPv6 address as its /64 (one machine
    holds that many)."""
    hosts = set()
    for place in places:
        host = place.rsplit(":", 1)[0]
        if host.startswith("["):
            net = ipaddress.ip_network(host.strip("[]") + "/64", strict=False)
            host = str(net)
        hosts.add(host)
    return sorted(hosts)


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
    held = [("key", key)] + [("address", h) for h in held_hosts(places)]
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
    # a relay counts while advertised, or while its first checks may still pass: one
    # whose URL never verified does not keep an honest relay out
    grace = now - o.relay_check_s * (o.relay_check_failures + 1)
    live = (
        f"role = 'relay' AND state IN ({marks}) AND key != ? AND (registered > ?"
        " OR url IN (SELECT url FROM relay_checks WHERE listed = 1))"
    )
    total = cur.execute(f"SELECT COUNT(*) FROM nodes WHERE {live}", (*LIVE, key, grace)).fetchone()[
        0
    ]
    if total >= o.max_relays:
        raise ApiError(429, f"the run holds its most relays ({o.max_relays})", retry_after_s=60.0)
    if o.range_share < 1.0 and net:  # '': no peer address: no range to share with
        share = max(1, math.floor(o.range_share * o.max_relays))
        mine = cur.execute(
            f"SELECT COUNT(*) FROM nodes WHERE {live} AND net = ?", (*LIVE, key, grace, net)
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
            f"SELECT key FROM nodes WHERE role = 'relay' AND state IN ({marks}) AND url = ?",
            (*LIVE, url),
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
    """Delist `relay` and every other live relay key serving from one of its endpoints
    (the same server under other keys), holding each key and their hosts."""
    places = set(json.loads(_endpoints_of(cur, relay)))
    marks = ", ".join("?" for _ in LIVE)
    others = cur.execute(
        f"SELECT key, endpoints FROM nodes WHERE role = 'relay' AND state IN ({marks})"
        " AND key != ?",
        (*LIVE, relay),
    ).fetchall()
    keys = [relay] + [k for k, e in others if places & set(json.loads(e or "[]"))]
    for key in keys:
        _delist_one(svc, cur, key, f"delisted: reported by {reporters} nodes"
                    + ("" if key == relay else f" (it shares an endpoint with {relay[:16]})"), now)  # fmt: skip


def _endpoints_of(cur, key: str) -> str:
    row = cur.execute("SELECT endpoints FROM nodes WHERE key = ?", (key,)).fetchone()
    return (row[0] if row else None) or "[]"


def _delist_one(svc: Service, cur, relay: str, why: str, now: float) -> None:
    o = svc.cfg.orchestrator
    row = cur.execute("SELECT times FROM relay_holds WHERE kind = 'key' AND name = ?", (relay,))
    times = (row.fetchone() or (0,))[0] + 1
    until = now + o.relay_hold_s * 2.0 ** min(times - 1, MAX_DOUBLINGS)
    hosts = held_hosts(json.loads(_endpoints_of(cur, relay)))
    holds = [("key", relay, times)] + [("address", h, 1) for h in hosts]
    for kind, name, n in holds:
        cur.execute(
            "INSERT INTO relay_holds VALUES (?, ?, ?, ?) ON CONFLICT (kind, name) DO UPDATE"
            " SET until = CASE WHEN excluded.until > relay_holds.until THEN excluded.until"
            " ELSE relay_holds.until END, times = excluded.times",
            (kind, name, until, n),
        )
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

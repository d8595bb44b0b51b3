"""Relays are checked before they are advertised, and while they are.

A relay registers with a URL whose addresses the operator allows
(orchestrator/relays.py). It is advertised in `/v1/run/servers` only once the
orchestrator has fetched from that URL the manifest of a version this run
published and verified it, and only while later checks keep passing. The
orchestrator's sweeper starts a pass every sweep (`RelayChecker.start_due`); a
pass checks the relays whose turn has come (`orchestrator.relay_check_s`, 30 s;
a newly registered relay at the next sweep) on a thread of its own, so a slow or hostile
relay never holds up node silence, finality or the event loop.

One check (`probe`): `GET /versions`, then the manifest of the newest version
the relay announces between the run's newest policy (`meta` 'policy') minus
`async_level` and that policy. A worker may still use a policy that old, so a
relay holding one is useful; one holding only older versions would serve
stale weights. Asking for the newest only would fail a relay that is still
downloading a version announced a moment ago. Before the trainer publishes
anything there is nothing to verify, and no relay is checked or advertised.

The manifest must be signed by the key workers are told to trust
(`Service.manifest_key`, the `trainer_key` of `/v1/run`), with the version
asked for: a relay passes exactly when workers would accept its manifest. A
manifest carries no run id; the trainer key stands for the run, so an operator
who signs two runs with one key lets either run's relays pass for the other
(and the workers would accept either run's weights as well).

What a check's outcome does:

- verified: the relay is advertised and its failures reset;
- failed (no answer, refused address, an HTTP error or a redirect, a body
  over its cap, garbage, no version in the window): one more failure; an
  advertised relay is dropped after `relay_check_failures` (3) in a row, so
  one that is briefly unreachable, or briefly behind the window, stays;
- wrong (a well-formed manifest signed by another key, unsigned, or of another
  version than asked): dropped at once, advertised again once a check passes.
  This is what a relay following another run's origin serves: misconfigured
  rather than hostile, and harmless to workers, which refuse it too;
- forged (signed in the name of the run's key, but the signature does not
  verify): dropped, and every live relay key registered with that URL is
  ejected (no slash: relays hold no stake). An honest relay never serves
  this, since it verifies each manifest before announcing it; only tampering
  does. It stays off until the operator unbans the key, which then registers
  and is checked again (a new key costs the registration's proof of work).

The fetch is made safe against a hostile relay: the URL's addresses are vetted
again right before it (`relays.vetted_addresses`: DNS may have changed since
registration) and the connection goes only to those addresses (`Pinned`);
the whole check, name lookup included, ends after `relay_check_timeout_s`
(5 s; connecting at most 2 s of it); a body over its cap (the manifest's 1 MiB,
64 KiB for the list of versions) or compressed is refused; redirects are not
followed, nor proxies from the environment. Any error means "not verified".

State: the table `relay_checks` (url, listed, failures, the newest verified
version, last check, next check, what the last check found), so a restarted
orchestrator advertises only relays verified before; a row goes when no live
relay key has its URL any more (a relay that died or was ejected and registers
again is verified again). A pass claims its relays with a conditional UPDATE,
so replicas sharing a PostgreSQL database do not check a relay twice. The
operator's own servers (`shardcast.servers`, among them the relays `swarmrl rl`
starts) are never checked nor dropped.

Not covered: a relay that serves a valid manifest to the orchestrator and bad
shards (or nothing) to workers. The check fetches no shards; workers hash every
shard against the signed manifest, fail over to another server, and report the
relay (`orchestrator.relay_reports`). Nor does one check cover every version a
relay announces: only the one it verifies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver

from swarmrl.orchestrator import relays
from swarmrl.orchestrator.nodes import punish
from swarmrl.orchestrator.service import Service
from swarmrl.orchestrator.work import run_state
from swarmrl.protocol.manifest import MAX_MANIFEST_BYTES, ManifestError, parse_manifest

log = logging.getLogger("swarmrl.orchestrator.relaycheck")

MAX_VERSIONS_BYTES = 64 << 10
CONNECT_S = 2.0
BATCH = 64  # relays claimed by one pass
PARALLEL = 16  # of which checked at once
CHECKED = "('registered', 'healthy')"  # the states in which work.servers advertises a relay
LIVE = "('registered', 'healthy', 'unhealthy')"  # the states in which its check is kept


@dataclass(frozen=True)
class Outcome:
    """What one check found: `kind` is 'verified', 'failed', 'wrong' or 'forged'."""

    kind: str
    detail: str
    version: int | None = None


class _NotVerified(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


class Pinned(AbstractResolver):
    """Answers every name lookup with the addresses vetted just before: the connection
    goes where the check looked, whatever the name resolves to by then."""

    def __init__(self, addresses: set):
        self.addresses = sorted(addresses, key=str)

    async def resolve(self, host: str, port: int = 0, family=socket.AF_UNSPEC) -> list[dict]:
        out = []
        for a in self.addresses:
            fam = socket.AF_INET6 if a.version == 6 else socket.AF_INET
            if family in (socket.AF_UNSPEC, fam):
                out.append({"hostname": host, "host": str(a), "port": port, "family": fam,
                            "proto": 0, "flags": socket.AI_NUMERICHOST})  # fmt: skip
        return out

    async def close(self) -> None:
        pass


async def probe(
    url: str, networks: list[str], key: str, window: tuple[int, int], timeout_s: float,
    lookups: ThreadPoolExecutor | None = None,
) -> Outcome:  # fmt: skip
    """Check the relay at `url` once: the newest version it announces within `window`
    (oldest, newest), whose manifest must be signed by `key`. Returns within `timeout_s`
    (a name lookup still running then is left to finish on `lookups`); never raises."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _probe(url, networks, key, window, timeout_s, lookups)
    except _NotVerified as e:
        return Outcome(e.kind, str(e))
    except TimeoutError:
        return Outcome("failed", f"no complete answer within {timeout_s:g} s")
    except Exception as e:  # recovered: whatever a relay makes go wrong, it is not verified
        return Outcome("failed", f"{type(e).__name__}: {str(e)[:200]}")


async def _probe(url, networks, key, window, timeout_s, lookups) -> Outcome:
    loop = asyncio.get_running_loop()
    try:
        addresses = await loop.run_in_executor(lookups, relays.vetted_addresses, url, networks)
    except relays.Refused as e:
        raise _NotVerified("failed", f"refused: {e}") from None
    connector = aiohttp.TCPConnector(resolver=Pinned(addresses), use_dns_cache=False, limit=1)
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(CONNECT_S, timeout_s))
    base = url.rstrip("/")
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
    ) as session:
        version = _choose(_versions(await _get(session, f"{base}/versions", MAX_VERSIONS_BYTES)),
                          window)  # fmt: skip
        raw = await _get(session, f"{base}/v/{version}/manifest.json", MAX_MANIFEST_BYTES)
    return _verify(raw, version, key)


async def _get(session: aiohttp.ClientSession, url: str, limit: int) -> bytes:
    what = url.rsplit("/", 1)[-1]
    async with session.get(
        url, allow_redirects=False, headers={"Accept-Encoding": "identity"}
    ) as r:
        if 300 <= r.status < 400:
            raise _NotVerified("failed", f"{what}: redirect (HTTP {r.status}), not followed")
        if r.status != 200:
            raise _NotVerified("failed", f"{what}: HTTP {r.status}")
        if r.headers.get("Content-Encoding", "identity").lower() != "identity":
            raise _NotVerified("failed", f"{what}: compressed body refused")
        if r.content_length is not None and r.content_length > limit:
            raise _NotVerified("failed", f"{what}: body over {limit} bytes")
        body = bytearray()
        async for chunk in r.content.iter_chunked(64 << 10):
            body += chunk
            if len(body) > limit:
                raise _NotVerified("failed", f"{what}: body over {limit} bytes")
    return bytes(body)


def _versions(raw: bytes) -> list[int]:
    try:
        versions = json.loads(raw)["versions"]
    except (ValueError, TypeError, KeyError) as e:
        raise _NotVerified("failed", f"versions: not a version list ({type(e).__name__})") from None
    if not isinstance(versions, list) or not all(
        type(v) is int and 0 <= v < 1 << 62 for v in versions
    ):
        raise _NotVerified("failed", "versions: not a list of version numbers")
    return versions


def _choose(versions: list[int], window: tuple[int, int]) -> int:
    oldest, newest = window
    fresh = [v for v in versions if oldest <= v <= newest]
    if not fresh:
        have = max(versions, default=None)
        raise _NotVerified(
            "failed", f"announces no version in [{oldest}, {newest}] (newest announced: {have})"
        )
    return max(fresh)


def _verify(raw: bytes, version: int, key: str) -> Outcome:
    try:
        manifest = parse_manifest(raw, f"version {version}")
    except ManifestError as e:
        raise _NotVerified("failed", str(e)[:300]) from None
    if manifest.version != version:
        raise _NotVerified("wrong", f"asked for version {version}, got {manifest.version}")
    if manifest.signer != key.strip().lower():
        who = f"by {manifest.signer[:16]}..." if manifest.signer else "not"
        raise _NotVerified(
            "wrong", f"manifest of version {version} signed {who}, not by the run's key"
        )
    try:
        manifest.check_signature(key)
    except ManifestError as e:
        raise _NotVerified("forged", str(e)) from None
    return Outcome("verified", f"version {version} verified", version)


class RelayChecker:
    """The relay checks of one orchestrator process: `run_due` checks the relays whose
    turn has come and records what it found; `start_due` (the sweeper's, every sweep)
    claims them on the caller's thread and checks them on a thread of its own, unless
    the previous pass is still running."""

    def __init__(self, svc: Service):
        self.svc = svc
        self.thread: threading.Thread | None = None
        self.lookups = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="relay-dns")

    def start_due(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        due = self.claim()
        if due is not None:
            self.thread = threading.Thread(
                target=self._pass, args=due, daemon=True, name="relay-check"
            )
            self.thread.start()

    def run_due(self) -> dict[str, Outcome]:
        """Check the relays that are due, now; their outcomes by URL."""
        due = self.claim()
        return {} if due is None else self.check(*due)

    def claim(self) -> tuple[list[str], tuple[int, int]] | None:
        """The relays due for a check and the window of versions to ask for, or None."""
        svc = self.svc
        with svc.db.tx() as cur:
            policy = run_state(svc, cur)["policy"]
            if policy is None:  # nothing published: nothing to verify, no relay advertised
                return None
            due = claim_due(svc, cur, svc.clock())
        return (due, (max(0, policy - svc.cfg.async_level), policy)) if due else None

    def check(self, urls: list[str], window: tuple[int, int]) -> dict[str, Outcome]:
        outcomes = asyncio.run(self._probe_all(urls, window))
        for url, outcome in outcomes.items():
            record(self.svc, url, outcome)
        return outcomes

    def _pass(self, urls: list[str], window: tuple[int, int]) -> None:
        try:
            self.check(urls, window)
        except Exception:  # recovered: the claimed relays are checked again at their next turn
            log.exception("relay check pass failed")

    async def _probe_all(self, urls: list[str], window: tuple[int, int]) -> dict[str, Outcome]:
        o = self.svc.cfg.orchestrator
        key = self.svc.manifest_key()
        limit = asyncio.Semaphore(PARALLEL)

        async def one(url: str) -> Outcome:
            async with limit:
                return await probe(url, o.relay_networks, key, window, o.relay_check_timeout_s,
                                   self.lookups)  # fmt: skip

        return dict(zip(urls, await asyncio.gather(*map(one, urls)), strict=True))

    def close(self) -> None:
        self.lookups.shutdown(wait=False, cancel_futures=True)


def claim_due(svc: Service, cur, now: float) -> list[str]:
    """Bring `relay_checks` in line with the live relays, then claim the URLs due for a
    check (their next check moves on, so no other pass or replica takes them)."""
    own = sorted(
        {v for u in svc.cfg.shardcast.servers for v in (u.rstrip("/"), u.rstrip("/") + "/")}
    )
    marks = ", ".join("?" * len(own)) or "''"
    cur.execute(
        "DELETE FROM relay_checks WHERE url NOT IN (SELECT url FROM nodes WHERE role = 'relay'"
        f" AND state IN {LIVE}) OR url IN ({marks})",
        own,
    )
    cur.execute(
        "INSERT INTO relay_checks (url, listed, failures, checked, next_check, detail)"
        " SELECT DISTINCT url, 0, 0, 0, 0, '' FROM nodes WHERE role = 'relay'"
        f" AND state IN {CHECKED} AND url NOT IN ({marks}) ON CONFLICT (url) DO NOTHING",
        own,
    )
    rows = cur.execute(
        "UPDATE relay_checks SET next_check = ? WHERE next_check <= ? AND url IN (SELECT url"
        f" FROM nodes WHERE role = 'relay' AND state IN {CHECKED}) AND url IN (SELECT url FROM"
        " relay_checks WHERE next_check <= ? ORDER BY next_check LIMIT ?) RETURNING url",
        (now + svc.cfg.orchestrator.relay_check_s, now, now, BATCH),
    ).fetchall()
    return sorted(u for (u,) in rows)


def record(svc: Service, url: str, outcome: Outcome) -> None:
    """Apply one check's outcome to the relay at `url` (see the module's docstring)."""
    now = svc.clock()
    with svc.db.tx() as cur:
        row = cur.execute(
            "SELECT listed, failures FROM relay_checks WHERE url = ?", (url,)
        ).fetchone()
        if row is None:  # no live relay has this URL any more
            return
        was, failures = row
        if outcome.kind == "verified":
            listed, failures = 1, 0
        else:
            failures += 1
            dropped = (
                outcome.kind != "failed" or failures >= svc.cfg.orchestrator.relay_check_failures
            )
            listed = 0 if dropped else was
        detail = f"{outcome.kind}: {outcome.detail}"[:500]
        cur.execute(
            "UPDATE relay_checks SET listed = ?, failures = ?, version = COALESCE(?, version),"
            " checked = ?, detail = ? WHERE url = ?",
            (listed, failures, outcome.version, now, detail, url),
        )
        if outcome.kind == "forged":
            keys = cur.execute(
                f"SELECT key FROM nodes WHERE role = 'relay' AND url = ? AND state IN {LIVE}",
                (url,),
            ).fetchall()
            for (key,) in keys:
                punish(svc, cur, key, "ejected", f"relay served a forged manifest: {outcome.detail}",
                       slash=False)  # fmt: skip
    if outcome.kind == "forged":
        log.error(
            "relay %s served a forged manifest (%s): its keys are ejected", url, outcome.detail
        )
    elif listed and not was:
        log.info("relay %s advertised: %s", url, outcome.detail)
    elif was and not listed:
        log.warning("relay %s no longer advertised: %s", url, outcome.detail)
    elif not listed and failures == 1:  # said once, not at every check of a relay that stays off
        log.info("relay %s not advertised: %s", url, outcome.detail)

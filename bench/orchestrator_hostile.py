"""The hostile mix of bench/orchestrator_load.py: what arrives beside the honest nodes.

- **Sybil registrations**: `sybils` fresh keys register at an even rate across the
  measured window, each from a new connection of its own (an attacker's fresh
  keys come from fresh clients), each with a valid proof of work for the run's
  `register_work_bits` (solved before the window, so the client's hashing does
  not load the machine during it). The orchestrator admits the first
  `faucet_burst` as workers and answers the rest 429: the figures count the
  answers by status and time them.
- **Slow-loris connections**: `loris` connections, each sending the start of a
  request head and then one header byte every `drip_s`, never finishing it.
  When the orchestrator closes one, the attacker opens another at once. The
  figures say how long the server held each (its header timeout) and how many
  it closed.

- **Declared lengths**: `long_lengths` connections, each sending a request head
  that declares a body of 10^12 bytes (half to `/v1/nodes/heartbeat`, half as an
  object PUT) and then dripping it two bytes a second; reopened when closed. The
  figures say how long the server held each after its refusal.
- **Rollout bombs**: one more key from the sybils' address pays the proof, takes a
  stake from the faucet and uploads the bombs of bench/rollout_bombs.py through
  the real upload flow; the operator opens each in the dashboard's rollout viewer,
  which decodes it in the orchestrator's capped child. The figures: the viewer's
  answers, the child's peak against its cap, and the orchestrator's own resident
  memory before and after.
- **A newcomer**: one honest key from another address registers halfway through
  the window, paying the proof of work (no invitation), and asks for work.

All the sybils come from one loopback address: one address range
(orchestrator/ranges.py), whose share of the faucet they exhaust.

The honest nodes are the load benchmark's own, admitted by invitation (the
operator's) so that the faucet is the sybils' and the newcomer's alone; their
latencies and errors are recorded apart from the attack's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from benchproc import process_tree, status_kb
from nacl.signing import SigningKey
from yarl import URL

from swarmrl.protocol import work_proof
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.signing import sign_request

HARDWARE = {"cpus": 4, "memory_gb": 16.0, "tokens_per_s": 500.0}


@dataclass(frozen=True)
class Hostile:
    nodes: int = 1000  # honest nodes beside the attack
    sybils: int = 1000
    loris: int = 50
    drip_s: float = 1.0
    long_lengths: int = 20
    bombs: bool = True
    newcomer: bool = True


@dataclass
class Attack:
    """What the attack saw: sybil answers by status with their latencies, and for
    each slow-loris connection the seconds the server held it."""

    sybil_status: Counter = field(default_factory=Counter)
    sybil_latency: list[float] = field(default_factory=list)
    loris_held: list[float] = field(default_factory=list)
    loris_answers: Counter = field(default_factory=Counter)  # what the server said on closing
    loris_open_at_end: int = 0
    loris_connect_errors: int = 0
    long_held: list[float] = field(default_factory=list)
    long_answers: Counter = field(default_factory=Counter)
    long_open_at_end: int = 0
    bombs: dict = field(default_factory=dict)  # name -> what the viewer answered
    newcomer: dict = field(default_factory=dict)


def solve_all(run_id: str, keys: list[SigningKey], bits: int) -> list[str]:
    return [work_proof.solve(run_id, public_key_hex(k), bits) for k in keys]


async def sybil_flood(
    url: str, run_id: str, keys: list[SigningKey], work: list[str], start: float, end: float,
    attack: Attack, source: str | None = None,
) -> None:  # fmt: skip
    """Register `keys` at an even rate over [start, end), each on a new connection
    (from the loopback address `source`, if given)."""
    hardware = {"cpus": 4, "memory_gb": 16.0, "tokens_per_s": 500.0}
    gap = (end - start) / max(1, len(keys))
    timeout = aiohttp.ClientTimeout(total=30.0)

    async def one(i: int, key: SigningKey) -> None:
        await asyncio.sleep(max(0.0, start + i * gap - time.monotonic()))
        body = json.dumps({"role": "worker", "hardware": hardware, "work": work[i]}).encode()
        headers = sign_request(key, run_id, "POST", "/v1/nodes/register", body)
        headers["Content-Type"] = "application/json"
        t0 = time.monotonic()
        try:
            local = (source, 0) if source else None
            connector = aiohttp.TCPConnector(force_close=True, local_addr=local)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
                async with s.post(url + "/v1/nodes/register", data=body, headers=headers) as r:
                    await r.read()
                    status = r.status
        except (aiohttp.ClientError, TimeoutError):
            status = 0  # no answer
        attack.sybil_latency.append(time.monotonic() - t0)
        attack.sybil_status[str(status)] += 1

    await asyncio.gather(*(one(i, k) for i, k in enumerate(keys)))


async def _drip(
    host: str, port: int, head: bytes, drip: bytes, every_s: float, end: float,
    source: str | None,
) -> tuple[str | None, float] | None:  # fmt: skip
    """One connection: `head`, then `drip` every `every_s` until the server hangs up or
    `end`. (the status it said before hanging up, or None if it was still open at
    `end`; seconds held), or None when it could not connect."""
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(
            host, port, local_addr=(source, 0) if source else None
        )
    except OSError:
        return None
    eof = asyncio.ensure_future(reader.read())  # done when the server hangs up
    status = None
    try:
        writer.write(head)
        await writer.drain()
        while time.monotonic() < end:
            done, _ = await asyncio.wait({eof}, timeout=every_s)
            if done:
                status = status_of(eof)
                break
            writer.write(drip)
            await writer.drain()
    except (ConnectionError, OSError):
        status = "none"
    finally:
        eof.cancel()
        writer.close()
    return status, time.monotonic() - t0


async def slow_loris(
    host: str, port: int, n: int, drip_s: float, end: float, attack: Attack,
    source: str | None = None,
) -> None:  # fmt: skip
    """`n` connections dripping a request head until `end`, each reopened when closed
    (from the loopback address `source`, if given)."""
    head = b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: orchestrator\r\n"

    async def one() -> None:
        while time.monotonic() < end:
            got = await _drip(host, port, head, b"X", drip_s, end, source)
            if got is None:
                attack.loris_connect_errors += 1
                await asyncio.sleep(drip_s)
            elif got[0] is None:
                attack.loris_open_at_end += 1
            else:
                attack.loris_answers[got[0]] += 1
                attack.loris_held.append(got[1])

    await asyncio.gather(*(one() for _ in range(n)))


async def long_declared(
    host: str, port: int, n: int, end: float, attack: Attack, source: str | None = None
) -> None:
    """`n` connections declaring a 10^12-byte body and dripping it (two bytes a second)
    until `end`, each reopened half a second after the server closes it (at once, it
    would be a flood of requests from one address, which nothing here rate-limits)."""
    heads = [
        b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: o\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000000\r\n\r\n",
        b"PUT /objects/rollouts/x.parquet?node=ab&size=1&sha256=00&expires=1&sig=00 HTTP/1.1"
        b"\r\nHost: o\r\nContent-Length: 1000000000000\r\n\r\n",
    ]

    async def one(head: bytes) -> None:
        while time.monotonic() < end:
            got = await _drip(host, port, head, b"{ ", 0.5, end, source)
            if got is None:
                await asyncio.sleep(1.0)
            elif got[0] is None:
                attack.long_open_at_end += 1
            else:
                attack.long_answers[got[0]] += 1
                attack.long_held.append(got[1])
                await asyncio.sleep(0.5)

    await asyncio.gather(*(one(heads[i % 2]) for i in range(n)))


async def _signed(session, url: str, run_id: str, key: SigningKey, path: str, body: dict):
    content = json.dumps(body).encode()
    headers = sign_request(key, run_id, "POST", path, content)
    headers["Content-Type"] = "application/json"
    async with session.post(url + path, data=content, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def bomber(
    url: str, run_id: str, key: SigningKey, work: str, bombs: dict[str, bytes], token: str,
    start: float, end: float, attack: Attack, orchestrator_pid: int, source: str | None,
) -> None:  # fmt: skip
    """Register `key` (paying `work`) before `start`, then upload each bomb through the
    real flow, spread over the window, and open it in the dashboard's rollout viewer as
    the operator; record the answers and the decoding child's peak."""
    timeout = aiohttp.ClientTimeout(total=60.0)
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        body = {"role": "worker", "hardware": HARDWARE, "work": work}
        status, answer = await _signed(s, url, run_id, key, "/v1/nodes/register", body)
        attack.bombs["registered"] = status
        if status != 200:
            return
        attack.bombs["orchestrator_rss_before_mb"] = _mb(status_kb(orchestrator_pid, "VmRSS"))
        gap = (end - start) / (len(bombs) + 1)
        for i, (name, data) in enumerate(bombs.items()):
            await asyncio.sleep(max(0.0, start + (i + 1) * gap - time.monotonic()))
            seen = {"file_kb": round(len(data) / 1024, 1)}
            attack.bombs[name] = seen
            want = {"policy_version": 0, "want_work": True}
            for _ in range(5):  # its address's connections may be at their cap: try again
                status, hb = await _signed(s, url, run_id, key, "/v1/nodes/heartbeat", want)
                if status == 200:
                    break
                await asyncio.sleep(1.0)
            if status != 200 or hb.get("assignment") is None:
                seen["no_assignment"] = f"{status} {hb}"[:200]
                continue
            sha = hashlib.sha256(data).hexdigest()
            grant_body = {"counter": hb["assignment"]["counter"], "size": len(data), "sha256": sha}
            status, grant = await _signed(s, url, run_id, key, "/v1/uploads", grant_body)
            if status != 200:
                seen["upload"] = status
                continue
            async with s.put(URL(grant["url"], encoded=True), data=data) as r:
                seen["put"] = r.status
            status, _ = await _signed(
                s, url, run_id, key, "/v1/submit", {"key": grant["key"], "sha256": sha}
            )
            seen["submit"] = status
            auth = {"Authorization": f"Bearer {token}"}
            t0 = time.monotonic()
            async with s.get(f"{url}/v1/dashboard/files/{grant['key']}", headers=auth) as r:
                view = await r.json(content_type=None)
                seen["viewer"] = r.status
            seen["viewer_s"] = round(time.monotonic() - t0, 2)
            seen["refused"] = str(view.get("gone", ""))[:240]
            # the decoding child's peak resident memory over what it holds after the call
            # (its peak is reset at each call); a child stopped at its cap is gone: None
            growth = [
                _mb(status_kb(c, "VmHWM")) - _mb(status_kb(c, "VmRSS"))
                for c in process_tree(orchestrator_pid)[1:]
            ]
            seen["child_peak_mb"] = round(max(growth), 1) if growth else None
        attack.bombs["orchestrator_rss_after_mb"] = _mb(status_kb(orchestrator_pid, "VmRSS"))


def _mb(kb: int | None) -> float:
    return round((kb or 0) / 1024, 1)


async def newcomer(
    url: str, run_id: str, key: SigningKey, work: str, at: float, attack: Attack,
    source: str | None,
) -> None:  # fmt: skip
    """At `at`, an honest key from another address registers with its proof of work and
    asks for work; what it was answered."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None)
    timeout = aiohttp.ClientTimeout(total=30.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        t0 = time.monotonic()
        body = {"role": "worker", "hardware": HARDWARE, "work": work}
        status, answer = await _signed(s, url, run_id, key, "/v1/nodes/register", body)
        attack.newcomer = {"register": status, "stake": (answer or {}).get("stake")}
        if status == 200:
            want = {"policy_version": 0, "want_work": True}
            status, hb = await _signed(s, url, run_id, key, "/v1/nodes/heartbeat", want)
            attack.newcomer |= {
                "heartbeat": status,
                "assignment": bool(hb and hb.get("assignment")),
                "wait": hb.get("wait") if hb else None,
            }
        else:
            attack.newcomer["detail"] = str((answer or {}).get("detail"))[:200]
        attack.newcomer["seconds"] = round(time.monotonic() - t0, 3)
        attack.newcomer["admitted"] = bool(attack.newcomer.get("assignment"))


def status_of(eof: asyncio.Future) -> str:
    """The status the server sent before hanging up ('none': it said nothing)."""
    said = b"" if eof.exception() else eof.result()
    parts = said.split(b" ", 2)
    return parts[1].decode() if said.startswith(b"HTTP/") and len(parts) > 1 else "none"


def summarize_attack(attack: Attack, hostile: Hostile, seconds: float) -> dict:
    lat = sorted(attack.sybil_latency)
    held = sorted(attack.loris_held)

    def pct(xs: list[float], q: float) -> float | None:
        return round(xs[max(0, math.ceil(q * len(xs)) - 1)] * 1000, 1) if xs else None

    return {
        "sybil_registrations": hostile.sybils,
        "sybil_per_s": round(hostile.sybils / seconds, 1),
        "sybil_answers": dict(attack.sybil_status),
        "sybil_p50_ms": pct(lat, 0.5),
        "sybil_p99_ms": pct(lat, 0.99),
        "loris_connections": hostile.loris,
        "loris_closed_by_server": len(held),
        "loris_answers": dict(attack.loris_answers),
        "loris_held_median_s": round(held[len(held) // 2], 1) if held else None,
        "loris_held_max_s": round(held[-1], 1) if held else None,
        "loris_open_at_end": attack.loris_open_at_end,
        "loris_connect_errors": attack.loris_connect_errors,
        "long_lengths": hostile.long_lengths,
        "long_closed_by_server": len(attack.long_held),
        "long_answers": dict(attack.long_answers),
        "long_held_median_s": round(sorted(attack.long_held)[len(attack.long_held) // 2], 2)
        if attack.long_held
        else None,
        "long_held_max_s": round(max(attack.long_held), 2) if attack.long_held else None,
        "long_open_at_end": attack.long_open_at_end,
        "bombs": attack.bombs,
        "newcomer": attack.newcomer,
    }

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

The honest nodes are the load benchmark's own, admitted by invitation (the
operator's) so that the faucet is the sybils' alone; their latencies and
errors are recorded apart from the attack's.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from nacl.signing import SigningKey

from swarmrl.protocol import work_proof
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.signing import sign_request


@dataclass(frozen=True)
class Hostile:
    nodes: int = 1000  # honest nodes beside the attack
    sybils: int = 1000
    loris: int = 50
    drip_s: float = 1.0


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


async def slow_loris(
    host: str, port: int, n: int, drip_s: float, end: float, attack: Attack,
    source: str | None = None,
) -> None:  # fmt: skip
    """`n` connections dripping a request head until `end`, each reopened when closed
    (from the loopback address `source`, if given)."""

    async def one() -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(source, 0) if source else None
                )
            except OSError:
                attack.loris_connect_errors += 1
                await asyncio.sleep(drip_s)
                continue
            eof = asyncio.ensure_future(reader.read())  # done when the server hangs up
            closed = False
            try:
                writer.write(b"POST /v1/nodes/heartbeat HTTP/1.1\r\nHost: orchestrator\r\n")
                await writer.drain()
                while time.monotonic() < end:
                    done, _ = await asyncio.wait({eof}, timeout=drip_s)
                    if done:
                        closed = True
                        attack.loris_answers[status_of(eof)] += 1
                        break
                    writer.write(b"X")
                    await writer.drain()
            except (ConnectionError, OSError):
                closed = True
            finally:
                eof.cancel()
                writer.close()
            if closed:
                attack.loris_held.append(time.monotonic() - t0)
            else:
                attack.loris_open_at_end += 1

    await asyncio.gather(*(one() for _ in range(n)))


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
    }

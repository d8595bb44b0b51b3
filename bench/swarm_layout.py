"""The emulated open swarm's shape (bench/swarm_scale.py): each node's link, round
trip, jitter, loss and address range, the cheats handed out, and how the links set
and the delay line's record are summarised in the JSON. Its docstring explains the
choices."""

from __future__ import annotations

import argparse

CHEATS = ["inflated-reward", "stale-policy", "wrong-seed", "weight-noise", "forged-logprobs",
          "copier"]  # fmt: skip
LINKS = (10, 50, 100)  # Mbit/s, the workers' in turn
RTTS = (20.0, 60.0, 120.0, 200.0, 300.0)  # ms, the workers' round trips in turn
LOSSES = (0.0, 0.001, 0.005, 0.01)  # each way, the workers' in turn
SERVER_PATH = (10.0, 1.0, 0.0)  # rented servers: round trip, jitter, loss
WORKER_BLOCKS = 18  # /24 ranges the workers and cheaters share
# cpu.shares by role: every node competes inside the run's cgroup. The orchestrator,
# the relays, the validators and the trainer have machines (GPUs) of their own in a
# real swarm and do not slow down as workers join: here they come first when they
# want the CPU; the workers share what is left, each held to --worker-cpu
WEIGHTS = {"orchestrator": 16384, "relay": 4096, "trainer": 8192, "validator": 8192,
           "worker": 1024, "cheater": 1024}  # fmt: skip


def launch_cheats(a: argparse.Namespace) -> list[str]:
    """Each cheater's kind, as the launcher hands them out (in turn)."""
    kinds = a.cheats.split(",")
    return [kinds[j % len(kinds)] for j in range(a.cheaters)]


def link_classes(links_set: dict[str, dict], layout) -> dict[str, dict]:
    """The workers' links as set and read back (netns.Network.impairment), by class:
    bandwidth, round trip, jitter, loss each way, and how many workers have it."""
    out: dict[str, dict] = {}
    for name, got in sorted(links_set.items()):
        if not name.startswith(("worker-", "cheater-")):
            continue
        mbit = layout.of(layout.links, name)
        label = f"{mbit:g} Mbit/s, {got['rtt_ms']:g} ms, loss {got['loss_up']:g}"
        c = out.setdefault(label, {"mbit": mbit, **got, "nodes": 0})
        c["nodes"] += 1
    return out


def delay_summary(stats: dict | None) -> dict | None:
    """What the delay line held: packets, and the sampled delays' quantiles (ms)."""
    if not stats:
        return None
    d = sorted(stats["delays_ms"])
    if not d:
        return {"packets": stats["packets"]}
    return {"packets": stats["packets"], "cpu_s": stats.get("cpu_s"), "sampled": len(d),
            "p50_ms": d[len(d) // 2],
            "p99_ms": d[int(0.99 * (len(d) - 1))], "max_ms": d[-1]}  # fmt: skip


def paths(a: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    """Each node's round trip, jitter and loss (the module's docstring)."""
    if a.clean_links:
        return {}
    out = {f"worker-{i}": (RTTS[i % len(RTTS)], RTTS[i % len(RTTS)] / 10, LOSSES[i % len(LOSSES)])
           for i in range(a.workers)}  # fmt: skip
    for j in range(a.cheaters):
        rtt = RTTS[(j + 2) % len(RTTS)]
        out[f"cheater-{j}"] = (rtt, rtt / 10, LOSSES[j % len(LOSSES)])
    return out | {role: SERVER_PATH for role in ("orchestrator", "trainer", "relay", "validator")}


def blocks(a: argparse.Namespace) -> dict[str, int]:
    """Each node's /24: workers spread over WORKER_BLOCKS ranges (two in most), each
    cheater in a range honest workers hold, each server in one of its own."""
    out = {f"worker-{i}": 1 + (5 * i) % WORKER_BLOCKS for i in range(a.workers)}
    out |= {f"cheater-{j}": 1 + (7 * j + 3) % WORKER_BLOCKS for j in range(a.cheaters)}
    out |= {f"relay-{i}": 100 + i for i in range(a.relays)}
    out |= {f"validator-{i}": 150 + i for i in range(a.validators)}
    return out | {"orchestrator": 200, "trainer": 201}

"""`swarmrl status --orchestrator URL`: the public ledger of a run as a table: the node
table of the dashboard (its swarm view: the ledger with each node's hardware, pace and
the policy version it holds), or the ledger's columns alone where the dashboard is off."""

from __future__ import annotations

import json
import sys
import time

import httpx


def _kl(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def ledger_table(ledger: dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    run = ledger["run"]
    head = (
        f"run {ledger['run_id']}: trainer step {run['step']}, policy {run['policy']}"
        f"{', done' if run['done'] else ''}{', paused' if run['paused'] else ''}"
    )
    mismatch = ledger.get("mismatch") or {}
    if mismatch.get("steps"):
        first, last = mismatch["steps"]
        head += f"; mismatch KL over steps {first}..{last}: reference {_kl(mismatch['reference'])}"
    cols = [
        "node",
        "role",
        "state",
        "seen",
        "accepted",
        "pending",
        "rejected",
        "void",
        "final",
        "stake",
        "slashed",
        "kl-unchecked",
        "kl-checked",
        "suspect",
        "device",
    ]
    swarm = any("version" in n for n in ledger["nodes"])  # the dashboard's swarm view
    if swarm:
        cols += ["hardware", "s/unit", "policy", "behind", "lag"]
    rows = [
        [
            n["key"][:16],
            n["role"],
            n["state"],
            f"{max(0, now - n['last_seen']):.0f}s ago",
            str(n["accepted"]),
            str(n["pending"]),
            str(n["rejected"]) + (f" ({n['blameless']} no fault)" if n.get("blameless") else ""),
            str(n["void"]),
            str(n["final"]),
            f"{n['stake']:.1f}",
            f"{n['slashed']:.1f}",
            _kl(n.get("kl_unchecked")),
            _kl(n.get("kl_checked")),
            "yes" if n.get("suspect") else "no",
            n.get("device") or "-",
            *(_swarm_cells(n) if swarm else []),
        ]
        for n in ledger["nodes"]
    ]
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)
    ]
    lines = [head, *_device_lines(ledger.get("devices") or {})]
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    reasons = [f"  {n['key'][:16]}: {n['reason']}" for n in ledger["nodes"] if n["reason"]]
    if reasons:
        lines += ["why nodes were ejected or banned:", *reasons]
    if any(n.get("suspect") for n in ledger["nodes"]):
        lines.append(
            "suspect: mismatch KL on unchecked files far above the reference; every file of "
            "the node is validated"
        )
    return "\n".join(lines)


def _swarm_cells(n: dict) -> list[str]:
    """The swarm view's columns: hardware, measured pace, policy held, weights lag."""

    def show(v, fmt="{}"):
        return "-" if v is None else fmt.format(v)

    hw = f"{n['cpus']} cpu, {n['memory_gb']:.0f} GB" if n.get("cpus") else "-"
    if n.get("gpus"):
        hw += ", " + ", ".join(n["gpus"])
    return [hw, show(n.get("s_per_unit"), "{:.3g}"), show(n.get("version")),
            show(n.get("behind")), show(n.get("lag_s"), "{:.1f}s")]  # fmt: skip


def _device_lines(devices: dict) -> list[str]:
    """Where the trainer and each validator compute, as they last reported it."""
    lines = []
    if devices.get("trainer"):
        lines.append(f"trainer on {devices['trainer']}")
    for key, where in (devices.get("validators") or {}).items():
        lines.append(f"validator {key[:16]} on {where}")
    return lines


def print_status(url: str, as_json: bool = False) -> int:
    base = url.rstrip("/")
    try:
        resp = httpx.get(base + "/v1/dashboard/swarm", timeout=10.0)
        if resp.status_code == 404:  # the dashboard is off: the ledger alone
            resp = httpx.get(base + "/v1/ledger", timeout=10.0)
    except httpx.TransportError as e:
        print(f"swarmrl: cannot reach the orchestrator at {url}: {e}", file=sys.stderr)
        return 2
    if resp.status_code != 200:
        print(f"swarmrl: {resp.request.url} answered {resp.status_code}", file=sys.stderr)
        return 2
    ledger = resp.json()
    print(json.dumps(ledger, indent=1) if as_json else ledger_table(ledger))
    return 0

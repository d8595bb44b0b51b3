"""What became of every file a worker of an emulated swarm made, read from both sides:
each worker's own record (`<home>/files.jsonl`, inference/worker.py: a line when a
file's bytes are made, then its fate) and the orchestrator's ledger (its `files`
table). bench/swarm_scale.py prints these figures; its docstring defines them.

A worker's side says what it attempted; the ledger says what the run did with it.
Neither is told who is honest: the names come from the node homes the launcher made
(`nodes/<name>/node.pub`), the link classes from the bench's own layout.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

ACCEPTED = ("accepted", "consumed", "trained")  # past the validator (or not drawn for it)
QUEUED = ("pending", "accepted", "consumed")  # still waiting when the run ended


def worker_records(run: Path) -> dict[str, list[dict]]:
    """Each node's `files.jsonl` lines, by node name (workers and cheaters)."""
    out: dict[str, list[dict]] = {}
    for path in sorted((run / "nodes").glob("*/files.jsonl")):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        out[path.parent.name] = lines
    return out


def attempts(lines: list[dict]) -> list[dict]:
    """One entry per file made, with its fate from the worker's side: `submitted` (with
    the key), `refused` (status), `failed`, or `held` (made, no fate: the worker died
    holding it, or the run ended first)."""
    files: dict[int, dict] = {}
    for x in lines:
        if x["event"] == "made":
            files[x["counter"]] = {**x, "fate": "held"}
        elif x["event"] in ("submitted", "refused", "failed") and x["counter"] in files:
            files[x["counter"]].update({k: v for k, v in x.items() if k not in ("time",)})
            files[x["counter"]]["fate"] = x["event"]
    return list(files.values())


def ledger(run: Path) -> dict[str, dict]:
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    cols = ("key", "node", "state", "void", "step", "policy", "counter", "submitted", "checked",
            "check_name", "verdict")  # fmt: skip
    rows = db.execute(f"SELECT {', '.join(cols)} FROM files").fetchall()
    db.close()
    return {r[0]: dict(zip(cols, r, strict=True)) for r in rows}


def accepted(row: dict) -> bool:
    """A file past the validator: a verdict that accepts it, or one the trainer took
    unchecked (spot-checking drew others); it may have gone stale since."""
    if row["state"] in ACCEPTED:
        return True
    return bool(row["verdict"]) and json.loads(row["verdict"]).get("accepted") is True


def started(lines: list[dict], not_before: float | None = None) -> float | None:
    """Its first process's start, or `not_before` if later (a late worker's process
    is the shell that waited for its turn: /proc gives the shell's start)."""
    times = [x["time"] for x in lines if x["event"] == "start"]
    if not times:
        return None
    return max(min(times), not_before) if not_before else min(times)


def quantiles(xs: list[float]) -> dict:
    """p50, p99 and max; with fewer than 100 values p99 is the max."""
    if not xs:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 1),
            "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 1),
            "max": round(xs[-1], 1), "n": len(xs)}  # fmt: skip


def fates(run: Path, names: dict[str, str], killed: set[str], classes: dict[str, str],
          cores: dict[str, float], end: float, kinds: dict[str, str],
          joined: dict[str, float] | None = None) -> dict:  # fmt: skip
    """The open swarm's figures (bench/swarm_scale.py's docstring): `names` maps keys to
    node names, `killed` the nodes churn killed, `classes` each worker's link class,
    `cores` its CPU share, `end` when the run ended (time.time()), `kinds` each
    cheater's cheat, `joined` when late workers were let start.

    A copier's files made while there was nothing to copy, and a stale-policy
    cheater's files of the first version it held (taken to be 0), are honest work
    counted under `trained`/`trained_while_honest` as the cheat's."""
    book = ledger(run)
    key_of = {n: k for k, n in names.items()}
    records = worker_records(run)
    honest = sorted(n for n in names.values() if n.startswith("worker-"))
    lost, wasted, first, first_trained = [], {}, {}, {}
    per_class: dict[str, dict] = {}
    for name in honest:
        made = attempts(records.get(name, []))
        c = per_class.setdefault(classes.get(name, "?"), {"workers": 0, "made": 0,
                                                         "trained": 0, "wasted": 0})  # fmt: skip
        c["workers"] += 1
        t0 = started(records.get(name, []), (joined or {}).get(name))
        alive = max(0.0, end - t0) if t0 else 0.0  # from its start to the run's end
        c["core_s"] = round(c.get("core_s", 0.0) + cores.get(name, 1.0) * alive, 1)
        for f in made:
            c["made"] += 1
            row = book.get(f.get("key", ""))
            why = waste(f, row, name in killed)
            if why == "lost":
                lost.append({"node": name, **f})
            elif why:
                wasted[why] = wasted.get(why, 0) + 1
                c["wasted"] += 1
            if row and row["state"] == "trained" and not row["void"]:
                c["trained"] += 1
        mine = [r for r in book.values() if r["node"] == key_of.get(name) and not r["void"]]
        ok = [r["submitted"] for r in mine if accepted(r) and r["submitted"]]
        first[name] = round(min(ok) - t0, 1) if ok and t0 else None
        used = [r["submitted"] for r in mine if r["state"] == "trained" and r["submitted"]]
        first_trained[name] = round(min(used) - t0, 1) if used and t0 else None
    made_all = sum(c["made"] for c in per_class.values())
    for c in per_class.values():
        c["files_per_core_s"] = round(c["made"] / c["core_s"], 4) if c.get("core_s") else None
        c["trained_per_core_s"] = round(c["trained"] / c["core_s"], 4) if c.get("core_s") else None
        c["wasted_fraction"] = round(c["wasted"] / c["made"], 3) if c["made"] else None
    waits = [v for v in first.values() if v is not None]
    cheats: dict[str, dict] = {}
    for name, kind in sorted(kinds.items()):
        k = cheats.setdefault(kind, {"cheaters": 0, "submitted": 0, "rejected": 0,
                                     "trained": 0, "trained_while_honest": 0})  # fmt: skip
        k["cheaters"] += 1
        for r in book.values():
            if r["node"] != key_of.get(name) or not r["submitted"]:
                continue
            k["submitted"] += 1
            k["rejected"] += r["state"] == "rejected"
            if r["state"] == "trained":  # a void file was trained before its node's ejection
                # a stale-policy cheater's files of version 0 are honest: it held no older
                honest_yet = kind == "stale-policy" and r["policy"] == 0
                k["trained_while_honest" if honest_yet else "trained"] += 1
    return {
        "honest_files_made": made_all,
        "lost": len(lost),
        "lost_files": lost[:10],
        "wasted": dict(sorted(wasted.items())),
        "wasted_fraction": round(sum(wasted.values()) / made_all, 3) if made_all else None,
        "by_link_class": dict(sorted(per_class.items())),
        "first_accepted_file_s": quantiles(waits),
        "honest_workers_without_accepted_file": sorted(n for n, v in first.items() if v is None),
        "first_trained_file_s": quantiles([v for v in first_trained.values() if v is not None]),
        "honest_workers_without_trained_file": sorted(
            n for n, v in first_trained.items() if v is None
        ),
        "cheater_files": cheats,
    }


def honest_waste(opened: dict) -> float | None:
    """Honest files made and never trained, over the honest files made: stale, refused
    at upload or blamelessly, voided, held by a worker churn killed, failed, or lost
    (bench/swarm_fates.py); files still queued when the run ended are not counted (a
    longer run trains them)."""
    made = opened["honest_files_made"]
    wasted = sum(n for why, n in opened["wasted"].items() if why != "unused_at_end")
    return round((wasted + opened["lost"]) / made, 3) if made else None


def waste(f: dict, row: dict | None, killed: bool) -> str | None:
    """Why an honest file made was not trained (`unused_at_end`: still queued when the
    run ended), None if it was, or "lost" if neither side can say: a file the worker
    submitted that the ledger lacks or never settled, or one it held when nothing
    killed it (the run's own end included: a worker stopped mid-upload at the end
    counts it lost)."""
    if f["fate"] == "held":
        return "churn" if killed else "lost"
    if f["fate"] == "failed":
        return "failed"
    if f["fate"] == "refused":
        return "refused_upload"
    if row is None:
        return "lost"
    if row["void"]:
        return "voided"
    state = row["state"]
    if state == "trained" or state in QUEUED:
        return None if state == "trained" else "unused_at_end"
    if state in ("stale", "discarded"):  # discarded: stale, its object deleted
        return "stale"
    if state == "rejected":  # blamed, or the validator's or trainer's own refusal
        return "refused_blamelessly" if blameless(row["check_name"]) else "rejected"
    return "lost"


def blameless(check: str | None) -> bool:
    from swarmrl.protocol.verdict import BLAMELESS_CHECKS

    return check in BLAMELESS_CHECKS or check == "trainer"

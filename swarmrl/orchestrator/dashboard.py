"""The live dashboard: one page (static/, shipped in the package) and the read-only
API it polls under /v1/dashboard/.

It is served by the orchestrator because the orchestrator already holds every figure
it shows (nodes, files, verdicts, events, the trainer's metrics rows it is sent, the
launcher's held-out scores) and its operator token: a separate process would read
the same data through the same API and add a port to open. The page polls every
few seconds (no held connection, so orchestrator/connections.py's answer and idle
limits apply to it as to any client).

What the public view shows is what the public ledger already shows, plus the run's
figures and the verdicts' checks and reasons. Rollout texts (prompts and
completions) need the operator token unless `orchestrator.public_rollouts` is
set; ban, unban and pause are the operator routes of app.py, called by the page
with the token the operator types in (kept in the tab's sessionStorage only).
No answer carries a URL signature, a key other than a public key, or the token.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse

from swarmrl.orchestrator import work
from swarmrl.orchestrator.admission import measured_pace
from swarmrl.orchestrator.auth import require_operator
from swarmrl.orchestrator.objects import ObjectError
from swarmrl.orchestrator.service import ApiError, Recent, Service, stored_object
from swarmrl.protocol.rollouts import Limits, RolloutFileError, RolloutUnreadable, read_rollouts

STATIC = Path(__file__).parent / "static"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
# what the page shows of a rollout file, per sample (never the proofs or token ids)
SAMPLE_FIELDS = ("problem_id", "group", "prompt", "completion", "reward", "task_reward",
                 "length_penalty", "target_length", "policy_step", "step", "task_type",
                 "temperature")  # fmt: skip
RECENT = 300  # verdicts and events per answer
FILES_PER_ANSWER = 500
# the page's own headers: nothing from elsewhere, no framing by another site
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


SERVERS_EVERY_S = 5.0  # how often the dashboard asks each operator's server what it holds
SERVER_ANSWER_BYTES = 64 * 1024
ROLLOUT_FILE_BYTES = 32 << 20  # the viewer reads files up to this size...
ROLLOUT_DECODED_BYTES = 128 << 20  # ...that decode to at most this much (and the run's budget)
TEXT_CHARS = 20_000  # a prompt or completion shown is cut to this many characters
_viewers = threading.BoundedSemaphore(2)  # rollout files decoded at once
_refused = Recent(256)  # a file's sha256 -> why it does not read: a bomb is decoded once


def ask_servers(svc: Service) -> None:
    """In the background, ask each server the operator named (`shardcast.servers`) which
    versions it serves (`GET /versions`: 2 s a step, 64 KiB), at most every
    SERVERS_EVERY_S; the swarm view shows the answers it has. Registered relays are not
    asked here (their address resolves anew at each lookup, and a relay chooses it): the
    view shows the version the relay checker verified on them (relaycheck.py)."""
    urls = [u.rstrip("/") for u in svc.cfg.shardcast.servers]
    now = svc.clock()
    due = [u for u in urls if now - svc.server_versions.get(u, (0.0,))[0] >= SERVERS_EVERY_S]
    if not due or not svc.asking_servers.acquire(blocking=False):
        return
    for u in due:  # marked now, so the next view does not ask again while this one runs
        svc.server_versions[u] = (now, *svc.server_versions.get(u, (0.0, None, ""))[1:])

    def ask(http, u: str) -> tuple:
        with http.stream("GET", u + "/versions") as r:
            r.raise_for_status()
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > SERVER_ANSWER_BYTES:
                    return (now, None, "answer too large")
        versions = json.loads(body).get("versions", [])
        if not isinstance(versions, list):
            return (now, None, "not a list of versions")
        return (now, [v for v in versions if type(v) is int][-8:], "")

    def run():
        import httpx

        try:
            with httpx.Client(timeout=2.0, follow_redirects=False) as http:
                for u in due:
                    try:
                        svc.server_versions[u] = ask(http, u)
                    except Exception as e:  # a server's failure is shown, never raised
                        svc.server_versions[u] = (now, None, type(e).__name__)
        finally:
            svc.asking_servers.release()

    try:
        threading.Thread(target=run, daemon=True, name="dashboard-servers").start()
    except RuntimeError:
        svc.asking_servers.release()


def eta_s(ends: list[tuple[int, dict]], steps: int, max_minutes: float) -> float | None:
    """Seconds left at the pace of the rows so far (the run also ends at max_minutes):
    `ends` is the first and last (step, metrics row). None when a row lacks its
    `elapsed_s` (the trainer's rows are read as they come, whatever fields they carry)."""
    if len(ends) < 2:
        return None
    (first_step, first), (last_step, last) = ends[0], ends[-1]
    start, now = _number(first.get("elapsed_s")), _number(last.get("elapsed_s"))
    done = last_step - first_step
    if done <= 0 or start is None or now is None:
        return None
    eta = max(0.0, now - start) / done * max(0, steps - last_step)
    if max_minutes:
        eta = min(eta, max(0.0, 60 * max_minutes - now))
    return eta


def _number(x) -> float | None:
    """`x` if it is a finite number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float) or x != x or abs(x) == float("inf"):
        return None
    return float(x)


def record_metrics(svc: Service, step: int, row: dict) -> dict:
    """The trainer's metrics row of `step` (a resumed step's row replaces the old one)."""
    with svc.db.tx() as cur:
        cur.execute(
            "INSERT INTO run_metrics VALUES (?, ?, ?) ON CONFLICT (step) DO UPDATE SET"
            " time = excluded.time, row = excluded.row",
            (step, svc.clock(), json.dumps(row)),
        )
    return {"step": step}


def record_evaluation(svc: Service, name: str, step: int, result: dict) -> dict:
    """A held-out score the launcher measured (eval.json's `name`)."""
    with svc.db.tx() as cur:
        cur.execute(
            "INSERT INTO evaluations VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
            " step = excluded.step, time = excluded.time, result = excluded.result",
            (name, step, svc.clock(), json.dumps(result)),
        )
    return {"name": name}


def run_view(svc: Service, after: int) -> dict:
    """The run's settings, state, metrics rows past `after`, held-out scores and ETA."""
    cfg = svc.cfg
    with svc.db.read() as cur:
        run = work.run_state(svc, cur)
        rows = cur.execute(
            "SELECT step, time, row FROM run_metrics WHERE step > ? ORDER BY step", (after,)
        ).fetchall()
        first = cur.execute("SELECT step, row FROM run_metrics ORDER BY step LIMIT 1").fetchall()
        last = cur.execute(
            "SELECT step, row FROM run_metrics ORDER BY step DESC LIMIT 1"
        ).fetchall()
        evals = cur.execute(
            "SELECT name, step, time, result FROM evaluations ORDER BY time"
        ).fetchall()
        levels = cur.execute("SELECT step, sampler FROM steps ORDER BY step").fetchall()
    ends = [(int(step), stored_object(r)) for step, r in first + last]
    return {
        "run_id": svc.run_id,
        "name": cfg.name,
        "model": Path(cfg.model.path).name or cfg.model.path,
        "task": cfg.task.name,
        "steps": cfg.trainer.steps,
        "async_level": cfg.async_level,
        "validation": cfg.validator.enabled,
        "public_rollouts": cfg.orchestrator.public_rollouts,
        "state": run,
        "metrics": [{**stored_object(row), "step": step, "time": t} for step, t, row in rows],
        "evaluations": [
            {**stored_object(r), "name": n, "step": s, "time": t} for n, s, t, r in evals
        ],
        "levels": {str(s): stored_object(sampler).get("level", 0) for s, sampler in levels},
        "eta_s": eta_s(ends, cfg.trainer.steps, cfg.trainer.max_minutes),
        "now": svc.clock(),
    }


def work_wasted(nodes: list[dict]) -> dict:
    """Contributors' work that was not trained through no fault of theirs, from the
    ledger's counts: files gone stale (the trainer moved past their policy) and files
    refused without blame (the validator's or trainer's own failure), over the files
    neither blamed nor voided (a blamed file is its sender's fault; a voided one an
    ejected node's). A live view: pending and accepted files may still be trained."""
    counts = {"files": 0, "stale": 0, "refused_blamelessly": 0}
    for n in nodes:
        if n["role"] != "worker":
            continue
        counts["stale"] += n["stale"]
        counts["refused_blamelessly"] += n["blameless"]
        counts["files"] += n["accepted"] + n["pending"] + n["stale"] + n["blameless"]
    lost = counts["stale"] + counts["refused_blamelessly"]
    return counts | {
        "wasted_fraction": round(lost / counts["files"], 4) if counts["files"] else None
    }


def swarm_view(svc: Service) -> dict:
    """Every node with its role, state, hardware, device, pace, files, stake, last
    heartbeat, policy version and weights lag; the relays and the versions they hold."""
    ledger = work.ledger(svc)
    now = svc.clock()
    with svc.db.read() as cur:
        hw = dict(cur.execute("SELECT key, hardware FROM nodes").fetchall())
        urls = dict(cur.execute("SELECT key, url FROM nodes WHERE role = 'relay'").fetchall())
        paces = {n["key"]: measured_pace(cur, n["key"]) for n in ledger["nodes"]}
        checks = cur.execute(
            "SELECT url, listed, failures, version, checked, detail FROM relay_checks"
        ).fetchall()
        servers = work.servers(svc, cur)
    newest = ledger["run"]["policy"]
    nodes = []
    for n in ledger["nodes"]:
        h = stored_object(hw.get(n["key"]))
        version = svc.node_versions.get(n["key"])
        nodes.append({
            **n,
            "cpus": h.get("cpus"), "memory_gb": h.get("memory_gb"), "gpus": h.get("gpus", []),
            "tokens_per_s": h.get("tokens_per_s"),
            "s_per_unit": paces.get(n["key"]),
            "version": version,
            "behind": None if version is None or newest is None else max(0, newest - version),
            "lag_s": _lag(svc, version, newest, now),
            "url": urls.get(n["key"], ""),
        })  # fmt: skip
    by_url = {c[0]: c for c in checks}
    ask_servers(svc)
    relays = []
    for url in sorted({*servers, *by_url}):
        c = by_url.get(url)
        asked, holds, error = svc.server_versions.get(url.rstrip("/"), (None, None, ""))
        relays.append({
            "url": url, "advertised": url in servers,
            "holds": holds, "asked": asked if holds is not None or error else None,
            "error": error,
            "listed": bool(c[1]) if c else None, "failures": c[2] if c else 0,
            "version": c[3] if c else None, "checked": c[4] if c else None,
            "detail": c[5] if c else "",
        })  # fmt: skip
    return {"run_id": ledger["run_id"], "run": ledger["run"], "devices": ledger["devices"],
            "mismatch": ledger["mismatch"], "nodes": nodes, "relays": relays,
            "wasted": work_wasted(ledger["nodes"]), "now": now}  # fmt: skip


def _lag(svc: Service, version: int | None, newest: int | None, now: float) -> float | None:
    """Seconds since the first version this node lacks was announced (0 when current)."""
    if version is None or newest is None:
        return None
    if version >= newest:
        return 0.0
    announced = svc.published_at.copy()  # publishes insert from another thread
    missing = [t for v, t in announced.items() if version < v <= newest]
    return now - min(missing) if missing else None


def verdicts_view(svc: Service) -> dict:
    """The newest verdicts (with the failing check) and ledger events (ejections,
    slashes, suspects, stakes)."""
    with svc.db.read() as cur:
        files = cur.execute(
            "SELECT key, node, step, policy, state, check_name, reason, validator, verdict,"
            " counter FROM files WHERE checked = 1 AND verdict IS NOT NULL"
            " ORDER BY submitted DESC, counter DESC LIMIT ?",
            (RECENT,),
        ).fetchall()
        events = cur.execute(
            "SELECT id, time, node, kind, amount, detail FROM events ORDER BY id DESC LIMIT ?",
            (RECENT,),
        ).fetchall()
    verdicts = []
    order = {}
    for key, node, step, policy, state, check, reason, validator, blob, counter in files:
        order[key] = counter
        v = stored_object(blob)
        verdicts.append({
            "key": key, "node": node, "step": step, "policy": policy, "state": state,
            "accepted": bool(v.get("accepted")), "check": check or "", "reason": reason or "",
            "validator": validator, "time": _number(v.get("time")), "seconds": v.get("seconds"),
            "samples": v.get("n_samples"), "tokens": v.get("n_tokens"),
        })  # fmt: skip
    verdicts.sort(key=lambda v: (v["time"] or 0.0, order[v["key"]]))  # oldest first
    return {
        "verdicts": verdicts,
        "events": [
            {"id": i, "time": t, "node": n, "kind": k, "amount": a, "detail": d}
            for i, t, n, k, a, d in reversed(events)
        ],
        "now": svc.clock(),
    }


def files_view(svc: Service, step: int | None) -> dict:
    """The files of `step` (the newest step with files when None), with node, policy,
    staleness, state, the verdict's check, and the step's difficulty level."""
    with svc.db.read() as cur:
        steps = [s for (s,) in cur.execute(
            "SELECT DISTINCT step FROM files ORDER BY step DESC LIMIT 1000"
        ).fetchall()]  # fmt: skip
        if step is None:
            step = steps[0] if steps else 0
        rows = cur.execute(
            "SELECT key, node, step, policy, groups, size, state, checked, check_name, reason,"
            " submitted, consumed_step FROM files WHERE step = ? ORDER BY counter LIMIT ?",
            (step, FILES_PER_ANSWER),
        ).fetchall()
        s = cur.execute("SELECT sampler FROM steps WHERE step = ?", (step,)).fetchone()
    level = stored_object(s[0]).get("level", 0) if s else None
    files = [
        {"key": k, "node": n, "step": st, "policy": p, "staleness": st - p, "groups": g,
         "size": size, "state": state, "checked": bool(c), "check": chk or "",
         "reason": why or "", "submitted": sub, "consumed_step": cs, "level": level}
        for k, n, st, p, g, size, state, c, chk, why, sub, cs in rows
    ]  # fmt: skip
    return {"step": step, "steps": sorted(steps), "level": level, "files": files}


def rollout_view(svc: Service, key: str) -> dict:
    """The samples of one rollout file, read back from the object store."""
    with svc.db.read() as cur:
        row = cur.execute(
            "SELECT node, step, policy, state, check_name, reason, verdict FROM files"
            " WHERE key = ?",
            (key,),
        ).fetchone()
    if row is None:
        raise ApiError(404, "no such file")
    node, step, policy, state, check, reason, blob = row
    head = {"key": key, "node": node, "step": step, "policy": policy, "staleness": step - policy,
            "state": state, "check": check or "", "reason": reason or "",
            "checked_samples": stored_object(blob).get("samples", [])}  # fmt: skip
    if not _viewers.acquire(timeout=10.0):
        raise ApiError(503, "the rollout viewer is busy; try again", retry_after_s=2.0)
    try:
        try:
            data = svc.objects.read(key, ROLLOUT_FILE_BYTES)
        except ObjectError as e:
            raise ApiError(e.status, e.detail) from None
        if data is None:
            return {**head, "samples": [], "gone": "the file was deleted from the object store "
                    "(trained or rejected, and past orchestrator.keep_trained_steps; or stale)"}  # fmt: skip
        digest = hashlib.sha256(data).hexdigest()
        if digest in _refused:
            return {**head, "samples": [], "gone": _refused[digest]}
        try:
            # the run's sizes bound the decoding; whole groups are the validator's business
            limits = dataclasses.replace(Limits.of_run(svc.cfg), group_size=None)
            rows = read_rollouts(data, limits, ROLLOUT_DECODED_BYTES)
        except RolloutFileError as e:  # a rejected file may be malformed: say so, show nothing
            _refused[digest] = f"the file does not read as rollouts: {e}"
            return {**head, "samples": [], "gone": _refused[digest]}
        except RolloutUnreadable as e:  # kept too: a public page must not decode it again
            _refused[digest] = f"the file could not be decoded here: {e}"
            return {**head, "samples": [], "gone": _refused[digest]}
        samples = [
            {**{f: r[f] for f in SAMPLE_FIELDS}, "index": i,
             "prompt": r["prompt"][:TEXT_CHARS], "completion": r["completion"][:TEXT_CHARS],
             "completion_tokens": len(r["completion_tokens"])}
            for i, r in enumerate(rows)
        ]  # fmt: skip
        return {**head, "samples": samples}
    finally:
        _viewers.release()


def dashboard_routes(app: FastAPI, svc: Service) -> None:
    """The page, its two assets, and the read-only API the page polls."""

    @app.get("/dashboard", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "dashboard.html").read_text(), headers=PAGE_HEADERS)

    @app.get("/dashboard/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise ApiError(404, "no such asset")
        return FileResponse(STATIC / name, media_type=ASSETS[name], headers=PAGE_HEADERS)

    @app.get("/v1/dashboard/run")
    def dash_run(after: int = Query(-1, ge=-1, le=1 << 40)) -> dict:
        """The run: settings, state, metrics rows after step `after`, held-out scores, ETA."""
        return run_view(svc, after)

    @app.get("/v1/dashboard/swarm")
    def dash_swarm() -> dict:
        """Every node (role, state, hardware, device, pace, files, stake, heartbeat,
        weights lag) and the relays."""
        return swarm_view(svc)

    @app.get("/v1/dashboard/verdicts")
    def dash_verdicts() -> dict:
        """The newest verdicts and ledger events."""
        return verdicts_view(svc)

    @app.get("/v1/dashboard/files")
    def dash_files(step: int | None = Query(None, ge=0, le=1 << 40)) -> dict:
        """The files of a step (default: the newest step with files)."""
        return files_view(svc, step)

    @app.get(
        "/v1/dashboard/files/{key:path}",
        responses={401: {"description": "Rollout texts need the operator token"}},
    )
    def dash_rollout(key: str, request: Request) -> dict:
        """One file's samples: prompt, completion, reward (the operator token unless
        orchestrator.public_rollouts)."""
        if not svc.cfg.orchestrator.public_rollouts:
            require_operator(svc, request)
        return rollout_view(svc, key)

"""The dashboard as a person uses it: a real swarm with a cheater, its page in a headless
Chromium (the Debian package, driven by Playwright), live updates, real values; and the
trackers of the same run read back against metrics.jsonl.

One swarm serves every test of this module (a module fixture): it runs long enough for
the checks, which end it. Skipped, saying why, where Chromium or Playwright is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bench.benchproc import free_port, interrupt_group
from tests.integration.conftest import ROOT, at, read_metrics, swarm_cmd, wait_for

# 135 s for the module (its swarm); in the default suite: the dashboard's API on real
# run records (tests/unit/test_dashboard_api.py) and the trackers (tests/unit/test_tracking.py)
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# the screenshot the README shows is refreshed by SWARMRL_SCREENSHOTS=docs make test
SHOTS = os.environ.get("SWARMRL_SCREENSHOTS", "")


@pytest.fixture(scope="module")
def swarm(tiny_model, tmp_path_factory):
    """A tiny swarm with one cheater, W&B offline beside TensorBoard; yields
    (url, run directory, operator token, launcher process). It has steps enough to
    outlive every check (an idle machine trains the tiny model at a step a second: 40
    steps once ended before the first test's last check); the last test stops it."""
    tmp = tmp_path_factory.mktemp("dash")
    url = f"http://127.0.0.1:{free_port()}"
    cmd = swarm_cmd(
        tmp, tiny_model, *at(url), "trainer.steps=1000", "launcher.eval_problems=32",
        'tracking.wandb="offline"', "orchestrator.register_work_bits=8",
    )  # fmt: skip
    cmd[4:4] = ["--cheaters", "1", "--cheats", "other-model"]
    log = open(tmp / "launcher.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run = tmp / "runs" / "tiny"
    try:
        wait_for(lambda: _up(url), 120, "the orchestrator", proc)
        token = (run / "keys" / "operator.token").read_text().strip()
        yield url, run, token, proc
    finally:
        interrupt_group(proc)
        log.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; `make test` tries)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _rows(page, table: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        f"#{table} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )


def _wait(page, what: str, pred, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        page.wait_for_timeout(500)
    state = page.inner_text("#run-state") + " | " + page.inner_text("#updated")
    raise AssertionError(f"the page never showed {what} (it says: {state})")


def _shot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if SHOTS == "docs":
        shutil.copy(path, ROOT / "docs" / name)
    return path


def test_dashboard_shows_the_live_swarm_and_its_rollouts(swarm, browser, tmp_path):
    url, run, token, proc = swarm
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors, answers = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda a: answers.append(a))  # every answer, read back at the end
    page.goto(url + "/dashboard")
    # the nodes: every worker of the ledger, with its key and its accepted files
    _wait(page, "the three workers", lambda: len(
        [r for r in _rows(page, "nodes") if r[1] == "worker"]) >= 3)  # fmt: skip
    # live: the step in the header moves without a reload
    first = _wait(page, "an open step", lambda: _step(page) or None)
    _wait(page, "a later step", lambda: (_step(page) or 0) > first)
    ledger = httpx.get(url + "/v1/ledger").json()
    shown = {r[0]: r for r in _rows(page, "nodes")}
    for n in ledger["nodes"]:
        assert n["key"][:12] in shown, n["key"]
        assert shown[n["key"][:12]][1] == n["role"]
    # the relay, with the versions it serves (the orchestrator asks it in the background)
    relay = _wait(page, "the relay's versions", lambda: [
        r for r in _rows(page, "relays") if r[2][:1].isdigit()])  # fmt: skip
    shown = [int(v) for v in relay[0][2].split(", ")]
    served = httpx.get(relay[0][0] + "/versions").json()["versions"]  # asked later: newer
    assert shown == sorted(shown) and max(shown) <= max(served), (shown, served)
    # a verdict with its real values
    verdicts = httpx.get(url + "/v1/dashboard/verdicts").json()["verdicts"]
    assert verdicts
    rows = _wait(page, "a verdict", lambda: _rows(page, "verdicts"))
    assert any(r[1] == verdicts[0]["node"][:12] and r[2] == str(verdicts[0]["step"]) for r in rows)
    # the run's figures: the reward tile shows a row of metrics.jsonl (the newest the page has)
    wait_for(lambda: read_metrics(run), 120, "a trained step", proc)
    tile = _wait(page, "the reward tile", lambda: [
        t for t in page.eval_on_selector_all(".tile", "ts => ts.map(t => t.innerText)")
        if "reward" in t and "–" not in t])  # fmt: skip
    last = tile[0].split()[0]
    assert last in {f"{r['reward']:.3f}" for r in read_metrics(run)}, (tile, read_metrics(run))
    assert page.locator("#chart-reward svg polyline, #chart-reward svg circle").count() >= 1
    # a rollout: public view first (texts need the token), then the operator's; the
    # table stays on its step (a fast swarm moves "the newest" on every refresh)
    _wait(page, "a file", lambda: _rows(page, "files"))
    page.uncheck("#follow")
    page.click("#files tbody tr >> nth=0")
    page.wait_for_selector("#rollout .note")
    assert "operator" in page.inner_text("#rollout")
    page.fill("#token", token)
    page.click("#token-set")
    _wait(page, "the operator view", lambda: page.inner_text("#token-state") == "operator view")
    page.click("#files tbody tr >> nth=0")
    page.wait_for_selector("#rollout .sample pre")
    key = page.get_attribute("#rollout", "data-key")  # the file the viewer shows
    real = httpx.get(
        url + "/v1/dashboard/files/" + key, headers={"Authorization": f"Bearer {token}"}
    ).json()
    texts = page.eval_on_selector_all("#rollout .sample pre", "ps => ps.map(p => p.textContent)")
    assert texts == [s["completion"] for s in real["samples"]][: len(texts)] and texts
    prompt = page.inner_text("#rollout .prompt >> nth=0")
    assert prompt.strip() == real["samples"][0]["prompt"].strip()
    _shot(page, tmp_path, "dashboard.png")
    assert not errors, errors
    # no answer the page got, public or the operator's, holds the token or the URL secret
    import sqlite3

    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    secret = db.execute("SELECT v FROM meta WHERE k = 'url_secret'").fetchone()[0]
    bodies = [a.body() for a in answers if a.status != 304]
    assert len(bodies) > 20, len(bodies)
    for body in bodies:
        assert token.encode() not in body and secret.encode() not in body
    assert proc.poll() is None, "the swarm ended before the checks"


def _step(page) -> int | None:
    text = page.inner_text("#run-state")
    if not text.startswith("step "):
        return None
    head = text.split()[1].split("/")[0]
    return int(head) if head.isdigit() else None


def test_dashboard_shows_the_cheater_ejected(swarm, browser, tmp_path):
    url, run, token, proc = swarm
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(url + "/dashboard")

    def ejected():
        nodes = httpx.get(url + "/v1/ledger").json()["nodes"]
        return next((n for n in nodes if n["state"] == "ejected"), None)

    cheater = wait_for(ejected, 180, "the cheater's ejection", proc)
    events = _wait(page, "the ejection event", lambda: [
        r for r in _rows(page, "events") if r[2] == "ejected" and r[1] == cheater["key"][:12]])  # fmt: skip
    assert events
    nodes = {r[0]: r for r in _rows(page, "nodes")}
    assert nodes[cheater["key"][:12]][2] == "ejected"
    rejected = [r for r in _rows(page, "verdicts") if r[4] == "rejected"]
    assert rejected and rejected[0][1] == cheater["key"][:12] and rejected[0][5]
    # the timeline marks it
    assert page.locator("#timeline svg text", has_text="ejected").count() >= 1
    page.locator("#verification").scroll_into_view_if_needed()
    _shot(page, tmp_path, "dashboard-cheater.png")


def test_public_answers_hold_no_secret(swarm):
    """Every public answer of the run (the page, its assets, the dashboard API, the ledger)
    is scanned for the run's secrets: the operator token, the URL-signing secret, a signed
    URL; and the operator's routes refuse a caller without the token."""
    import sqlite3

    url, run, token, proc = swarm
    wait_for(lambda: read_metrics(run), 120, "a trained step", proc)
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    secret = db.execute("SELECT v FROM meta WHERE k = 'url_secret'").fetchone()[0]
    files = httpx.get(url + "/v1/dashboard/files").json()
    paths = ["/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css",
             "/v1/dashboard/run", "/v1/dashboard/swarm", "/v1/dashboard/verdicts",
             "/v1/dashboard/files", "/v1/ledger", "/v1/run", "/health"]  # fmt: skip
    for p in paths:
        body = httpx.get(url + p).text
        assert token not in body and secret not in body and "sig=" not in body, p
    key = files["files"][0]["key"]
    assert httpx.get(url + "/v1/dashboard/files/" + key).status_code == 401
    bad = {"Authorization": "Bearer " + "x" * 43}
    assert httpx.get(url + "/v1/dashboard/files/" + key, headers=bad).status_code == 401
    ok = httpx.get(url + "/v1/dashboard/files/" + key, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.json()["samples"]
    assert token not in ok.text and secret not in ok.text
    assert httpx.post(url + "/v1/admin/evaluations", json={}).status_code == 401
    assert httpx.post(url + "/v1/admin/nodes/" + "0" * 64 + "/ban").status_code == 401
    assert httpx.get(url + "/v1/admin/nodes").status_code == 401


def test_trackers_hold_the_metrics_rows(swarm):
    """TensorBoard's event files (read back with TensorBoard's own reader) and the W&B
    offline run hold each step's figures as metrics.jsonl has them, under its names.
    Last in the module: it ends the swarm."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    url, run, token, proc = swarm
    wait_for(lambda: len(read_metrics(run)) >= 3, 180, "three trained steps", proc)
    rows = {r["step"]: r for r in read_metrics(run)}
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for name in ("reward", "loss", "staleness", "signal_fraction", "level"):
        assert name in tags, name
        got = {e.step: e.value for e in acc.Scalars(name)}
        for step, value in got.items():
            assert value == pytest.approx(float(rows[step][name]), rel=1e-6), (name, step)
        assert got
    assert any(t.startswith("node/") and t.endswith("/accepted") for t in tags)
    # W&B offline: a run directory whose history records carry the same rows, complete
    # once the trainer closes it: the operator stops the run (the dashboard's admin route)
    from tests.unit.test_tracking import wandb_history

    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.post(url + "/v1/admin/run", json={"stopped": True}, headers=auth).is_success
    assert proc.wait(timeout=180) == 0
    # the starting policy's held-out score, taken once the swarm is done, at step 0
    start = json.loads((run / "eval.json").read_text())["start_model"]["accuracy"]
    acc.Reload()
    assert [e.value for e in acc.Scalars("heldout/start_model/accuracy")] == [pytest.approx(start)]
    rows = {r["step"]: r for r in read_metrics(run)}
    history = wandb_history(run / "wandb")
    logged = {int(h["_step"]): h for h in history if "reward" in h}
    assert logged
    for step, h in logged.items():
        if step in rows:
            assert float(h["reward"]) == pytest.approx(rows[step]["reward"], rel=1e-6)

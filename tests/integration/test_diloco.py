"""DiLoCo across local sites on loopback: torchft quorums, live recovery, 8-bit syncs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from swarmrl.launch.supervisor import free_port
from tests.integration.conftest import wait_for

FAST = ["diloco.inner_steps=20", "diloco.heartbeat_timeout_s=2", "corpus.lines=4000"]


def _rows(run: Path, site: int) -> list[dict]:
    path = run / f"metrics-site{site}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _processes():
    """(pid, argv as bytes) of every process we can read."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                yield int(pid), Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue


def _site_pid(runs: Path, site: int) -> int | None:
    for pid, argv in _processes():
        if (
            b"diloco-site" in argv
            and str(site).encode() == argv[argv.index(b"--site") + 1]
            and any(str(runs).encode() in a for a in argv)
        ):
            return pid
    return None


def _agree(run: Path, sites: list[int]) -> None:
    """The global weights are bit-identical: every site scores them the same."""
    by_step: dict[int, set[float]] = {}
    for s in sites:
        for r in _rows(run, s):
            by_step.setdefault(r["outer_step"], set()).add(r["eval_loss"])
    assert by_step and all(len(v) == 1 for v in by_step.values()), by_step


@pytest.mark.slow  # 35 s; the RL site-kill test covers the same path (also slow), the
# allreduce death and asynchronous-checkpoint resume tests stay in the default run
def test_site_killed_others_go_on_and_restarted_site_recovers(tmp_path):
    """SIGKILL one of three sites mid-run: the other two commit outer steps without it;
    the launcher restarts it, it takes the global state from a live peer, contributes
    again, and every site ends with the same weights; held-out loss falls."""
    runs = tmp_path / "runs"
    run = runs / "diloco"
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmrl", "diloco", f"runs_dir={json.dumps(str(runs))}",
         "sites=3", "outer_steps=30", *FAST],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: len(_rows(run, 1)) >= 3, 180, "three outer steps at site 1", proc)
        os.kill(wait_for(lambda: _site_pid(runs, 1), 10, "site 1's pid"), signal.SIGKILL)
        killed_at = _rows(run, 0)[-1]["outer_step"]
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    assert "site-1 exited with code -9" in out and "site-1: restarting" in out
    without = [r for r in _rows(run, 0) if r["outer_step"] > killed_at and r["sites"] == 2]
    assert without, "no outer step was committed by the two surviving sites"
    back = [r for r in _rows(run, 1) if r["outer_step"] > killed_at]
    assert back and back[0]["healed"] and not back[0]["contributed"], back[:2]
    assert any(r["contributed"] and r["contributors"] == 3 for r in back[1:]), back
    _agree(run, [0, 1, 2])
    losses = [r["eval_loss"] for r in _rows(run, 0)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert (run / "loss.png").exists()
    assert "recovered from a live peer" in (run / "logs" / "site-1.log").read_text()


def test_site_dying_inside_the_allreduce(tmp_path):
    """A site exits between the two collectives of the 8-bit all-reduce. The survivors'
    sync fails, nothing is committed anywhere, and the same pseudo-gradients are
    synchronised again in a new quorum without it; the run then completes."""
    runs = tmp_path / "runs"
    run = runs / "diloco"
    (run / "logs").mkdir(parents=True)
    port = free_port()
    lighthouse = f"http://127.0.0.1:{port}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "swarmrl.diloco.lighthouse",
                "--bind",
                f"127.0.0.1:{port}",
                "--heartbeat-timeout-s",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
    ]
    cfg = [f"runs_dir={json.dumps(str(runs))}", "sites=3", "outer_steps=6", *FAST]
    logs = [open(run / "logs" / f"site-{k}.log", "w") for k in range(3)]
    for k in range(3):
        fail = ["--fail-in-sync", "3"] if k == 2 else []
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "swarmrl",
                    "diloco-site",
                    "--site",
                    str(k),
                    "--lighthouse",
                    lighthouse,
                    *fail,
                    *cfg,
                ],
                stdout=logs[k],
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
    try:
        codes = [p.wait(timeout=300) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in logs:
            f.close()
    assert codes == [0, 0, 17], codes
    survivors = (run / "logs" / "site-0.log").read_text() + (
        run / "logs" / "site-1.log"
    ).read_text()
    assert "sync not committed" in survivors
    step3 = next(r for r in _rows(run, 0) if r["outer_step"] == 3)
    assert step3["sites"] == 2 and step3["contributors"] == 2, step3
    assert [r["outer_step"] for r in _rows(run, 0)][-1] == 6
    _agree(run, [0, 1])


def test_resume_from_asynchronous_checkpoints(tmp_path):
    """Two sites checkpoint in the background; a second `swarmrl diloco --resume` goes on
    from the newest complete checkpoint (an unfinished copy is ignored) with the same
    global weights, and trains on."""
    runs = tmp_path / "runs"
    run = runs / "diloco"
    base = [sys.executable, "-m", "swarmrl", "diloco", f"runs_dir={json.dumps(str(runs))}",
            "sites=2", "checkpoint_every=2", *FAST]  # fmt: skip
    first = subprocess.run(base + ["outer_steps=4"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    for k in (0, 1):
        names = sorted(p.name for p in (run / "checkpoints" / f"site{k}").glob("outer-*.pt"))
        assert names == ["outer-2.pt", "outer-4.pt"], names
    n_first = [len(_rows(run, k)) for k in (0, 1)]
    (run / "checkpoints" / "site0" / "outer-9.pt.tmp").write_bytes(b"a copy cut short")
    again = subprocess.run(base + ["outer_steps=6"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr
    second = subprocess.run(
        base + ["outer_steps=6", "--resume"], capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr[-2000:]
    # The first quorum after the restart has no pseudo-gradients: its sites record outer
    # step 4 again, and _agree checks they score the same weights as before the restart
    # (a site that starts late joins a later quorum, healed from a peer).
    resumed = [r for k in (0, 1) for r in _rows(run, k)[n_first[k] :]]
    assert any(r["outer_step"] == 4 and r["contributors"] == 0 for r in resumed), resumed
    assert max(r["outer_step"] for r in resumed) == 6
    for k in (0, 1):
        assert "outer-4.pt (outer step 4)" in (run / "logs" / f"site-{k}.log").read_text()
    _agree(run, [0, 1])


@pytest.mark.slow  # 44 s (moved out of the default run when the vLLM tests came in)
def test_lighthouse_killed_run_recovers_from_checkpoints(tmp_path):
    """SIGKILL the lighthouse mid-run: the launcher restarts it on its port; the quorum
    requests in flight time out (diloco.quorum_timeout_s), the sites exit, and the
    launcher restarts them from their newest checkpoints, so the run still finishes
    with the global state it had at that checkpoint."""
    runs = tmp_path / "runs"
    run = runs / "diloco"
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmrl", "diloco", f"runs_dir={json.dumps(str(runs))}",
         "sites=2", "outer_steps=16", "checkpoint_every=4", "diloco.quorum_timeout_s=20", *FAST],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (run / "checkpoints" / "site0" / "outer-4.pt").exists(), 180,
                 "the checkpoint of outer step 4", proc)  # fmt: skip
        lighthouse = wait_for(lambda: _pid_with(b"swarmrl.diloco.lighthouse", runs), 10, "pid")
        os.kill(lighthouse, signal.SIGKILL)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    assert "the lighthouse exited (-9); restarting it" in out
    assert "restarting (from its newest checkpoint" in out
    logs = "".join((run / "logs" / f"site-{k}.log").read_text() for k in (0, 1))
    assert "resumed from" in logs
    assert max(r["outer_step"] for r in _rows(run, 0)) == 16
    _agree(run, [0, 1])


def _pid_with(marker: bytes, runs: Path) -> int | None:
    """The lighthouse of this test's run: the process beside site 0 (same parent, the
    launcher) whose argv holds `marker`."""
    site0 = _site_pid(runs, 0)
    if site0 is None:
        return None
    launcher = int(Path(f"/proc/{site0}/stat").read_text().split()[3])
    for pid, argv in _processes():
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().split()[3])
        except (OSError, ValueError):
            continue
        if any(marker in a for a in argv) and parent == launcher:
            return pid
    return None


def _site_rows(run: Path, k: int) -> list[dict]:
    path = run / f"site-{k}" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _published(run: Path, k: int, version: int) -> dict:
    from safetensors.torch import load_file

    return load_file(run / f"site-{k}" / "weights" / f"step_{version:06d}" / "model.safetensors")


def _same(a: dict, b: dict) -> bool:
    import torch

    return all(torch.equal(a[n], b[n]) for n in a)


def _two_rl_sites(tmp_path: Path, model: Path, steps: int, resume: bool = False):
    from tests.integration.conftest import swarm_cmd

    cmd = swarm_cmd(tmp_path, model, "name=dl", f"trainer.steps={steps}",
                    "trainer.diloco.sites=2", "trainer.diloco.inner_steps=3",
                    "launcher.workers=1", "shardcast.relays=0", "validator.enabled=false",
                    "launcher.eval_problems=0", resume=False)  # fmt: skip
    res = subprocess.run(cmd + (["--resume"] if resume else []), capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp_path / "runs" / "dl", res


@pytest.mark.slow  # 28 s; DiLoCo itself: the integration tests above and tests/unit/test_diloco_*
def test_rl_sites_sync_their_policies(tiny_model, tmp_path):
    """`swarmrl rl` with trainer.diloco.sites = 2: two swarms (own orchestrator, trainer,
    worker) on the tiny model whose trainers sync every 3 steps through the lighthouse.
    Both sites train every step, both contribute to each sync, and the version published
    after a sync is the same global policy, bit for bit, on both; between syncs they differ."""
    run, res = _two_rl_sites(tmp_path, tiny_model, 6)
    for k in (0, 1):
        rows = _site_rows(run, k)
        assert [r["step"] for r in rows] == list(range(1, 7))
        synced = [(r["step"], r["sync_contributors"], r["outer_step"]) for r in rows if r["synced"]]
        assert synced == [(3, 2, 1), (6, 2, 2)], synced
        assert rows[-1]["sync_bytes_total"] > 0
    assert _same(_published(run, 0, 6), _published(run, 1, 6))  # the global policy
    assert not _same(_published(run, 0, 5), _published(run, 1, 5))  # each site's own steps
    assert (run / "reward.png").stat().st_size > 10_000
    assert "site 1: 6 steps, 2 outer steps" in res.stdout


@pytest.mark.slow  # 100 s
def test_rl_sites_resume_keeps_the_outer_state(tiny_model, tmp_path):
    """Extended with --resume, the outer state comes back from trainer_state/diloco.pt
    (outer step 3 next, not 1) and the two sites sync again at step 9."""
    run, _ = _two_rl_sites(tmp_path, tiny_model, 6)
    run, _ = _two_rl_sites(tmp_path, tiny_model, 9, resume=True)
    for k in (0, 1):
        rows = _site_rows(run, k)
        assert [r["step"] for r in rows] == list(range(1, 10))
        last = rows[-1]
        assert (last["synced"], last["sync_contributors"], last["outer_step"]) == (True, 2, 3)
    assert _same(_published(run, 0, 9), _published(run, 1, 9))


@pytest.mark.slow  # 2-3 minutes
def test_rl_site_killed_others_go_on_and_it_rejoins(tiny_model, tmp_path):
    """SIGKILL site 1's trainer mid-run: site 0 syncs without it; the launcher restarts
    site 1 with --resume, its trainer is healed from site 0 and contributes again."""
    from tests.integration.conftest import swarm_cmd

    run = tmp_path / "runs" / "dl"
    # 45 steps: site 0 is still training when site 1 has restarted (about 20 s)
    cmd = swarm_cmd(tmp_path, tiny_model, "name=dl", "trainer.steps=45",
                    "trainer.diloco.sites=2", "trainer.diloco.inner_steps=3",
                    "trainer.diloco.heartbeat_timeout_s=2", "launcher.workers=1",
                    "shardcast.relays=0", "validator.enabled=false",
                    "launcher.eval_problems=0")  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def site_rows(k: int) -> list[dict]:
        return _site_rows(run, k) if (run / f"site-{k}" / "metrics.jsonl").exists() else []

    try:
        wait_for(lambda: len(site_rows(1)) >= 4, 300, "4 steps at site 1", proc)
        marker = b"name=site-1"
        pid = wait_for(lambda: _trainer_pid(marker, run), 10, "site 1's trainer")
        os.kill(pid, signal.SIGKILL)
        killed_at = len(site_rows(0))
        outer_then = site_rows(0)[-1]["outer_step"]
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    assert "site-1 exited with code 1" in out and "site-1: restarting" in out
    alone = [r for r in site_rows(0)[killed_at:] if r["synced"] and r["sync_sites"] == 1]
    assert alone, "site 0 did not sync on without site 1"
    log = (run / "site-1" / "logs" / "trainer.log").read_text()
    assert "recovered the global policy from a live peer" in log
    for k in (0, 1):
        assert [r["step"] for r in site_rows(k)] == list(range(1, 46))
    both = [r["outer_step"] for r in site_rows(1) if r["synced"] and r["sync_contributors"] == 2]
    assert any(o > outer_then + 1 for o in both), (outer_then, both)  # contributing again


def _trainer_pid(marker: bytes, runs: Path) -> int | None:
    """A trainer of this test's run whose argv holds `marker`."""
    for pid, argv in _processes():
        if b"trainer" in argv and marker in argv and any(str(runs).encode() in a for a in argv):
            return pid
    return None

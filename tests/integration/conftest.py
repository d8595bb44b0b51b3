"""Integration fixtures: the warm-started tiny model (cached like `make run`'s) and a swarm runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "tiny-reverse_text"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The same cached model `make run` uses, built the same way on first use (1-3 minutes)."""
    if not (TINY / "warm_start.json").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "swarmrl",
                "init-model",
                "--task",
                "reverse_text",
                "--out",
                str(TINY),
                "--config",
                str(ROOT / "configs" / "tiny.toml"),
            ],
            check=True,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    return TINY


def swarm_cmd(tmp_path: Path, model: Path, *overrides: str, resume: bool = False) -> list[str]:
    return [
        sys.executable,
        "-m",
        "swarmrl",
        "rl",
        "--config",
        str(ROOT / "configs" / "tiny.toml"),
        *(["--resume"] if resume else []),
        f"runs_dir={json.dumps(str(tmp_path / 'runs'))}",
        f"model.path={json.dumps(str(model))}",
        *overrides,
    ]


def read_metrics(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"swarm exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_of(run_dir: Path, role_arg: str) -> int | None:
    """PID of a swarm child process whose command line contains role_arg and this run's dir."""
    from bench.benchproc import find_pid

    return find_pid(role_arg, str(run_dir.parent))


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def at(url: str) -> list[str]:
    """Overrides that put the run's orchestrator at `url` (a loopback port)."""
    return [f"orchestrator.url={json.dumps(url)}", f"orchestrator.port={url.rsplit(':', 1)[1]}"]

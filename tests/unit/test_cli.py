"""The CLI's error paths: clear messages, non-zero exit, nothing started."""

import subprocess
import sys
import time


def _run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "swarmrl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_help_is_fast():
    t0 = time.time()
    res = _run("--help")
    assert res.returncode == 0 and "rl" in res.stdout
    assert (
        time.time() - t0 < 5
    )  # generous: no torch import on --help (timing is not asserted tightly)


def test_bad_config_is_named(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[trainer]\nstepz = 3\n")
    res = _run("rl", "--config", str(f))
    assert res.returncode == 2
    assert "unknown key 'trainer.stepz'" in res.stderr


def test_missing_model_is_named(tmp_path):
    res = _run("rl", f"runs_dir={tmp_path}", f"model.path={tmp_path / 'nope'}")
    assert res.returncode == 2
    assert "does not exist" in res.stderr and "Traceback" not in res.stderr


def test_existing_run_needs_resume_or_fresh(tmp_path, random_model_dir):
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    res = _run("rl", f"runs_dir={tmp_path}", f"model.path={random_model_dir}")
    assert res.returncode == 2
    assert "already exists: pass --resume" in res.stderr
    assert (run / "metrics.jsonl").exists()  # nothing deleted


def test_eval_reports_how_the_model_follows_a_budget(random_model_dir):
    import json

    res = _run("eval", "--model", str(random_model_dir), "--n", "6", "--threads", "1",
               "--target-length", "20", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    b = out["budget"]
    assert b["target"] == 20 and 0 <= b["within_25pct"] <= 1
    lengths = [s["tokens"] for s in out["samples"]]  # the first five
    assert all(0 <= k <= 40 for k in lengths)  # max new tokens: 2T
    assert out["samples"][0]["prompt"].endswith("Think for 20 tokens before giving a response.")
    assert b["hit_limit"] >= sum(k >= 40 for k in lengths) / 6


def test_bad_eval_task_is_named():
    for args, named in ((("--task", "bogus"), "name:"), (("--digits", "99"), "digits:")):
        res = _run("eval", "--model", "unused", *args)
        assert res.returncode == 2, res.stderr
        assert named in res.stderr and "Traceback" not in res.stderr

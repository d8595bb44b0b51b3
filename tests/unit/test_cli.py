"""The CLI's error paths: clear messages, non-zero exit, nothing started."""

import json
import subprocess
import sys
import time
from pathlib import Path


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


def test_fresh_and_resume_refuse_each_other():
    for command in ("rl", "diloco"):
        res = _run(command, "--fresh", "--resume")
        assert res.returncode == 2
        assert "--resume: not allowed with argument --fresh" in res.stderr


def test_help_hides_the_test_flags_that_still_work():
    from swarmrl.cli import _parser

    hidden = {"rl": ["--cheaters", "--cheats"], "worker": ["--cheat"],
              "diloco-site": ["--fail-in-sync"]}  # fmt: skip
    for command, flags in hidden.items():
        res = _run(command, "--help")
        assert res.returncode == 0 and res.stdout.startswith("usage:")
        assert not [f for f in flags if f in res.stdout], (command, res.stdout)
    args = _parser().parse_args(["rl", "--cheaters", "1", "--cheats", "other-model"])
    assert args.cheaters == 1 and args.cheats == "other-model"
    args = _parser().parse_args(["worker", "--orchestrator", "http://x", "--cheat", "k"])
    assert args.cheat == "k"


def test_version():
    import swarmrl

    res = _run("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"swarmrl {swarmrl.__version__}"


def test_a_flag_that_names_a_setting_is_its_override():
    import pytest

    from swarmrl.cli import _parser, setting_overrides
    from swarmrl.errors import UserError

    def overrides(*argv):
        return setting_overrides(_parser().parse_args(list(argv)))

    assert overrides("init-model", "--out", "m", "--seed", "3", "--task", "addition") == [
        'task.name="addition"',
        "seed=3",
    ]
    assert overrides("init-model", "--out", "m", "seed=3", "--seed", "3")[-1] == "seed=3"
    assert overrides("eval", "--model", "m", "--digits", "2") == ["task.digits=2"]
    assert overrides("init-model", "--out", "m", "seed=4") == ["seed=4"]  # no default flag
    with pytest.raises(UserError, match="--seed 3 and seed=4 disagree"):
        overrides("init-model", "--out", "m", "--seed", "3", "seed=4")
    with pytest.raises(UserError, match="--task addition and task.name=reverse_text disagree"):
        overrides("eval", "--model", "m", "--task", "addition", "task.name=reverse_text")


def test_init_model_reads_its_task_from_the_config(tmp_path, capsys):
    from swarmrl.cli import main

    assert main(["init-model", "--out", str(tmp_path / "m"), "task.name=multiplication"]) == 2
    assert "not task.name = 'multiplication': pass --task" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_the_commands_are_calls_into_the_api(monkeypatch, capsys):
    from swarmrl import api
    from swarmrl.cli import main

    calls = []
    result = api.SwarmResult(3, Path("runs/x"))
    monkeypatch.setattr(api, "run_swarm", lambda *a, **k: calls.append(("rl", a, k)) or result)
    monkeypatch.setattr(api, "evaluate", lambda *a, **k: calls.append(("eval", a, k)) or {"n": 1})
    monkeypatch.setattr(api, "join", lambda *a, **k: calls.append(("worker", a, k)))
    assert main(["rl", "--config", "c.toml", "seed=1", "--fresh", "--cheaters", "2",
                 "--cheats", "a,b"]) == 3  # fmt: skip
    assert calls[-1] == ("rl", ("c.toml", ["seed=1"]),
                         {"fresh": True, "resume": False, "cheaters": 2, "cheats": ["a", "b"]})  # fmt: skip
    assert main(["eval", "--model", "m", "--n", "5", "--digits", "2", "--json"]) == 0
    name, args, kw = calls[-1]
    assert (name, args) == ("eval", ("m", None, ["task.digits=2"])) and kw["n"] == 5
    assert json.loads(capsys.readouterr().out) == {"n": 1}
    assert main(["worker", "--orchestrator", "http://o", "--home", "h", "--cheat", "k"]) == 0
    name, args, kw = calls[-1]
    assert (name, args, kw["cheat"], kw["threads"]) == ("worker", ("http://o", "h"), "k", 1)

"""`swarmrl filter`: solve rates, the kept range, errors, and a killed run resumed."""

import json
import signal
import subprocess
import sys
import time

import pytest

from swarmrl.apps.filter import FilterError, run_filter


def _tasks(path, n):
    rows = [{"problem_id": f"t{i}", "prompt": f"Reverse the text: abc{i}", "task_type": "reverse_text",
             "verification_info": {"answer": f"{i}cba"}} for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_kept_range_and_the_recorded_rates(random_model_dir, tmp_path):
    data = _tasks(tmp_path / "in.jsonl", 4)
    kw = dict(samples=2, max_new_tokens=6, threads=1, show_progress=False)
    res = run_filter(str(random_model_dir), data, tmp_path / "none.jsonl", min_solve_rate=0.5, **kw)
    assert res["kept"] == 0 and res["sampled_now"] == 4  # an untrained model solves nothing
    res = run_filter(str(random_model_dir), data, tmp_path / "all.jsonl", max_solve_rate=0.0, **kw)
    kept = _lines(tmp_path / "all.jsonl")
    assert res["kept"] == 4 and [r["metadata"]["solve_rate"] for r in kept] == [0.0] * 4
    again = run_filter(
        str(random_model_dir), data, tmp_path / "all.jsonl", max_solve_rate=0.0, **kw
    )
    assert again["sampled_now"] == 0 and len(_lines(tmp_path / "all.jsonl")) == 4


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"min_solve_rate": 0.8, "max_solve_rate": 0.5}, "--min-solve-rate"),
        ({"samples": 0}, "--samples"),
        ({"out_name": "out.parquet"}, "JSONL task file"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kw, says):
    data = _tasks(tmp_path / "in.jsonl", 2)
    out = tmp_path / kw.pop("out_name", "out.jsonl")
    with pytest.raises(FilterError, match=says):
        run_filter("unused", data, out, **kw)


def test_duplicate_ids_and_bad_files_are_refused(tmp_path):
    data = tmp_path / "dup.jsonl"
    row = {
        "problem_id": "same",
        "prompt": "p",
        "task_type": "addition",
        "verification_info": {"answer": "1"},
    }
    data.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(FilterError, match="'same' appears more than once"):
        run_filter("unused", data, tmp_path / "o.jsonl")
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(FilterError, match="broken.jsonl line 1"):
        run_filter("unused", tmp_path / "broken.jsonl", tmp_path / "o.jsonl")


def test_a_killed_run_continues_where_it_stopped(random_model_dir, tmp_path):
    data = _tasks(tmp_path / "in.jsonl", 40)
    out = tmp_path / "kept.jsonl"
    progress = tmp_path / "kept.jsonl.progress.jsonl"
    cmd = [sys.executable, "-m", "swarmrl", "filter", "--model", str(random_model_dir),
           "--data", str(data), "--out", str(out), "--samples", "2", "--max-new-tokens", "6",
           "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and (
        not progress.exists() or len(progress.read_text().splitlines()) < 3
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = len(_lines(progress))
    assert 3 <= first < 40, "the run was not stopped part-way"
    with open(progress, "a") as f:
        f.write('{"problem_id": "t3')  # a torn line, as a kill mid-write leaves it
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["sampled_now"] == 40 - first
    ids = [r["problem_id"] for r in _lines(progress)]
    assert sorted(ids) == sorted(f"t{i}" for i in range(40))  # each task once
    assert [r["problem_id"] for r in _lines(out)] == ids  # kept (all: solve rate 0 <= 0.75)

"""The launcher's held-out check: what the run taught, measured as a person would.

Greedy decoding, exact answers (task reward 1.0), on the same
`launcher.eval_problems` problems of the eval split (its own seed stream, never
drawn for training) at the run's starting difficulty. The starting policy and
the final one are scored after the swarm ends (so the check neither delays the
first trainer step nor takes cores from the swarm), each with a progress bar;
both go to runs/<name>/eval.json, and a resumed run reuses the starting score.
With a curriculum the final policy is also scored at the highest level it
reached. Sampled reward, which the progress line shows,
rewards sharpening toward the greedy answer by construction; this does not.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.launch.report import read_metrics, write_report


def applies(cfg: RunConfig) -> bool:
    return bool(cfg.launcher.eval_problems) and not cfg.task.dataset


def _score(cfg: RunConfig, model: str, what: str, level: int) -> dict:
    from tqdm import tqdm

    from swarmrl.apps.evaluate import evaluate
    from swarmrl.envs.environment import environment_of

    n = cfg.launcher.eval_problems
    with tqdm(total=n, desc=f"swarmrl: held-out check of the {what}", unit="problem",
              file=sys.stdout, leave=False, disable=False) as bar:  # fmt: skip
        res = evaluate(model, cfg.task, n, cfg.sampling.max_new_tokens, level=level,
                       threads=2, on_batch=bar.update, env=environment_of(cfg))  # fmt: skip
    res.pop("samples", None)
    return res


def _what(cfg: RunConfig, level: int) -> str:
    from swarmrl.tasks.sources.generated import describe_level

    return f"{cfg.launcher.eval_problems} held-out {describe_level(cfg.task, level)}"


def before(cfg: RunConfig, run: Path, url: str | None = None) -> None:
    """Score the starting policy (unless eval.json already holds it), print it, and give
    it to the dashboard at `url` and the trackers."""
    if not applies(cfg):
        return
    path = run / "eval.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    level = cfg.curriculum.start_level
    if "start_model" not in res:
        res["start_model"] = _score(cfg, cfg.model.path, "starting policy", level)
        path.write_text(json.dumps(res, indent=2) + "\n")
        share(cfg, run, url, ("start_model",))
    a = res["start_model"]
    print(
        f"swarmrl: starting policy on {_what(cfg, level)}, greedy: exact {a['accuracy']:.3f} "
        f"({a['seconds']:.0f}s)",
        flush=True,
    )


def after(cfg: RunConfig, run: Path, url: str | None = None) -> list[str]:
    """Score the final policy; the summary's lines, before against after."""
    path, final = run / "eval.json", run / "final"
    rows = read_metrics(run / "metrics.jsonl")
    if not applies(cfg) or not rows or not final.exists() or not path.exists():
        return []
    res = json.loads(path.read_text())
    start, top = cfg.curriculum.start_level, max(r.get("level", 0) for r in rows)
    res["final_model"] = _score(cfg, str(final), "final policy", start)
    if top != start:
        res["final_model_top_level"] = _score(cfg, str(final), "final policy", top)
    path.write_text(json.dumps(res, indent=2) + "\n")
    share(cfg, run, url, ("final_model", "final_model_top_level"))
    write_report(run / "metrics.jsonl", run / "report.png")  # with the held-out points
    a, b = res["start_model"], res["final_model"]
    out = [
        f"held-out accuracy on {_what(cfg, start)} (greedy, exact answers): "
        f"start {a['accuracy']:.3f} -> final {b['accuracy']:.3f} "
        f"({100 * (b['accuracy'] - a['accuracy']):+.1f} points)"
    ]
    if top != start:
        c = res["final_model_top_level"]
        out.append(f"final policy on {_what(cfg, top)}: exact {c['accuracy']:.3f}")
    return out


def share(cfg: RunConfig, run: Path, url: str | None, names: tuple[str, ...]) -> None:
    """eval.json's `names` to the orchestrator's dashboard (operator route) and to the
    trackers, at the policy version each scored (0 for the start, the last step after).
    A dashboard that cannot take them loses a view, not the run."""
    import httpx

    from swarmrl.errors import ConfigError
    from swarmrl.orchestrator.server import operator_token
    from swarmrl.tracking import Tracker, heldout_scalars

    path = run / "eval.json"
    if not path.exists():
        return
    res = {k: v for k, v in json.loads(path.read_text()).items() if k in names}
    if not res:
        return
    rows = read_metrics(run / "metrics.jsonl")
    last = rows[-1]["step"] if rows else 0
    steps = {k: 0 if k == "start_model" else last for k in res}
    if url:
        auth = {"Authorization": f"Bearer {operator_token(cfg)}"}
        for name, scores in res.items():
            body = {"name": name, "step": steps[name], "result": _flat(scores)}
            try:
                r = httpx.post(url + "/v1/admin/evaluations", json=body, headers=auth,
                               timeout=10.0)  # fmt: skip
                r.raise_for_status()
            except httpx.HTTPError as e:
                print(f"swarmrl: the dashboard did not take the {name} score: {e}", flush=True)
    try:  # a tracker that cannot start stops the trainer too, which says why
        tracker = Tracker(cfg, "launcher")
    except ConfigError as e:
        print(f"swarmrl: no tracker for the held-out scores: {e}", flush=True)
        return
    try:
        for name in res:
            tracker.log(heldout_scalars({name: res[name]}), steps[name])
    finally:
        tracker.close()


def _flat(scores: dict) -> dict:
    """The figures of one score that the orchestrator takes (numbers and short text)."""
    return {
        k: v
        for k, v in scores.items()
        if isinstance(v, bool | int)
        or (isinstance(v, float) and math.isfinite(v))
        or (isinstance(v, str) and len(v) <= 200)
    }

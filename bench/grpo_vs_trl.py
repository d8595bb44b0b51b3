"""swarmrl vs TRL's GRPOTrainer, each to the same held-out accuracy on the default task.

    .venv/bin/python bench/grpo_vs_trl.py [--config configs/default.toml] [--target 0.4]
        [--snapshot-every 2] [--eval-problems 200] [--max-seconds 900] [--max-steps 14]
        [--systems trl,swarmrl] [--trl-threads 2] [--seeds 0,1] [--trl-lr LR]
        [--trl-from EARLIER.json]

The task is `make run`'s: SmolLM2-135M-Instruct (the same GGUF file for both) learning
2-digit addition on this CPU. What counts is what a researcher would check: greedy
decoding, exact answers, on `--eval-problems` held-out problems of the eval split at
the run's fixed difficulty (swarmrl.apps.evaluate, as `make run`'s before/after
check). The starting model is scored once; each system's policy is saved every
`--snapshot-every` optimizer steps and scored after its run, in order, until one
reaches `--target` (and the last one, for the final accuracy). Both systems train
`--max-steps` steps (`make run`'s budget, 14), the same samples.

Per seed, the two figures the comparison is judged by:
- `speedup_to_target`: TRL's seconds to `--target` over swarmrl's, both from the
  command's start (imports, model loads and start-up included); above 1, swarmrl
  is sooner. None when either system did not reach it.
- `accuracy_at_equal_time`: at T, the earlier of the two systems' last snapshots
  in wall time, each system's held-out accuracy of its newest snapshot taken by T.

`--trl-from` reuses the TRL runs of an earlier output of this bench (TRL's side
unchanged, only swarmrl re-run): its snapshots are gone, so at T it gives TRL's
newest *scored* snapshot taken by T, marked `newest_scored_by_t`.

Systems, run one after another on the same machine:
- trl: GRPOTrainer in this process with --trl-threads threads, generating with
  model.generate. Snapshots are written in a step-end callback whose time is taken
  off TRL's clock.
- swarmrl: `python -m swarmrl rl` with the config (orchestrator, trainer, relay,
  validator checking `validator.sample_rate` of the files, workers: each its own
  process). Snapshots are hard links to the weights the trainer publishes anyway.
- swarmrl-unvalidated (only when asked for): the same with validator.enabled = false.

Shared settings come from the swarmrl config: model, task and prompts (the chat
template, one user turn), group size G, batch_groups B (TRL: B·G completions per
step), max_new_tokens, temperature, top_p, lr (TRL's own with `--trl-lr`: at the same
lr TRL's update is smaller, since it averages over groups without signal too), AdamW
betas and weight decay, grad clip, ε, δ, KL coefficient, seed. TRL also gets a constant lr, plain AdamW, no
activation checkpointing, one optimizer step per generation batch, scale_rewards =
"group" and loss_type = "dr_grpo" (token losses summed and divided by
B·G·max_new_tokens: swarmrl's "grpo" loss and its constant token budget).

Reported per system: wall-clock to target, from the system's start (imports and model
loads included) and from its first step (training alone); steps and samples to
target (trained: B·G a step for both; generated: swarmrl also samples groups it drops
for carrying no signal); held-out accuracy at each scored snapshot; update tokens/s
(prompt + completion tokens trained on / seconds in the update: swarmrl's train_s,
TRL's step time less generation and scoring). Ratios are TRL over swarmrl for
times (above 1: swarmrl faster) and swarmrl over TRL for rates.

Design differences under test, not settings: swarmrl runs trainer and each worker
as single-thread processes sharing the cores, overlaps generation with training,
trains on exactly B groups with signal from policies up to `async_level` versions
old (corrected by importance weights against the worker's log-probs), and checks
rollouts; TRL generates and trains in turn on the current policy, zero-advantage
groups included. One JSON object goes to stdout and bench/results/grpo_vs_trl.json;
progress goes to stderr. Timings on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("trl", "swarmrl", "swarmrl-unvalidated")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def rnd(x, n=4):
    return None if x is None else round(x, n)


def score(cfg, args, model: str) -> dict:
    """Held-out greedy exact accuracy of the model directory `model` (or the config's)."""
    from swarmrl.apps.evaluate import evaluate

    res = evaluate(
        model, cfg.task, args.eval_problems, cfg.sampling.max_new_tokens,
        level=cfg.curriculum.start_level, threads=args.eval_threads,
    )  # fmt: skip
    return {"accuracy": res["accuracy"], "seconds": round(res["seconds"], 1)}


def run_trl(cfg, args, snaps: Path) -> dict:
    """GRPOTrainer for up to --max-steps / --max-seconds; a snapshot every K steps."""
    t0 = time.time()  # before the heavy imports: swarmrl's clock includes its processes' own
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from swarmrl.models.loading import load_model, load_tokenizer
    from swarmrl.tasks.graders.registry import verify
    from swarmrl.tasks.sources.task_source import TaskSource

    torch.set_num_threads(args.trl_threads)
    tc, G, B = cfg.trainer, cfg.worker.group_size, cfg.trainer.batch_groups
    tok = load_tokenizer(cfg.model.path)
    source = TaskSource(cfg.task, cfg.seed)
    n = (args.max_steps + 1) * B
    prompts = [source.get("train", i).prompt for i in range(n)]
    if tok.chat_template:  # the prompt format of swarmrl.models.prompting.encode_prompt
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    else:
        prompts = [p + "\n" for p in prompts]
    data = Dataset.from_dict({"prompt": prompts, "problem_index": list(range(n))})
    gen_s, rows, paused = [], [], [0.0]

    def reward_fn(completions, problem_index, **_):
        if completions and not isinstance(completions[0], str):  # conversational
            completions = [c[-1]["content"] for c in completions]
        return [
            verify(source.get("train", i), c)
            for i, c in zip(problem_index, completions, strict=True)
        ]

    class TimedTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, *a, **kw):
            s = time.perf_counter()
            out = super()._generate_and_score_completions(*a, **kw)
            gen_s.append(time.perf_counter() - s)
            return out

    class Clock(TrainerCallback):
        step_start, tokens_seen = 0.0, 0

        def on_step_begin(self, _args, state, control, **kw):
            self.step_start = time.time()

        def on_log(self, _args, state, control, logs=None, **kw):
            if not logs or "reward" not in logs:
                return
            now, seen = time.time(), int(logs["num_tokens"])
            step = state.global_step
            rows.append({
                "step": step, "wall_s": now - t0 - paused[0], "reward": logs["reward"],
                "tokens": seen - self.tokens_seen, "update_s": now - self.step_start - gen_s[-1],
                "generated": B * G,
            })  # fmt: skip
            self.tokens_seen = seen
            log(f"trl step {step}: reward {logs['reward']:.3f} t={rows[-1]['wall_s']:.0f}s")
            if step % args.snapshot_every == 0:
                s = time.time()
                trainer.model.save_pretrained(snaps / f"step_{step:06d}")
                tok.save_pretrained(snaps / f"step_{step:06d}")
                paused[0] += time.time() - s  # off the clock: swarmrl publishes anyway
            if now - t0 - paused[0] > args.max_seconds:
                control.should_training_stop = True

    # transformers below 5.20 (vLLM's pin) calls it gradient_checkpointing, on in GRPOConfig
    fields = GRPOConfig.__dataclass_fields__
    ckpt = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else "gradient_checkpointing"
    )
    k = tc.optimizer_steps  # swarmrl's optimizer steps per rollout batch
    gcfg = GRPOConfig(
        output_dir=str(snaps.parent / "trl-out"), use_cpu=True, bf16=False, **{ckpt: False},
        num_generations=G, per_device_train_batch_size=B * G // k, steps_per_generation=k,
        gradient_accumulation_steps=1, num_iterations=1,
        max_completion_length=cfg.sampling.max_new_tokens, temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p, top_k=0, learning_rate=args.trl_lr or tc.lr, lr_scheduler_type="constant",
        warmup_steps=0, optim="adamw_torch", adam_beta1=tc.betas[0], adam_beta2=tc.betas[1],
        weight_decay=tc.weight_decay, max_grad_norm=tc.grad_clip, beta=tc.kl_coef,
        epsilon=tc.epsilon, delta=tc.delta, loss_type="dr_grpo", scale_rewards="group",
        max_steps=args.max_steps, logging_steps=1, report_to="none", save_strategy="no",
        seed=cfg.seed, disable_tqdm=True,
    )  # fmt: skip
    model = load_model(cfg.model.path, cfg.model.dtype)  # as swarmrl loads it
    trainer = TimedTrainer(
        model=model, reward_funcs=reward_fn, args=gcfg, train_dataset=data, processing_class=tok
    )
    trainer.add_callback(Clock())
    trainer.remove_callback(PrinterCallback)  # it prints each log dict to stdout
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    return {"rows": rows, "threads": args.trl_threads}


def run_swarmrl(cfg, args, snaps: Path, validated: bool) -> dict:
    """`swarmrl rl` for up to --max-steps / --max-seconds; its published weights every K
    steps hard-linked aside before the trainer deletes them."""
    runs_dir = snaps.parent / "runs"
    run_dir, launcher_log = runs_dir / cfg.name, snaps.parent / "launcher.log"
    metrics, weights = run_dir / "metrics.jsonl", run_dir / "weights"
    cmd = [sys.executable, "-m", "swarmrl", "rl", "--config", args.config, "--fresh"]
    cmd += [f"runs_dir={runs_dir}", f"trainer.steps={args.max_steps}", f"seed={cfg.seed}"]
    cmd += ["launcher.eval_problems=0", f"trainer.max_minutes={args.max_seconds / 60 + 10}"]
    if not validated:
        cmd += ["validator.enabled=false"]
    rows, linked, stopped = [], set(), False
    with open(launcher_log, "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            alive = proc.poll() is None
            # complete lines only: a row being appended has no newline yet
            lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
            for m in map(json.loads, lines[len(rows) :]):
                rows.append({
                    "step": m["step"], "wall_s": time.time() - t0, "reward": m["reward"],
                    "tokens": round(m["tokens_per_s"] * m["train_s"]), "update_s": m["train_s"],
                    "generated": m["samples_read"], "staleness": m["staleness"],
                    "mismatch_kl": m.get("mismatch_kl"),
                })  # fmt: skip
                log(
                    f"swarmrl step {m['step']}: reward {m['reward']:.3f} t={rows[-1]['wall_s']:.0f}s"
                )
            for d in weights.glob("step_*") if weights.exists() else ():
                v = int(d.name[5:])
                if v and v % args.snapshot_every == 0 and v not in linked:
                    if (d / "manifest.json").exists():  # written last: the version is whole
                        with contextlib.suppress(FileNotFoundError):
                            shutil.copytree(d, snaps / d.name, copy_function=os.link)
                            linked.add(v)
            if not alive:
                break
            if not stopped and time.time() - t0 > args.max_seconds:
                proc.send_signal(signal.SIGINT)  # the launcher stops its processes cleanly
                stopped = True
            time.sleep(0.1)
    if proc.returncode != 0 and not (stopped and proc.returncode == 130):
        tail = launcher_log.read_text(errors="replace")[-3000:]
        sys.exit(f"swarmrl exited with code {proc.returncode}:\n{tail}")
    return {"rows": rows, "validated": validated}


def to_target(cfg, args, rows: list[dict], snaps: Path, target: float, scored: dict) -> dict:
    """Score the snapshots in step order until one reaches the target, then the last
    (into `scored`, by step)."""
    by_step = {r["step"]: r for r in rows}
    steps = sorted(int(d.name[5:]) for d in snaps.glob("step_*") if int(d.name[5:]) in by_step)
    hit = None
    for s in steps:
        scored[s] = score(cfg, args, str(snaps / f"step_{s:06d}"))
        log(f"  step {s}: held-out exact {scored[s]['accuracy']:.3f}")
        if scored[s]["accuracy"] >= target:
            hit = s
            break
    if steps and steps[-1] not in scored:
        scored[steps[-1]] = score(cfg, args, str(snaps / f"step_{steps[-1]:06d}"))
        log(f"  step {steps[-1]} (last): held-out exact {scored[steps[-1]]['accuracy']:.3f}")
    B, G = cfg.trainer.batch_groups, cfg.worker.group_size
    first = rows[0]["wall_s"] if rows else None
    out = {
        "steps": len(rows),
        "snapshots": {s: rnd(by_step[s]["wall_s"], 1) for s in steps},  # step: wall seconds
        "reached_target": hit is not None,
        "held_out": [{"step": s, **scored[s]} for s in sorted(scored)],
        "final_accuracy": scored[max(scored)]["accuracy"] if scored else None,
        "startup_s": rnd(first, 1),
    }
    if hit is not None:
        r = by_step[hit]
        upto = [x for x in rows if x["step"] <= hit]
        out |= {
            "steps_to_target": hit,
            "seconds_to_target": rnd(r["wall_s"], 1),
            "seconds_to_target_training": rnd(r["wall_s"] - first, 1),
            "samples_to_target_trained": hit * B * G,
            "samples_to_target_generated": sum(x["generated"] for x in upto),
        }
    tokens, upd = sum(r["tokens"] for r in rows), sum(r["update_s"] for r in rows)
    out["update_tokens_per_s"] = rnd(tokens / upd, 1) if upd else None
    out["e2e_trained_tokens_per_s"] = rnd(tokens / rows[-1]["wall_s"], 1) if rows else None
    out["per_step"] = [{k: rnd(v) if type(v) is float else v for k, v in r.items()} for r in rows]
    return out


def at_time(cfg, args, res: dict, snaps: dict, scored: dict) -> dict:
    """Each system's held-out accuracy at T, the earlier of their last snapshots' wall
    times: its newest snapshot taken by T (the starting model's if none)."""
    t = min(max(r["snapshots"].values()) for r in res.values())
    out = {"seconds": t}
    for name, r in res.items():
        taken = [s for s, w in r["snapshots"].items() if w <= t]
        if not taken:
            out[name] = {"step": 0, "accuracy": args.start_accuracy}
            continue
        s = max(taken)
        if s not in scored[name] and snaps[name] is None:  # reused: its newest scored one
            s = max([x for x in scored[name] if x <= s], default=0)
            out[name] = {"step": s, "accuracy": scored[name].get(s, {}).get(
                "accuracy", args.start_accuracy), "newest_scored_by_t": True}  # fmt: skip
            continue
        if s not in scored[name]:
            scored[name][s] = score(cfg, args, str(snaps[name] / f"step_{s:06d}"))
        out[name] = {"step": s, "accuracy": scored[name][s]["accuracy"]}
    return out


def reused(args, seed: int, scored: dict) -> dict | None:
    """TRL's result for `seed` from an earlier run of this bench (`--trl-from`), its
    scored snapshots into `scored`; None when that file has no TRL run of the seed."""
    if not args.trl_from:
        return None
    old = json.loads(Path(args.trl_from).read_text())["seeds"].get(str(seed), {}).get("trl")
    if old is None:
        return None
    old["snapshots"] = {int(k): v for k, v in old["snapshots"].items()}
    scored.update({h["step"]: h for h in old["held_out"]})
    return old | {"reused_from": args.trl_from}


def one_seed(args, seed: int) -> dict:
    """Every system on one seed: to the target, and at equal wall time."""
    from swarmrl.config import load_config

    cfg = load_config(args.config, [f"seed={seed}"])
    log(f"seed {seed}: scoring the starting model on {args.eval_problems} held-out problems")
    start = score(cfg, args, cfg.model.path)
    args.start_accuracy = start["accuracy"]
    log(f"start: held-out exact {start['accuracy']:.3f}; target {args.target}")
    res, scored, snaps = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as d:
        for name in args.system_list:
            scored[name] = {}
            if name == "trl" and (old := reused(args, seed, scored[name])) is not None:
                log(f"trl: seed {seed} reused from {args.trl_from}")
                res[name], snaps[name] = old, None
                continue
            work = Path(d) / name
            snaps[name] = work / "snaps"
            snaps[name].mkdir(parents=True)
            log(f"{name}: up to {args.max_steps} steps / {args.max_seconds:.0f}s")
            if name == "trl":
                run = run_trl(cfg, args, snaps[name])
            else:
                run = run_swarmrl(cfg, args, snaps[name], validated=name == "swarmrl")
            rows = run.pop("rows")
            if not rows:
                sys.exit(f"{name} trained no step within {args.max_seconds:.0f}s")
            log(f"{name}: {len(rows)} steps; scoring its snapshots")
            res[name] = run | to_target(cfg, args, rows, snaps[name], args.target, scored[name])
        equal = at_time(cfg, args, res, snaps, scored)
    for name, r in res.items():
        r["held_out"] = [{"step": s, **scored[name][s]} for s in sorted(scored[name])]
    out = {"start_accuracy": start["accuracy"], **res, "ratios": ratios(args, res)}
    if "trl" in res and "swarmrl" in res:
        out["speedup_to_target"] = out["ratios"]["swarmrl"]["seconds_to_target_trl_over_swarmrl"]
        out["accuracy_at_equal_time"] = equal
    return out


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def ratios(args, res: dict) -> dict:
    out = {}
    if "trl" not in res:
        return out
    tr = res["trl"]
    for name in (s for s in args.system_list if s != "trl"):
        sw = res[name]
        out[name] = {
            f"{k}_trl_over_swarmrl": _ratio(tr.get(k), sw.get(k))
            for k in ("seconds_to_target", "seconds_to_target_training",
                      "samples_to_target_trained", "samples_to_target_generated")
        } | {
            f"{k}_swarmrl_over_trl": _ratio(sw.get(k), tr.get(k))
            for k in ("update_tokens_per_s", "e2e_trained_tokens_per_s")
        }  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/default.toml")
    p.add_argument("--target", type=float, default=0.40, help="held-out greedy exact accuracy")
    p.add_argument("--snapshot-every", type=int, default=2, help="optimizer steps")
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--eval-threads", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=900.0, help="per system, a guard")
    p.add_argument("--max-steps", type=int, default=14, help="per system (make run's budget)")
    p.add_argument("--systems", default="trl,swarmrl", help=f"of {', '.join(SYSTEMS)}")
    p.add_argument("--trl-threads", type=int, default=2)
    p.add_argument("--trl-lr", type=float, default=None, help="TRL's lr (default: the config's)")
    p.add_argument(
        "--trl-from", default=None,
        help="an earlier output of this bench: its TRL runs are reused, not run again",
    )  # fmt: skip
    p.add_argument("--seeds", default="0,1", help="comma-separated; each runs every system")
    p.add_argument("--out", default="bench/results/grpo_vs_trl.json")
    args = p.parse_args()
    os.chdir(ROOT)
    from swarmrl.config import load_config

    cfg = load_config(args.config, [])
    args.system_list = [s for s in args.systems.split(",") if s]
    if unknown := set(args.system_list) - set(SYSTEMS):
        sys.exit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    if cfg.length_reward.mode != "none" or cfg.trainer.entropy_coef > 0:
        sys.exit("length rewards and the entropy bonus have no TRL counterpart here; turn them off")
    if cfg.curriculum.enabled:
        sys.exit("the curriculum changes the difficulty, TRL trains at one: disable it")
    load_before = os.getloadavg()
    seeds = [int(x) for x in args.seeds.split(",") if x]
    per_seed = {str(seed): one_seed(args, seed) for seed in seeds}
    import torch
    import transformers
    import trl

    result = {
        "machine": {
            "nproc": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "versions": {m.__name__: m.__version__ for m in (torch, transformers, trl)},
        },
        "config": {
            "file": args.config,
            "model": cfg.model.path,
            "task": cfg.task.name,
            "digits": cfg.task.digits,
        },  # fmt: skip
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in ("config", "out", "system_list", "start_accuracy")
        },  # fmt: skip
        "held_out": {
            "problems": args.eval_problems,
            "decoding": "greedy",
            "metric": "exact",
            "target": args.target,
        },  # fmt: skip
        "seeds": per_seed,
        "speedup_to_target": {k: v.get("speedup_to_target") for k, v in per_seed.items()},
        "accuracy_at_equal_time": {k: v.get("accuracy_at_equal_time") for k, v in per_seed.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out}")
    print(json.dumps(result))  # one JSON object, the last line


if __name__ == "__main__":
    main()

"""swarmrl vs TRL's GRPOTrainer: same tiny model, task, group size, batch, lengths.

    .venv/bin/python bench/grpo_vs_trl.py [--max-steps N] [--max-seconds S]
        [--margin M | --threshold X] [--window W] [--trl-threads K] [--trl-loss-type T]
        [--full]

TRL runs first, in this process; then swarmrl as a user starts it
(`python -m swarmrl rl`: trainer and workers in their own processes); --swarmrl-first
swaps the order. One JSON object goes to stdout and bench/results/grpo_vs_trl.json;
progress goes to stderr.

Shared settings come from the swarmrl config (configs/tiny.toml): model, task, group
size G, batch_groups B (TRL: B·G completions per step), max_new_tokens, temperature,
top_p, lr, AdamW betas and weight decay, grad clip, ε, δ, KL coef, seed. TRL also gets
a constant lr, plain AdamW, no activation checkpointing, one optimizer step per
generation batch, scale_rewards="group" and, by default, loss_type="dr_grpo": token
losses summed and divided by B·G·max_new_tokens, which is swarmrl's constant token
budget ("grpo" averages per sequence first: --trl-loss-type grpo). swarmrl runs with
curriculum.enabled=false: TRL has no adaptive difficulty, so both train at the task's
fixed difficulty.

Both systems start from the same model file (cfg.model.path; its model.safetensors
sha256 is recorded under "start"). The threshold is relative to where that model
starts, because the warm-started model lands differently from machine to machine and a
fixed threshold can lie below both starting points (then "time to threshold" measures
start-up alone): threshold = start_reward + --margin, where start_reward is the model's
mean sampled reward at the run's temperature, as `swarmrl init-model` records it in
<model>/warm_start.json ("sampled_reward"). --threshold X sets an absolute threshold
instead. Each system's mean reward over its first --window steps (first_window_reward)
is reported beside start_reward as a sanity check: the two should roughly agree.

Per training step, for both systems:
- reward: mean reward over every completion sampled for the step (TRL: its logged
  "reward"; swarmrl: metrics.jsonl "reward", every sample of the files read for the
  step, before zero-advantage groups are dropped). This is the policy's real
  performance. reward_signal, the mean over the groups with signal only (what each
  system trains on), is reported beside it.
- (b) seconds_to_threshold: training time only, the wall clock from the first step's
  row to the row of the first step at which the mean of `reward` over the last
  --window steps is >= the threshold. Rows are stamped by this script: TRL's in an
  on_log callback, swarmrl's when its metrics row appears (polled every 0.1 s). null
  when not reached within --max-steps / --max-seconds. Start-up is reported apart:
  startup_s, from the start of the system (TRL: before importing
  torch/transformers/trl; swarmrl: before starting the subprocess, whose processes
  import the same) to the first step's row; seconds_to_threshold_incl_startup is the
  sum. For swarmrl, trainer_elapsed_s (the trainer's own clock, after its model load)
  is kept per step.
- (a) tokens: prompt + completion tokens (EOS included) of the samples an update
  trained on. e2e_tokens_per_s: all of them / wall clock from start to the last step;
  steady_tokens_per_s: steps 2.. over the time after step 1; update_tokens_per_s:
  over update time only (swarmrl: the trainer's train_s, which includes its
  old-log-prob pass; TRL: step time minus generation and scoring).
Each system stops once it crosses the threshold unless --full is given; --max-seconds
counts from the system's start, start-up included.

Fairness caveats. Timings mean little on a busy machine (load averages are
recorded). swarmrl runs trainer + workers as single-thread processes (3 on 2 cores
by default); TRL is one process with --trl-threads threads (default 2). swarmrl
trains on exactly B groups with signal (surplus groups carry to the next step) from
policies up to async_level versions old; TRL trains on exactly B groups of the
current policy, zero-advantage ones included. These are
design differences under test, not settings. TRL normalises advantages by the sample
std (swarmrl: population std) and samples with model.generate. The second system
runs with the OS file cache already warm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from benchproc import sha256_file  # noqa: E402

SW_KEEP = ("samples", "groups", "wait_s", "staleness", "dropped_groups", "stale_files")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def read_start(cfg, config_file: str) -> dict:
    """The starting model's identity and its mean sampled reward, from warm_start.json."""
    model = Path(cfg.model.path)
    rebuild = (
        f"rebuild the model with `swarmrl init-model --task {cfg.task.name} --out {model} "
        f"--config {config_file}` (`make run` does it)"
    )
    ws = model / "warm_start.json"
    info = json.loads(ws.read_text()) if ws.is_file() else {}
    missing = [k for k in ("sampled_reward", "temperature") if info.get(k) is None]
    if missing:
        what = f"{ws} is missing" if not ws.is_file() else f"{ws} has no {', '.join(missing)}"
        sys.exit(f"{what}: the threshold is relative to the starting reward; {rebuild}")
    if abs(info["temperature"] - cfg.sampling.temperature) > 1e-9:
        sys.exit(
            f"{ws} records the sampled reward at temperature {info['temperature']}, the run "
            f"samples at {cfg.sampling.temperature}; {rebuild}"
        )
    weights = model / "model.safetensors"
    if not weights.is_file():
        sys.exit(f"{weights} is missing; {rebuild}")
    return {
        "model": str(model),
        "model_sha256": sha256_file(weights),
        "start_reward": float(info["sampled_reward"]),
        "temperature": info["temperature"],
    }


def crossing(rows: list[dict], threshold: float, window: int) -> int | None:
    """Index of the first row whose trailing `window`-step mean reward is >= threshold."""
    for i in range(window - 1, len(rows)):
        m = mean(r["reward"] for r in rows[i - window + 1 : i + 1])
        if m is not None and m >= threshold:
            return i
    return None


def summarize(rows: list[dict], args, threshold: float) -> dict:
    def rnd(x, n=4):
        return None if x is None else round(x, n)

    if not rows:
        return {"steps": 0, "reached_threshold": False, "seconds_to_threshold": None}
    i = crossing(rows, threshold, args.window)
    tokens, wall = sum(r["tokens"] for r in rows), rows[-1]["wall_s"]
    startup = rows[0]["wall_s"]
    after_first = rows[-1]["wall_s"] - startup
    return {
        "steps": len(rows),
        "reached_threshold": i is not None,
        "seconds_to_threshold": None if i is None else rnd(rows[i]["wall_s"] - startup, 2),
        "seconds_to_threshold_incl_startup": None if i is None else rnd(rows[i]["wall_s"], 2),
        "steps_to_threshold": None if i is None else rows[i]["step"],
        "startup_s": rnd(startup, 2),
        "wall_s": rnd(wall, 2),
        "first_window_reward": rnd(mean(r["reward"] for r in rows[: args.window])),
        "first5_reward": rnd(mean(r["reward"] for r in rows[:5])),
        "last5_reward": rnd(mean(r["reward"] for r in rows[-5:])),
        "first5_reward_signal": rnd(mean(r["reward_signal"] for r in rows[:5])),
        "last5_reward_signal": rnd(mean(r["reward_signal"] for r in rows[-5:])),
        "trained_tokens": tokens,
        "trained_samples": sum(r["samples"] for r in rows),
        "e2e_tokens_per_s": rnd(tokens / wall, 1),
        "steady_tokens_per_s": rnd((tokens - rows[0]["tokens"]) / after_first, 1)
        if after_first > 0
        else None,
        "update_tokens_per_s": rnd(tokens / sum(r["update_s"] for r in rows), 1),
        "per_step": [{k: rnd(v) if type(v) is float else v for k, v in r.items()} for r in rows],
    }


def run_trl(cfg, args, threshold: float, tmp: Path) -> list[dict]:
    t0 = time.time()  # before the heavy imports: swarmrl's clock includes its processes' imports
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
    signal_reward, gen_s, rows = [], [], []  # one entry per generation batch = per step

    def reward_fn(completions, problem_index, **_):
        if completions and not isinstance(completions[0], str):  # conversational
            completions = [c[-1]["content"] for c in completions]
        r = [
            verify(source.get("train", i), c)
            for i, c in zip(problem_index, completions, strict=True)
        ]
        groups = [r[k : k + G] for k in range(0, len(r), G)]  # a prompt's G samples are adjacent
        signal_reward.append(mean(x for g in groups if max(g) - min(g) > 1e-9 for x in g))
        return r

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
            row = {"step": state.global_step, "wall_s": now - t0, "reward": logs["reward"]}
            row |= {"reward_signal": signal_reward[-1], "tokens": seen - self.tokens_seen}
            row |= {"update_s": now - self.step_start - gen_s[-1], "samples": B * G}
            rows.append(row)
            self.tokens_seen = seen
            log(f"trl step {row['step']}: reward {row['reward'] or 0:.3f} t={row['wall_s']:.1f}s")
            crossed = crossing(rows, threshold, args.window) is not None
            if (crossed and not args.full) or now - t0 > args.max_seconds:
                control.should_training_stop = True

    k = tc.optimizer_steps  # swarmrl's optimizer steps per rollout batch
    # transformers below 5.20 (as vLLM pins it) has gradient_checkpointing only, off by default
    fields = GRPOConfig.__dataclass_fields__
    no_ckpt = {"activation_checkpointing": False} if "activation_checkpointing" in fields else {}
    gcfg = GRPOConfig(
        output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, **no_ckpt,
        num_generations=G, per_device_train_batch_size=B * G // k, steps_per_generation=k,
        gradient_accumulation_steps=1, num_iterations=1,
        max_completion_length=cfg.sampling.max_new_tokens, temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p, top_k=0, learning_rate=tc.lr, lr_scheduler_type="constant",
        warmup_steps=0, optim="adamw_torch", adam_beta1=tc.betas[0], adam_beta2=tc.betas[1],
        weight_decay=tc.weight_decay, max_grad_norm=tc.grad_clip, beta=tc.kl_coef,
        epsilon=tc.epsilon, delta=tc.delta, loss_type=args.trl_loss_type, scale_rewards="group",
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
    return rows


def run_swarmrl(cfg, args, threshold: float, tmp: Path) -> list[dict]:
    runs_dir = tmp / "swarmrl"
    run_dir, launcher_log = runs_dir / cfg.name, tmp / "swarmrl-launcher.log"
    metrics = run_dir / "metrics.jsonl"
    cmd = [sys.executable, "-m", "swarmrl", "rl", "--config", args.config, "--fresh"]
    cmd += [f"runs_dir={runs_dir}", f"trainer.steps={args.max_steps}"]
    cmd += ["curriculum.enabled=false"]  # fixed difficulty, as TRL trains
    rows, stopped = [], False
    with open(launcher_log, "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            alive = proc.poll() is None
            # complete lines only: a row being appended has no newline yet
            lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
            for m in map(json.loads, lines[len(rows) :]):
                row = {"step": m["step"], "wall_s": time.time() - t0, "reward": m["reward"]}
                row |= {"reward_signal": m["reward_trained"]}
                row |= {"tokens": round(m["tokens_per_s"] * m["train_s"])}
                row |= {"update_s": m["train_s"], "trainer_elapsed_s": m["elapsed_s"]}
                row |= {k: m[k] for k in SW_KEEP}
                rows.append(row)
                log(f"swarmrl step {m['step']}: reward {m['reward']:.3f} t={row['wall_s']:.1f}s")
            if not alive:
                break
            crossed = crossing(rows, threshold, args.window) is not None
            if not stopped and ((crossed and not args.full) or time.time() - t0 > args.max_seconds):
                proc.send_signal(signal.SIGINT)  # the launcher stops trainer and workers cleanly
                stopped = True
            time.sleep(0.1)
    if proc.returncode != 0 and not (stopped and proc.returncode == 130):
        tail = launcher_log.read_text(errors="replace")[-3000:]
        sys.exit(f"swarmrl exited with code {proc.returncode}:\n{tail}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/tiny.toml")
    p.add_argument("--max-steps", type=int, default=300, help="per system")
    p.add_argument("--max-seconds", type=float, default=400.0, help="per system")
    p.add_argument(
        "--margin", type=float, default=0.10,
        help="threshold = the starting model's mean sampled reward + this",
    )  # fmt: skip
    p.add_argument(
        "--threshold", type=float, default=None,
        help="absolute mean reward to reach (overrides --margin)",
    )  # fmt: skip
    p.add_argument("--window", type=int, default=5, help="steps in the rolling mean")
    p.add_argument("--trl-threads", type=int, default=2)
    p.add_argument("--trl-loss-type", default="dr_grpo", choices=["dr_grpo", "grpo", "bnpo"])
    p.add_argument("--swarmrl-first", action="store_true", help="run swarmrl before TRL")
    p.add_argument("--full", action="store_true", help="run on after reaching the threshold")
    p.add_argument("--out", default="bench/results/grpo_vs_trl.json")
    args = p.parse_args()
    os.chdir(ROOT)
    from swarmrl.config import load_config

    cfg = load_config(args.config)
    if not (Path(cfg.model.path) / "config.json").is_file():
        sys.exit(
            f"model {cfg.model.path} is missing: build it with `make run` or `swarmrl "
            f"init-model --task {cfg.task.name} --out {cfg.model.path}`"
        )
    if cfg.length_reward.mode != "none" or cfg.trainer.entropy_coef > 0:
        sys.exit("length rewards and the entropy bonus have no TRL counterpart here; turn them off")
    start = read_start(cfg, args.config)
    relative = args.threshold is None
    threshold = start["start_reward"] + args.margin if relative else args.threshold
    log(f"start reward {start['start_reward']:.3f}, threshold {threshold:.3f}")
    order = ["swarmrl", "trl"] if args.swarmrl_first else ["trl", "swarmrl"]
    load_before, res = os.getloadavg(), {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as d:
        for name in order:
            log(f"{name}: up to {args.max_steps} steps / {args.max_seconds:.0f}s")
            rows = (run_trl if name == "trl" else run_swarmrl)(cfg, args, threshold, Path(d))
            res[name] = summarize(rows, args, threshold)
            first = res[name].get("first_window_reward")
            log(
                f"{name}: first {args.window} steps' mean reward "
                f"{'n/a' if first is None else f'{first:.3f}'} "
                f"(start reward {start['start_reward']:.3f})"
            )
            if not res[name]["reached_threshold"]:
                log(f"{name} did not reach the threshold {threshold:.3f} within its caps")
    import torch
    import transformers
    import trl

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    sw, tr = res["swarmrl"], res["trl"]
    b_ratio = ratio(tr["seconds_to_threshold"], sw["seconds_to_threshold"])
    result = {
        "machine": {
            "nproc": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "versions": {m.__name__: m.__version__ for m in (torch, transformers, trl)},
        },
        "order": order,
        "config": {"file": args.config, **cfg.model_dump(mode="json")},
        "settings": {k: v for k, v in vars(args).items() if k not in ("config", "out")},
        "start": {
            **start,
            "first_window_reward": {n: res[n].get("first_window_reward") for n in order},
        },
        "threshold": {
            "value": round(threshold, 4),
            "rule": "start_reward + margin" if relative else "absolute (--threshold)",
            "margin": args.margin if relative else None,
            "window": args.window,
            "metric": "mean over the last `window` steps of the step's mean reward over all samples",
        },
        "trl": tr,
        "swarmrl": sw,
        "ratios": {
            "seconds_to_threshold_trl_over_swarmrl": b_ratio,
            "goal_swarmrl_1.5x_faster_to_threshold": None if b_ratio is None else b_ratio >= 1.5,
            "startup_s_swarmrl_over_trl": ratio(sw.get("startup_s"), tr.get("startup_s")),
            **{
                f"{k}_swarmrl_over_trl": ratio(sw.get(k), tr.get(k))
                for k in ("e2e_tokens_per_s", "steady_tokens_per_s", "update_tokens_per_s")
            },
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()

"""The Python API: what a researcher scripts, and what the CLI calls.

    import swarmrl

    cfg = swarmrl.load_config("configs/tiny.toml", ["trainer.steps=20"])
    cfg.name = "tiny-short"
    result = swarmrl.run_swarm(cfg, fresh=True)
    scores = swarmrl.evaluate(result.final_model, cfg, n=200)

`run_swarm` is `swarmrl rl`, `evaluate` is `swarmrl eval` and `join` is
`swarmrl worker`: each command's handler in cli.py parses its flags and calls
one of these, so a script and the command take one code path. docs/reference/
python-api.md has the signatures and a runnable example.

Decisions:
- A config is a `RunConfig` (built in code, or loaded with `load_config`), the
  path of a TOML file, or None for the defaults; dotted `overrides` apply on top,
  as on the command line. A `RunConfig` reaches the swarm's processes as the
  dotted overrides that make it from the defaults (config/overrides.py), and is
  checked as a file would be: a bad value is a `ConfigError` naming its key. A
  path is passed on as `--config PATH`, as the command always has.
- `run_swarm` returns a `SwarmResult` (the exit code, the run directory, the
  held-out scores) rather than raising on a run that failed: the launcher has
  already said why on stdout and stderr, and the run directory holds the rest.
  Bad input (a config, a model path, a run directory that exists) raises a
  `UserError` before anything starts.
- Nothing heavy is imported at module level: `import swarmrl` and `swarmrl
  --help` do not load torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.config import ConfigError, RunConfig, load_config
from swarmrl.config.overrides import config_overrides
from swarmrl.errors import LaunchError

__all__ = ["RunConfig", "SwarmResult", "evaluate", "join", "load_config", "run_swarm"]

ConfigSource = RunConfig | str | Path | None


def resolve_config(
    config: ConfigSource = None, overrides: Sequence[str] = ()
) -> tuple[RunConfig, str | None, list[str]]:
    """The run config that `config` and `overrides` describe, and how a process reads
    it: (config, the `--config` path or None, the dotted overrides)."""
    if not isinstance(config, RunConfig):
        path = None if config is None else str(config)
        return load_config(path, list(overrides)), path, list(overrides)
    mine = config_overrides(config)
    back = load_config(None, mine)  # what a process started with these overrides reads
    lost = sorted(set(config_overrides(back)) ^ set(mine))
    if lost:
        raise ConfigError(f"settings that do not survive being passed on: {', '.join(lost)}")
    extra = list(overrides)
    return (load_config(None, mine + extra) if extra else back), None, mine + extra


@dataclass(frozen=True)
class SwarmResult:
    """What `run_swarm` leaves: its exit code (0: the trainer finished), the run
    directory, and the held-out scores of runs/<name>/eval.json (`start_model`,
    `final_model`, `final_model_top_level`: each with `accuracy`, `mean_reward`, `n`,
    ...; empty when the run was not scored)."""

    exit_code: int
    run_dir: Path
    heldout: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def final_model(self) -> Path | None:
        """The final policy's HF directory, once the trainer has written it."""
        final = self.run_dir / "final"
        return final if final.exists() else None

    def metrics(self) -> list[dict]:
        """The trainer's metrics.jsonl, one dict per step."""
        from swarmrl.launch.report import read_metrics

        return read_metrics(self.run_dir / "metrics.jsonl")


def run_swarm(
    config: ConfigSource = None,
    overrides: Sequence[str] = (),
    *,
    fresh: bool = False,
    resume: bool = False,
    cheaters: int = 0,
    cheats: Sequence[str] | None = None,
) -> SwarmResult:
    """Run a whole swarm on this machine until the trainer finishes (`swarmrl rl`).

    `fresh` deletes an existing run directory of the run's name first; `resume`
    continues it from its newest complete version (one of the two is needed when it
    exists). `cheaters` adds that many dishonest workers, given the `cheats` in turn
    (a demonstration of the validators; the default cheats when None)."""
    if fresh and resume:
        raise LaunchError("fresh and resume exclude each other: fresh deletes the run")
    cfg, path, args = resolve_config(config, overrides)
    cheat_list = list(cheats) if cheats else None
    if cfg.trainer.diloco.sites and not cfg.trainer.diloco.lighthouse:
        from swarmrl.launch.diloco_rl import launch_sites

        if cheat_list or cheaters:
            raise LaunchError("cheaters with trainer.diloco.sites: start the sites one by one")
        code = launch_sites(cfg, path, args, resume, fresh)
    else:
        from swarmrl.launch.swarm import launch

        code = launch(cfg, path, args, resume, fresh, cheaters, cheat_list)
    scores = cfg.run_dir / "eval.json"
    heldout = json.loads(scores.read_text()) if scores.exists() else {}
    return SwarmResult(code, cfg.run_dir, heldout)


def evaluate(
    model: str | Path | None,
    config: ConfigSource = None,
    overrides: Sequence[str] = (),
    *,
    n: int = 200,
    level: int = 0,
    target_length: int = 0,
    max_new_tokens: int | None = None,
    threads: int = 2,
) -> dict:
    """Greedy accuracy and mean reward of `model` (an HF directory, a .gguf file or
    'smollm2') on `n` held-out problems of the config's task at difficulty `level`
    (`swarmrl eval`). With `target_length` T the prompts carry the thinking-budget
    instruction and the result's `budget` says how closely lengths follow it.
    `max_new_tokens` defaults to enough for the task's answer (twice T with a budget).

    Returns `model`, `task`, `level`, `n`, `accuracy`, `mean_reward`, `seconds` and
    the first five `samples` (with `budget` and `tool_use` where they apply)."""
    if model is None:  # e.g. the final_model of a run that did not finish
        raise ConfigError("evaluate: no model given")
    if target_length < 0:
        raise ConfigError(f"target_length must not be negative (got {target_length})")
    cfg, _, _ = resolve_config(config, overrides)
    from swarmrl.apps.evaluate import default_max_new_tokens
    from swarmrl.apps.evaluate import evaluate as greedy_eval
    from swarmrl.envs.environment import environment_of

    max_new = max_new_tokens or default_max_new_tokens(cfg.task.name, target_length)
    lr = cfg.length_reward
    return greedy_eval(
        str(model), cfg.task, n, max_new, threads=threads, level=level,
        target_length=target_length, length_mode=lr.mode if lr.mode != "none" else "exact",
        length_coef=lr.coef, env=environment_of(cfg),
    )  # fmt: skip


def join(
    orchestrator: str,
    home: str | Path = "swarmrl-worker",
    *,
    threads: int = 1,
    device: str = "auto",
    backend: str | None = None,
    invite: str = "",
    cheat: str | None = None,
) -> None:
    """Join the run at `orchestrator` as an inference worker and work until the run is
    done (`swarmrl worker`). `home` keeps this node's key, weights and logs; `device`
    is auto, cpu, cuda or cuda:N; `backend` (auto, hf, vllm) overrides the run's
    `inference.backend`; `invite` is an operator's invitation (no proof of work).
    `cheat` makes a dishonest worker of that kind (tests and demos). Raises
    `NodeRefused` (a `UserError`) when the orchestrator refuses the node."""
    from swarmrl.inference.worker import run_worker

    home = Path(home)
    work = None
    if cheat:  # a dishonest worker, built on the worker's public steps
        from swarmrl.sim.registry import make_cheat, seed_from_home

        work = make_cheat(cheat, seed=seed_from_home(home))
    run_worker(
        orchestrator, home, threads, backend, work=work,
        after_load=work.after_load if work else None, invite=invite, device=device,
    )  # fmt: skip

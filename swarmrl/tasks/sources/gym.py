"""Procedural task families from reasoning-gym, generated offline from the seed.

`task.name = "reasoning_gym"` with `task.gym = ["basic_arithmetic", ...]`:
problem i of a split comes from family `gym[i mod n]`, item `i div n` (modulo
`task.gym_size`). Each family is one `reasoning_gym.create_dataset(family,
seed=..., size=gym_size, **gym_options[family])`; reasoning-gym derives item k
from the dataset's seed and k alone, so a validator recomputes any prompt from
the assignment, as for the built-in generators. The eval split uses the seed
`gym_size` above the train split's, so for families that seed items by
`seed + k` (most of them) the two splits share no item.

The prompt is the family's question followed by an instruction to put the
final answer in `<answer>...</answer>`; the verifier takes the last such tag
(reasoning-gym's own extraction) and calls the family's own `score_answer`,
which may give partial credit (a reward in [0, 1]). Scoring runs in a checker
process (tasks/graders/checker.py) bounded by `TIMEOUT_S`: some families' scorers
parse the answer with SymPy, and a hostile answer must not hang the grader.

The curriculum's level does not change reasoning-gym problems (each family has
its own difficulty options; set them in `gym_options`). A family whose
generator fails for the configured size or options (some refuse very large
sizes) is reported when the task source is built, before any work is done.
"""

from __future__ import annotations

import functools
import json

from swarmrl.config import TaskConfig
from swarmrl.tasks.graders.checker import CheckerProcess, serve
from swarmrl.tasks.schema import Task, TaskError

TIMEOUT_S = 5.0
INSTRUCTION = "\nGive your final answer inside <answer></answer> tags."
_SEED_SPACE = 1 << 30


def families() -> list[str]:
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


def check_config(cfg: TaskConfig) -> None:
    """Refuse unknown families and options that the family's generator rejects."""
    try:
        known = set(families())
    except ImportError:
        raise TaskError(
            "task.name = 'reasoning_gym' needs the reasoning-gym package: "
            "pip install 'swarmrl[tasks]'"
        ) from None
    unknown = [f for f in cfg.gym if f not in known]
    if unknown:
        raise TaskError(
            f"task.gym: unknown reasoning-gym families {unknown} (known: {sorted(known)})"
        )
    extra = [f for f in cfg.gym_options if f not in cfg.gym]
    if extra:
        raise TaskError(f"task.gym_options: {extra} are not in task.gym")
    for family in cfg.gym:
        try:
            _entry(_info(cfg, family, "train", 0, 0))
        except Exception as e:  # reported, not recovered: the run cannot use this family
            raise TaskError(f"task.gym: family '{family}' cannot generate: {e!r}") from None


def _info(cfg: TaskConfig, family: str, split: str, item: int, seed: int) -> dict:
    base = seed % _SEED_SPACE + (cfg.gym_size if split == "eval" else 0)
    return {
        "family": family,
        "seed": base,
        "size": cfg.gym_size,
        "item": item % cfg.gym_size,
        "options": cfg.gym_options.get(family, {}),
    }


@functools.lru_cache(maxsize=256)
def _dataset(family: str, seed: int, size: int, options: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(family, seed=seed, size=size, **json.loads(options))


def _entry(info: dict) -> dict:
    ds = _dataset(
        info["family"], info["seed"], info["size"], json.dumps(info["options"], sort_keys=True)
    )
    return ds, ds[info["item"]]


def gym_task(cfg: TaskConfig, split: str, index: int, seed: int, level: int = 0) -> Task:
    family = cfg.gym[index % len(cfg.gym)]
    item = index // len(cfg.gym)
    info = _info(cfg, family, split, item, seed)
    _, entry = _entry(info)
    return Task(
        problem_id=f"{family}/{split}/{info['item']}",
        prompt=entry["question"] + INSTRUCTION,
        task_type="reasoning_gym",
        verification_info=info,
        metadata={"family": family},
    )


def _score(request: list) -> float:
    info, completion = request
    from reasoning_gym.utils import extract_answer

    ds, entry = _entry(info)
    try:
        return float(ds.score_answer(extract_answer(completion), entry))
    except Exception:  # recovered: a scorer that chokes on the answer grades it 0
        return 0.0


class GymChecker(CheckerProcess):
    def __init__(self, timeout_s: float = TIMEOUT_S):
        super().__init__("swarmrl.tasks.sources.gym", timeout_s)


_checker = GymChecker()


def score_gym(info: dict, completion: str, checker: GymChecker | None = None) -> float:
    """The family's own score of the completion's last <answer> (0 after a timeout)."""
    got = (checker or _checker).call([info, completion])
    return 0.0 if got is None else float(got)


if __name__ == "__main__":
    import reasoning_gym  # noqa: F401  (imported before "ready")

    serve(_score)

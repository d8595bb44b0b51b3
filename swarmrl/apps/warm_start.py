"""The supervised warm start of the tiny model, stopped by what it measures.

RL needs a starting policy with a partial reward: at 0 nothing has signal, near
1 nothing is left to learn. The supervised curve of these tasks has a sharp
phase transition, and where it falls moves with the CPU, the thread count and
the seed: a fixed step count once gave a sampled reward of 0.33 on one machine
and 0.58 on another. So the warm start stops on a measurement instead:

- the quantity is the one RL moves: the mean task reward of completions
  *sampled* at the run's temperature and top-p (not greedy), on a check split
  ("warmup-check": neither train nor eval), at difficulty level 0;
- it is measured with the workers' own seeded sampler and fixed seeds, so two
  checks of the same weights agree exactly and successive checks differ only
  by what training changed;
- it is checked every `check_every` steps (every `coarse_every` while the
  reward is more than two half-widths below the centre), and training stops at the first check
  between the band's centre and its top. When a check lands above the band,
  training goes back to the last checkpoint below the centre and continues
  with half the learning rate and checks twice as often: each overshoot halves
  the distance a check interval can travel, so a sharp transition cannot jump
  the band for ever. After `max_restarts` overshoots or `max_steps` steps the
  checkpoint closest to the centre is kept; `in_band` says whether it lies in
  the band, and a warning says when it does not.

The outcome goes to `warm_start.json` in the model directory (see
`WarmStartResult`), and `init-model` prints it.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import asdict, dataclass, field

from swarmrl.config import SamplingConfig, TaskConfig

log = logging.getLogger(__name__)

CHECK_SPLIT = "warmup-check"


@dataclass
class Band:
    center: float = 0.30
    half_width: float = 0.05

    @property
    def lo(self) -> float:
        return self.center - self.half_width

    @property
    def hi(self) -> float:
        return self.center + self.half_width


@dataclass
class WarmStartResult:
    sampled_reward: float
    in_band: bool
    band: list[float]
    temperature: float
    top_p: float
    steps: int
    loss: float
    restarts: int
    check: dict
    threads: int
    seed: int
    greedy_reward: float = 0.0  # on the same check problems, greedy decoding (for reference)
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # every check: step, reward, lr

    def to_json(self) -> dict:
        return asdict(self)


def sampled_reward(
    backend,
    tokenizer,
    task_cfg: TaskConfig,
    sampling: SamplingConfig,
    problems: int,
    samples: int,
    seed: int,
) -> float:
    """Mean task reward of `samples` seeded completions of each of `problems` check
    problems, sampled as the workers sample (temperature, top-p, Gumbel-max)."""
    from swarmrl.models.prompting import decode_completion, encode_prompt
    from swarmrl.protocol.seeds import derive_seed
    from swarmrl.tasks.graders.registry import verify
    from swarmrl.tasks.sources.generated import GENERATORS

    gen = GENERATORS[task_cfg.name]
    tasks = [gen(task_cfg, CHECK_SPLIT, i, seed) for i in range(problems)]
    prompts = [encode_prompt(tokenizer, t.prompt) for t in tasks for _ in range(samples)]
    seeds = [derive_seed(seed, CHECK_SPLIT, i) for i in range(len(prompts))]
    done = backend.generate(
        prompts, seeds, sampling.max_new_tokens, sampling.temperature, sampling.top_p, proofs=False
    )
    total = 0.0
    for k, c in enumerate(done):
        total += verify(tasks[k // samples], decode_completion(tokenizer, c.tokens))
    return total / len(done)


class _Supervised:
    """The supervised pass: AdamW steps on batches of generated train problems, taken
    in order (prompt + answer + EOS, loss on the answer tokens only), and checkpoints
    of the model, the optimizer and the position in the problems to go back to."""

    def __init__(self, model, tokenizer, task_cfg: TaskConfig, batch: int, lr: float, seed: int):
        import torch

        from swarmrl.tasks.sources.generated import GENERATORS

        self.model, self.tokenizer, self.task_cfg = model, tokenizer, task_cfg
        self.batch, self.seed = batch, seed
        self.gen = GENERATORS[task_cfg.name]
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.index = 0  # the next train problem

    def _tensors(self):
        """The next `batch` problems, right-padded: token ids, attention mask, loss mask."""
        import torch

        from swarmrl.models.prompting import encode_prompt
        from swarmrl.tasks.sources.generated import answer_text

        tok = self.tokenizer
        eos, pad = tok.eos_token_id, tok.pad_token_id
        seqs, masks = [], []
        for _ in range(self.batch):
            task = self.gen(self.task_cfg, "train", self.index, self.seed + 1_000_003)
            self.index += 1
            p = encode_prompt(tok, task.prompt)
            a = tok(answer_text(task), add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(p + a)
            masks.append([0] * len(p) + [1] * len(a))
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
        lm = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        return ids, attn, lm

    def step(self) -> float:
        """One optimizer step on the next batch; its loss."""
        import torch

        ids, attn, lm = self._tensors()
        logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        mask = lm[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[mask].float(), ids[:, 1:][mask])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.item()

    def snapshot(self, step: int, reward: float, loss: float) -> dict:
        return {
            "model": copy.deepcopy(self.model.state_dict()),
            "opt": copy.deepcopy(self.opt.state_dict()),
            "step": step, "index": self.index, "reward": reward, "loss": loss,
        }  # fmt: skip

    def restore(self, snap: dict, lr: float) -> None:
        """Go back to `snap` and go on with learning rate `lr`."""
        self.model.load_state_dict(snap["model"])
        self.opt.load_state_dict(snap["opt"])
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.index = snap["index"]


def warm_start(
    model,
    tokenizer,
    task_cfg: TaskConfig,
    sampling: SamplingConfig,
    band: Band,
    max_steps: int = 3000,
    batch: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    check_every: int = 10,
    coarse_every: int = 40,
    check_problems: int = 128,
    check_samples: int = 4,
    max_restarts: int = 8,
    threads: int = 1,
) -> WarmStartResult:
    """Supervised pass on (prompt, answer) pairs until the sampled reward is in `band`."""
    from swarmrl.inference.hf import HFBackend

    t0 = time.time()
    sft = _Supervised(model, tokenizer, task_cfg, batch, lr, seed)
    backend = HFBackend.around(model)

    def measure() -> float:
        model.eval()
        return sampled_reward(
            backend, tokenizer, task_cfg, sampling, check_problems, check_samples, seed
        )

    step, reward, loss_value, restarts, history = _train_into_band(
        sft, measure, band, max_steps, lr, check_every, coarse_every, max_restarts
    )
    in_band = band.lo <= reward <= band.hi
    if not in_band:
        log.warning(
            "warm start did not land in the band %.2f-%.2f; keeping the closest checkpoint "
            "(step %d, sampled reward %.3f)", band.lo, band.hi, step, reward,
        )  # fmt: skip
    model.eval()
    return WarmStartResult(
        greedy_reward=_greedy_reward(model, tokenizer, task_cfg, sampling, check_problems, seed),
        sampled_reward=round(reward, 4),
        in_band=in_band,
        band=[round(band.lo, 4), round(band.hi, 4)],
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        steps=step,
        loss=round(loss_value, 4),
        restarts=restarts,
        check={
            "split": CHECK_SPLIT,
            "problems": check_problems,
            "samples": check_samples,
            "level": 0,
            "max_new_tokens": sampling.max_new_tokens,
        },  # fmt: skip
        threads=threads,
        seed=seed,
        seconds=round(time.time() - t0, 1),
        history=history,
    )


def _train_into_band(sft: _Supervised, measure, band: Band, max_steps: int, lr: float,
                     check_every: int, coarse_every: int, max_restarts: int):  # fmt: skip
    """Train and measure until a check lands between the band's centre and its top, going
    back to the last checkpoint below the centre on an overshoot (module docstring).
    Returns the kept checkpoint's step, reward and loss, the overshoots, and every check."""

    def done(r: float) -> bool:
        return band.center <= r <= band.hi

    step = restarts = 0
    lr_now, every, loss_value = lr, check_every, float("nan")
    reward = measure()
    history = [{"step": 0, "reward": round(reward, 4), "lr": lr_now}]
    below = sft.snapshot(0, reward, loss_value)  # the last checkpoint below the centre
    best = below  # the checkpoint closest to the centre
    while not done(reward) and step < max_steps:
        sft.model.train()
        far = reward < band.center - 2 * band.half_width and restarts == 0
        for _ in range(coarse_every if far else every):
            loss_value = sft.step()
            step += 1
        reward = measure()
        history.append({"step": step, "reward": round(reward, 4), "lr": lr_now})
        log.info(
            "warm start step %d: loss %.4f, sampled reward %.3f (band %.2f-%.2f, lr %.2g)",
            step, loss_value, reward, band.lo, band.hi, lr_now,
        )  # fmt: skip
        if abs(reward - band.center) < abs(best["reward"] - band.center):
            best = sft.snapshot(step, reward, loss_value)
        if reward < band.center:
            below = sft.snapshot(step, reward, loss_value)
        elif reward > band.hi:
            if restarts >= max_restarts:
                break
            restarts += 1
            lr_now, every = lr_now / 2, max(1, every // 2)
            log.info(
                "overshot the band at step %d: back to step %d, lr %.2g, checks every %d steps",
                step, below["step"], lr_now, every,
            )  # fmt: skip
            sft.restore(below, lr_now)
            step, reward, loss_value = below["step"], below["reward"], below["loss"]
    if not done(reward):
        sft.model.load_state_dict(best["model"])
        step, reward, loss_value = best["step"], best["reward"], best["loss"]
    return step, reward, loss_value, restarts, history


def _greedy_reward(model, tokenizer, task_cfg: TaskConfig, sampling: SamplingConfig,
                   problems: int, seed: int) -> float:  # fmt: skip
    """Mean task reward of greedy completions of the check problems (for reference)."""
    from swarmrl.apps.evaluate import greedy_scores
    from swarmrl.tasks.sources.generated import GENERATORS

    gen = GENERATORS[task_cfg.name]
    checks = [gen(task_cfg, CHECK_SPLIT, i, seed) for i in range(problems)]
    greedy = greedy_scores(model, tokenizer, checks, sampling.max_new_tokens)
    return round(sum(r for _, r in greedy) / len(greedy), 4)

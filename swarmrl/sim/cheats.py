"""Dishonest workers, for `swarmrl rl --cheaters N` and the detection tests.

Each cheat is a worker that saves work or games the reward in one way, and
otherwise behaves like an honest one, so that the validator has to catch it
by that one thing:

- other-model: generates and proves with a copy of the policy moved away from
  it (every weight tensor plus 5% of its own std of noise);
- low-precision: rounds the policy weights one precision down (float32 to bfloat16,
  bfloat16 to fp8 e4m3);
- altered-prompt: generates from the assigned prompt with a system line in
  front, and reports the assigned prompt;
- cheap-tokens: makes tokens with another model (here: a fresh initialisation
  of the same architecture, standing for a smaller one) and the assigned
  seeds, then proves them honestly with one prefill of the policy;
- inflated-reward: honest generation, every reward reported as 1;
- wrong-seed: samples with seeds of its own choosing, and reports the
  assigned ones;
- truncate: cuts completions short (the end-of-sequence token included) and
  proves and scores the shortened ones honestly;
- wrong-prompts: answers problems other than the assigned ones;
- easy-level: answers problems of the easiest difficulty level (and no
  down-weighting of mastered problems) instead of the issued sampler state;
- replay: after one honest file, submits that file again, relabelled, as the
  work of every later assignment;
- copier: submits the newest file of another node (read from the run's object
  store on the emulated swarm's shared disk), relabelled with its own assignment;
- stale-policy: generates with the version before the newest it holds, claiming
  the newest;
- weight-noise: the policy moved by 0.1% of each tensor's std (other-model's
  quiet end);
- forged-tool-result, dropped-turn, edited-after-tool, loose-tool-limits: the
  cheats of multi-turn runs (sim/tool_cheats.py).

sim/registry.py names them all (`make_cheat`).

These are test fixtures of the validator, not part of an honest run. Each
is a `Cheat`: the public steps of `inference/worker.py` (plan the prompts,
complete them, score the rows, upload), of which a cheat overrides one, plus
`after_load`, which `swarmrl worker --cheat KIND` hands to `run_worker` as
its one seam for altering the model after every weights load. The worker
itself knows nothing of cheats.
"""

from __future__ import annotations

from pathlib import Path

import torch

from swarmrl.inference import worker
from swarmrl.inference.generation import Completion
from swarmrl.inference.hf import HFBackend
from swarmrl.models.prompting import encode_prompt
from swarmrl.protocol.prompts import AssignedPrompt, assigned_prompts
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.toploc.proof import build_proofs_many

SYSTEM_LINE = "You are a careful assistant.\n"


def perturb(model, scale: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.add_((noise * scale * p.float().std()).to(p.dtype))


def prove_by_prefill(backend, prompts, completions: list[list[int]]) -> list[Completion]:
    """Proofs and log-probs of given tokens from one honest prefill of `backend`'s model."""
    done = backend.prefill(prompts, completions)
    proofs = build_proofs_many([h for h, _ in done])
    out = []
    for toks, (_, logits), pr in zip(completions, done, proofs, strict=True):
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(toks)[:, None]).squeeze(-1)
        out.append(Completion(list(toks), lp.tolist(), False, pr))
    return out


class Cheat:
    """A worker that does every step of a file honestly; each cheat below overrides
    the one step it cheats in. A `FileWork` for `run_worker`, with `after_load`."""

    name = "honest"

    def after_load(self, backend) -> None:
        """Called after every weights load, before the backend is used."""

    def plan(self, cfg, source, tokenizer, a) -> list[AssignedPrompt]:
        return worker.plan_prompts(cfg, source, tokenizer, a)

    def complete(
        self, cfg, backend, plan: list[AssignedPrompt], tokenizer=None
    ) -> list[Completion]:
        return worker.complete(cfg, backend, plan, tokenizer)

    def tamper(self, cfg, tokenizer, backend, plan, rows: list[dict]) -> list[dict]:
        return rows

    def rows(self, cfg, tokenizer, source, backend, a, node) -> list[dict]:
        """The file's rows: `build_rows` of the worker, step by step."""
        cfg = worker.with_budget(cfg, a)
        plan = self.plan(cfg, source, tokenizer, a)
        made = self.complete(cfg, backend, plan, tokenizer)
        rows = worker.score_rows(cfg, tokenizer, plan, made, a, node)
        return self.tamper(cfg, tokenizer, backend, plan, rows)

    def upload(self, client, a, data: bytes) -> str:
        return worker.upload_file(client, a, data)


class OtherModel(Cheat):
    name = "other-model"

    def __init__(self, seed: int = 0, scale: float = 0.05):
        self.seed, self.scale = seed, scale

    def after_load(self, backend) -> None:
        perturb(backend.model, self.scale, self.seed)


class WeightNoise(OtherModel):
    """The policy moved by 0.1% of each tensor's std: the quiet end of other-model."""

    name = "weight-noise"

    def __init__(self, seed: int = 0):
        super().__init__(seed, scale=0.001)


class StalePolicy(Cheat):
    """Generates with the version before the newest it holds, and claims the newest:
    it saves nothing here, but a node that did so for real would skip every download
    and understate its staleness. Honest until it has held two versions."""

    name = "stale-policy"

    def __init__(self):
        self.previous: dict | None = None

    def after_load(self, backend) -> None:
        model = backend.model
        newest = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if self.previous is not None:
            with torch.no_grad():
                model.load_state_dict(self.previous)
        self.previous = newest


class Copier(Cheat):
    """Passes off another node's file as its own: it uploads the newest rollout file
    in the run's object store (`cfg.paths.store`: an emulated swarm's shared disk,
    standing for a leaked or colluding node's files) that is not its own, relabelled
    with its own node, step and policy. It makes each file honestly first, so that
    it takes the same time per file and has something to send when there is nothing
    to copy."""

    name = "copier"

    def __init__(self):
        self.store: Path | None = None

    def rows(self, cfg, tokenizer, source, backend, a, node) -> list[dict]:
        self.store = cfg.paths.store
        return super().rows(cfg, tokenizer, source, backend, a, node)

    def upload(self, client, a, data):
        mine = read_rollouts(data)[0]["node"]
        theirs = self.newest_other(mine)
        if theirs is not None:
            relabel = {"node": mine, "step": a.step, "policy_step": a.policy_step}
            data = write_rollouts([r | relabel for r in read_rollouts(theirs)])
        return worker.upload_file(client, a, data)

    def newest_other(self, mine: str) -> bytes | None:
        if self.store is None or not (self.store / "rollouts").is_dir():
            return None
        files = []
        for p in (self.store / "rollouts").rglob("*.parquet"):
            if mine in p.name:
                continue
            try:
                files.append((p.stat().st_mtime, p))
            except OSError:  # recovered: deleted since it was listed (a stale file)
                continue
        for _, path in sorted(files, reverse=True)[:5]:
            try:
                return path.read_bytes()
            except OSError:  # recovered: deleted since it was listed; the next one
                continue
        return None


# the next precision down from the policy's: a run published in bfloat16 is cheated in fp8
LOWER = {
    torch.float32: torch.bfloat16,
    torch.bfloat16: torch.float8_e4m3fn,
    torch.float16: torch.float8_e4m3fn,
}


class LowPrecision(Cheat):
    name = "low-precision"

    def after_load(self, backend) -> None:
        with torch.no_grad():
            for p in backend.model.parameters():
                p.copy_(p.to(LOWER[p.dtype]).to(p.dtype))


class AlteredPrompt(Cheat):
    name = "altered-prompt"

    def complete(self, cfg, backend, plan, tokenizer=None):
        tok = self.tokenizer
        altered = [
            AssignedPrompt(
                p.task, p.target_length, p.text, encode_prompt(tok, SYSTEM_LINE + p.text), p.seeds
            )
            for p in plan
        ]
        return super().complete(cfg, backend, altered, tokenizer)

    def plan(self, cfg, source, tokenizer, a):
        self.tokenizer = tokenizer
        return super().plan(cfg, source, tokenizer, a)


class CheapTokens(Cheat):
    name = "cheap-tokens"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.cheap: HFBackend | None = None

    def after_load(self, backend) -> None:
        if self.cheap is not None:
            return  # the cheap model does not follow the policy
        torch.manual_seed(1_000_003 + self.seed)  # not the seed any policy was built with
        self.cheap = HFBackend(dtype=backend.dtype, device=backend.device)
        dtype = next(backend.model.parameters()).dtype
        self.cheap.model = (
            type(backend.model)(backend.model.config).to(backend.device, dtype=dtype).eval()
        )
        self.cheap.eos_id, self.cheap.pad_id = backend.eos_id, backend.pad_id

    def complete(self, cfg, backend, plan, tokenizer=None):
        made = super().complete(cfg, self.cheap, plan)  # the cheap model, no proofs needed
        prompts = [p.tokens for p in plan for _ in p.seeds]
        proved = prove_by_prefill(backend, prompts, [c.tokens for c in made])
        for c, m in zip(proved, made, strict=True):
            c.finished = m.finished
        return proved


class InflatedReward(Cheat):
    name = "inflated-reward"

    def tamper(self, cfg, tokenizer, backend, plan, rows):
        for r in rows:
            r.update(reward=1.0, task_reward=1.0, length_penalty=0.0)
        return rows


class ForgedLogprobs(Cheat):
    """Samples honestly and records every log-prob 3 nats lower than the truth: a
    trainer that trusted them would weigh its tokens e^3 = 20x (π_prox/π_behav).
    A validator finds log-probs that are not the policy's; unvalidated, the
    trainer's importance correction bounds or masks the weight, and its mismatch
    singles the node out."""

    name = "forged-logprobs"
    shift = 3.0

    def tamper(self, cfg, tokenizer, backend, plan, rows):
        for r in rows:
            r["completion_logprobs"] = [x - self.shift for x in r["completion_logprobs"]]
        return rows


class WrongSeed(Cheat):
    name = "wrong-seed"

    def complete(self, cfg, backend, plan, tokenizer=None):
        """Samples with seeds of its own, and reports the assigned ones."""
        mine = [
            AssignedPrompt(p.task, p.target_length, p.text, p.tokens, [s + 1 for s in p.seeds])
            for p in plan
        ]
        return super().complete(cfg, backend, mine, tokenizer)


class Truncate(Cheat):
    name = "truncate"

    def tamper(self, cfg, tokenizer, backend, plan, rows):
        cut = [r["completion_tokens"][: max(1, len(r["completion_tokens"]) - 1)] for r in rows]
        proved = prove_by_prefill(backend, [r["prompt_tokens"] for r in rows], cut)
        out = []
        for r, c in zip(rows, proved, strict=True):
            p = plan[r["group"]]
            j = p.seeds.index(r["seed"])
            out.append(r | worker.score_row(cfg, tokenizer, p, r["group"], j, c))
        return out


class WrongPrompts(Cheat):
    name = "wrong-prompts"

    def plan(self, cfg, source, tokenizer, a):
        return assigned_prompts(cfg, source, tokenizer, a.seed + 1, a.sampler or SamplerState())


class EasyLevel(Cheat):
    name = "easy-level"

    def plan(self, cfg, source, tokenizer, a):
        return assigned_prompts(cfg, source, tokenizer, a.seed, SamplerState())


class Replay(Cheat):
    name = "replay"

    def __init__(self):
        self.first: bytes | None = None

    def upload(self, client, a, data):
        """Uploads its first file honestly, then passes that file off as the work of
        every later assignment, relabelled with its step and policy. The same bytes
        again are refused by the orchestrator; relabelled bytes are new to it, and the
        validator finds prompts that are not the assignment's."""
        if self.first is None:
            self.first = data
        else:
            rows = read_rollouts(self.first)
            data = write_rollouts(
                [r | {"step": a.step, "policy_step": a.policy_step} for r in rows]
            )
        return worker.upload_file(client, a, data)

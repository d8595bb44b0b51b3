"""The dishonest behaviours of the detection matrix (bench/verification_rates.py), beyond
the cheats of sim/cheats.py that a swarm's `--cheats` runs: fine-tuned neighbours of
the claimed policy, weights quantised in several ways, and other samplers whose tokens
are then proved honestly by one prefill of the policy (the smart form of each: its
proofs and log-probs are the policy's, so only the token choice can give it away).

Quantisation is weight-only round-to-nearest (symmetric, the absolute maximum of each
output row or group sets the scale): the arithmetic of weight-only int8 and int4 as
optimum-quanto and llama.cpp's Q8_0/Q4_0 do it, written here in a few lines so that the
bench needs no quantisation library on CPU (torchao targets GPUs; bitsandbytes' CPU
build is a fork). fp8 is torch's own e4m3 cast (sim/cheats.py `LowPrecision`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from swarmrl.inference.hf import HFBackend
from swarmrl.inference.rows import complete_with
from swarmrl.models.loading import load_model, load_tokenizer, set_config_dtype
from swarmrl.sim.cheats import Cheat, LowPrecision, perturb, prove_by_prefill
from swarmrl.sim.registry import make_cheat


class Noise(Cheat):
    """The policy with every weight tensor moved by `scale` of its own std of noise."""

    def __init__(self, scale: float, seed: int = 0):
        self.scale, self.seed, self.name = scale, seed, f"noise-{scale:g}"

    def after_load(self, backend) -> None:
        perturb(backend.model, self.scale, self.seed)


def quantize_rtn(weight: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """`weight` (out, in) rounded to `bits`-bit integers, symmetric, one scale per
    output row (`group` None) or per `group` inputs of a row; back in its dtype."""
    w = weight.float()
    out, inp = w.shape
    g = inp if group is None or inp % group else group
    blocks = w.reshape(out, inp // g, g)
    top = 2 ** (bits - 1) - 1
    scale = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / top
    q = (blocks / scale).round().clamp(-top - 1, top) * scale
    return q.reshape(out, inp).to(weight.dtype)


class Quantized(Cheat):
    """Generates with the linear layers' weights quantised (weight-only, round to
    nearest); embeddings and norms as published."""

    def __init__(self, bits: int, group: int | None, name: str):
        self.bits, self.group, self.name = bits, group, name

    def after_load(self, backend) -> None:
        with torch.no_grad():
            for m in backend.model.modules():
                if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2:
                    m.weight.copy_(quantize_rtn(m.weight, self.bits, self.group))


class OtherSampler(Cheat):
    """Samples with another temperature, top-p, or greedily (temperature near 0), with
    the assigned seeds, then proves the tokens and reports their log-probs from one
    honest prefill of the policy, claiming the run's sampler."""

    def __init__(self, name: str, temperature: float | None = None, top_p: float | None = None):
        self.name, self.temperature, self.top_p = name, temperature, top_p

    def complete(self, cfg, backend, plan, tokenizer=None):
        s = cfg.sampling
        mine = s.model_copy(
            update={
                "temperature": self.temperature or s.temperature,
                "top_p": self.top_p or s.top_p,
            }
        )
        made = complete_with(cfg.model_copy(update={"sampling": mine}), backend, plan, None, None)
        prompts = [p.tokens for p in plan for _ in p.seeds]
        proved = prove_by_prefill(backend, prompts, [c.tokens for c in made])
        for c, m in zip(proved, made, strict=True):
            c.finished = m.finished
        return proved


class HeadStart(Cheat):
    """A stale worker that hides it: it generates with an older version (it began before
    the claimed one arrived, or never fetched it while generating), then proves the
    tokens and reports their log-probs from one prefill of the claimed version. Its
    proofs and log-probs are the claimed policy's; only its token choices are the older
    policy's, which the version check's log-prob comparison cannot see."""

    def __init__(self, older: Path, name: str):
        self.older, self.name, self.engine = Path(older), name, None

    def complete(self, cfg, backend, plan, tokenizer=None):
        if self.engine is None:
            self.engine = HFBackend(device=getattr(backend, "device", "cpu"))
            self.engine.load(self.older)
        made = complete_with(cfg, self.engine, plan, None, None)
        prompts = [p.tokens for p in plan for _ in p.seeds]
        proved = prove_by_prefill(backend, prompts, [c.tokens for c in made])
        for c, m in zip(proved, made, strict=True):
            c.finished = m.finished
        return proved


def behaviours(dtype: str) -> dict[str, Cheat]:
    """The matrix's behaviours that alter a worker's model or sampler, by name, for a run
    whose versions are in `dtype` (model versions and replays are made by the bench)."""
    out: dict[str, Cheat] = {}
    for scale in (0.001, 0.01, 0.05):
        out[f"noise-{scale:g}"] = Noise(scale)
    low = LowPrecision()
    low.name = "fp8" if dtype == "bfloat16" else "bf16-claims-f32"
    out[low.name] = low
    out["int8"] = Quantized(8, None, "int8")
    out["int4"] = Quantized(4, 32, "int4")
    for t in (0.9, 1.1):
        out[f"temperature-{t:g}"] = OtherSampler(f"temperature-{t:g}", temperature=t)
    out["top-p-0.9"] = OtherSampler("top-p-0.9", top_p=0.9)
    out["greedy"] = OtherSampler("greedy", temperature=1e-4)
    for name in ("wrong-seed", "cheap-tokens", "altered-prompt", "wrong-prompts", "truncate",
                 "inflated-reward", "forged-logprobs"):  # fmt: skip
        out[name] = make_cheat(name)
    return out


def save_version(model, tokenizer_src, dtype: str, out: Path) -> Path:
    """`model` published as a version in `dtype`, as the trainer writes one."""
    copy.deepcopy(model).to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    load_tokenizer(str(tokenizer_src)).save_pretrained(out)
    set_config_dtype(out, dtype)
    return out


def fine_tuned_versions(
    source, rows: list[dict], dtypes: list[str], out: Path, keep: list[int], lr: float, inner: int
) -> dict[str, dict[int, Path]]:
    """Versions 0..max(keep) of a policy fine-tuned from `source`, saved in each of
    `dtypes` for the steps in `keep` (out/<dtype>/v<step>): each version is `inner` AdamW steps at the run's `lr` on a GRPO-shaped loss
    (the log-likelihood of `rows`' completions weighted by advantages of +1 or -1,
    seeded). Under Adam a weight moves by about lr per step whatever the advantages,
    which is what sets the distance between neighbouring versions."""
    torch.manual_seed(0)
    model = load_model(str(source)).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    seqs = [r["prompt_tokens"] + r["completion_tokens"] for r in rows]
    starts = [len(r["prompt_tokens"]) for r in rows]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    keep_mask = torch.zeros(len(seqs), width)
    for i, (s, p) in enumerate(zip(seqs, starts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        keep_mask[i, p : len(s)] = 1.0
    attention = torch.arange(width)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]
    gen = torch.Generator().manual_seed(1)
    saved: dict[str, dict[int, Path]] = {dtype: {} for dtype in dtypes}
    for version in range(max(keep) + 1):
        if version in keep:
            for dtype in dtypes:
                path = out / dtype / f"v{version}"
                saved[dtype][version] = save_version(model.eval(), source, dtype, path)
            model.train()
        for _ in range(inner):
            adv = torch.randint(0, 2, (len(seqs), 1), generator=gen).float() * 2 - 1
            logits = model(input_ids=ids, attention_mask=attention.long()).logits[:, :-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            mask = keep_mask[:, 1:]
            loss = -(adv * lp * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    return saved

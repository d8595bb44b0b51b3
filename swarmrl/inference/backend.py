"""Generation backends: the seam between the worker loop and an inference engine.

`HFBackend` runs a transformers causal LM with its own sampling loop (batched,
left-padded, KV cache, temperature, top-p). It owns the loop instead of calling
`model.generate` because swarmrl needs what `generate` does not give cleanly:
the sampler's log-prob of each chosen token, exact control of the random
stream (TOPLOC's seeded sampling check, issue 4, replaces the noise source
here), and later a hook on the last hidden state for proofs.

Randomness: one torch.Generator per call, seeded from the assignment. The
seed is recorded per sample. Per-sample seeded Gumbel-max noise, which a
validator can regenerate token by token, comes with the TOPLOC issue.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finished: bool  # ended on EOS (False: stopped at the length limit)


class GenerationBackend(Protocol):
    def load(self, path: Path) -> None: ...

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
    ) -> list[list[Completion]]: ...


def _sample(logits, temperature: float, top_p: float, generator):
    """Return (token, log-prob of token under the temperature-scaled distribution)."""
    import torch

    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p, 1, generator=generator)
        token = order.gather(-1, choice).squeeze(-1)
    else:
        token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


class HFBackend:
    """Sampling loop over a transformers model on CPU or one GPU."""

    def __init__(self, dtype: str = "float32", device: str = "cpu", max_batch: int = 256):
        self.dtype = dtype
        self.device = device
        self.max_batch = max_batch
        self.model = None
        self.eos_id: int | None = None
        self.pad_id: int | None = None

    def load(self, path: Path) -> None:
        """Load a model, or swap weights into the one already loaded (hot swap)."""
        import torch
        from safetensors.torch import load_file

        from swarmrl.models.loading import load_model

        path = Path(path)
        if self.model is None:
            self.model = load_model(str(path), self.dtype).to(self.device)
            cfg = self.model.config
            eos = cfg.eos_token_id
            self.eos_id = eos[0] if isinstance(eos, list) else eos
            self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else self.eos_id
            return
        state = {}
        for f in sorted(path.glob("*.safetensors")):
            state.update(load_file(str(f), device=self.device))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied embeddings are saved once; anything else missing is a real error.
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise RuntimeError(
                f"{path}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        with torch.no_grad():
            self.model.tie_weights()

    def generate(self, prompts, n, max_new_tokens, temperature, top_p, seed):
        import torch

        gen = torch.Generator(device=self.device).manual_seed(seed)
        flat = [p for p in prompts for _ in range(n)]
        out: list[Completion] = []
        for start in range(0, len(flat), self.max_batch):
            out.extend(
                self._generate_batch(
                    flat[start : start + self.max_batch], max_new_tokens, temperature, top_p, gen
                )
            )
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, prompts, max_new_tokens, temperature, top_p, gen):
        import torch
        from transformers import DynamicCache

        model = self.model
        b = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        tokens = torch.empty((b, 0), dtype=torch.long, device=self.device)
        logps = torch.empty((b, 0), dtype=torch.float32, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        lengths = torch.full((b,), max_new_tokens, dtype=torch.long, device=self.device)
        cache = DynamicCache()
        with torch.no_grad():
            logits = model(
                input_ids=ids,
                attention_mask=attn,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
            for t in range(max_new_tokens):
                tok, lp = _sample(logits, temperature, top_p, gen)
                tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
                tokens = torch.cat([tokens, tok[:, None]], dim=1)
                logps = torch.cat([logps, lp[:, None]], dim=1)
                newly = (~done) & (tok == self.eos_id)
                lengths = torch.where(newly, torch.full_like(lengths, t + 1), lengths)
                done = done | newly
                if bool(done.all()) or t == max_new_tokens - 1:
                    break
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
                pos = pos[:, -1:] + 1
                logits = model(
                    input_ids=tok[:, None],
                    attention_mask=attn,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=True,
                ).logits[:, -1]
        out = []
        for i in range(b):
            n_i = int(lengths[i])
            out.append(Completion(tokens[i, :n_i].tolist(), logps[i, :n_i].tolist(), bool(done[i])))
        return out

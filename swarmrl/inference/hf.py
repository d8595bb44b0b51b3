"""Generation backends: the seam between the worker loop and an inference engine.

`HFBackend` runs a transformers causal LM with its own sampling loop (batched,
left-padded, KV cache, temperature, top-p). It owns the loop instead of calling
`model.generate` because swarmrl needs what `generate` does not give cleanly:
the sampler's log-prob of each chosen token, seeded Gumbel-max sampling that a
validator can replay token by token (toploc/sampling.py), and the last hidden
state of every generated position for the TOPLOC proofs.

Each sequence has its own seed; the noise depends only on (seed, position,
token id), so the tokens of a sample do not depend on the batch it ran in.

Hidden states: a forward hook on the final norm (the input of the LM head)
keeps the last position of every forward pass, in bfloat16: the position
whose state produced the next token. `prefill` is the validator's side: one
forward over prompt + completion[:-1] that returns the same states and the
logits of the generated positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swarmrl.toploc.proof import build_proofs_many
from swarmrl.toploc.sampling import gumbel_sample


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finished: bool  # ended on EOS (False: stopped at the length limit)
    proofs: bytes = b""  # TOPLOC proofs of the generated positions (when asked for)


class GenerationBackend(Protocol):
    def load(self, path: Path) -> None: ...

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        proofs: bool = True,
    ) -> list[Completion]: ...


def final_norm(model):
    """The module whose output is the LM head's input (Llama, Qwen, Mistral... naming)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for name in ("norm", "final_layernorm", "ln_f"):
        if hasattr(decoder, name):
            return getattr(decoder, name)
    raise RuntimeError(f"{type(model).__name__}: no final norm found to hook for TOPLOC proofs")


class _LastStates:
    """Forward hook keeping the final norm's output (all positions or the last)."""

    def __init__(self, model, last_only: bool):
        self.last_only = last_only
        self.states = []
        self.handle = final_norm(model).register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        import torch

        out = output[0] if isinstance(output, tuple) else output
        self.states.append((out[:, -1] if self.last_only else out).to(torch.bfloat16))

    def close(self) -> None:
        self.handle.remove()


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

    def generate(self, prompts, seeds, max_new_tokens, temperature, top_p, proofs=True):
        """One completion per prompt, drawn with its own seed; with TOPLOC proofs if asked."""
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        out: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch):
            out.extend(
                self._generate_batch(
                    prompts[start : start + self.max_batch],
                    seeds[start : start + self.max_batch],
                    max_new_tokens,
                    temperature,
                    top_p,
                    proofs,
                )
            )
        return out

    def _generate_batch(self, prompts, seeds, max_new_tokens, temperature, top_p, proofs):
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
        seed_t = torch.tensor(seeds, dtype=torch.int64, device=self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        tokens = torch.empty((b, 0), dtype=torch.long, device=self.device)
        logps = torch.empty((b, 0), dtype=torch.float32, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        lengths = torch.full((b,), max_new_tokens, dtype=torch.long, device=self.device)
        cache = DynamicCache()
        states = _LastStates(model, last_only=True) if proofs else None
        try:
            with torch.no_grad():
                logits = model(
                    input_ids=ids,
                    attention_mask=attn,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                ).logits[:, -1]
                for t in range(max_new_tokens):
                    step = torch.full((b,), t, dtype=torch.int64, device=self.device)
                    tok, lp = gumbel_sample(logits, seed_t, step, temperature, top_p)
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
        finally:
            if states is not None:
                states.close()
        n = [int(x) for x in lengths]
        proof_bytes = [b""] * b
        if proofs:
            hidden = torch.stack(states.states, dim=1).cpu()  # (b, steps, H)
            proof_bytes = build_proofs_many([hidden[i, : n[i]] for i in range(b)])
        return [
            Completion(tokens[i, : n[i]].tolist(), logps[i, : n[i]].tolist(), bool(done[i]), pb)
            for i, pb in enumerate(proof_bytes)
        ]

    def prefill(self, prompts, completions, max_tokens: int = 16384, max_logits: int = 1 << 26):
        """All of `prefill_batches`, in input order (for callers that need every sample)."""
        out = [None] * len(prompts)
        for batch in self.prefill_batches(prompts, completions, max_tokens, max_logits):
            for j, hidden, logits in batch:
                out[j] = (hidden, logits)
        return out

    def prefill_batches(
        self, prompts, completions, max_tokens: int = 16384, max_logits: int = 1 << 26
    ):
        """The validator's pass, one batch at a time: for each (prompt, completion),
        yields (index, bf16 final-norm states (n, H), float32 logits (n, V)) of its n
        generated positions, from one forward over prompt + completion[:-1],
        left-padded like the sampling loop. A batch holds at most `max_tokens`
        padded tokens and `max_logits` logits; the caller drops each batch before
        the next is computed, so memory stays bounded whatever the file."""
        import torch

        vocab = self.model.config.vocab_size
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
        batches: list[list[int]] = [[]]
        for i in order:
            trial = batches[-1] + [i]
            width = max(len(prompts[j]) + len(completions[j]) - 1 for j in trial)
            keep = max(len(completions[j]) for j in trial)
            if batches[-1] and (
                width * len(trial) > max_tokens or keep * vocab * len(trial) > max_logits
            ):
                batches.append([i])
            else:
                batches[-1] = trial
        for batch in batches:
            if not batch:
                continue
            seqs = [(prompts[j] + completions[j])[:-1] for j in batch]
            width = max(len(x) for x in seqs)
            keep = max(len(completions[j]) for j in batch)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            attn = torch.zeros((len(batch), width), dtype=torch.long)
            for row, seq in enumerate(seqs):
                ids[row, width - len(seq) :] = torch.tensor(seq)
                attn[row, width - len(seq) :] = 1
            states = _LastStates(self.model, last_only=False)
            try:
                with torch.no_grad():
                    logits = self.model(
                        input_ids=ids.to(self.device),
                        attention_mask=attn.to(self.device),
                        position_ids=(attn.cumsum(-1) - 1).clamp(min=0).to(self.device),
                        logits_to_keep=keep,
                    ).logits
            finally:
                states.close()
            hidden = states.states[0][:, width - keep :]
            out = []
            for row, j in enumerate(batch):
                n = len(completions[j])
                out.append(
                    (j, hidden[row, keep - n :].cpu(), logits[row, keep - n :].float().cpu())
                )
            del logits, hidden, states
            yield out


VLLM_MISSING = (
    "inference.backend = 'vllm' but vLLM is not installed: `make vllm` installs it "
    "(see the README section 'vLLM backend')"
)


def resolve_backend(name: str) -> str:
    """'hf' or 'vllm' for a configured name; 'auto' takes vLLM only where it is
    installed and a CUDA GPU is present (on CPU its start-up and KV cache cost more
    than they give a worker of the local swarm; choose it with 'vllm')."""
    if name not in ("auto", "hf", "vllm"):
        raise ValueError(f"unknown inference backend {name!r} (auto, hf or vllm)")
    if name != "auto":
        return name
    import torch

    from swarmrl.inference.vllm import vllm_available

    return "vllm" if torch.cuda.is_available() and vllm_available() else "hf"


def make_backend(cfg, threads: int = 1, name: str | None = None):
    """The generation backend of a worker: the one place it is chosen."""
    inf = cfg.inference
    which = resolve_backend(name or inf.backend)
    if which == "hf":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        return HFBackend(dtype=cfg.model.dtype, device=device, max_batch=inf.max_batch)
    from swarmrl.inference.vllm import VLLMBackend, vllm_available

    if not vllm_available():
        from swarmrl.config.base import ConfigError

        raise ConfigError(VLLM_MISSING)  # the CLI prints it and exits 2
    return VLLMBackend(
        dtype=cfg.model.dtype, max_batch=inf.max_batch, kv_cache_gb=inf.kv_cache_gb,
        threads=threads, gpu_memory=inf.gpu_memory,
    )  # fmt: skip

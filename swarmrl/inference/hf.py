"""The transformers engine: generation with proofs, and the validator's prefill.

`HFBackend` runs a transformers causal LM through the decoding loop of
inference/generation.py (batched, left-padded, KV cache) with seeded
Gumbel-max sampling (temperature, top-p) as its token choice. It runs its own
loop instead of calling `model.generate` because swarmrl needs what
`generate` does not give cleanly: the sampler's log-prob of each chosen token,
sampling that a validator can replay token by token (toploc/sampling.py), and
the last hidden state of every generated position for the TOPLOC proofs.

Each sequence has its own seed; the noise depends only on (seed, position,
token id), so the tokens of a sample do not depend on the batch it ran in.

Hidden states: a forward hook on the final norm (the input of the LM head)
keeps the last position of every forward pass, in bfloat16: the position
whose state produced the next token. `prefill` is the validator's side: one
forward over prompt + completion[:-1] that returns the same states and the
logits of the generated positions. It is this engine's alone: the factory
(inference/engine.py) gives it to every caller that needs a prefill.
"""

from __future__ import annotations

from pathlib import Path

from swarmrl.inference.generation import Completion, decode, distinct_prompts
from swarmrl.toploc.proof import build_proofs_many
from swarmrl.toploc.sampling import gumbel_sample


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


def float32_head(model) -> None:
    """Compute the LM head in float32 when the model runs in a lower precision.

    A bfloat16 logit has 8 bits of mantissa: at a magnitude of 16 to 32 its step is
    0.125, so a worker's decode and a validator's prefill, which round differently,
    disagree by tenths of a logit, and the sampling and log-prob checks must allow
    that much. The head's input (the final-norm state) and weight are upcast and
    the product taken in float32; the weight's float32 copy is kept while the
    weight is unchanged (a hot swap writes it in place, which bumps its version).
    Both engines' users (worker and validator) get the same head."""
    import types

    import torch

    head = model.get_output_embeddings()
    if head is None or head.weight.dtype == torch.float32:
        return
    head._float32 = (None, -1)

    def forward(self, x):
        weight, seen = self._float32
        if weight is None or seen != self.weight._version:
            weight = self.weight.detach().float()
            self._float32 = (weight, self.weight._version)
        bias = None if self.bias is None else self.bias.float()
        return torch.nn.functional.linear(x.float(), weight, bias)

    head.forward = types.MethodType(forward, head)


class HFBackend:
    """The engine over a transformers model on CPU or one GPU: `generate` and `prefill`.

    `dtype` 'auto' runs each version in the dtype its files hold (the trainer's
    `model.publish_dtype`; float32 for a GGUF file); a dtype name casts to it."""

    def __init__(self, dtype: str = "auto", device: str = "cpu", max_batch: int = 256):
        self.dtype = dtype
        self.device = device
        self.max_batch = max_batch
        self.model = None
        self.eos_id: int | None = None
        self.pad_id: int | None = None

    @classmethod
    def around(cls, model, max_batch: int = 256) -> HFBackend:
        """An engine over a model already in memory (on the CPU), which it does not copy."""
        engine = cls(max_batch=max_batch)
        engine._adopt(model)
        return engine

    def _adopt(self, model) -> None:
        self.model = model
        float32_head(model)
        cfg = model.config
        eos = cfg.eos_token_id
        self.eos_id = eos[0] if isinstance(eos, list) else eos
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else self.eos_id

    def load(self, path: Path) -> None:
        """Load a model, or swap weights into the one already loaded (hot swap)."""
        import torch
        from safetensors.torch import load_file

        from swarmrl.models.loading import load_model

        path = Path(path)
        want = self.run_dtype_for(path)
        gguf = not path.is_dir()  # "smollm2" or a .gguf file: no safetensors to swap in
        if self.model is None or self.running_dtype != want or gguf:  # first load, a new dtype
            self.model = None
            self._adopt(load_model(str(path), want).to(self.device))
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

    def run_dtype_for(self, path: Path) -> str:
        """The dtype a version at `path` runs in on this engine."""
        from swarmrl.models.loading import stored_dtype

        if self.dtype != "auto":
            return self.dtype
        return stored_dtype(path) or "float32"

    @property
    def running_dtype(self) -> str | None:
        """The dtype of the loaded model's weights ('float32', 'bfloat16'), None before."""
        if self.model is None:
            return None
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

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

        seed_t = torch.tensor(seeds, dtype=torch.int64, device=self.device)

        def choose(logits, t: int):
            step = torch.full((len(prompts),), t, dtype=torch.int64, device=self.device)
            return gumbel_sample(logits, seed_t, step, temperature, top_p)

        states = _LastStates(self.model, last_only=True) if proofs else None
        try:
            out = decode(self.model, prompts, max_new_tokens, choose, [self.eos_id], self.pad_id,
                         share_prompts=True)  # fmt: skip
        finally:
            if states is not None:
                states.close()
        if proofs:  # the prompt pass ran once per distinct prompt: its states to every row
            _, index = distinct_prompts(prompts)
            states.states[0] = states.states[0][torch.tensor(index, device=states.states[0].device)]
            hidden = torch.stack(states.states, dim=1).cpu()  # (b, steps, H)
            proofs = build_proofs_many([hidden[i, : len(c.tokens)] for i, c in enumerate(out)])
            for c, pb in zip(out, proofs, strict=True):
                c.proofs = pb
        return out

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
        left-padded like the sampling loop; where samples of a batch share a prompt
        (a group), it runs once (`_prefill_shared`). A batch holds at most `max_tokens`
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
            if len({tuple(prompts[j]) for j in batch}) < len(batch):
                yield self._prefill_shared(batch, prompts, completions)
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

    def _prefill_shared(self, batch: list[int], prompts, completions) -> list:
        """One batch of `prefill_batches` with each distinct prompt run once, laid out
        as the sampling loop lays out a file (inference/generation.py: prompts
        left-padded to one width, each row's keys and values copied from its prompt's,
        the completions after them): the prompt pass's last position scores each
        completion's first token, one pass over the completions (last token dropped)
        the rest. A group's samples share their prompt, so this runs a file's
        prompt tokens once per group instead of once per sample."""
        import torch
        from transformers import DynamicCache

        from swarmrl.inference.generation import with_cache

        dev, model = self.device, self.model
        ps = [prompts[j] for j in batch]
        firsts, index = distinct_prompts(ps)
        width = max(len(x) for x in ps)
        ids = torch.full((len(ps), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(ps), width), dtype=torch.long)
        for row, x in enumerate(ps):
            ids[row, width - len(x) :] = torch.tensor(x)
            attn[row, width - len(x) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        rows, place = torch.tensor(firsts), torch.tensor(index, device=dev)
        cache = DynamicCache()
        states = _LastStates(model, last_only=True)
        try:
            with torch.no_grad():
                logits = model(
                    input_ids=ids[rows].to(dev), attention_mask=attn[rows].to(dev),
                    position_ids=pos[rows].to(dev), **with_cache(model, cache),
                    use_cache=True, logits_to_keep=1,
                ).logits[:, -1][place]  # fmt: skip
        finally:
            states.close()
        hidden = states.states[0][place]
        rest = max(len(completions[j]) for j in batch) - 1
        if rest > 0:
            cache.reorder_cache(place)
            c_ids = torch.full((len(ps), rest), self.pad_id, dtype=torch.long)
            for row, j in enumerate(batch):
                c = completions[j][:-1]
                c_ids[row, : len(c)] = torch.tensor(c, dtype=torch.long)
            c_attn = torch.cat([attn, torch.ones((len(ps), rest), dtype=torch.long)], dim=1)
            c_pos = pos[:, -1:] + 1 + torch.arange(rest)
            c_states = _LastStates(model, last_only=False)
            try:
                with torch.no_grad():
                    c_logits = model(
                        input_ids=c_ids.to(dev), attention_mask=c_attn.to(dev),
                        position_ids=c_pos.to(dev), **with_cache(model, cache), use_cache=True,
                    ).logits  # fmt: skip
            finally:
                c_states.close()
            c_hidden = c_states.states[0]
        out = []
        for row, j in enumerate(batch):
            n = len(completions[j])
            h, lg = hidden[row : row + 1], logits[row : row + 1]
            if n > 1:
                h = torch.cat([h, c_hidden[row, : n - 1]])
                lg = torch.cat([lg, c_logits[row, : n - 1]])
            out.append((j, h.cpu(), lg.float().cpu()))
        return out

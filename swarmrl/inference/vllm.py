"""The vLLM generation backend: vLLM's engine with swarmrl's sampler and proofs.

vLLM schedules, batches and runs the forward passes (paged KV cache, its CPU
or GPU kernels); swarmrl keeps the two things a validator checks:

- **Sampling.** `GumbelSampler`, a vLLM logits processor, picks every token
  by the same seeded Gumbel-max rule as the HF backend (`gumbel_sample`, the
  same function on the same float32 logits): per row, the sample's seed comes
  from the request's `extra_args`, the position is the length of its output
  so far. It writes the chosen token as the only finite logit and the request
  runs greedy, so vLLM's own sampler takes exactly that token. The log-prob
  under softmax(logits / T) is recorded beside it.
- **Hidden states.** The model's `compute_logits` is wrapped (through the
  worker RPC, once) to keep its input: the final-norm states of the rows
  about to be sampled, in the batch's row order. The logits processor, called
  next in the same step, files row i's state under row i's sample at its
  position. It lies outside vLLM's compiled graph, so it works with
  compilation on. TOPLOC proofs are then built from them as in the HF path.

Both land in a registry in this process: the engine runs in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so no data crosses a process boundary
and scripts need no spawn guard. A position computed more than once (a
chunked prefill, a preempted request recomputed) is overwritten: the last
computation is the one vLLM kept. After each call the tokens vLLM returns are
compared with the recorded choices; any difference is an error, not a file.

Weights are swapped in place with the model runner's `reload_weights`
(vLLM's CPU backend repacks linear weights, so loading into the module
directly is wrong), then the prefix cache is reset. vLLM's own weight
checksums are empty on its CPU build, so `load` compares the engine's
unpacked tensors (the norms, and the embedding rows without vLLM's vocabulary
padding) with the files it just loaded: a reload that silently kept the old
version fails there. The linear layers, repacked, are not compared; a wrong
one would fail the validator's proofs.

vLLM's CPU worker replaces `torch.set_num_threads` for the whole process:
run this backend in a process of its own (a worker is one).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmrl.inference.generation import Completion
from swarmrl.toploc.proof import build_proofs_many
from swarmrl.toploc.sampling import gumbel_sample

log = logging.getLogger("swarmrl.vllm")

EXTRA_KEY = "swarmrl"


@dataclass
class _Sample:
    """What the sampler recorded for one request, by position."""

    seed: int
    temperature: float
    top_p: float
    offset: int = 0  # the Gumbel noise's position of output token 0 (a trajectory's turn)
    tokens: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, float] = field(default_factory=dict)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class Turn:
    """One sample of `VLLMBackend.sample`: its tokens, their log-probs, whether it
    ended on end of sequence, and the states that predicted them ([n, hidden])."""

    tokens: list[int]
    logprobs: list[float]
    finished: bool
    hidden: torch.Tensor | None = None


class _Registry:
    """In-process state shared by the backend, the logits processor and the hook."""

    def __init__(self):
        self.samples: dict[str, _Sample] = {}
        self.hidden: torch.Tensor | None = None  # input of the last compute_logits
        self.capture = True

    def take_hidden(self, rows: int) -> torch.Tensor | None:
        h, self.hidden = self.hidden, None
        if not self.capture:
            return None
        if h is None or h.shape[0] != rows:
            raise RuntimeError(
                f"vLLM sampled {rows} rows but the hidden-state hook saw "
                f"{None if h is None else h.shape[0]}: this vLLM version runs "
                "compute_logits differently (speculative decoding is not supported)"
            )
        return h


REGISTRY = _Registry()


def _processor_class():
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class GumbelSampler(LogitsProcessor):
        """Seeded Gumbel-max sampling of swarmrl's requests (see the module docstring)."""

        def __init__(self, vllm_config, device, is_pin_memory):
            self.rows: dict[int, tuple[str, list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the argmax: applied before vLLM's greedy pick

        def update_state(self, batch_update) -> None:
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for i, params, _prompt, output in batch_update.added:
                extra = (params.extra_args or {}).get(EXTRA_KEY)
                if extra is None:
                    self.rows.pop(i, None)
                else:
                    self.rows[i] = (extra, output)
            for a, b, how in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and how.name == "SWAP":
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            mine = [(i, key, len(out)) for i, (key, out) in self.rows.items()]
            if not mine:
                REGISTRY.hidden = None
                return logits
            hidden = REGISTRY.take_hidden(logits.shape[0])
            groups: dict[tuple[float, float], list[tuple[int, str, int]]] = {}
            for i, key, pos in list(mine):
                s = REGISTRY.samples.get(key)
                if s is None:  # left in the engine by a call that failed: not sampled by us
                    continue
                groups.setdefault((s.temperature, s.top_p), []).append((i, key, pos))
            for (temperature, top_p), rows in groups.items():
                idx = torch.tensor([r[0] for r in rows], device=logits.device)
                seeds = torch.tensor(
                    [REGISTRY.samples[k].seed for _, k, _ in rows], dtype=torch.int64
                )
                positions = torch.tensor(
                    [p + REGISTRY.samples[k].offset for _, k, p in rows], dtype=torch.int64
                )
                sub = logits.index_select(0, idx)
                tok, lp = gumbel_sample(
                    sub, seeds.to(sub.device), positions.to(sub.device), temperature, top_p
                )
                forced = torch.full_like(sub, float("-inf"))
                forced.scatter_(1, tok[:, None], 0.0)
                logits.index_copy_(0, idx, forced)
                tok, lp = tok.tolist(), lp.tolist()
                states = None
                if hidden is not None:  # one conversion per step; rows are views of it
                    states = hidden.index_select(0, idx).to(device="cpu", dtype=torch.bfloat16)
                for j, (_, key, pos) in enumerate(rows):
                    s = REGISTRY.samples[key]
                    s.tokens[pos], s.logprobs[pos] = tok[j], lp[j]
                    if states is not None:
                        s.hidden[pos] = states[j]
            return logits

    return GumbelSampler


def _install_hook(worker) -> str:
    """Runs inside vLLM's worker (collective_rpc): keep compute_logits' input."""
    model = worker.model_runner.get_model()
    if getattr(model, "_swarmrl_hooked", False):
        return "already"
    inner = model.compute_logits

    def compute_logits(hidden_states, *args, **kwargs):
        REGISTRY.hidden = hidden_states
        return inner(hidden_states, *args, **kwargs)

    model.compute_logits = compute_logits
    model._swarmrl_hooked = True
    return type(model).__name__


def _reload(worker, path: str) -> None:
    worker.model_runner.reload_weights(weights_path=path)


def _check_loaded(worker, path: str) -> tuple[int, list[str]]:
    """Runs inside vLLM's worker: compare the engine's 1-D parameters and embedding
    rows (kept as loaded on every backend; vLLM pads the vocabulary rows) with the
    files, reading only those tensors. Returns (tensors compared, names that differ)."""
    from safetensors import safe_open

    params = {
        name: p
        for name, p in worker.model_runner.get_model().named_parameters()
        if p.dim() == 1 or name.endswith("embed_tokens.weight")
    }
    checked, differ = 0, []
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in params.keys() & set(st.keys()):
                mine, p = st.get_tensor(name), params[name].detach()
                if mine.dim() != p.dim() or mine.shape[1:] != p.shape[1:]:
                    continue
                if mine.shape[0] > p.shape[0]:
                    continue
                checked += 1
                if not torch.equal(mine.to(device=p.device, dtype=p.dtype), p[: mine.shape[0]]):
                    differ.append(name)
    return checked, differ


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


class VLLMBackend:
    """`Engine` (inference/engine.py) on vLLM (CPU build or CUDA), loaded once per process."""

    def __init__(
        self,
        dtype: str = "auto",
        max_batch: int = 256,
        kv_cache_gb: int = 2,
        threads: int | None = None,
        max_model_len: int | None = None,
        gpu_memory: float = 0.9,
    ):
        self.dtype = dtype
        self.running_dtype: str | None = None  # set when the engine starts
        self.gpu_memory = gpu_memory
        self.max_batch = max_batch
        self.kv_cache_gb = kv_cache_gb
        self.threads = threads
        self.max_model_len = max_model_len
        self.llm = None
        self.eos_id: int | None = None
        self.pad_id: int | None = None
        self.calls = 0
        self.swap_s: float | None = None

    def _environment(self) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # The logits processor is a V1 one: vLLM 0.32's V2 model runner (its default
        # where Triton has a GPU backend) accepts only its own processor class.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(self.kv_cache_gb)))
            if self.threads:
                # Bound to no core: several workers may share a machine.
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
                os.environ.setdefault("OMP_NUM_THREADS", str(self.threads))
                torch.set_num_threads(self.threads)

    def load(self, path: Path) -> None:
        """Start the engine on the first version; later versions are swapped in place."""
        path = Path(path)
        if self.llm is None:
            self._start(path)
        else:
            if self.run_dtype_for(path) != self.running_dtype:
                raise RuntimeError(
                    f"{path} holds {self.run_dtype_for(path)} weights; this vLLM engine runs "
                    f"{self.running_dtype} (restart the worker to change dtype)"
                )
            t0 = time.perf_counter()
            self.llm.collective_rpc(_reload, args=(str(path),))
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM could not reset its prefix cache after a weights swap")
            self.swap_s = time.perf_counter() - t0
        self._verify(path)

    def run_dtype_for(self, path: Path) -> str:
        """The dtype a version at `path` runs in: its files' with 'auto' (vLLM's own
        'auto' would run float32 weights in float16)."""
        from swarmrl.models.loading import stored_dtype

        if self.dtype != "auto":
            return self.dtype
        return stored_dtype(path) or "float32"

    def _start(self, path: Path) -> None:
        self._environment()
        from transformers import AutoConfig
        from vllm import LLM

        cfg = AutoConfig.from_pretrained(str(path))
        eos = cfg.eos_token_id
        self.eos_id = eos[0] if isinstance(eos, list) else eos
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else self.eos_id
        kwargs = {}
        if self.max_model_len:
            kwargs["max_model_len"] = self.max_model_len
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = self.gpu_memory
        self.running_dtype = self.run_dtype_for(path)
        self.llm = LLM(
            model=str(path),
            dtype=self.running_dtype,
            skip_tokenizer_init=True,
            logits_processors=[_processor_class()],
            max_num_seqs=self.max_batch,
            seed=0,
            **kwargs,
        )
        names = self.llm.collective_rpc(_install_hook)
        log.info("vLLM engine on %s (hidden-state hook on %s)", path, names[0])

    def _verify(self, path: Path) -> None:
        checked, differ = self.llm.collective_rpc(_check_loaded, args=(str(path),))[0]
        if differ:
            raise RuntimeError(f"{path}: vLLM did not load {differ[:3]} (the engine's differ)")
        if checked == 0:
            raise RuntimeError(f"{path}: no engine parameter could be compared with the files")

    def generate(self, prompts, seeds, max_new_tokens, temperature, top_p, proofs=True):
        """One completion per prompt, drawn with its own seed; with TOPLOC proofs if asked."""
        turns = self.sample(
            prompts, seeds, [max_new_tokens] * len(prompts), [0] * len(prompts),
            temperature, top_p, proofs,
        )  # fmt: skip
        done = [Completion(t.tokens, t.logprobs, t.finished) for t in turns]
        if proofs:
            for c, pb in zip(done, build_proofs_many([t.hidden for t in turns]), strict=True):
                c.proofs = pb
        return done

    def sample(
        self, prompts, seeds, max_tokens: list[int], offsets: list[int], temperature: float,
        top_p: float, capture: bool = True,
    ) -> list[Turn]:  # fmt: skip
        """One sample per prompt, each up to its `max_tokens` or end of sequence, with
        its own seed and the Gumbel positions starting at its `offset` (a trajectory's
        turn: the completion's length so far); `capture`: keep the final-norm state
        that predicted each token (`Turn.hidden`)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not len(prompts) == len(seeds) == len(max_tokens) == len(offsets):
            raise ValueError(
                f"{len(prompts)} prompts, {len(seeds)} seeds, {len(max_tokens)} lengths and "
                f"{len(offsets)} offsets: one of each per sample"
            )
        self.calls += 1
        keys = [f"{self.calls}:{i}" for i in range(len(prompts))]
        for key, seed, offset in zip(keys, seeds, offsets, strict=True):
            REGISTRY.samples[key] = _Sample(int(seed), float(temperature), float(top_p), offset)
        REGISTRY.capture = capture
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=int(n),
                stop_token_ids=[self.eos_id],  # the HF rule: this one token ends a sample,
                ignore_eos=True,  # not the other EOS ids a generation_config may list
                detokenize=False,
                extra_args={EXTRA_KEY: key},
            )
            for key, n in zip(keys, max_tokens, strict=True)
        ]
        try:
            outs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
            )
            return [
                self._collect(out, key, capture, n)
                for out, key, n in zip(outs, keys, max_tokens, strict=True)
            ]
        finally:
            for key in keys:
                REGISTRY.samples.pop(key, None)

    def last_states(self, prefixes: list[list[int]]) -> list[torch.Tensor]:
        """The final-norm state at the last position of each token sequence (bfloat16,
        on the CPU): what predicts the token after it. A trajectory's proofs need it
        at the positions of the environment's tokens, which vLLM computes only inside
        a prefill, where its logits are not taken."""
        turns = self.sample(prefixes, [0] * len(prefixes), [1] * len(prefixes),
                            [0] * len(prefixes), 1.0, 1.0)  # fmt: skip
        return [t.hidden[0] for t in turns]

    def _collect(self, out, key: str, capture: bool, max_tokens: int) -> Turn:
        s = REGISTRY.samples[key]
        tokens = list(out.outputs[0].token_ids)
        n = len(tokens)
        recorded = [s.tokens.get(t) for t in range(n)]
        if recorded != tokens:
            raise RuntimeError(
                f"vLLM returned tokens {tokens[:8]}... that the seeded sampler did not "
                f"choose {recorded[:8]}...: its logits processors ran differently"
            )
        finished = n > 0 and tokens[-1] == self.eos_id
        if not finished and n < max_tokens:
            raise RuntimeError(
                f"vLLM stopped a sample after {n} of {max_tokens} tokens without EOS "
                f"({out.outputs[0].finish_reason}): raise the engine's max_model_len"
            )
        hidden = None
        if capture:
            missing = [t for t in range(n) if t not in s.hidden]
            if missing:
                raise RuntimeError(f"no hidden state captured at positions {missing[:5]}")
            hidden = torch.stack([s.hidden[t] for t in range(n)])
        return Turn(tokens, [s.logprobs[t] for t in range(n)], finished, hidden)

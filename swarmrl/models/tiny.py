"""The built-in tiny model: a few-million-parameter Llama with a character tokenizer.

`swarmrl init-model --task T --out DIR` builds it, warm-starts it with a
supervised pass on generated problems of task T (prompt + "\n" → answer + EOS,
loss on the answer only) until its sampled reward at the run's temperature
lies in a target band (apps/warm_start.py), and saves a normal HF directory
(config, safetensors, tokenizer) with a manifest, so it loads like any other
model and is version 0 of a run. `warm_start.json` beside the weights records
the measured starting reward and how it was measured.
"""

from __future__ import annotations

import logging
import string
import time
from pathlib import Path

from swarmrl.apps.warm_start import Band, WarmStartResult, warm_start
from swarmrl.config import SamplingConfig, TaskConfig

log = logging.getLogger(__name__)
WARM_START_FILE = "warm_start.json"

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    return tok


def build_tiny_model(tokenizer, hidden: int = 192, layers: int = 4, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=hidden // 32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg)


def init_model(
    task_cfg: TaskConfig,
    sampling: SamplingConfig,
    out: Path,
    band: Band | None = None,
    max_steps: int = 3000,
    batch: int = 64,
    lr: float = 2e-3,
    hidden: int = 192,
    layers: int = 4,
    seed: int = 0,
    threads: int = 1,
) -> WarmStartResult:
    import torch

    from swarmrl.protocol.manifest import write_json_atomic, write_manifest

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.time()
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden=hidden, layers=layers, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("tiny model: %.2fM parameters, vocab %d", n_params / 1e6, len(tok))
    result = warm_start(
        model, tok, task_cfg, sampling, band or Band(), max_steps, batch, lr, seed, threads=threads
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_json_atomic(out / WARM_START_FILE, result.to_json() | {"task": task_cfg.model_dump()})
    write_manifest(out, version=0)
    log.info(
        "saved %s: %d warm-start steps, sampled reward %.3f at temperature %g (%s band %.2f-%.2f), "
        "%.1fs",
        out, result.steps, result.sampled_reward, result.temperature,
        "inside the" if result.in_band else "OUTSIDE the", *result.band, time.time() - t0,
    )  # fmt: skip
    return result

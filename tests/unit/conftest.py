"""Unit-test fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture
def key(tmp_path):
    """The trainer's signing key, in a fresh key file."""
    from swarmrl.protocol.identity import load_or_create_key

    return load_or_create_key(tmp_path / "keys" / "trainer.key")

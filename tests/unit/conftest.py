"""Unit-test fixtures (`orch`: the orchestrator tests' in-process orchestrator; `tiny_dir`:
a tiny model on disk)."""

from __future__ import annotations

import pytest

from tests.unit.orch_util import Orch, new_pg_database, postgres_url  # noqa: F401


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny model directory (hidden 64, 2 layers) with its character tokenizer."""
    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

    d = tmp_path_factory.mktemp("tiny")
    tok = build_char_tokenizer()
    build_tiny_model(tok, hidden=64, layers=2, seed=4).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def key(tmp_path):
    """The trainer's signing key, in a fresh key file."""
    from swarmrl.protocol.identity import load_or_create_key

    return load_or_create_key(tmp_path / "keys" / "trainer.key")


@pytest.fixture(params=["sqlite", "postgres"])
def orch(request, tmp_path):
    """`orch(*overrides)` makes an Orch on SQLite, then (second param) on a fresh
    PostgreSQL database; skipped there without a server (`postgres_url`)."""
    made: list[Orch] = []

    def make(*overrides: str) -> Orch:
        if request.param == "sqlite":
            made.append(Orch(tmp_path, *overrides))
        else:
            base = request.getfixturevalue("postgres_url")
            db = new_pg_database(base, tmp_path.name.lower())
            made.append(Orch(tmp_path, *overrides, database=db))
        return made[-1]

    yield make
    for o in made:  # PostgreSQL's connections are a limited resource
        o.svc.db.close()

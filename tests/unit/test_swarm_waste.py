"""bench/swarm_fates.py's account of honest work wasted: why each honest file made was
not trained, and the fraction issue 52's done-when reads (`honest_waste_fraction`)."""

from __future__ import annotations

from bench.swarm_fates import honest_waste, waste


def _row(state: str, void: int = 0, check: str | None = None) -> dict:
    return {"state": state, "void": void, "check_name": check}


def test_each_untrained_honest_file_has_one_reason():
    sent = {"fate": "submitted"}
    assert waste(sent, _row("trained"), killed=False) is None
    assert waste(sent, _row("stale"), killed=False) == "stale"
    assert waste(sent, _row("discarded"), killed=False) == "stale"  # stale, object deleted
    assert waste(sent, _row("trained", void=1), killed=False) == "voided"
    assert (
        waste(sent, _row("rejected", check="unverifiable"), killed=False) == "refused_blamelessly"
    )
    assert waste(sent, _row("rejected", check="trainer"), killed=False) == "refused_blamelessly"
    assert waste(sent, _row("rejected", check="sampling"), killed=False) == "rejected"
    assert waste(sent, None, killed=False) == "lost"  # submitted, the ledger lacks it
    assert waste({"fate": "held"}, None, killed=True) == "churn"
    assert waste({"fate": "held"}, None, killed=False) == "lost"
    assert waste({"fate": "refused"}, None, killed=False) == "refused_upload"


def test_the_waste_fraction_counts_lost_files_and_not_the_queue_at_the_end():
    """10 files made: 2 stale, 1 refused blamelessly, 1 lost, 3 still queued when the
    run stopped (a longer run trains them): (2 + 1 + 1) / 10."""
    opened = {"honest_files_made": 10, "lost": 1,
              "wasted": {"stale": 2, "refused_blamelessly": 1, "unused_at_end": 3}}  # fmt: skip
    assert honest_waste(opened) == 0.4
    assert honest_waste({"honest_files_made": 0, "lost": 0, "wasted": {}}) is None

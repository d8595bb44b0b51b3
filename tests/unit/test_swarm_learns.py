"""bench/swarm_learns.py's reading of a run's held-out scores (eval.json)."""

from __future__ import annotations

from bench.swarm_learns import gain


def test_the_gain_is_in_points_and_missing_without_a_final_score():
    evals = {"start_model": {"accuracy": 0.045}, "final_model": {"accuracy": 0.7}}
    assert gain(evals) == (0.045, 0.7, 65.5)
    assert gain({"start_model": {"accuracy": 0.045}}) == (0.045, None, None)

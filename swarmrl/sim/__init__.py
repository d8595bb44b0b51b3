"""Dishonest workers, for the cheating demo (`swarmrl rl --cheaters N`) and the
tests that show validators catch them."""

"""Every dishonest worker by name (`swarmrl rl --cheats`, `swarmrl worker --cheat`):
the single-turn ones of sim/cheats.py and the multi-turn ones of sim/tool_cheats.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

from swarmrl.sim.cheats import (
    AlteredPrompt,
    CheapTokens,
    Cheat,
    Copier,
    EasyLevel,
    ForgedLogprobs,
    InflatedReward,
    LowPrecision,
    OtherModel,
    Replay,
    StalePolicy,
    Truncate,
    WeightNoise,
    WrongPrompts,
    WrongSeed,
)
from swarmrl.sim.tool_cheats import TOOL_CHEATS

CHEATS = {
    c.name: c
    for c in (
        OtherModel,
        LowPrecision,
        AlteredPrompt,
        CheapTokens,
        InflatedReward,
        ForgedLogprobs,
        WrongSeed,
        Truncate,
        WrongPrompts,
        EasyLevel,
        Replay,
        Copier,
        StalePolicy,
        WeightNoise,
        *TOOL_CHEATS,
    )
}
RL_CHEATS = ["other-model", "low-precision", "altered-prompt", "cheap-tokens", "inflated-reward"]
# cheats of a run's environment: in a run without [env] they are honest workers
MULTI_TURN_CHEATS = [c.name for c in TOOL_CHEATS]
# cheats not every file of which can be told from honest work: the validator's limits
# (docs/verification.md) or nothing to copy yet; bench/swarm_scale.py counts what of
# theirs was trained
QUIET_CHEATS = ["stale-policy", "weight-noise", "copier"]
SINGLE_TURN_CHEATS = [n for n in CHEATS if n not in MULTI_TURN_CHEATS + QUIET_CHEATS]


def seed_from_home(home: Path) -> int:
    """A cheat's seed for a node home (`swarmrl worker --cheat`): nodes differ in it."""
    return int(hashlib.sha256(str(home).encode()).hexdigest()[:6], 16)


def make_cheat(name: str, seed: int = 0) -> Cheat:
    if name not in CHEATS:
        raise ValueError(f"unknown cheat '{name}'; known: {', '.join(CHEATS)}")
    cls = CHEATS[name]
    return cls(seed=seed) if name in ("other-model", "cheap-tokens", "weight-noise") else cls()

"""The sampler state an assignment carries, and the prompt draw it fixes.

The trainer's curriculum (tasks/curriculum.py) issues a `SamplerState` per
step: the difficulty level of generated tasks, and the down-weighted problems
of a file dataset. Together with the assignment's seed it fixes every problem
index of a file (`draw_indices`), so a worker and a validator draw the same
problems and a worker cannot pick its own. Drawing is rejection sampling over
hashed candidates: a pure function of (seed, state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmrl.protocol.digits import ascii_int
from swarmrl.protocol.seeds import derive_seed

MAX_DRAWS = 64  # candidates tried per prompt before taking the last one
MAX_STATE_BYTES = 64 << 20  # a state larger than this is refused when read


class SamplerStateError(ValueError):
    """A malformed sampler state; the message names the field."""


@dataclass(frozen=True)
class SamplerState:
    """What an assignment carries besides its seed: the difficulty level, and the
    down-weighted problems of a file dataset (record index → weight < 1)."""

    level: int = 0
    weights: dict[int, float] = field(default_factory=dict)

    def weight(self, index: int) -> float:
        return self.weights.get(index, 1.0)

    def to_json(self) -> dict:
        return {"level": self.level, "weights": {str(k): v for k, v in self.weights.items()}}

    @classmethod
    def from_json(cls, data: object) -> SamplerState:
        if not isinstance(data, dict) or set(data) - {"level", "weights"}:
            raise SamplerStateError(f"sampler state must be {{level, weights}}, got {data!r:.80}")
        level = data.get("level", 0)
        if type(level) is not int or not 0 <= level <= 1000:
            raise SamplerStateError(f"sampler state: field 'level': bad value {level!r:.40}")
        raw = data.get("weights", {})
        if not isinstance(raw, dict):
            raise SamplerStateError("sampler state: field 'weights' must be an object")
        weights = {}
        for k, v in raw.items():
            index = ascii_int(k, max_digits=9)
            if index is None or type(v) not in (int, float):
                raise SamplerStateError(f"sampler state: field 'weights': bad entry {k!r:.20}")
            if not 0.0 < v < 1.0:
                raise SamplerStateError(f"sampler state: weight of {k} is {v}, not in (0, 1)")
            weights[index] = float(v)
        return cls(level=level, weights=weights)


def draw_indices(seed: int, count: int, state: SamplerState, n_records: int | None) -> list[int]:
    """The problem indices of one file. Generated tasks (n_records None): any
    index; a dataset: record indices, down-weighted ones accepted with their
    weight."""
    out = []
    for i in range(count):
        if n_records is None:
            out.append(derive_seed(seed, "prompt", i) % (1 << 40))
            continue
        for attempt in range(MAX_DRAWS):
            index = derive_seed(seed, "prompt", i, attempt) % n_records
            w = state.weight(index)
            if w >= 1.0 or derive_seed(seed, "accept", i, attempt) / 2**63 < w:
                break
        out.append(index)
    return out

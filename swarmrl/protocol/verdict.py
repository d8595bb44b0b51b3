"""Verdicts: the signed record a validator posts for each file it judged.

A verdict is the record the orchestrator keeps for each submitted file:
which file (store key and sha256), whose (node key), for which step and policy
version, accept or reject, the check that failed with a reason and the failing
sample indices, the statistics of the checks, and the validator's key and
ed25519 signature over "swarmrl-verdict-v1\\n" + the canonical JSON of the
record with an empty signature. The orchestrator accepts a verdict only from
a validator key of its config that signed it, and lists it with the file; the
trainer checks the signature again against the validator keys it was given.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from swarmrl.protocol.identity import sign, verify

PAYLOAD_PREFIX = b"swarmrl-verdict-v1\n"
# A rejection with one of these checks blames no one: the validator's own failure
# (`error`), or a tool answer the validator cannot settle (`unverifiable`: a Python
# program at its time limit or with output that changes between runs).
BLAMELESS_CHECKS = ("error", "unverifiable")


@dataclass
class Verdict:
    key: str
    sha256: str
    node: str
    step: int
    policy_step: int
    accepted: bool
    check: str = ""  # the check that failed ("" when accepted)
    reason: str = ""
    samples: list[int] = field(default_factory=list)
    n_samples: int = 0
    n_tokens: int = 0
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    time: float = 0.0
    validator: str = ""
    signature: str = ""

    def payload(self) -> bytes:
        body = asdict(self) | {"signature": ""}
        return PAYLOAD_PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, key) -> Verdict:
        from swarmrl.protocol.identity import public_key_hex

        self.validator = public_key_hex(key)
        self.signature = ""
        self.signature = sign(key, self.payload())
        return self

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


_TYPES = {"key": str, "sha256": str, "accepted": bool, "validator": str, "signature": str}


def read_verdict(data: bytes, trusted: list[str]) -> Verdict | None:
    """The verdict, if well formed and signed by one of the `trusted` keys; else None.
    Whatever the bytes (deep nesting, wrong types), this returns None, never raises."""
    try:
        v = Verdict(**json.loads(data))
        if any(not isinstance(getattr(v, k), t) for k, t in _TYPES.items()):
            return None
        if v.validator not in trusted or not verify(v.validator, v.payload(), v.signature):
            return None
        return v
    except Exception:  # any malformed verdict is simply not trusted
        return None

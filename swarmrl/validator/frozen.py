"""The numbers frozen for out-of-sample counts: every default that decides an honest
file's fate, and their fingerprint (docs/verification-frozen.json names the commit and
the fingerprint they were frozen at; docs/verification.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from swarmrl.config.validator import ValidatorConfig
from swarmrl.toploc.proof import Thresholds
from swarmrl.validator.calibrate import (
    FACTOR,
    FILE_Z,
    FLOOR,
    MAX_FILES,
    MIN_GROUPS,
    MIN_TOKENS,
    PER_LOGPROB,
    UPPER_T,
)
from swarmrl.validator.checks import REWARD_TOLERANCE
from swarmrl.validator.loop import LOGPROB_TOLERANCE, SAMPLING_MEAN_TOLERANCE, SAMPLING_TOLERANCE


def frozen_tolerances() -> dict:
    """Every number that decides an honest file's fate by default: the dtype defaults of
    the sampling check, the calibration's factors and floors, TOPLOC's thresholds, the
    reward tolerance and the version check's. bench/verification_rates.py records its
    sha256 (`tolerance_fingerprint`) with every judged file and counts honest files
    out of sample only under the fingerprint frozen in docs/verification-frozen.json."""
    v = ValidatorConfig()
    return {
        "defaults": {"logprob": LOGPROB_TOLERANCE, "sampling": SAMPLING_TOLERANCE,
                     "sampling_mean": SAMPLING_MEAN_TOLERANCE},
        "calibration": {"factor": FACTOR, "per_logprob": PER_LOGPROB, "floor": FLOOR,
                        "min_tokens": MIN_TOKENS, "min_groups": MIN_GROUPS,
                        "max_files": MAX_FILES, "upper_t": UPPER_T, "file_z": FILE_Z},
        "toploc": dataclasses.asdict(Thresholds()),
        "config": {k: getattr(v, k) for k in (
            "max_exp_mismatches", "max_mantissa_mean", "max_mantissa_median", "calibrate",
            "version_check", "version_check_ratio", "version_check_t")},
        "reward": REWARD_TOLERANCE,
    }  # fmt: skip


def tolerance_fingerprint() -> str:
    return _fingerprint(frozen_tolerances())


def draws_tolerances() -> dict:
    """The numbers of check 9 set after the freeze above, frozen on their own: the
    comparison of token choices across versions (the sign test) and the fewest samples
    its log-prob comparison weighs (a rule for files shorter than any the first
    freeze's counts judged). Its honest files are counted from its own commit;
    docs/verification-frozen.json `draws`. The fewest samples also bear on the first
    freeze's log-prob comparison: its counts stand while the number is at most 32, the
    fewest samples of any file they judged."""
    v = ValidatorConfig()
    return {"version_draws_alpha": v.version_draws_alpha, "test": "one-sided sign test",
            "then_two_back": "error ratio under 1 or more tokens following the older",
            "logprob_min_samples": v.version_check_min_samples}  # fmt: skip


def draws_fingerprint() -> str:
    return _fingerprint(draws_tolerances())


def _fingerprint(numbers: dict) -> str:
    blob = json.dumps(numbers, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

"""The `[validator]` section: how rollout files are checked."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config.base import DEVICE_SETTING, Section


class ValidatorConfig(Section):
    """[validator]: TOPLOC proofs and the other checks of every rollout file."""

    enabled: bool = Field(
        True,
        description="Run validators; the trainer then trains only on files a validator accepted.",
    )
    count: int = Field(1, ge=1, le=16, description="Validator processes (`swarmrl rl`).")
    public_keys: list[str] = Field(
        default_factory=list,
        description="Validator keys (hex) whose verdicts the trainer trusts "
        "(`swarmrl rl` fills it; otherwise runs/<name>/keys/validator-*.pub).",
    )
    max_exp_mismatches: int = Field(
        38, ge=0, le=128, description="TOPLOC: exponent mismatches allowed per 128-entry chunk."
    )
    max_mantissa_mean: float = Field(
        10.0, ge=0.0, le=128.0, description="TOPLOC: mean mantissa error allowed per chunk."
    )
    max_mantissa_median: float = Field(
        8.0, ge=0.0, le=128.0, description="TOPLOC: median mantissa error allowed per chunk."
    )
    sampling_tolerance: float | None = Field(
        None,
        ge=0.0,
        le=10.0,
        description="Near-tie tolerance of the Gumbel-max check, in units of logits/T: "
        "must exceed twice the logit error between worker and validator (default by the "
        "dtype versions run in: float32 0.01, bfloat16 1.0, which `calibrate` tightens; "
        "docs/verification.md).",
    )
    sampling_mean_tolerance: float | None = Field(
        None,
        ge=0.0,
        le=10.0,
        description="Largest mean over a file's tokens of the Gumbel-max check's margin (how "
        "far a token's score falls short of the best, in logits/T; zero but at near-ties for "
        "an honest worker). Default by the dtype versions run in: float32 0.01 (the per-token "
        "tolerance: no further bound), bfloat16 0.005, which `calibrate` tightens; "
        "docs/verification.md.",
    )
    logprob_tolerance: float | None = Field(
        None,
        ge=0.0,
        le=10.0,
        description="Largest mean difference over a file between a worker's log-probs and "
        "the validator's (default by the dtype versions run in, model.publish_dtype: "
        "float32 2e-5, bfloat16 0.1, which `calibrate` tightens; docs/verification.md).",
    )
    calibrate: bool = Field(
        True,
        description="Set the three tolerances above, where not given, from this validator's "
        "own honest samples of the first version of each dtype (4,000 tokens): scaled from "
        "their errors and spread, between a floor and the dtype's default "
        "(validator/calibrate.py).",
    )
    version_check: bool = Field(
        True,
        description="Decide which policy version explains a file: its reported log-probs "
        "are compared with the claimed version's and with the version before it (and the "
        "one before that, when the first explains the file as well), held in up to two "
        "more engines (three times the model's memory), on every judged file; a file an "
        "older version explains clearly better is rejected (check `version`: a worker "
        "that generates with an older policy than it claims; validator/checks.py).",
    )
    version_check_ratio: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="The version check rejects when the older version's mean log-prob "
        "error is below this fraction of the claimed version's (and the paired t "
        "statistic over samples passes version_check_t).",
    )
    version_check_t: float = Field(
        2.0,
        gt=0.0,
        le=1e6,
        description="The paired t statistic (claimed version's error minus the older's, "
        "per sample) the version check needs, beside version_check_ratio.",
    )
    version_check_min_samples: int = Field(
        8,
        ge=2,
        le=1 << 20,
        description="The fewest samples a file needs for the version check's log-prob "
        "comparison: with fewer, the paired t statistic has too little spread to weigh "
        "(one sample has none) and the comparison is skipped; the token-choice test still "
        "runs. Files hold worker.group_size x worker.groups_per_file samples.",
    )
    version_draws_alpha: float = Field(
        1e-4,
        ge=0.0,
        lt=1.0,
        description="The version check also rejects a file whose token choices follow the "
        "older version rather than the claimed one (tokens that fall short of their "
        "seeded choice under one version only, counted each way) when the one-sided sign "
        "test's p-value is below this: a worker that generated with the older policy and "
        "proved its tokens with the claimed one. 0: off.",
    )
    max_batch_tokens: int = Field(
        16384, ge=256, le=1 << 24, description="Padded tokens per validation prefill."
    )
    sample_rate: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Fraction of submitted files validated, drawn by the orchestrator after "
        "upload (1: every file; below 1 the rest are trained on unchecked: spot-checking).",
    )
    mismatch_window: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Spot-checking: steps over which the orchestrator compares a node's "
        "log-prob mismatch on unchecked files with the swarm's "
        "(swarmrl/orchestrator/mismatch.py).",
    )
    mismatch_min_tokens: int = Field(
        64,
        ge=1,
        le=1 << 40,
        description="Spot-checking: unchecked tokens a node needs in the window before "
        "its mismatch is judged.",
    )
    mismatch_factor: float = Field(
        50.0,
        ge=1.0,
        le=1e6,
        description="Spot-checking: a node whose mean mismatch KL on unchecked files "
        "exceeds this many times max(reference, mismatch_floor) becomes suspect: every "
        "file of it is validated from then on (the reference, per staleness: the larger "
        "of the mean KL of checked files in the window and the median over nodes of their "
        "KL; an honest file measured 15x its node's mean, a 3-nat forgery 600x).",
    )
    mismatch_floor: float = Field(
        1e-3,
        gt=0.0,
        le=100.0,
        description="Spot-checking: the smallest reference KL the factor applies to, so "
        "that near-zero honest mismatch does not flag rounding noise.",
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads per validator process.")
    device: str = Field(
        "auto",
        pattern=DEVICE_SETTING,
        description="Where validators prefill: auto (CUDA if torch sees it, else the CPU), "
        "cpu, cuda or cuda:N.",
    )
    poll_s: float = Field(0.2, gt=0.0, le=60.0, description="Wait between polls for files.")

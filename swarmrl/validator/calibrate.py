"""The validator's own measure of honest numerical error, which sets the sampling
check's three tolerances for the model and dtype it runs.

An honest worker's log-probs and token scores differ from the validator's only by
rounding: decoding with a key/value cache against one prefill, other batch shapes,
other kernels. How large that is depends on the model as much as on the dtype. In
bfloat16 SmolLM2-135M's honest files reach a mean log-prob error of 0.03, the tiny
model's 6e-4 at most (bench/verification_rates.py, docs/verification.md), so the
dtype's default, set for the first, let the second's cheats through: weights moved
by 1% noise, int8 and int4 weights, another temperature.

So when a validator loads a version of a dtype it has not measured yet, it makes
honest samples itself, as a worker does (seeded Gumbel-max decoding, the first group
all at once and one at a time, then whole files' groups at once), and judges them
with its prefill, until they hold `MIN_TOKENS` completion tokens in at least
`MIN_GROUPS` prompt groups. The mean log-prob error of those tokens measures the
rounding between decoding and prefill on this model; the two margins of the
Gumbel-max check are extreme values of the same rounding (a near-tie now and then),
which samples see too rarely to measure them directly.

The error is far from even across tokens: a fine-tuned model answers most tokens
with a probability near 1 (error near 0) and a few uncertain ones carry most of it,
and which ones are uncertain depends on the prompt. So the error of a prompt group's
tokens varies from group to group, and a file's mean (four to eight groups) with it.
Measured on SmolLM2 fine-tuned by a real run (version 14 of `make run`, bfloat16,
960 samples; docs/verification.md): group means spread so that a file of 380 tokens
has a standard deviation of 0.0029 around a mean of 0.0079 (observed across 30
files: 0.0028), and a calibration of 24 samples, as this file made before, measured
anywhere from 0.0038 to 0.0127 (1% and 99%); tolerances 3x the low end rejected
honest files. Hence:

- `spread`: the groups' standard deviation scaled to one token (a file of n tokens
  has a standard error of about spread / sqrt(n)), from the calibration's groups;
- the calibrated mean is taken at its upper bound, `UPPER_T` standard errors over
  the estimate, so that an unlucky calibration errs towards leniency;
- a file's log-prob tolerance is the larger of `FACTOR` times that bound and the
  bound plus `FILE_Z` of the file's own standard errors (`LogprobNoise.limit`): a
  short file is allowed its larger noise.

Each tolerance is never below the dtype's floor (set from honest files of other
thread counts, which a validator's own samples do not show) nor above its default
(validator/loop.py): calibration only tightens. A tolerance set in `[validator]` is
used as it is. A validator whose engine cannot generate keeps the defaults.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from swarmrl.protocol.prompts import assigned_prompts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.validator.checks import Context, LogprobNoise, check_with_model

log = logging.getLogger("swarmrl.validator")

# Each tolerance is at least its own statistic's largest value over the calibration
# samples times FACTOR, and at least their mean log-prob error's upper bound times
# PER_LOGPROB. Measured on SmolLM2-135M in bfloat16 (bench/verification_rates.py,
# docs/verification.md): honest files' mean log-prob error stayed within 1.3x of what a
# validator's calibration measured on the base model (0.020-0.027), while int8 weights
# gave 0.073 and the default (0.1) let them through: 3x leaves 2.3x room. Honest token
# margins reached 21x a file's log-prob error (0.53) and mean margins 0.08x (0.002): 50x
# and 0.5x leave 2.4x and 6x, since margins are extreme values that samples seldom show.
FACTOR = {"logprob": 3.0, "sampling": 10.0, "sampling_mean": 10.0}
PER_LOGPROB = {"logprob": 3.0, "sampling": 50.0, "sampling_mean": 0.5}
# Tolerances never go below these. Float32's are its defaults (calibration leaves them).
# A validator's own samples miss what differs between machines: on the tiny model in
# bfloat16 its calibration measured a mean log-prob error of 2e-6 to 6e-6, while honest
# files made with another thread count and batch size reached 5.9e-4, a token margin of
# 0.058 and a mean margin of 1.3e-4 (bench/verification_rates.py, 66k rollouts,
# 2026-12-01). The bfloat16 floors are 3.4x, 5x and 7.5x those, and still under what
# another temperature, int8 weights or the policy one version older give on that model
# (docs/verification.md).
FLOOR = {
    "float32": {"logprob": 2e-5, "sampling": 0.01, "sampling_mean": 0.01},
    "bfloat16": {"logprob": 2e-3, "sampling": 0.3, "sampling_mean": 1e-3},
}
SEED = 0x5EED_CA1B  # the calibration's own assignment seeds start here: no worker's
# The calibration's size, and the statistics' allowance for its and a file's noise. On
# the fine-tuned SmolLM2 above, 4,000 tokens (about 42 groups, 40 s here) put the mean's
# 99% range at 0.0066-0.0093; with the bound 3 standard errors up and 5 for a file, a
# resampling of 1,000 calibrations judged 19,000 honest files with none past the limit
# and the worst at 0.87 of it (0.97 and 1 of 24,000 past it with 2 and 2,000 tokens).
MIN_TOKENS = 4000
MIN_GROUPS = 24
MAX_FILES = 64  # files' worth of groups at most, however short the completions
UPPER_T = 3.0
FILE_Z = 5.0


@dataclasses.dataclass(frozen=True)
class Calibration:
    dtype: str
    measured: dict  # statistic -> honest value seen: the mean error, the largest margins
    tolerances: dict  # "logprob", "sampling", "sampling_mean" -> tolerance
    noise: LogprobNoise  # a file's log-prob tolerance by its number of tokens

    def line(self) -> str:
        t, m = self.tolerances, self.measured
        return (
            f"calibrated tolerances for {self.dtype} on {m['tokens']} tokens: log-prob "
            f"{t['logprob']:.1e} (a file of 100 tokens {self.noise.limit(t['logprob'], 100):.1e}), "
            f"token margin {t['sampling']:.2g}, mean margin {t['sampling_mean']:.1e} "
            f"(honest log-prob error {m['mean_logprob_error']:.2g} +- {m['spread']:.2g}/sqrt(n), "
            f"margins {m['worst_sampling_margin']:.2g}, {m['mean_sampling_margin']:.2g})"
        )


STAT_OF = {
    "logprob": "mean_logprob_error",
    "sampling": "worst_sampling_margin",
    "sampling_mean": "mean_sampling_margin",
}


def upper_mean(measured: dict) -> float:
    """The calibrated mean log-prob error at its upper bound: the estimate plus UPPER_T
    of its standard errors (measurements without a spread: the estimate)."""
    spread, tokens = measured.get("spread", 0.0), measured.get("tokens", 0)
    return measured["mean_logprob_error"] + (
        UPPER_T * spread / math.sqrt(tokens) if tokens else 0.0
    )


def tolerances(measured: dict, dtype: str, defaults: dict) -> dict:
    """Each tolerance from the honest values: FACTOR times its own statistic or
    PER_LOGPROB times the mean log-prob error's upper bound, whichever is larger, within
    [the dtype's floor, its default]."""
    floor = FLOOR.get(dtype, FLOOR["float32"])
    lp = upper_mean(measured)
    own = {name: measured[stat] for name, stat in STAT_OF.items()} | {"logprob": lp}
    return {
        name: min(
            defaults[name], max(floor[name], FACTOR[name] * own[name], PER_LOGPROB[name] * lp)
        )
        for name in STAT_OF
    }


def noise(measured: dict, defaults: dict) -> LogprobNoise:
    """A file's allowance for its own noise: the mean's upper bound plus FILE_Z standard
    errors of a file of its size, never above the dtype's default."""
    return LogprobNoise(
        upper_mean(measured), FILE_Z * measured.get("spread", 0.0), defaults["logprob"]
    )


def spread(groups: list[tuple[int, float]]) -> tuple[float, float]:
    """The token-weighted mean of groups' (tokens, mean error) and the groups' standard
    deviation scaled to one token: a file of n tokens made of such groups has a
    standard error of about spread / sqrt(n) (the ratio estimator's variance)."""
    total = sum(n for n, _ in groups)
    mean = sum(n * m for n, m in groups) / max(total, 1)
    if len(groups) < 2 or total == 0:
        return mean, 0.0
    per_group = total / len(groups)
    var = sum(n * n * (m - mean) ** 2 for n, m in groups) / (len(groups) - 1) / per_group
    return mean, math.sqrt(var)


def _rows(prompts, seeds, made) -> list[dict]:
    return [
        {
            "prompt_tokens": p,
            "completion_tokens": c.tokens,
            "completion_logprobs": c.logprobs,
            "completion_mask": [1] * len(c.tokens),
            "seed": seed,
            "proofs": c.proofs,
        }
        for p, seed, c in zip(prompts, seeds, made, strict=True)
    ]


def honest_groups(ctx: Context, backend):
    """Samples of the run's task as honest workers make them, one file's groups at a
    time (assignment seeds SEED, SEED + 1, ...): each yield is the rows of one file and
    the group each row belongs to. The first group is decoded all at once and again one
    sample at a time (a worker with a batch of one)."""
    cfg = ctx.cfg
    s = cfg.sampling
    for k in range(MAX_FILES):
        plan = assigned_prompts(cfg, ctx.source, ctx.tokenizer, SEED + k, SamplerState())
        prompts = [p.tokens for p in plan for _ in p.seeds]
        seeds = [seed for p in plan for seed in p.seeds]
        group = [g for g, p in enumerate(plan) for _ in p.seeds]
        made = backend.generate(prompts, seeds, s.max_new_tokens, s.temperature, s.top_p)
        if k == 0:
            first = len(plan[0].seeds)
            made += [
                backend.generate([p], [seed], s.max_new_tokens, s.temperature, s.top_p)[0]
                for p, seed in zip(prompts[:first], seeds[:first], strict=True)
            ]
            prompts, seeds = prompts + prompts[:first], seeds + seeds[:first]
            group += [len(plan)] * first  # its own group: the same prompt, other batches
        yield _rows(prompts, seeds, made), group


def calibrate(ctx: Context, backend, defaults: dict) -> Calibration | None:
    """The tolerances for the version `backend` holds, from its own honest samples;
    None when the engine cannot generate or no tolerance can be tightened."""
    dtype = backend.running_dtype or "float32"
    floor = FLOOR.get(dtype, FLOOR["float32"])
    if not hasattr(backend, "generate") or all(floor[k] >= defaults[k] for k in defaults):
        return None  # no engine to sample with, or nothing to tighten (float32's defaults)
    lifted = dataclasses.replace(
        ctx, sampling_tolerance=10.0, sampling_mean_tolerance=10.0, logprob_tolerance=10.0,
        logprob_noise=None,
    )  # fmt: skip
    groups: list[tuple[int, float]] = []
    worst, margin_sum, tokens = 0.0, 0.0, 0
    for rows, group in honest_groups(ctx, backend):
        errors: list[float] = []
        stats = check_with_model(lifted, backend, rows, errors=errors)
        n = [len(r["completion_tokens"]) for r in rows]
        for g in sorted(set(group)):
            at = [i for i, x in enumerate(group) if x == g]
            size = sum(n[i] for i in at)
            if size:
                groups.append((size, sum(n[i] * errors[i] for i in at) / size))
        worst = max(worst, float(stats["worst_sampling_margin"]))
        margin_sum += float(stats["mean_sampling_margin"]) * sum(n)
        tokens += sum(n)
        if tokens >= MIN_TOKENS and len(groups) >= MIN_GROUPS:
            break
    mean, per_token = spread(groups)
    measured = {
        "mean_logprob_error": mean, "spread": per_token, "tokens": tokens, "groups": len(groups),
        "worst_sampling_margin": worst, "mean_sampling_margin": margin_sum / max(tokens, 1),
    }  # fmt: skip
    return Calibration(
        dtype, measured, tolerances(measured, dtype, defaults), noise(measured, defaults)
    )

"""The validator's own measure of honest numerical error, which sets the sampling
check's three tolerances for the model and dtype it runs.

An honest worker's log-probs and token scores differ from the validator's only by
rounding: decoding with a key/value cache against one prefill, other batch shapes,
other kernels. How large that is depends on the model as much as on the dtype. In
bfloat16 SmolLM2-135M's honest files reach a mean log-prob error of 0.03, the tiny
model's 6e-4 at most (bench/verification_rates.py, docs/verification.md), so the
dtype's default, set for the first, let the second's cheats through: weights moved
by 1% noise, int8 and int4 weights, another temperature.

So when a validator loads a version of a dtype it has not measured yet, it makes a
few honest samples itself, as a worker does (seeded Gumbel-max decoding, all at once
and one at a time), and judges them with its prefill. The mean log-prob error of those
samples measures the rounding between decoding and prefill on this model; the two
margins of the Gumbel-max check are extreme values of the same rounding (a near-tie
now and then), which a few samples see too rarely to measure them directly. So each
tolerance is the larger of `FACTOR` times its own honest figure and `PER_LOGPROB`
times the log-prob error, never below the dtype's floor (set from honest files of
other thread counts, which a validator's own samples do not show) nor above its
default (validator/loop.py): calibration only tightens. A tolerance set in `[validator]` is
used as it is. A validator whose engine cannot generate keeps the defaults.
"""

from __future__ import annotations

import dataclasses
import logging

from swarmrl.protocol.prompts import assigned_prompts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.validator.checks import Context, check_with_model

log = logging.getLogger("swarmrl.validator")

# Each tolerance is at least its own statistic's largest value over the calibration
# samples times FACTOR, and at least their mean log-prob error times PER_LOGPROB.
# Measured on SmolLM2-135M in bfloat16 (bench/verification_rates.py,
# docs/verification.md): honest files' mean log-prob error stayed within 1.3x of what a
# validator's calibration measured (0.020-0.027), while int8 weights gave 0.073 and the
# default (0.1) let them through: 3x leaves 2.3x room. Honest token margins reached 21x
# a file's log-prob error (0.53) and mean margins 0.08x (0.002): 50x and 0.5x leave 2.4x
# and 6x, since margins are extreme values that a few samples seldom show.
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
SEED = 0x5EED_CA1B  # the calibration's own assignment seed: no worker is issued it
GROUPS = 2  # groups decoded all at once; the first group's samples again one at a time


@dataclasses.dataclass(frozen=True)
class Calibration:
    dtype: str
    measured: dict  # statistic -> largest honest value seen
    tolerances: dict  # "logprob", "sampling", "sampling_mean" -> tolerance

    def line(self) -> str:
        t = self.tolerances
        return (
            f"calibrated tolerances for {self.dtype}: log-prob {t['logprob']:.1e}, "
            f"token margin {t['sampling']:.2g}, mean margin {t['sampling_mean']:.1e} "
            f"(honest maxima {', '.join(f'{k} {v:.2g}' for k, v in self.measured.items())})"
        )


STAT_OF = {
    "logprob": "mean_logprob_error",
    "sampling": "worst_sampling_margin",
    "sampling_mean": "mean_sampling_margin",
}


def tolerances(measured: dict, dtype: str, defaults: dict) -> dict:
    """Each tolerance from the largest honest values: FACTOR times its own statistic or
    PER_LOGPROB times the mean log-prob error, whichever is larger, within [the dtype's
    floor, its default]."""
    floor = FLOOR.get(dtype, FLOOR["float32"])
    lp = measured["mean_logprob_error"]
    return {
        name: min(
            defaults[name],
            max(floor[name], FACTOR[name] * measured[stat], PER_LOGPROB[name] * lp),
        )
        for name, stat in STAT_OF.items()
    }


def honest_rows(ctx: Context, backend) -> list[dict]:
    """A few samples of the run's task as an honest worker makes them: the assigned
    prompts of the calibration seed, decoded in one batch and one at a time."""
    cfg = ctx.cfg
    s = cfg.sampling
    plan = assigned_prompts(cfg, ctx.source, ctx.tokenizer, SEED, SamplerState())[:GROUPS]
    prompts = [p.tokens for p in plan for _ in p.seeds]
    seeds = [seed for p in plan for seed in p.seeds]
    made = backend.generate(prompts, seeds, s.max_new_tokens, s.temperature, s.top_p)
    first = len(plan[0].seeds)
    made += [
        backend.generate([p], [seed], s.max_new_tokens, s.temperature, s.top_p)[0]
        for p, seed in zip(prompts[:first], seeds[:first], strict=True)
    ]
    prompts += prompts[:first]
    seeds += seeds[:first]
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


def calibrate(ctx: Context, backend, defaults: dict) -> Calibration | None:
    """The tolerances for the version `backend` holds, from its own honest samples;
    None when the engine cannot generate or no tolerance can be tightened."""
    dtype = backend.running_dtype or "float32"
    floor = FLOOR.get(dtype, FLOOR["float32"])
    if not hasattr(backend, "generate") or all(floor[k] >= defaults[k] for k in defaults):
        return None  # no engine to sample with, or nothing to tighten (float32's defaults)
    rows = honest_rows(ctx, backend)
    lifted = dataclasses.replace(
        ctx, sampling_tolerance=10.0, sampling_mean_tolerance=10.0, logprob_tolerance=10.0
    )
    stats = check_with_model(lifted, backend, rows)
    measured = {stat: float(stats[stat]) for stat in STAT_OF.values()}
    return Calibration(dtype, measured, tolerances(measured, dtype, defaults))

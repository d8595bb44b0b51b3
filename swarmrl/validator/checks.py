"""The checks of one rollout file, cheapest first; the first that fails decides.

1. schema and limits: protocol/rollouts.py reads the file without trusting it
   (types, lengths, whole groups of group_size, finite numbers). A reader that
   fails on its own side (its decoding child died, ran past `decode_timeout_s`
   or its memory cap, or our code raised) proves nothing against the sender:
   the file is `unverifiable`, blameless, and counted against the sender's
   standing (orchestrator/judgement.py);
2. identity: the key names the node, step, policy and group count that the
   rows claim;
3. replay: never reaches a validator: the orchestrator refuses a second file
   for an assignment and a second submission of the same sha256;
4. assignment: the problems, thinking budgets, prompt tokens and sampling
   seeds are recomputed from (run seed, node, step, counter) and the sampler
   state the trainer issued for the step (difficulty level, down-weighted
   problems; a step with no issued state fails closed), and the temperature
   and nucleus (top_p) from the config;
5. termination: a completion ends on its first end-of-sequence token or at
   the length limit; anything shorter is a truncation. A trajectory (a run
   with `[env]`) is replayed instead (inference/trajectory.py: `replay`):
   each model span ends exactly where the environment's call rule, end of
   sequence or the budget ends it (termination), and each environment span is
   exactly what the environment answers the span before it, recomputed here
   with the validator's own tools and limits (check `environment`);
6. rewards: the validator decodes the tokens itself, re-scores with the
   task's verifier and the length rule, and compares; a grading process that
   gives no answer here (the run's reward function or math-verify past its
   time limit) makes the file `unverifiable`, raised last as in 5;
7. proofs: one prefill of the claimed policy over prompt + completion[:-1];
   TOPLOC chunk checks (toploc/proof.py) on the final-norm states;
8. sampling: every model token (a trajectory's environment tokens are
   context: the proofs cover them, the sampling check does not) must be the
   seeded Gumbel-max choice, keyed by its place in the completion, under the
   validator's own logits, up to the near-tie tolerance (toploc/sampling.py),
   the file's mean shortfall below the best score must stay under a second
   tolerance, and the log-probs the worker reports must be the validator's:
   their mean absolute difference over the file must stay under a tolerance.
   The three tolerances are set by the dtype the version runs in
   (validator/loop.py). Float32 on CPU (tiny models: random, warm-started,
   after 250 RL steps): honest log-prob errors at most 5e-7 per file (single
   tokens reach 2e-4, which is why the file mean is compared, not the
   largest error), weights rounded to bfloat16 1.1e-4 to 2.4e-3: the
   default, 2e-5, sits between. Bfloat16 (bench/bf16_tolerances.py,
   SmolLM2-135M, worker and validator threads 1 and 2, batches 1 and 16):
   honest files' mean log-prob error at most 0.031, worst token margin
   0.33, mean margin 0.0013; the defaults 0.1, 1.0 and 0.005 are 3 to 4
   times those. A smaller model's honest errors are far smaller (the tiny
   model's: 5e-4), and low-precision or other weights can hide under
   SmolLM2's tolerance there: set the log-prob tolerance from the honest
   spread your verdicts record (`stats`).

9. version (`validator.version_check`): the same log-probs against the version
   before the claimed one, held in a second engine: a file that version
   explains clearly better than the claimed one was generated with it
   (`check_version` in validator/version_check.py).

Steps 1 to 6 need no model; 7 and 8 share one prefill; 9 is a second.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from swarmrl.config import RunConfig
from swarmrl.envs.environment import bound, environment_of
from swarmrl.inference.trajectory import replay
from swarmrl.models.prompting import decode_completion, model_replies
from swarmrl.protocol.assign import parse_rollout_key
from swarmrl.protocol.prompts import assigned_prompts
from swarmrl.protocol.rollouts import (
    DECODE_TIMEOUT_S,
    Limits,
    RolloutFileError,
    RolloutUnreadable,
    read_rollouts,
)
from swarmrl.protocol.sampler import SamplerState, SamplerStateError
from swarmrl.protocol.seeds import derive_seed
from swarmrl.tasks.graders.checker import RewardUnavailable
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.length import length_penalty
from swarmrl.toploc.proof import Thresholds, check_proofs_many, decode, split_proofs
from swarmrl.toploc.sampling import check_sampling, sampling_logprobs

REWARD_TOLERANCE = 1e-4  # float32 storage of the rewards


@dataclass
class Outcome:
    """What the checks found; `check` is empty when the file passed all of them."""

    check: str = ""
    reason: str = ""
    samples: list[int] = field(default_factory=list)
    n_samples: int = 0
    n_tokens: int = 0
    stats: dict = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return not self.check


class Reject(Exception):
    def __init__(self, check: str, reason: str, samples: list[int] | None = None):
        super().__init__(reason)
        self.check, self.reason, self.samples = check, reason, samples or []


def _failing(check: str, what: str, bad: list[int], n: int) -> None:
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        raise Reject(check, f"{len(bad)} of {n} samples {what} (samples {shown})", bad)


@dataclass(frozen=True)
class LogprobNoise:
    """A file's allowance for its own noise in the mean log-prob error, set by the
    validator's calibration (validator/calibrate.py): `center` plus `scale` over the
    square root of the file's tokens, at most `cap` (the dtype's default)."""

    center: float
    scale: float
    cap: float

    def limit(self, tolerance: float, tokens: int) -> float:
        """The log-prob tolerance of a file of `tokens` tokens: `tolerance`, or the
        allowance for its noise where that is larger."""
        return max(tolerance, min(self.cap, self.center + self.scale / math.sqrt(max(tokens, 1))))


@dataclass
class Context:
    """What the checks need besides the file: the run's config, tokenizer and task
    source, and a backend holding the claimed policy version (for 7 and 8)."""

    cfg: RunConfig
    tokenizer: object
    source: object
    thresholds: Thresholds
    sampling_tolerance: float
    logprob_tolerance: float
    sampling_mean_tolerance: float
    eos_id: int
    vocab: int
    hidden_size: int
    max_batch_tokens: int = 16384
    max_prompt_tokens: int = 4096
    decode_timeout_s: float = DECODE_TIMEOUT_S  # the file's decoding, at most
    issued: dict | None = None  # the file's assignment as the orchestrator issued it
    logprob_noise: LogprobNoise | None = None  # calibrated: a short file's larger allowance

    def with_issued(self, issued: dict) -> Context:
        """This context for one file's assignment as the orchestrator issued it: its
        sampler state, and its node's length budget in place of the run's."""
        cfg = self.cfg
        budget = issued.get("max_new_tokens") or cfg.sampling.max_new_tokens
        if budget != cfg.sampling.max_new_tokens:
            sampling = cfg.sampling.model_copy(update={"max_new_tokens": budget})
            cfg = cfg.model_copy(update={"sampling": sampling})
        return dataclasses.replace(self, cfg=cfg, issued=issued)

    def limits(self) -> Limits:
        return Limits.of_run(self.cfg)


def check_without_model(ctx: Context, key: str, data: bytes) -> tuple[dict, list[dict]]:
    """Checks 1, 2, 4, 5 and 6 (3 is the orchestrator's). Returns the key's
    fields and the rows; raises Reject. A tool answer the validator cannot settle
    is not raised here: it is `info["unverifiable"]`, a Reject to raise only after
    every other check, the model's included, has passed (`unverifiable`: a worker
    must not escape blame for a forgery by adding an unsettled call to its file)."""
    info = parse_rollout_key(key)
    if info is None:
        raise Reject("identity", f"unrecognised rollout key {key!r}")
    try:
        rows = read_rollouts(data, ctx.limits(), timeout_s=ctx.decode_timeout_s)
    except RolloutFileError as e:
        raise Reject("schema", str(e)) from None
    except RolloutUnreadable as e:  # nothing else can be checked: no one is blamed
        raise Reject("unverifiable", f"the file could not be read here: {e}") from None
    _check_identity(ctx, info, rows)
    plan = _check_assignment(ctx, info, rows)
    _check_termination(ctx, rows)
    unsettled = _check_environment(ctx, rows, plan)
    info["unverifiable"] = _check_rewards(ctx, rows, plan) or unsettled
    return info, rows


def _check_identity(ctx: Context, info: dict, rows: list[dict]) -> None:
    cfg = ctx.cfg
    for name, want in (("node", info["node"]), ("step", info["step"])):
        _failing("identity", f"do not carry the key's {name}", _where(rows, name, want), len(rows))
    _failing(
        "identity", "claim another policy", _where(rows, "policy_step", info["policy"]), len(rows)
    )
    if info["groups"] != cfg.worker.groups_per_file:
        raise Reject(
            "identity", f"key says {info['groups']} groups, runs use {cfg.worker.groups_per_file}"
        )


def _where(rows: list[dict], name: str, want) -> list[int]:
    return [i for i, r in enumerate(rows) if r[name] != want]


def _check_assignment(ctx: Context, info: dict, rows: list[dict]) -> list:
    cfg = ctx.cfg
    seed = derive_seed(cfg.seed, info["node"], info["step"], info["counter"])
    issued = ctx.issued
    if issued is None or issued.get("step") != info["step"] or issued.get("sampler") is None:
        raise Reject("assignment", f"no sampler state was issued for step {info['step']}")
    try:
        state = SamplerState.from_json(issued["sampler"])
    except SamplerStateError as e:  # fail closed: judged as unassigned
        msg = f"the sampler state of step {info['step']} is unreadable: {e}"
        raise Reject("assignment", msg) from None
    plan = assigned_prompts(cfg, ctx.source, ctx.tokenizer, seed, state)
    groups = sorted({r["group"] for r in rows})
    if groups != list(range(len(plan))):
        raise Reject("assignment", f"file holds groups {groups[:10]}, assigned {len(plan)}")
    bad_prompt, bad_seed, bad_temp = [], [], []
    seen: dict[int, int] = {}
    for i, r in enumerate(rows):
        p = plan[r["group"]]
        if (
            r["problem_id"] != p.task.problem_id
            or r["prompt_tokens"] != p.tokens
            or r["prompt"] != p.text
            or r["target_length"] != p.target_length
            or r["task_type"] != p.task.task_type
        ):
            bad_prompt.append(i)
        j = seen.get(r["group"], 0)
        seen[r["group"]] = j + 1
        if r["seed"] != p.seeds[j]:
            bad_seed.append(i)
        if not (
            math.isclose(r["temperature"], cfg.sampling.temperature, rel_tol=1e-6)
            and math.isclose(r["top_p"], cfg.sampling.top_p, rel_tol=1e-6)
        ):
            bad_temp.append(i)
    _failing("assignment", "are not the assigned prompts", bad_prompt, len(rows))
    _failing("assignment", "do not carry their assigned seeds", bad_seed, len(rows))
    _failing("assignment", "were sampled at another temperature or top_p", bad_temp, len(rows))
    return plan


def _check_termination(ctx: Context, rows: list[dict]) -> None:
    limit = ctx.cfg.sampling.max_new_tokens
    single = ctx.cfg.env.kind == "none"  # a trajectory's spans are replayed instead
    bad_ids, cut = [], []
    for i, r in enumerate(rows):
        toks = r["completion_tokens"]
        if min(toks) < 0 or max(toks) >= ctx.vocab:
            bad_ids.append(i)
            continue
        first_eos = toks.index(ctx.eos_id) if ctx.eos_id in toks else None
        if single and (
            first_eos is None and len(toks) != limit or first_eos not in (None, len(toks) - 1)
        ):
            cut.append(i)
    _failing("schema", "hold token ids outside the vocabulary", bad_ids, len(rows))
    _failing("termination", "end neither on EOS nor at the length limit", cut, len(rows))


def _check_environment(ctx: Context, rows: list[dict], plan) -> Reject | None:
    """Replay every trajectory (a run with `[env]`): the first sample that fails names
    the check, termination or environment, and why. Returns the `unverifiable`
    refusal, if any, for the caller to raise last."""
    env = environment_of(ctx.cfg)
    if env is None:
        return None
    limit = ctx.cfg.sampling.max_new_tokens
    failed: dict[str, list[int]] = {}
    why: dict[str, str] = {}
    for i, r in enumerate(rows):
        row_env = bound(env, [plan[r["group"]].task])[0]  # a taskset's tools answer per task
        got = replay(
            row_env, ctx.tokenizer, r["completion_tokens"], r["completion_mask"], ctx.eos_id, limit
        )
        if got is not None:
            failed.setdefault(got[0], []).append(i)
            why.setdefault(got[0], f"sample {i}, {got[1]}")
    for check in ("termination", "environment"):
        bad = failed.get(check, [])
        if bad:
            raise Reject(check, f"{len(bad)} of {len(rows)} samples fail: {why[check]}", bad)
    bad = failed.get("unverifiable", [])
    if bad:
        why_not = f"{len(bad)} of {len(rows)} samples cannot be settled: {why['unverifiable']}"
        return Reject("unverifiable", why_not, bad)
    return None


def _check_rewards(ctx: Context, rows: list[dict], plan) -> Reject | None:
    """Re-scores every sample; a reward the verifier could not give here (the run's
    reward function past its time limit, or its process dead) is not the sender's
    fault: the first such sample ends the scoring (each could take the function's time
    limit) and is returned as the `unverifiable` refusal, for the caller to raise last;
    a wrong reward among the samples scored before it is still blamed."""
    lr = ctx.cfg.length_reward
    wrong_text, wrong_reward, unsettled = [], [], []
    for i, r in enumerate(rows):
        text = decode_completion(ctx.tokenizer, r["completion_tokens"])
        if text != r["completion"]:
            wrong_text.append(i)
            continue
        penalty = length_penalty(lr.mode, len(r["completion_tokens"]), r["target_length"], lr.coef)
        mask = r["completion_mask"] if ctx.cfg.env.kind != "none" else None
        replies = model_replies(ctx.tokenizer, r["completion_tokens"], mask)
        try:
            task_reward = verify(plan[r["group"]].task, text, replies, strict=True)
        except RewardUnavailable:  # the rest is not scored: the file is refused anyway,
            unsettled.append(i)  # and each call could take the reward's time limit
            break
        if not (
            math.isclose(r["task_reward"], task_reward, abs_tol=REWARD_TOLERANCE)
            and math.isclose(r["length_penalty"], penalty, abs_tol=REWARD_TOLERANCE)
            and math.isclose(r["reward"], task_reward - penalty, abs_tol=REWARD_TOLERANCE)
        ):
            wrong_reward.append(i)
    _failing("schema", "have a completion text that is not their tokens", wrong_text, len(rows))
    _failing("reward", "claim rewards the verifier does not give", wrong_reward, len(rows))
    if unsettled:
        why = f"the reward of sample {unsettled[0]} could not be computed here in time"
        return Reject("unverifiable", why, unsettled)
    return None


def check_with_model(
    ctx: Context,
    backend,
    rows: list[dict],
    errors: list[float] | None = None,
    behind: list | None = None,
) -> dict:
    """Checks 7 and 8 with `backend` holding the claimed policy, one prefill batch at a
    time (each batch's logits are dropped before the next). Returns statistics;
    `errors` and `behind`, when given, receive each sample's mean log-prob error and
    which of its tokens fall short of their seeded Gumbel-max choice at all (check 9)."""
    for i, r in enumerate(rows):  # grammar first: nothing is computed for a malformed file
        try:
            for piece in split_proofs(r["proofs"], len(r["completion_tokens"]), ctx.hidden_size):
                decode(piece)  # a modulus out of range is the worker's fault, not an error
        except ValueError as e:
            raise Reject("proof", f"malformed proofs: sample {i}: {e}", [i]) from None
    s = ctx.cfg.sampling
    bad_proof, bad_sampling, not_finite = [], [], []
    lp_sum, lp_count, per_sample = 0.0, 0, [0.0] * len(rows)
    short_of: list = [None] * len(rows)
    stats = {"chunks": 0, "max_exp_mismatches": 0, "max_mantissa_mean": 0.0,
             "max_mantissa_median": 0.0}  # fmt: skip
    worst, margin_sum, margin_tokens = 0.0, 0.0, 0
    batches = backend.prefill_batches(
        [r["prompt_tokens"] for r in rows],
        [r["completion_tokens"] for r in rows],
        max_tokens=ctx.max_batch_tokens,
    )
    for batch in batches:
        finite = [b for b in batch if all_finite(b[1], b[2])]
        not_finite += [b[0] for b in batch if not all_finite(b[1], b[2])]
        checks = check_proofs_many(
            [rows[j]["proofs"] for j, _, _ in finite],
            [h for _, h, _ in finite],
            thresholds=ctx.thresholds,
        )
        for (j, _, logits), cs in zip(finite, checks, strict=True):
            if not all(c.accepted for c in cs):
                bad_proof.append(j)
            stats["chunks"] += len(cs)
            stats["max_exp_mismatches"] = max(
                stats["max_exp_mismatches"], *(c.exp_mismatches for c in cs)
            )
            stats["max_mantissa_mean"] = max(
                stats["max_mantissa_mean"], *(c.mantissa_mean for c in cs)
            )
            stats["max_mantissa_median"] = max(
                stats["max_mantissa_median"], *(c.mantissa_median for c in cs)
            )
            r = rows[j]
            tokens = torch.tensor(r["completion_tokens"], device=logits.device)
            claimed = torch.tensor(r["completion_logprobs"], dtype=torch.float32)
            at = None
            if not all(r["completion_mask"]):  # a trajectory: only the model's positions
                at = torch.tensor([k for k, m in enumerate(r["completion_mask"]) if m])
                tokens, logits, claimed = tokens[at.to(logits.device)], logits[at], claimed[at]
            own = sampling_logprobs(logits, tokens, s.temperature, s.top_p)
            err = (own - claimed.to(device=own.device, dtype=own.dtype)).abs()
            per_sample[j] = float(err.mean())
            lp_sum, lp_count = lp_sum + float(err.sum()), lp_count + len(err)
            res = check_sampling(
                logits, tokens, r["seed"], s.temperature, s.top_p, ctx.sampling_tolerance,
                positions=at,  # a model token's noise is keyed by its place in the completion
            )  # fmt: skip
            worst = max(worst, res.worst_margin)
            margin_sum, margin_tokens = margin_sum + res.margin_sum, margin_tokens + res.tokens
            short_of[j] = res.behind
            if res.failures:
                bad_sampling.append(j)
    _failing(
        "proof", "make the policy's states or logits non-finite", sorted(not_finite), len(rows)
    )
    _failing("proof", "fail their TOPLOC proofs", sorted(bad_proof), len(rows))
    stats["worst_sampling_margin"] = worst
    _failing(
        "sampling",
        "hold tokens that are not their seeded Gumbel-max choice",
        sorted(bad_sampling),
        len(rows),
    )
    # the file's mean margin: honest tokens fall short of the best score only at
    # near-ties, tokens drawn another way on most positions
    mean_margin = margin_sum / max(margin_tokens, 1)
    stats["mean_sampling_margin"] = mean_margin
    if not mean_margin <= ctx.sampling_mean_tolerance:
        raise Reject(
            "sampling",
            f"tokens fall {mean_margin:.2e} short of their seeded Gumbel-max choice on "
            f"average (tolerance {ctx.sampling_mean_tolerance:.2g})",
            sorted(range(len(rows)))[:10],
        )
    # the file's mean log-prob error: rounding outliers of single tokens average out,
    # a systematic difference (another precision, other weights) does not
    mean_lp = lp_sum / max(lp_count, 1)
    stats["mean_logprob_error"] = mean_lp
    stats["logprob_tokens"] = lp_count
    limit = ctx.logprob_tolerance
    if ctx.logprob_noise is not None:
        limit = ctx.logprob_noise.limit(limit, lp_count)
    if errors is not None:
        errors[:] = per_sample
    if behind is not None:
        behind[:] = short_of
    if not mean_lp <= limit:  # written so that NaN fails
        worst_samples = sorted(range(len(rows)), key=lambda i: -per_sample[i])[:10]
        raise Reject(
            "sampling",
            f"reported log-probs differ from the policy's by {mean_lp:.2e} on average "
            f"(tolerance {limit:.2g} for {lp_count} tokens)",
            worst_samples,
        )
    return stats


def all_finite(hidden: torch.Tensor, logits: torch.Tensor) -> bool:
    return bool(torch.isfinite(hidden).all()) and bool(torch.isfinite(logits).all())

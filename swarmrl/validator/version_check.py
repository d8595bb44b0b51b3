"""Check 9, the version check: which policy version explains a file. Its log-probs and
its token choices are compared against the claimed version's (check 8's figures) and
against the versions before it that the validator holds (validator/loop.py
`check_versions`; docs/verification.md, "The version check")."""

from __future__ import annotations

import math

import torch

from swarmrl.toploc.sampling import check_sampling, sampling_logprobs
from swarmrl.validator.checks import Context, Reject, all_finite

REPORT_CAP = 1e9  # the largest ratio or t a verdict reports


def older_figures(ctx: Context, backend, rows: list[dict]) -> tuple[list[float], list] | None:
    """Each sample's mean absolute difference between its reported log-probs and those of
    the policy `backend` holds, and which of its tokens fall short of that policy's
    seeded Gumbel-max choice (the model's tokens only), from one prefill. None when
    that policy's states or logits are not finite on some sample (the file passed
    check 8 on the claimed version: the older one cannot tell anything against it)."""
    s = ctx.cfg.sampling
    errors, behind = [math.nan] * len(rows), [None] * len(rows)
    batches = backend.prefill_batches(
        [r["prompt_tokens"] for r in rows],
        [r["completion_tokens"] for r in rows],
        max_tokens=ctx.max_batch_tokens,
    )
    for batch in batches:
        for j, hidden, logits in batch:
            if not all_finite(hidden, logits):
                return None
            r = rows[j]
            tokens = torch.tensor(r["completion_tokens"], device=logits.device)
            claimed = torch.tensor(r["completion_logprobs"], dtype=torch.float32)
            at = None
            if not all(r["completion_mask"]):
                at = torch.tensor([k for k, m in enumerate(r["completion_mask"]) if m])
                tokens, logits, claimed = tokens[at.to(logits.device)], logits[at], claimed[at]
            own = sampling_logprobs(logits, tokens, s.temperature, s.top_p)
            errors[j] = float((own - claimed.to(device=own.device, dtype=own.dtype)).abs().mean())
            behind[j] = check_sampling(
                logits, tokens, r["seed"], s.temperature, s.top_p, ctx.sampling_tolerance,
                positions=at,
            ).behind  # fmt: skip
    return errors, behind


def draws_p_value(claimed_behind: list, older_behind: list) -> tuple[int, int, float]:
    """Which version the file's token choices follow: over the tokens that fall short of
    their seeded choice under exactly one of the two versions, `c` under the claimed
    one only and `b` under the older one only, and the chance of c or more of b + c
    when either version is as likely to be the one missed (one-sided sign test). An
    honest worker's tokens are the claimed version's choices but at rounding near-ties,
    which fall either way: c is then at most about half of b + c."""
    b = c = 0
    for mine, theirs in zip(claimed_behind, older_behind, strict=True):
        if mine is None or theirs is None:
            continue
        c += int((mine & ~theirs).sum())
        b += int((theirs & ~mine).sum())
    return b, c, sign_test_p(b, c)


def sign_test_p(b: int, c: int) -> float:
    """The chance of `c` or more of b + c at one half (one-sided sign test), in log space."""
    n = b + c
    log_half = n * math.log(0.5)
    terms = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + log_half
             for k in range(c, n + 1)]  # fmt: skip
    top = max(terms, default=0.0)
    p = math.exp(top) * sum(math.exp(x - top) for x in terms) if n else 1.0
    return min(p, 1.0)


def check_version(
    ctx: Context,
    older,
    rows: list[dict],
    claimed: list[float],
    ratio: float,
    t_min: float,
    claimed_behind: list | None = None,
    alpha: float = 0.0,
    min_samples: int = 8,
) -> dict:
    """Check 9: which version explains the file. `claimed`: each sample's mean log-prob
    error against the claimed version (check 8's); `older`: a backend holding the version
    before it. A worker that generates with the older policy reports that policy's
    log-probs, so its errors against the older version are rounding and against the
    claimed one rounding plus the versions' difference; an honest file is the other way
    round. Rejects when the older version's mean error is below `ratio` times the
    claimed one's and the paired t statistic of the per-sample differences is at least
    `t_min`; where the two versions are too close to tell apart (both errors rounding)
    neither holds, and the file passes: it is then as good as the claimed version's.
    A file of fewer than `min_samples` samples is not judged by this comparison: the
    spread of a few differences says little about the next (one has none, and its t is
    infinite).

    A worker that generates with the older policy and then proves and reports its
    tokens with one prefill of the claimed one (a head start on a version not yet
    fetched) has the claimed log-probs; only its token choices are the older policy's.
    So the check also counts the tokens that fall short of their seeded choice under one
    version only (`claimed_behind`: check 8's, under the claimed one) and rejects when
    the sign test's p-value that the claimed version is the one they follow is under
    `alpha` (`draws_p_value`; 0: off)."""
    figures = older_figures(ctx, older, rows)
    if figures is None:
        return {"version_error_ratio": 1.0, "older_not_finite": 1}
    mine, older_behind = figures
    diff = [c - o for c, o in zip(claimed, mine, strict=True)]
    mean_c = sum(claimed) / len(claimed)
    mean_o = sum(mine) / len(mine)
    n = len(diff)
    mean_d = sum(diff) / n
    sd = math.sqrt(sum((d - mean_d) ** 2 for d in diff) / max(n - 1, 1))
    t = mean_d / (sd / math.sqrt(n)) if sd > 0 else (math.inf if mean_d > 0 else 0.0)
    share = mean_o / mean_c if mean_c > 0 else (1.0 if mean_o == 0 else math.inf)
    # reported capped: a verdict is strict JSON (no Infinity); the decision below uses
    # the values themselves
    stats = {"version_error_ratio": min(share, REPORT_CAP),
             "version_t": max(min(t, REPORT_CAP), -REPORT_CAP), "older_logprob_error": mean_o}  # fmt: skip
    if n >= min_samples and not (share >= ratio or t < t_min):  # written so that NaN fails
        raise Reject(
            "version",
            f"the version before the claimed one explains the reported log-probs better: "
            f"mean error {mean_o:.2e} against {mean_c:.2e} (ratio {share:.2f}, under "
            f"{ratio:g}; paired t {t:.1f})",
            sorted(range(n), key=lambda i: -diff[i])[:10],
        )
    if claimed_behind is None:
        return stats
    b, c, p = draws_p_value(claimed_behind, older_behind)
    stats |= {"version_draws_older": b, "version_draws_claimed": c, "version_draws_p": p}
    if p < alpha:
        raise Reject(
            "version",
            f"the token choices follow an older version: {c} tokens fall short of their "
            f"seeded choice under the claimed version only, {b} under the older one only "
            f"(p {p:.1e}, under {alpha:g})",
        )
    return stats

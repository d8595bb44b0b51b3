"""The figures of bench/verification_rates.py from its results file: honest rates and
margins, the detection matrix, and (run as a script) its tables in Markdown and the
tokens-to-detect figure for docs/verification.md.

Usage: .venv/bin/python bench/verification_report.py runs/verification/rates.jsonl
       [--markdown] [--plot docs/verification-detect.png]
(docs/verification-rates.jsonl.gz is the results file the docs' figures come from.)
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.verification_nodes import node_draws  # noqa: E402
from swarmrl.config.validator import ValidatorConfig  # noqa: E402
from swarmrl.toploc.proof import Thresholds  # noqa: E402
from swarmrl.validator.calibrate import STAT_OF, noise, tolerances  # noqa: E402
from swarmrl.validator.checks import LogprobNoise  # noqa: E402
from swarmrl.validator.frozen import draws_fingerprint, tolerance_fingerprint  # noqa: E402
from swarmrl.validator.loop import (  # noqa: E402
    LOGPROB_TOLERANCE,
    SAMPLING_MEAN_TOLERANCE,
    SAMPLING_TOLERANCE,
)

# each statistic a verdict records, the check it belongs to, and its default threshold
STATS = {
    "mean_logprob_error": ("logprob", LOGPROB_TOLERANCE),
    "worst_sampling_margin": ("sampling", SAMPLING_TOLERANCE),
    "mean_sampling_margin": ("sampling_mean", SAMPLING_MEAN_TOLERANCE),
    "max_exp_mismatches": ("proof", Thresholds().max_exp_mismatches),
    "max_mantissa_mean": ("proof", Thresholds().max_mantissa_mean),
    "max_mantissa_median": ("proof", Thresholds().max_mantissa_median),
}


CALIBRATED = {stat: name for name, stat in STAT_OF.items()}  # statistic -> tolerance


FROZEN = ROOT / "docs" / "verification-frozen.json"  # the commit and fingerprint frozen


def calibration_key(r: dict) -> str:
    key = "{model}-{dtype}-{length}-{turns}-v{validator_threads}".format(**r)
    return key if r.get("version", "base") == "base" else f"{key}-{r['version']}"


def version_rejects(stats: dict, samples: int | None = None) -> bool:
    """Whether the version check's log-prob comparison (validator/version_check.py, check 9) at
    its defaults rejects a file with these statistics (recorded with its rule lifted),
    as frozen: the version two back only where the one before explains the log-probs
    at least as well as the claimed one. `samples`: the file's, to which the second
    freeze's fewest samples apply (None: the first freeze's rule, which had none)."""
    v = ValidatorConfig()
    if samples is not None and samples < v.version_check_min_samples:
        return False
    backs = (1, 2) if stats.get("version_error_ratio_1", 1.0) < 1.0 else (1,)
    return any(
        stats.get(f"version_error_ratio_{k}", 1.0) < v.version_check_ratio
        and stats.get(f"version_t_{k}", 0.0) >= v.version_check_t
        for k in backs
    )


def draws_rejects(stats: dict) -> bool:
    """Whether what check 9 added at the second freeze rejects a file with these
    statistics (recorded with its rules lifted): the sign test on token choices at its
    default, against the version before the claimed one or two back, and the log-prob
    comparison two back where only the token choices led to it (the first freeze's
    rule went two back only on the log-probs' word)."""
    v = ValidatorConfig()
    if any(stats.get(f"version_draws_p_{k}", 1.0) < v.version_draws_alpha for k in (1, 2)):
        return True
    via_draws = stats.get("version_error_ratio_1", 1.0) >= 1.0
    return via_draws and (
        stats.get("version_error_ratio_2", 1.0) < v.version_check_ratio
        and stats.get("version_t_2", 0.0) >= v.version_check_t
    )


def threshold(stat: str, dtype: str, tol: dict | None = None, tokens: int = 0) -> float:
    """The threshold of `stat`: the calibrated tolerance `tol` where given, else the
    dtype's default. A calibration that recorded a file's allowance for its own noise
    (`tol["noise"]`, validator/calibrate.py) sets the log-prob error's threshold of a
    file of `tokens` tokens (0: the calibrated tolerance alone)."""
    if tol is not None and stat in CALIBRATED:
        t = tol[CALIBRATED[stat]]
        if stat == "mean_logprob_error" and tol.get("noise") and tokens:
            t = LogprobNoise(**tol["noise"]).limit(t, tokens)
        return t
    t = STATS[stat][1]
    return t[dtype] if isinstance(t, dict) else t


def rejected_by(r: dict, tol: dict | None = None, draws: bool = True) -> list[str]:
    """The checks that reject an honest file judged with lifted sampling tolerances: the
    check that failed, or each statistic past its threshold (`tol`: the tolerances the
    condition's validator calibrated; None: the dtype's defaults). `draws` False: by the
    first freeze's rule, without what check 9 added at the second."""
    if r["check"]:
        return [r["check"]]
    tokens = r["stats"].get("logprob_tokens", r.get("tokens", 0))
    out = [
        STATS[s][0]
        for s, x in r["stats"].items()
        if s in STATS and x > threshold(s, r["dtype"], tol, tokens)
    ]
    out += ["version"] if version_rejects(r["stats"], r.get("rollouts") if draws else None) else []
    return out + (["version_draws"] if draws and draws_rejects(r["stats"]) else [])


def draws_out_of_sample(records: list[dict], frozen: dict) -> dict:
    """Honest files judged since the token-choice comparison of check 9 was frozen (its
    own commit and fingerprint: `frozen["draws"]`) on which it ran (a claimed version
    with an older one held): per model, rollouts, files, its false rejections and the
    95% upper bound (3/n when none). A file's other checks are counted under the first
    freeze; the two bounds add up (a union bound) for the whole validator."""
    draws = frozen.get("draws")
    if not draws:
        return {"frozen_commit": None}
    after = _descends_from(draws["commit"])
    out = {"frozen_commit": draws["commit"], "fingerprint": draws["fingerprint"],
           "code_matches_frozen": draws_fingerprint() == draws["fingerprint"], "models": {}}  # fmt: skip
    mine = [r for r in records if r["kind"] == "honest"
            and r.get("draws_fingerprint") == draws["fingerprint"]
            and "version_draws_p_1" in r.get("stats", {}) and after(r.get("commit", ""))]  # fmt: skip
    for model in sorted({r["model"] for r in mine}):
        files = [r for r in mine if r["model"] == model]
        rollouts = sum(r["rollouts"] for r in files)
        bad = sum(draws_rejects(r["stats"]) for r in files)
        run = sum(r["rollouts"] for r in files if r.get("version_source") == "run")
        out["models"][model] = {
            "rollouts": rollouts, "files": len(files), "false_rejections": bad,
            "real_run_share": round(run / rollouts, 3),
            "bound95_per_file": round(3 / len(files), 6) if not bad else None,
        }  # fmt: skip
    return out


def margins(rows: list[dict], dtype: str, tol: dict | None) -> dict:
    out = {}
    for s in STATS:
        xs = [r["stats"][s] for r in rows if s in r.get("stats", {})]
        if not xs:
            continue
        sd = statistics.pstdev(xs)
        t, top = threshold(s, dtype, tol), max(xs)
        out[s] = {"max": top, "mean": statistics.fmean(xs), "sd": sd, "threshold": t,
                  "margin_sd": round((t - top) / sd, 1) if sd > 0 else None}  # fmt: skip
    return out


def calibrated(r: dict) -> dict:
    """A calibration record's tolerances, by the validator's rule of today from what it
    measured (a float32 record, which calibrates nothing, as recorded)."""
    if not r.get("measured"):
        return r["tolerances"]
    defaults = {k: threshold(s, r["dtype"]) for s, k in CALIBRATED.items()}
    out = tolerances(r["measured"], r["dtype"], defaults)
    if "spread" in r["measured"]:  # measured with a spread: a file's noise allowed too
        out["noise"] = dataclasses.asdict(noise(r["measured"], defaults))
    return out


def report(records: list[dict]) -> dict:
    honest = [r for r in records if r["kind"] == "honest"]
    cheats = [r for r in records if r["kind"] == "cheat"]
    cals = {r["cond"]: calibrated(r) for r in records if r["kind"] == "calibration"}
    out: dict = {"honest_rollouts": {}, "honest_files": {}, "false_rejections": {},
                 "false_rejections_at_defaults": {}, "calibrated": {}, "margins": {},
                 "conditions": {}, "detection": {}}  # fmt: skip
    for model in sorted({r["model"] for r in honest}):
        mine = [r for r in honest if r["model"] == model]
        out["honest_rollouts"][model] = sum(r["rollouts"] for r in mine)
        out["honest_files"][model] = len(mine)
        for name, tol_of in (("false_rejections", lambda r: cals.get(calibration_key(r))),
                             ("false_rejections_at_defaults", lambda r: None)):  # fmt: skip
            bad: dict[str, int] = {}
            for r in mine:
                for check in rejected_by(r, tol_of(r)):
                    bad[check] = bad.get(check, 0) + 1
            out[name][model] = bad
        out["calibrated"][model] = {}
        out["margins"][model] = {}
        for dtype in sorted({r["dtype"] for r in mine}):
            tols = [t for k, t in cals.items() if k.startswith(f"{model}-{dtype}-")]
            # the tightest tolerance any of the conditions' validators calibrated to
            tol = {k: min(t[k] for t in tols) for k in STAT_OF} if tols else None
            out["calibrated"][model][dtype] = tol
            ok = [r for r in mine if r["dtype"] == dtype and not r["check"]]
            out["margins"][model][dtype] = margins(ok, dtype, tol)
    for cid in sorted({r["cond"] for r in honest}):
        mine = [r for r in honest if r["cond"] == cid]
        out["conditions"][cid] = {
            "rollouts": sum(r["rollouts"] for r in mine),
            "files": len(mine),
            "false_rejections": sum(
                bool(rejected_by(r, cals.get(calibration_key(r)))) for r in mine
            ),
        }
    out["noise_distance"] = {r["model"]: {k: r[k] for k in ("kl_one_step", "kl_noise-0.001",
                             "noise_over_one_step", "tokens")}
                             for r in records if r["kind"] == "distance"}  # fmt: skip
    out["out_of_sample"] = out_of_sample(records)
    out["frozen_commit"] = out["out_of_sample"]["frozen_commit"]
    since = frozen_test(latest=True)
    for r in cheats:
        m = out["detection"].setdefault(r["model"], {})
        name = r["behaviour"] if r["dtype"] == "bfloat16" else f"{r['behaviour']} ({r['dtype']})"
        b = m.setdefault(name, {"files": 0, "caught": 0, "files_since_frozen": 0,
                                "caught_since_frozen": 0, "checks": {}, "ttd": [],
                                "ttd_since": []})  # fmt: skip
        b["files"] += 1
        b["caught"] += r["caught"]
        if since(r):
            b["files_since_frozen"] += 1
            b["caught_since_frozen"] += r["caught"]
            if r["caught"]:  # tokens to detect, like the caught share: by today's rule
                b["ttd_since"].append(r["tokens_to_detect"])
        if r["caught"]:
            b["ttd"].append(r["tokens_to_detect"])
        b["checks"][r["check"]] = b["checks"].get(r["check"], 0) + 1
    for model, m in out["detection"].items():
        for name, b in m.items():
            # by today's rule where it judged any file of the behaviour, else every file's
            # (`tokens_to_detect_of`), and the honest controls the same way
            ttd_all, ttd_since = sorted(b.pop("ttd")), sorted(b.pop("ttd_since"))
            ttd = ttd_since if b["files_since_frozen"] else ttd_all
            b["tokens_to_detect_of"] = "since_frozen" if b["files_since_frozen"] else "all"
            b["check"] = max(b["checks"], key=b["checks"].get)
            n, k = b["files_since_frozen"], b["caught_since_frozen"]
            b["caught_share_since_frozen"] = round(k / n, 4) if n else None
            b["caught_lower95_since_frozen"] = round(lower95(k, n), 4) if n else None
            b["tokens_to_detect"] = {"median": ttd[len(ttd) // 2], "max": ttd[-1]} if ttd else None
            dtype = "float32" if name.endswith("(float32)") else "bfloat16"
            # the honest controls judged by today's rule, as the caught share beside it
            b["honest_rejected_at_that_length"] = honest_at(
                [r for r in cheats if since(r) or not b["files_since_frozen"]], model, dtype, ttd
            )
    out["node_draws"] = node_draws([r for r in cheats if since(r)])
    return out


def honest_at(cheats: list[dict], model: str, dtype: str, ttd: list[int]) -> dict | None:
    """The honest control files' false rejections when a validator reads as many samples
    as the median file of a behaviour needed: (rejected, files) of the honest curves'
    points at the fewest samples covering that many tokens (None: no curve to read)."""
    if not ttd:
        return None
    need = ttd[len(ttd) // 2]
    hits, n = 0, 0
    for r in cheats:
        if r["behaviour"] != "honest" or r["model"] != model or r["dtype"] != dtype:
            continue
        points = [c for c in r["curve"] if len(c) >= 3]  # the check: a 4th, since 2026-12-07
        if not points:
            continue
        at = next((c for c in points if c[0] >= need), points[-1])
        hits, n = hits + bool(at[2]), n + 1
    return {"rejected": hits, "files": n} if n else None


def lower95(k: int, n: int) -> float:
    """The one-sided 95% lower bound on a rate seen k times in n (Clopper-Pearson: the
    rate p at which k or more in n has a 5% chance), by bisection."""
    if k == 0:
        return 0.0

    def at_least_k(p: float) -> float:
        if p <= 0.0 or p >= 1.0:
            return float(p >= 1.0)
        lg = math.lgamma(n + 1)
        return sum(math.exp(lg - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                            + i * math.log(p) + (n - i) * math.log1p(-p))
                   for i in range(k, n + 1))  # fmt: skip

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at_least_k(mid) < 0.05 else (lo, mid)
    return lo


def frozen_test(latest: bool = False):
    """A test of a record: judged under the frozen fingerprint, at or after the frozen
    commit (everything passes when nothing is frozen). `latest`: under every freeze
    since (the token-choice comparison's too, where it is frozen), i.e. by today's rule."""
    if not FROZEN.exists():
        return lambda r: True
    frozen = json.loads(FROZEN.read_text())
    after = _descends_from(frozen["commit"])
    draws = frozen.get("draws") if latest else None
    after_draws = _descends_from(draws["commit"]) if draws else None

    def test(r: dict) -> bool:
        if r.get("fingerprint") != frozen["fingerprint"] or not after(r.get("commit", "")):
            return False
        return not draws or (
            r.get("draws_fingerprint") == draws["fingerprint"] and after_draws(r["commit"])
        )

    return test


def _descends_from(frozen: str):
    """A test of a record's commit: the frozen commit itself or one after it (git's
    ancestry, in this checkout; where git cannot tell, the fingerprint alone decides)."""
    import subprocess

    seen: dict[str, bool] = {}

    def after(commit: str) -> bool:
        if commit.endswith("-dirty"):
            return False  # code that no commit holds
        if commit not in seen:
            try:
                r = subprocess.run(["git", "merge-base", "--is-ancestor", frozen, commit],
                                   cwd=ROOT, capture_output=True, timeout=30)  # fmt: skip
                seen[commit] = r.returncode == 0 if r.returncode in (0, 1) else True
            except (OSError, subprocess.TimeoutExpired):
                seen[commit] = True
        return seen[commit]

    return after


def out_of_sample(records: list[dict]) -> dict:
    """Honest files judged under the tolerances frozen in docs/verification-frozen.json
    (the same fingerprint), with the calibrated tolerances their validators recorded at
    the time: per model, rollouts, files, the share on fine-tuned versions (and on a
    real run's last versions), false rejections, and the 95% upper bound on the
    false-rejection rate (3/n when none)."""
    if not FROZEN.exists():
        return {"frozen_commit": None}
    frozen = json.loads(FROZEN.read_text())
    fp = frozen["fingerprint"]
    since = frozen_test()
    cals = {calibration_key(r): r["tolerances"] for r in records
            if r["kind"] == "calibration" and since(r)}  # fmt: skip
    out = {"frozen_commit": frozen["commit"], "fingerprint": fp,
           "code_matches_frozen": tolerance_fingerprint() == fp, "models": {},
           "draws": draws_out_of_sample(records, frozen)}  # fmt: skip
    for model in sorted({r["model"] for r in records if r["kind"] == "honest"}):
        mine = [r for r in records if r["kind"] == "honest" and r["model"] == model
                and since(r)]  # fmt: skip
        if not mine:
            continue
        rollouts = sum(r["rollouts"] for r in mine)
        tuned = sum(r["rollouts"] for r in mine if r.get("version") == "tuned")
        run = sum(r["rollouts"] for r in mine if r.get("version_source") == "run")
        bad = sum(bool(rejected_by(r, cals.get(calibration_key(r)), draws=False)) for r in mine)
        out["models"][model] = {
            "rollouts": rollouts, "files": len(mine), "tuned_share": round(tuned / rollouts, 3),
            "real_run_share": round(run / rollouts, 3),
            "false_rejections": bad,
            "bound95_per_file": round(3 / len(mine), 6) if not bad else None,
            "bound95_per_rollout": round(3 / rollouts, 8) if not bad else None,
        }  # fmt: skip
    return out


def markdown(result: dict) -> str:
    oos = result["out_of_sample"]
    lines = [f"Out of sample, since {oos['frozen_commit']} (checks 1-9) and since "
             f"{oos.get('draws', {}).get('frozen_commit')} (check 9's token choices):", "",
             "| model | rule | honest rollouts | files | false rejections | 95% bound per file |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for rule, per in (("checks 1-9", oos.get("models", {})),
                      ("token choices", oos.get("draws", {}).get("models", {}))):  # fmt: skip
        for m, x in per.items():
            bound = f"{x['bound95_per_file']:.2%}" if x["bound95_per_file"] else "-"
            lines.append(f"| {m} | {rule} | {x['rollouts']:,} | {x['files']:,} | "
                         f"{x['false_rejections']} | {bound} |")  # fmt: skip
    lines += ["", "All records, in sample and out:", "",
              "| model | honest rollouts | files | false rejections | at the dtype defaults |",
              "|---|---|---|---|---|"]  # fmt: skip
    for m, n in result["honest_rollouts"].items():
        shown = [", ".join(f"{k} {v}" for k, v in result[name][m].items()) or "0"
                 for name in ("false_rejections", "false_rejections_at_defaults")]  # fmt: skip
        lines.append(f"| {m} | {n:,} | {result['honest_files'][m]:,} | {shown[0]} | {shown[1]} |")
    lines += ["", "| model | dtype | statistic | honest max | mean | sd | threshold | margin (sd) |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m, per in result["margins"].items():
        for dtype, stats in per.items():
            for s, x in stats.items():
                lines.append(f"| {m} | {dtype} | {s} | {x['max']:.3g} | {x['mean']:.3g} | "
                             f"{x['sd']:.2g} | {x['threshold']:.3g} | {x['margin_sd'] or '-'} |")  # fmt: skip
    lines += ["", "| model | behaviour | files | caught | check | tokens to detect (median / max)"
              " | honest files rejected at the median's length | by today's rule: caught"
              " (95% lower bound) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m, per in result["detection"].items():
        for name, b in per.items():
            t = b["tokens_to_detect"]
            shown = f"{t['median']} / {t['max']}" if t and t["median"] is not None else "-"
            checks = ", ".join(f"{k} {v}" for k, v in b["checks"].items())
            h = b.get("honest_rejected_at_that_length")
            honest = f"{h['rejected']} of {h['files']}" if h else "-"
            n, k = b["files_since_frozen"], b["caught_since_frozen"]
            today = f"{k} of {n} ({b['caught_lower95_since_frozen']:.1%})" if n else "-"
            lines.append(f"| {m} | {name} | {b['files']} | {b['caught']} | {checks} | {shown} | "
                         f"{honest} | {today} |")  # fmt: skip
    nd = result.get("node_draws", {})
    lines += ["", f"Summing the token-choice counts over a node's last {nd.get('window')} files "
              "(a projection from the recorded counts, by today's rule; not built):", "",
              "| model | behaviour | files | nodes caught | of them by the sum | files to catch "
              "(median / max) | files uncaught at the end |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for m, per in nd.get("models", {}).items():
        for name, n in per.items():
            f = n["files_to_catch"]
            shown = f"{f['median']} / {f['max']}" if f else "-"
            lines.append(f"| {m} | {name} | {n['files']} | {n['nodes_caught']} | {n['by_sum']} | "
                         f"{shown} | {n['uncaught_at_end']} |")  # fmt: skip
    return "\n".join(lines)


GROUPS = {
    "another model": ("stale_1", "stale_2", "head-start_1", "head-start_2", "older-1",
                      "older-2", "older-10", "base",
                      "noise-0.001", "noise-0.01", "noise-0.05"),
    "lower precision": ("fp8", "int8", "int4", "bf16-claims-f32"),
    "the sampler": ("temperature-0.9", "temperature-1.1", "top-p-0.9", "greedy", "wrong-seed",
                    "cheap-tokens"),
    "the task": ("altered-prompt", "wrong-prompts", "truncate", "inflated-reward",
                 "forged-logprobs", "replay", "forged-tool-result", "dropped-turn",
                 "edited-after-tool"),
}  # fmt: skip


def plot(records: list[dict], path: Path) -> None:
    """Share of each behaviour's files caught against the completion tokens read: a row
    per model, a column per kind of behaviour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cheats = [r for r in records if r["kind"] == "cheat" and r["behaviour"] != "honest"]
    models = sorted({r["model"] for r in cheats})
    fig, axes = plt.subplots(
        len(models), len(GROUPS), figsize=(4.2 * len(GROUPS), 3.4 * len(models)), squeeze=False
    )
    for row, model in zip(axes, models, strict=True):
        mine = [r for r in cheats if r["model"] == model]
        top = max(r["file_tokens"] for r in mine)
        budgets = sorted({2**k for k in range(top.bit_length())} | {top})
        for ax, (group, names) in zip(row, GROUPS.items(), strict=True):
            for name in names:
                files = [r for r in mine if r["behaviour"] == name]
                if not files:
                    continue
                share = [sum(r["caught"] and r["tokens_to_detect"] <= b for r in files)
                         / len(files) for b in budgets]  # fmt: skip
                ax.step(budgets, share, where="post", label=f"{name} ({len(files)})")
            ax.set_xscale("log", base=2)
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"{model}: {group}", fontsize=9)
            ax.set_xlabel("completion tokens read", fontsize=8)
            ax.set_ylabel("share of files caught", fontsize=8)
            ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    path = Path(args.results)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    records = [json.loads(line) for line in text.splitlines() if line]
    result = report(records)
    if args.plot:
        plot(records, Path(args.plot))
    print(markdown(result) if args.markdown else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

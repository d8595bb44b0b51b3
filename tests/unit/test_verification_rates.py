"""bench/verification_rates.py's parts: quantised weights, calibrated tolerances, tokens
to detect on real files and judges, and the figures it reports."""

from __future__ import annotations

import math

import pytest
import torch

from bench.verification_cheats import OtherSampler, quantize_rtn
from bench.verification_rates import Maker, issued, judged, make_judge, small_run
from bench.verification_report import report
from swarmrl.protocol.rollouts import read_rollouts
from swarmrl.sim.registry import make_cheat
from swarmrl.validator.calibrate import (
    FACTOR,
    FILE_Z,
    FLOOR,
    PER_LOGPROB,
    UPPER_T,
    noise,
    spread,
    tolerances,
)
from swarmrl.validator.checks import LogprobNoise


def test_weights_are_rounded_to_the_integer_grid_of_each_group():
    w = torch.randn(6, 64)
    q = quantize_rtn(w, bits=4, group=32)
    for row in range(6):
        for g in range(2):
            block, got = w[row, g * 32 : (g + 1) * 32], q[row, g * 32 : (g + 1) * 32]
            scale = block.abs().max() / 7
            steps = got / scale
            assert torch.allclose(steps, steps.round(), atol=1e-4)  # on the grid
            assert steps.abs().max() <= 8 and len(steps.round().unique()) <= 16
            assert (got - block).abs().max() <= scale / 2 + 1e-6  # the nearest point
    q8 = quantize_rtn(w, bits=8, group=None)  # one scale per output row
    assert (q8 - w).abs().max(dim=1).values.le(w.abs().max(dim=1).values / 127 / 2 + 1e-6).all()


def test_calibration_only_tightens_between_the_floor_and_the_default():
    defaults = {"logprob": 0.1, "sampling": 1.0, "sampling_mean": 0.005}
    stats = ("mean_logprob_error", "worst_sampling_margin", "mean_sampling_margin")
    exact = tolerances(dict.fromkeys(stats, 0.0), "bfloat16", defaults)
    assert exact == FLOOR["bfloat16"]
    noisy = tolerances(dict.fromkeys(stats, 1.0), "bfloat16", defaults)
    assert noisy == defaults
    # each statistic's own figure, where it is the larger
    own = tolerances(dict(zip(stats, (1e-3, 0.05, 2e-4), strict=True)), "bfloat16", defaults)
    assert own == pytest.approx(
        {
            "logprob": FACTOR["logprob"] * 1e-3,
            "sampling": FACTOR["sampling"] * 0.05,
            "sampling_mean": FACTOR["sampling_mean"] * 2e-4,
        }
    )
    # margins too rare to be seen in a few samples: scaled from the log-prob error
    rare = tolerances(dict(zip(stats, (8e-3, 0.0, 0.0), strict=True)), "bfloat16", defaults)
    assert rare["sampling"] == pytest.approx(PER_LOGPROB["sampling"] * 8e-3)
    assert rare["sampling_mean"] == pytest.approx(PER_LOGPROB["sampling_mean"] * 8e-3)


def test_the_spread_is_the_groups_deviation_scaled_to_one_token():
    """Two groups of 10 and 30 tokens with mean errors 0.1 and 0.3: the token-weighted
    mean is 0.25; the ratio estimator's variance, per group of 20 tokens on average,
    (10^2 * 0.15^2 + 30^2 * 0.05^2) / (2 - 1) / 20 = 0.225 per token."""
    mean, per_token = spread([(10, 0.1), (30, 0.3)])
    assert mean == pytest.approx(0.25)
    assert per_token == pytest.approx(math.sqrt(0.225))
    assert spread([(10, 0.1)]) == (pytest.approx(0.1), 0.0)  # one group: no spread


def test_a_calibration_errs_towards_leniency_and_a_short_file_gets_its_noise():
    """The mean error is taken UPPER_T standard errors over its estimate; a file's
    log-prob tolerance is the larger of FACTOR times that and that plus FILE_Z of the
    file's standard errors, never above the dtype's default."""
    defaults = {"logprob": 0.1, "sampling": 1.0, "sampling_mean": 0.005}
    measured = {"mean_logprob_error": 0.008, "spread": 0.06, "tokens": 3600,
                "worst_sampling_margin": 0.0, "mean_sampling_margin": 0.0}  # fmt: skip
    upper = 0.008 + UPPER_T * 0.06 / 60
    tol = tolerances(measured, "bfloat16", defaults)
    assert tol["logprob"] == pytest.approx(FACTOR["logprob"] * upper)
    assert tol["sampling"] == pytest.approx(PER_LOGPROB["sampling"] * upper)
    n = noise(measured, defaults)
    assert n == LogprobNoise(pytest.approx(upper), pytest.approx(FILE_Z * 0.06), 0.1)
    assert n.limit(tol["logprob"], 3600) == tol["logprob"]  # a long file: the tolerance
    assert n.limit(tol["logprob"], 25) == pytest.approx(upper + FILE_Z * 0.06 / 5)
    assert n.limit(tol["logprob"], 1) == 0.1  # one token: the default, no more
    assert LogprobNoise(0.01, 0.05, 0.1).limit(0.03, 0) == pytest.approx(0.06)


# The bench imports its helpers as top-level modules (bench/ on its path), so the files
# here are made through those same modules: their record of the assignments they
# issued is the one the judge reads.
@pytest.fixture(scope="module")
def files(random_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rates")
    cfg = small_run(tmp, random_model_dir)
    return make_judge(cfg, tmp), Maker(cfg, tmp, name="worker")


def test_tokens_to_detect_is_the_shortest_leading_run_of_samples_caught(files):
    judge, maker = files
    honest = judged(judge, "honest", *maker.file(), "random", "float32")
    assert not honest["caught"] and honest["tokens_to_detect"] is None
    key, data = maker.file(make_cheat("wrong-seed"))
    first = len(read_rollouts(data)[0]["completion_tokens"])
    seed = judged(judge, "wrong-seed", key, data, "random", "float32")
    # another seed changes the first sample's tokens: its tokens alone are caught
    assert seed["caught"] and seed["check"] == "sampling"
    assert seed["tokens_to_detect"] == first and seed["curve"] == [[first, 1, True, "sampling"]]
    reward = judged(judge, "inflated-reward", *maker.file(make_cheat("inflated-reward")),
                    "random", "float32")  # fmt: skip
    assert reward["check"] == "reward" and 0 < reward["tokens_to_detect"] <= reward["file_tokens"]
    hotter = judged(judge, "temperature-1.5", *maker.file(OtherSampler("t", temperature=1.5)),
                    "random", "float32")  # fmt: skip
    assert hotter["caught"] and hotter["check"] == "sampling", hotter["reason"]
    assert hotter["curve"][-1][::2] == [hotter["tokens_to_detect"], True]
    assert hotter["curve"][-1][3] == "sampling"  # which check rejected the prefix
    assert all(not caught and not check for _, _, caught, check in hotter["curve"][:-1])
    # the honest control's whole curve: not rejected at any length read
    assert [c[2] for c in honest["curve"]] == [False] * len(honest["curve"])
    assert honest["curve"][-1][1] == len(read_rollouts(maker.file()[1]))
    result = report([honest, seed, reward, hotter])["detection"]["random"]
    assert result["honest (float32)"]["caught"] == 0
    assert result["wrong-seed (float32)"]["caught"] == 1
    assert result["wrong-seed (float32)"]["tokens_to_detect"] == {"median": first, "max": first}


def test_an_honest_file_past_a_calibrated_tolerance_counts_as_falsely_rejected():
    base = {"kind": "honest", "model": "m", "dtype": "bfloat16", "length": "short",
            "turns": "single", "validator_threads": 1, "cond": "c", "rollouts": 8,
            "check": "", "stats": {"mean_logprob_error": 1e-3, "worst_sampling_margin": 0.0,
                                   "mean_sampling_margin": 0.0}}  # fmt: skip
    cal = {"kind": "calibration", "cond": "m-bfloat16-short-single-v1",
           "tolerances": {"logprob": 5e-4, "sampling": 0.01, "sampling_mean": 1e-4}}  # fmt: skip
    proof = base | {"check": "proof", "stats": {}}
    got = report([base, proof, cal])
    assert got["honest_rollouts"] == {"m": 16}
    assert got["false_rejections"] == {"m": {"logprob": 1, "proof": 1}}
    assert got["false_rejections_at_defaults"] == {"m": {"proof": 1}}  # 1e-3 < 0.1
    assert got["margins"]["m"]["bfloat16"]["mean_logprob_error"]["threshold"] == 5e-4
    # a calibration that measured its spread allows a short file its noise: 0.02 over
    # 10 tokens is within 2.6e-3 + 5 * 0.02 / sqrt(10), over 10,000 tokens it is past
    # 3 * 2.6e-3 (the mean 2e-3 at its upper bound, 3 * 0.02 / sqrt(10,000) over it)
    cal |= {"dtype": "bfloat16", "measured": {
        "mean_logprob_error": 2e-3, "spread": 0.02, "tokens": 10_000,
        "worst_sampling_margin": 0.0, "mean_sampling_margin": 0.0}}  # fmt: skip
    stats = base["stats"] | {"mean_logprob_error": 0.02}
    short = base | {"stats": stats | {"logprob_tokens": 10}}
    long = base | {"stats": stats | {"logprob_tokens": 10_000}}
    got = report([short, long, cal])
    assert got["false_rejections"] == {"m": {"logprob": 1}}


# TOPLOC's thresholds at their loosest: a proof from other weights passes
PROOF_LIFTED = ["validator.max_exp_mismatches=128", "validator.max_mantissa_mean=128.0",
                "validator.max_mantissa_median=128.0"]  # fmt: skip


@pytest.fixture(scope="module")
def versions(random_model_dir, tmp_path_factory):
    """Two versions of a model: the random one, and the next (its weights moved as a
    training step moves them), published in float32."""
    from bench.verification_cheats import save_version
    from swarmrl.models.loading import load_model
    from swarmrl.sim.cheats import perturb

    tmp = tmp_path_factory.mktemp("versions")
    model = load_model(str(random_model_dir))
    older = save_version(model, random_model_dir, "float32", tmp / "v0")
    perturb(model, 0.02, 7)
    newer = save_version(model, random_model_dir, "float32", tmp / "v1")
    return tmp, older, newer


def test_the_version_check_tells_a_stale_policy_from_the_claimed_one(versions, caplog):
    """Files generated with the version before the claimed one, claiming it, with the
    sampling check's tolerances lifted so that only check 9 can tell: rejected as
    `version`; honest files from the claimed version pass it, with the older version's
    error far above theirs."""
    from bench.verification_rates import LIFTED

    tmp, older, newer = versions
    # the stale files' TOPLOC proofs are the older version's: a 2% move of the weights
    # leaves most of them inside the proof's thresholds, not all (CI failed one of 12
    # samples on proofs), so those are lifted as well, for only check 9 to tell
    lifted = [*LIFTED[:-2], *PROOF_LIFTED]  # check 9 at its defaults
    cfg = small_run(tmp, newer, *lifted)
    judge = make_judge(cfg, tmp, [older])
    honest = Maker(cfg, tmp, name="honest")
    stale = Maker(small_run(tmp, older, *lifted), tmp, name="stale")
    honest.policy = stale.policy = 1
    for _ in range(2):
        key, data = honest.file()
        v = judge.judge(key, data, issued=issued(key))
        assert v.accepted, (v.check, v.reason)
        assert v.stats["version_error_ratio_1"] > 1.0 / judge.cfg.validator.version_check_ratio
        key, data = stale.file()
        v = judge.judge(key, data, issued=issued(key))
        assert not v.accepted and v.check == "version", (v.check, v.reason)
    off = make_judge(small_run(tmp, newer, *lifted, "validator.version_check=false"), tmp,
                     [older])  # fmt: skip
    assert off.judge(key, data, issued=issued(key)).accepted  # what check 9 adds
    # a file of fewer samples than version_check_min_samples (these hold 12) is not
    # judged by the log-prob comparison, however clearly the older version explains it
    few = make_judge(small_run(tmp, newer, *lifted, "validator.version_check_min_samples=13",
                               "validator.version_draws_alpha=0"), tmp, [older])  # fmt: skip
    assert "compares only their token choices" in caplog.text  # said when it starts
    v = few.judge(key, data, issued=issued(key))
    assert v.accepted, (v.check, v.reason)
    assert v.stats["version_error_ratio_1"] < judge.cfg.validator.version_check_ratio
    assert v.stats["version_t_1"] >= judge.cfg.validator.version_check_t


@pytest.fixture(scope="module")
def peaked_versions(random_model_dir, tmp_path_factory):
    """Two versions whose token choices differ: the random model with its output layer
    scaled up (an untrained model's flat logits leave every choice to the seeded noise,
    the same for both versions) and the same moved by 20% noise."""
    from bench.verification_cheats import save_version
    from swarmrl.models.loading import load_model
    from swarmrl.sim.cheats import perturb

    tmp = tmp_path_factory.mktemp("peaked")
    model = load_model(str(random_model_dir))
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    older = save_version(model, random_model_dir, "float32", tmp / "v0")
    perturb(model, 0.2, 7)
    newer = save_version(model, random_model_dir, "float32", tmp / "v1")
    return tmp, older, newer


def test_the_version_check_tells_whose_token_choices_a_file_follows(peaked_versions):
    """A head start: tokens generated with the version before the claimed one, proved and
    their log-probs reported with one prefill of the claimed version. The log-prob
    comparison cannot see it (the log-probs are the claimed version's); the sign test
    over tokens that fall short of their seeded choice under one version only does."""
    from bench.verification_cheats import HeadStart
    from bench.verification_rates import LIFTED

    tmp, older, newer = peaked_versions
    cfg = small_run(tmp, newer, *LIFTED[:-2])  # check 9 at its defaults
    judge = make_judge(cfg, tmp, [older])
    maker = Maker(cfg, tmp, name="head-start")
    maker.policy = 1
    head_start = HeadStart(older, "head-start_1")
    key, data = maker.file(head_start)
    v = judge.judge(key, data, issued=issued(key))
    assert not v.accepted and v.check == "version" and "token choices" in v.reason, v.reason
    honest = judge.judge(*(kd := maker.file()), issued=issued(kd[0]))
    assert honest.accepted, (honest.check, honest.reason)
    assert honest.stats["version_draws_older_1"] > honest.stats["version_draws_claimed_1"]
    off = make_judge(small_run(tmp, newer, *LIFTED[:-2], "validator.version_draws_alpha=0"),
                     tmp, [older])  # fmt: skip
    lenient = off.judge(key, data, issued=issued(key))
    assert lenient.accepted, lenient.reason  # what the sign test adds to check 9
    assert lenient.stats["version_draws_claimed_1"] > lenient.stats["version_draws_older_1"]


def test_the_sign_test_counts_each_version_missed_alone():
    from swarmrl.validator.version_check import draws_p_value

    def t(*bits):
        return torch.tensor(bits, dtype=torch.bool)

    # tokens behind under both versions or neither say nothing; None: no model tokens
    assert draws_p_value([t(1, 1, 0, 0), None], [t(1, 0, 0, 1), t(1)]) == (
        1,
        1,
        pytest.approx(0.75),
    )
    b, c, p = draws_p_value([torch.ones(14, dtype=torch.bool)], [torch.zeros(14, dtype=torch.bool)])
    assert (b, c) == (0, 14) and p == pytest.approx(2.0**-14)
    assert draws_p_value([t(0, 0)], [t(1, 1)])[2] == pytest.approx(1.0)
    b, c, p = draws_p_value([t(*[1] * 20 + [0] * 2)], [t(*[0] * 20 + [1] * 2)])
    assert p == pytest.approx(sum(math.comb(22, k) for k in range(20, 23)) / 2**22)


def test_only_honest_files_under_the_frozen_tolerances_count_out_of_sample(tmp_path, monkeypatch):
    import json

    from bench import verification_report
    from swarmrl.validator.frozen import tolerance_fingerprint

    frozen = tmp_path / "frozen.json"
    frozen.write_text(json.dumps({"commit": "HEAD", "fingerprint": tolerance_fingerprint()}))
    monkeypatch.setattr(verification_report, "FROZEN", frozen)
    # git's ancestry, as the checkout would answer it: "old" came before the freeze
    monkeypatch.setattr(verification_report, "_descends_from", lambda f: lambda c: c != "old")
    base = {"kind": "honest", "model": "m", "dtype": "float32", "length": "short",
            "turns": "single", "validator_threads": 1, "cond": "c", "rollouts": 64,
            "check": "", "stats": {"mean_logprob_error": 1e-7}, "version": "tuned",
            "fingerprint": tolerance_fingerprint(), "commit": "HEAD"}  # fmt: skip
    before = base | {"fingerprint": "an older rule", "check": "sampling"}
    earlier = base | {"commit": "old", "check": "sampling"}  # the same rule, before it froze
    stale_looking = base | {"stats": {"version_error_ratio_1": 0.5, "version_t_1": 3.0}}
    got = report([base, base | {"version": "base"}, before, earlier])["out_of_sample"]
    assert got["frozen_commit"] == "HEAD" and got["code_matches_frozen"]
    assert got["models"]["m"] == {"rollouts": 128, "files": 2, "tuned_share": 0.5,
                                  "real_run_share": 0.0, "false_rejections": 0, "bound95_per_file": 1.5,
                                  "bound95_per_rollout": round(3 / 128, 8)}  # fmt: skip
    got = report([base, stale_looking])["out_of_sample"]["models"]["m"]
    assert got["false_rejections"] == 1 and got["bound95_per_file"] is None


def test_detection_counts_since_the_freeze_with_a_lower_bound(tmp_path, monkeypatch):
    import json

    from bench import verification_report
    from swarmrl.validator.frozen import tolerance_fingerprint

    frozen = tmp_path / "frozen.json"
    frozen.write_text(json.dumps({"commit": "HEAD", "fingerprint": tolerance_fingerprint()}))
    monkeypatch.setattr(verification_report, "FROZEN", frozen)
    monkeypatch.setattr(verification_report, "_descends_from", lambda f: lambda c: c != "old")
    caught = {"kind": "cheat", "model": "m", "dtype": "bfloat16", "behaviour": "stale_1",
              "caught": True, "check": "version", "tokens_to_detect": 40, "curve": [],
              "commit": "HEAD", "fingerprint": tolerance_fingerprint()}  # fmt: skip
    missed = caught | {"caught": False, "check": "accepted", "tokens_to_detect": None}
    records = [caught] * 20 + [missed] + [caught | {"commit": "old"}] * 5
    got = report(records)["detection"]["m"]["stale_1"]
    assert (got["files"], got["caught"]) == (26, 25)
    assert (got["files_since_frozen"], got["caught_since_frozen"]) == (21, 20)
    # the rate p at which 20 or more of 21 has a 5% chance: 21 p^20 (1 - p) + p^21 = 0.05
    p = got["caught_lower95_since_frozen"]
    assert 21 * p**20 * (1 - p) + p**21 == pytest.approx(0.05, abs=1e-3)
    assert verification_report.lower95(100, 100) == pytest.approx(0.05 ** (1 / 100))
    assert verification_report.lower95(0, 7) == 0.0


def test_the_token_choice_comparison_is_counted_from_its_own_freeze(tmp_path, monkeypatch):
    """Check 9's sign test came after the first freeze: its honest files count from its
    own commit on, only where it ran (an older version held), and detection since the
    freeze is judged by today's whole rule."""
    import json

    from bench import verification_report
    from swarmrl.validator.frozen import draws_fingerprint, tolerance_fingerprint

    frozen = tmp_path / "frozen.json"
    frozen.write_text(json.dumps({"commit": "first", "fingerprint": tolerance_fingerprint(),
                                  "draws": {"commit": "second",
                                            "fingerprint": draws_fingerprint()}}))  # fmt: skip
    monkeypatch.setattr(verification_report, "FROZEN", frozen)
    order = ["old", "first", "between", "second", "new"]
    monkeypatch.setattr(verification_report, "_descends_from",
                        lambda f: lambda c: order.index(c) >= order.index(f))  # fmt: skip
    stamp = {"fingerprint": tolerance_fingerprint(), "draws_fingerprint": draws_fingerprint()}
    honest = {"kind": "honest", "model": "m", "dtype": "bfloat16", "length": "short",
              "turns": "single", "validator_threads": 1, "cond": "c", "rollouts": 32,
              "check": "", "version": "tuned", "commit": "new", **stamp,
              "stats": {"version_draws_p_1": 0.3}}  # fmt: skip
    flagged = honest | {"stats": {"version_draws_p_1": 1e-6}}
    # two back only because the token choices led there (the log-probs' ratio was not
    # under 1): the first freeze's rule never went there, the second's rejects
    two_back = honest | {"stats": {"version_draws_p_1": 0.2, "version_error_ratio_1": 3.0,
                                   "version_error_ratio_2": 0.5, "version_t_2": 4.0}}  # fmt: skip
    base = honest | {"version": "base", "stats": {}}  # no older version: the test cannot run
    before = honest | {"commit": "between"}
    got = report([honest, honest, flagged, two_back, base, before])["out_of_sample"]
    assert got["models"]["m"]["files"] == 6  # the first freeze counts them all
    assert got["models"]["m"]["false_rejections"] == 0  # by its own rule
    draws = got["draws"]
    assert draws["frozen_commit"] == "second" and draws["code_matches_frozen"]
    assert draws["models"]["m"] == {"rollouts": 128, "files": 4, "false_rejections": 2,
                                    "real_run_share": 0.0, "bound95_per_file": None}  # fmt: skip
    caught = {"kind": "cheat", "model": "m", "dtype": "bfloat16", "behaviour": "head-start_1",
              "caught": True, "check": "version", "tokens_to_detect": 9, "curve": [],
              "commit": "new", **stamp}  # fmt: skip
    older_rule = caught | {"commit": "between", "caught": False, "check": "accepted"}
    got = report([caught, older_rule])["detection"]["m"]["head-start_1"]
    assert (got["files"], got["files_since_frozen"], got["caught_since_frozen"]) == (2, 1, 1)


def test_an_older_version_that_breaks_down_tells_nothing_against_the_file(versions):
    """A held older version whose logits are not finite (a broken checkpoint on the
    validator's side) leaves the file to checks 1-8: its NaN must not count as the
    sender's tokens following it, nor its log-prob error as evidence."""
    from bench.verification_cheats import save_version
    from bench.verification_rates import LIFTED
    from swarmrl.models.loading import load_model

    tmp, older, newer = versions
    broken = load_model(str(older))
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    broken_dir = save_version(broken, older, "float32", tmp / "broken")
    cfg = small_run(tmp, newer, *LIFTED[:-2])
    judge = make_judge(cfg, tmp, [broken_dir])
    maker = Maker(cfg, tmp, name="honest-beside-broken")
    maker.policy = 1
    key, data = maker.file()
    v = judge.judge(key, data, issued=issued(key))
    assert v.accepted, (v.check, v.reason)
    assert v.stats["older_not_finite_1"] == 1


def test_a_continued_detection_run_starts_past_every_earlier_counter():
    from bench.verification_detection import first_counter

    # an earlier run that wrote 3 files used at most 1,000 counters a file past its start
    first = first_counter(0, None)
    assert first_counter(3, None) >= first + 3 * 1000
    # runs side by side on other behaviours: ranges of their own, a billion apart
    a, b = first_counter(0, {"stale_1"}), first_counter(0, {"stale_2"})
    assert a // 10**9 != b // 10**9 and a % 10**9 == b % 10**9 == first


def test_summing_a_nodes_token_choice_counts_catches_a_head_start_no_file_shows_alone():
    """The report's projection: a node whose every file has 4 tokens short under the
    claimed version only (p 0.06 a file) is caught once 14 such tokens add up (its 4th
    file; 0.5**14 < 1e-4 < 0.5**13), a file its own checks reject starts a fresh node,
    and honest counts (the older version missed, never the claimed one alone) never
    add up to a catch."""
    from bench.verification_nodes import node_draws

    def rec(name, b, c, caught=False, at=0.0):
        return {"model": "m", "dtype": "bfloat16", "behaviour": name, "caught": caught, "at": at,
                "stats": {"version_draws_older_1": b, "version_draws_claimed_1": c}}  # fmt: skip

    files = [rec("head-start", 0, 4, at=i) for i in range(10)]
    files[5] = rec("head-start", 0, 0, caught=True, at=5)  # the sampling check, say
    files += [rec("honest", 5, 0, at=20 + i) for i in range(50)]
    got = node_draws(files)["models"]["m"]
    hs = got["head-start"]
    # files 0-3: caught by the sum at the 4th; file 4 alone then file 5 caught by its
    # own check; files 6-9: caught by the sum at the 4th again
    assert (hs["nodes_caught"], hs["by_sum"]) == (3, 2)
    assert hs["files_to_catch"] == {"median": 4, "max": 4} and hs["uncaught_at_end"] == 0
    assert got["honest"]["nodes_caught"] == 0 and got["honest"]["uncaught_at_end"] == 50


def test_tokens_to_detect_and_the_honest_curve_come_from_files_judged_by_todays_rule():
    """Beside the caught share since the freeze, its tokens to detect and the honest
    controls' rejections at that length come from the files judged since the freeze
    too, not from those of an earlier one (the first freeze's looser numbers caught
    SmolLM2's stale files in 32 tokens, the second's in about 100)."""
    import json
    import subprocess

    from bench.verification_report import FROZEN

    frozen = json.loads(FROZEN.read_text())
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, cwd=FROZEN.parent.parent).stdout.strip()  # fmt: skip
    today = {"commit": head, "fingerprint": frozen["fingerprint"],
             "draws_fingerprint": frozen["draws"]["fingerprint"]}  # fmt: skip
    earlier = {"commit": "0" * 12, "fingerprint": "e9781b60270f2aa1"}
    base = {"kind": "cheat", "model": "m", "dtype": "bfloat16", "check": "version"}

    def stale(tokens, **when):
        return base | when | {"behaviour": "stale_1", "caught": True, "tokens_to_detect": tokens}

    def honest(rejected_at_16, **when):
        return base | when | {"behaviour": "honest", "caught": False, "check": "accepted",
                              "tokens_to_detect": None,
                              "curve": [[16, 1, rejected_at_16, ""], [200, 8, False, ""]]}  # fmt: skip

    records = [stale(16, **earlier), stale(16, **earlier), stale(100, **today),
               stale(120, **today), honest(True, **earlier), honest(False, **today)]  # fmt: skip
    got = report(records)["detection"]["m"]["stale_1"]
    assert got["files_since_frozen"] == 2 and got["tokens_to_detect_of"] == "since_frozen"
    assert got["tokens_to_detect"] == {"median": 120, "max": 120}
    # the earlier honest control, rejected at 16 tokens, is not today's curve
    assert got["honest_rejected_at_that_length"] == {"rejected": 0, "files": 1}

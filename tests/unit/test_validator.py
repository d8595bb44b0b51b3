"""The detection matrix: honest files accepted, every cheat rejected, hostile files refused."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bench.rollout_files import Maker, issued, make_judge, small_run
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.sim.cheats import OtherModel
from swarmrl.sim.registry import make_cheat
from swarmrl.validator.checks import Reject, check_with_model, check_without_model


@pytest.fixture(scope="module")
def setup(random_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validator")
    cfg = small_run(tmp, random_model_dir)
    return cfg, tmp, make_judge(cfg, tmp), Maker(cfg, tmp, name="worker")


def _judge(judge, key, data):
    v = judge.judge(key, data, issued=issued(key))
    assert v is not None
    return v


@pytest.mark.slow  # 26 s; honest files are accepted in every other validator test as well
def test_honest_files_are_accepted_under_varied_batches_threads_and_padding(
    random_model_dir, tmp_path
):
    """More than 500 honest samples: batch sizes 1 to 64 (padding changes with the batch),
    1 and 2 threads, prompts of 3 to 20 characters, long and short completions."""
    judge = None
    samples = 0
    worst = {"exp": 0, "mean": 0.0, "margin": 0.0, "lp": 0.0}
    for i, (max_batch, threads, groups) in enumerate(
        [(1, 1, 3), (3, 2, 4), (7, 1, 6), (16, 2, 6), (64, 1, 8), (64, 2, 8), (5, 1, 8)]
    ):
        cfg = small_run(tmp_path, random_model_dir, f"worker.groups_per_file={groups}")
        judge = make_judge(cfg, tmp_path / f"j{i}")
        torch.set_num_threads(threads)
        try:
            maker = Maker(cfg, tmp_path, name=f"honest-{i}", max_batch=max_batch)
            for _ in range(3):
                v = _judge(judge, *maker.file())
                assert v.accepted, (max_batch, threads, v.check, v.reason)
                samples += v.n_samples
                worst["exp"] = max(worst["exp"], v.stats["max_exp_mismatches"])
                worst["mean"] = max(worst["mean"], v.stats["max_mantissa_mean"])
                worst["margin"] = max(worst["margin"], v.stats["worst_sampling_margin"])
                worst["lp"] = max(worst["lp"], v.stats["mean_logprob_error"])
        finally:
            torch.set_num_threads(1)
    assert samples >= 500
    # far inside the limits, not just under them
    assert worst["exp"] <= 2 and worst["mean"] <= 1.0, worst
    assert worst["margin"] < 1e-3 and worst["lp"] < 2e-6, worst


CHEATS = {
    # 5% weight noise: its tokens and log-probs, sometimes a chunk of its proofs
    "other-model": {"sampling", "proof"},
    "low-precision": {"sampling"},  # its log-probs; proofs pass (see test below)
    "altered-prompt": {"proof"},
    "cheap-tokens": {"sampling"},
    "inflated-reward": {"reward"},
    "forged-logprobs": {"sampling"},  # its log-probs are not the policy's
    "wrong-seed": {"sampling"},
    "truncate": {"termination"},
    "wrong-prompts": {"assignment"},
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_each_cheat_is_rejected_every_time(setup, cheat):
    cfg, tmp, judge, maker = setup
    for rep in range(3):
        key, data = maker.file(make_cheat(cheat, seed=rep))
        v = _judge(judge, key, data)
        assert not v.accepted, f"{cheat} file {rep} accepted"
        assert v.check in CHEATS[cheat], (v.check, v.reason)
        assert v.samples and v.reason


@pytest.fixture(scope="module")
def bf16_setup(random_model_dir, tmp_path_factory):
    """The same random model published in bfloat16: worker and validator run it so."""
    from swarmrl.models.loading import load_model, load_tokenizer, set_config_dtype

    tmp = tmp_path_factory.mktemp("validator-bf16")
    version = tmp / "version"
    load_model(str(random_model_dir)).to(torch.bfloat16).save_pretrained(version)
    load_tokenizer(str(random_model_dir)).save_pretrained(version)
    set_config_dtype(version, "bfloat16")
    cfg = small_run(tmp, version)
    return cfg, tmp, make_judge(cfg, tmp), Maker(cfg, tmp, name="worker")


def test_in_bfloat16_honest_files_pass_and_every_cheat_is_rejected(bf16_setup):
    """The matrix on a policy published in bfloat16 (its low-precision cheat rounds to
    fp8): honest files accepted, each cheat caught at its check. The validator sets its
    tolerances from its own honest samples (validator/calibrate.py): the defaults, set
    for SmolLM2's honest spread (mean log-prob error up to 0.031), would let fp8 weights
    of a model this small through (7e-3 here, against honest files' 2e-4)."""
    from swarmrl.validator.calibrate import FLOOR
    from swarmrl.validator.loop import LOGPROB_TOLERANCE, SAMPLING_TOLERANCE

    cfg, tmp, judge, maker = bf16_setup
    assert maker.backend.running_dtype == judge.backend.running_dtype == "bfloat16"
    from swarmrl.validator.calibrate import MIN_GROUPS, MIN_TOKENS

    cal = judge.calibrations["bfloat16"]
    assert cal is not None and cal.measured["mean_logprob_error"] > 0
    # measured on enough tokens and prompt groups to see their spread
    assert cal.measured["tokens"] >= MIN_TOKENS and cal.measured["groups"] >= MIN_GROUPS
    assert cal.measured["spread"] > 0 and judge.ctx.logprob_noise == cal.noise
    assert judge.ctx.logprob_tolerance == cal.tolerances["logprob"]
    assert (
        FLOOR["bfloat16"]["logprob"] <= judge.ctx.logprob_tolerance < LOGPROB_TOLERANCE["bfloat16"]
    )
    assert judge.ctx.sampling_tolerance < SAMPLING_TOLERANCE["bfloat16"]
    for _ in range(2):
        v = _judge(judge, *maker.file())
        assert v.accepted, (v.check, v.reason)
    # fp8 weights (low-precision in bfloat16) are far enough off for the proofs too
    bf16_checks = {**CHEATS, "low-precision": {"proof", "sampling"}}
    for cheat, checks in sorted(bf16_checks.items()):
        v = _judge(judge, *maker.file(make_cheat(cheat, seed=1)))
        assert not v.accepted and v.check in checks, (cheat, v.check, v.reason)


def test_a_first_bfloat16_version_is_judged_with_its_own_tolerances(
    random_model_dir, bf16_setup, tmp_path
):
    """A validator starts from the float32 base model, then loads the first version the
    trainer published in bfloat16 to judge a file of it: that file is judged with the
    bfloat16 tolerances (with the float32 ones an honest file's 1e-4 log-prob error is
    far over 2e-5)."""
    from bench.rollout_files import FixedWeights
    from swarmrl.inference.hf import HFBackend
    from swarmrl.protocol.identity import load_or_create_key
    from swarmrl.validator.loop import Judge

    _, tmp, _, _ = bf16_setup
    version = tmp / "version"
    cfg = small_run(tmp_path, version)  # the defaults
    maker = Maker(cfg, tmp_path, name="worker")
    backend = HFBackend()
    backend.load(random_model_dir)  # float32, as `swarmrl validator` starts
    judge = Judge(cfg, backend, FixedWeights(version), load_or_create_key(tmp_path / "v.key"))
    assert judge.ctx.logprob_tolerance == 2e-5
    v = _judge(judge, *maker.file())
    assert backend.running_dtype == "bfloat16"
    assert v.accepted, (v.check, v.reason)
    assert 2e-5 < v.stats["mean_logprob_error"] < judge.ctx.logprob_tolerance, v.stats
    assert set(judge.calibrations) == {"bfloat16"}  # measured on the version's load


def test_tolerances_set_in_the_config_are_not_calibrated(bf16_setup, tmp_path):
    """A tolerance given in [validator] is used as it is; the others are calibrated."""
    _, tmp, _, _ = bf16_setup
    cfg = small_run(tmp_path, tmp / "version", "validator.logprob_tolerance=0.05")
    judge = make_judge(cfg, tmp_path)
    cal = judge.calibrations["bfloat16"]
    assert judge.ctx.logprob_tolerance == 0.05 and judge.ctx.logprob_noise is None  # as it is
    assert judge.ctx.sampling_mean_tolerance == cal.tolerances["sampling_mean"]
    off = make_judge(small_run(tmp_path, tmp / "version", "validator.calibrate=false"), tmp_path)
    assert off.calibrations == {} and off.ctx.logprob_tolerance == 0.1


def test_tolerances_follow_the_dtype_versions_run_in():
    from swarmrl.config import load_config
    from swarmrl.validator.loop import logprob_tolerance, sampling_tolerance

    cfg = load_config(None, [])
    assert logprob_tolerance(cfg, "float32") == 2e-5
    assert logprob_tolerance(cfg, "bfloat16") == 0.1
    assert sampling_tolerance(cfg, "float32") == 0.01
    assert sampling_tolerance(cfg, "bfloat16") == 1.0
    given = load_config(None, ["validator.logprob_tolerance=0.5", "validator.sampling_tolerance=2"])
    assert logprob_tolerance(given, "bfloat16") == sampling_tolerance(given, "float32") / 4


def test_a_reinitialised_model_fails_the_proofs(setup):
    """Another initialisation: the TOPLOC proofs alone reject it."""
    cfg, tmp, judge, maker = setup

    class Reinit(OtherModel):
        def after_load(self, backend):
            torch.manual_seed(12345)
            fresh = type(backend.model)(backend.model.config)
            backend.model.load_state_dict(fresh.state_dict())

    v = _judge(judge, *maker.file(Reinit()))
    assert not v.accepted and v.check == "proof"


def _with(rows, **changes):
    return [r | changes for r in rows]


def _table_bytes(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return buf.getvalue()


def test_hostile_files_are_rejected_with_a_reason(setup):
    cfg, tmp, judge, maker = setup
    key, data = maker.file()
    rows = read_rollouts(data)
    hostile = {
        "not parquet": b"PAR1 this is not a parquet file",
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "wrong types": _table_bytes(pa.table({"problem_id": [1, 2], "reward": ["a", "b"]})),
        "huge list": write_rollouts(_with(rows, completion_tokens=[1] * 100_000)),
        "proofs too short": write_rollouts(_with(rows, proofs=b"\x00" * 10)),
        "proofs too long": write_rollouts(
            [r | {"proofs": r["proofs"] + b"\x00\x01"} for r in rows]
        ),
        "bad modulus": write_rollouts(
            [r | {"proofs": b"\x00\x00" + r["proofs"][2:]} for r in rows]
        ),
        "token out of vocabulary": write_rollouts(
            [r | {"completion_tokens": [10**6] * len(r["completion_tokens"])} for r in rows]
        ),
        "negative token": write_rollouts(
            [r | {"completion_tokens": [-1] * len(r["completion_tokens"])} for r in rows]
        ),
        "nan reward": write_rollouts(_with(rows, reward=float("nan"))),
        "missing group": write_rollouts([r for r in rows if r["group"] != 1]),
        "other node column": write_rollouts(_with(rows, node="ab" * 32)),
        "text not the tokens": write_rollouts(_with(rows, completion="forged")),
    }
    for name, blob in hostile.items():
        v = _judge(judge, key, blob)
        assert not v.accepted, name
        assert v.check and v.check != "error" and v.reason, (name, v.check, v.reason)
    bad_key = _judge(judge, "rollouts/step_000001/evil.parquet", data)
    assert not bad_key.accepted and bad_key.check == "identity"


def test_low_precision_passes_the_proofs_and_fails_the_logprobs(setup):
    """What each check sees of weights rounded to bfloat16 under a float32 policy: the
    TOPLOC statistics stay inside the published thresholds; the log-probs do not."""
    cfg, tmp, judge, maker = setup
    key, data = maker.file(make_cheat("low-precision"))
    info, rows = check_without_model(judge.ctx.with_issued(issued(key)), key, data)
    assert judge.ensure_policy(0)
    tolerance, judge.ctx.logprob_tolerance = judge.ctx.logprob_tolerance, 10.0
    try:
        stats = check_with_model(judge.ctx, judge.backend, rows)
        assert stats["max_mantissa_mean"] <= 10
        assert stats["mean_logprob_error"] > tolerance
    except Reject as r:
        assert r.check == "sampling"  # a token flipped: caught even without the log-probs
    finally:
        judge.ctx.logprob_tolerance = tolerance


def test_files_ahead_of_the_trainer_are_rejected_not_left_waiting(setup):
    """A file for a later step, or from a policy not yet published, cannot be honest;
    left unjudged it would count as pending for ever and stall the workers."""
    cfg, tmp, judge, maker = setup
    key, data = maker.file(step=1)
    v = _judge_at(judge, key, data, trainer_step=1)  # policy 0 < step 1: fine
    assert v.accepted, v.reason
    key, data = maker.file(step=3)
    v = _judge_at(judge, key, data, trainer_step=2)
    assert not v.accepted and v.check == "identity" and "collecting step 2" in v.reason


def _judge_at(judge, key, data, trainer_step):
    v = judge.judge(key, data, trainer_step, issued=issued(key))
    assert v is not None
    return v


def test_the_issued_difficulty_is_enforced(random_model_dir, tmp_path):
    """Prompts come from the sampler state the trainer issued for the file's step: an
    honest file at level 3 passes, a worker that picks the easiest level is caught by
    the assignment check, and a step with no issued state fails closed."""
    cfg = small_run(tmp_path, random_model_dir)
    judge = make_judge(cfg, tmp_path / "j")
    maker = Maker(cfg, tmp_path, name="leveled", state=SamplerState(level=3))
    key, data = maker.file(step=1)
    v = _judge(judge, key, data)
    assert v.accepted, (v.check, v.reason)
    assert all("/L3/" in r["problem_id"] for r in read_rollouts(data))
    key, data = maker.file(make_cheat("easy-level"), step=2)
    v = _judge(judge, key, data)
    assert not v.accepted and v.check == "assignment", (v.check, v.reason)
    key, data = maker.file(step=4)
    v = judge.judge(key, data, issued={**issued(key), "sampler": None})
    assert not v.accepted and v.check == "assignment" and "no sampler state" in v.reason
    v = judge.judge(key, data, issued=None)
    assert not v.accepted and v.check == "assignment" and "no sampler state" in v.reason
    v = judge.judge(key, data, issued={**issued(key), "sampler": {"level": "hard"}})
    assert not v.accepted and v.check == "assignment" and "unreadable" in v.reason


def test_a_file_that_says_another_nucleus_is_rejected(setup):
    """The rows' recorded top_p must be the run's, as their temperature must."""
    cfg, tmp, judge, maker = setup
    key, data = maker.file(step=3)
    narrow = write_rollouts([r | {"top_p": 0.5} for r in read_rollouts(data)])
    v = _judge(judge, key, narrow)
    assert not v.accepted and v.check == "assignment", (v.check, v.reason)
    assert "another temperature or top_p" in v.reason


def test_configured_proof_thresholds_are_applied(setup):
    """validator.max_mantissa_* reach the TOPLOC check: with a zero mantissa allowance
    the bfloat16-rounded policy, which passes the published thresholds, fails its proofs."""
    from swarmrl.toploc.proof import Thresholds

    cfg, tmp, judge, maker = setup
    key, data = maker.file(make_cheat("low-precision"))
    info, rows = check_without_model(judge.ctx.with_issued(issued(key)), key, data)
    assert judge.ensure_policy(0)
    published, judge.ctx.thresholds = judge.ctx.thresholds, Thresholds(38, 0.0, 0.0)
    try:
        with pytest.raises(Reject) as e:
            check_with_model(judge.ctx, judge.backend, rows)
        assert e.value.check == "proof"
    finally:
        judge.ctx.thresholds = published


def test_claimed_files_are_judged_against_the_issued_assignment(random_model_dir, tmp_path):
    """The orchestrator's claim carries the sampler state and length budget of the
    assignment: a file made for them passes; the same file judged against another
    issued level fails; bytes other than the submitted ones are rejected outright."""
    from swarmrl.protocol.assign import parse_rollout_key
    from swarmrl.protocol.rollouts import sha256
    from swarmrl.validator.loop import judge_claimed

    cfg = small_run(tmp_path, random_model_dir)
    judge = make_judge(cfg, tmp_path / "j")
    maker = Maker(cfg, tmp_path, name="claimed", state=SamplerState(level=2))
    key, data = maker.file(step=1)
    info = parse_rollout_key(key)
    issued = {"step": 1, "policy_step": 0, "sampler": {"level": 2, "weights": {}},
              "max_new_tokens": cfg.sampling.max_new_tokens}  # fmt: skip
    claim = {"key": key, "sha256": sha256(data), "node": info["node"], "assignment": issued}
    assert judge_claimed(judge, claim, data, 2).accepted
    other = claim | {"assignment": issued | {"sampler": {"level": 0, "weights": {}}}}
    v = judge_claimed(judge, other, data, 2)
    assert not v.accepted and v.check == "assignment"
    v = judge_claimed(judge, claim | {"sha256": "0" * 64}, data, 2)
    assert not v.accepted and v.check == "identity" and v.sha256 == "0" * 64

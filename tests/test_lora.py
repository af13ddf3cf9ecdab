"""LoRA through peft (issue 36, item 2): only the adapter trains, the reference is the adapter switched off (no
second copy of the base), ``memory_plan`` counts it, the saved adapter loads back, and a LoRA run resumes exactly.
On the offline chat stand-in (``standins``); skipped without the [lora] extra."""

import math
import sys
import warnings

import datasets
import pytest
import torch
from standins import save_chat_standin
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from minirl import checkpoint, config, decoding, evaluation, lora, memory, models, rl, rollout

pytest.importorskip("peft")

PROMPTS = ["Tom has 3 apples.", "What is 2 times 6?", "A box holds 12 pens.", "Sam gives away 5 pens."]


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    return save_chat_standin(tmp_path_factory.mktemp("qwen3lora"))


def ids_reward(prompts, completions, completion_ids, **_):
    """A reward with signal on a random model (whose completions all run to max_new_tokens): the token ids' sum
    modulo 7."""
    return [float(sum(ids) % 7) for ids in completion_ids]


def lora_cfg(**overrides):
    return config.make_config("grpo", **{
        "steps": 2, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8, "lr": 1e-2, "beta": 0.04,
        "num_minibatches": 1, "num_iterations": 2, "lora_rank": 4, "lora_alpha": 8.0, "progress": False,
        **overrides})


def train(path, cfg, *, attach_first: bool = False, model=None, **kwargs):
    """``train_rl`` on the stand-in; it attaches the adapter itself (the caller's model then computes with it), or,
    with ``attach_first``, the caller attaches it and keeps the peft model (its ``disable_adapter`` included);
    ``model``: the caller's own model instead of the stand-in loaded afresh."""
    lm, tok = model if model is not None else models.load(str(path)), AutoTokenizer.from_pretrained(str(path))
    if attach_first:
        lm = lora.attach(lm, rank=cfg.lora_rank, alpha=cfg.lora_alpha, target=cfg.lora_target_modules, seed=cfg.seed)
    data = datasets.Dataset.from_dict({"prompt": PROMPTS})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = rl.train_rl(lm, tok, cfg, data, reward_fn=ids_reward, **kwargs)
    return lm, tok, history


def test_lora_trains_only_the_adapter_tensors(standin_dir):
    base = models.load(str(standin_dir)).state_dict()
    lm, _, history = train(standin_dir, lora_cfg())  # train_rl attaches the adapter
    names = {n: p for n, p in lm.named_parameters()}
    adapter = {n: p for n, p in names.items() if "lora_" in n}
    assert adapter and all(p.requires_grad for p in adapter.values())
    assert all(not p.requires_grad and p.grad is None for n, p in names.items() if n not in adapter)
    # every base weight exactly as loaded; the adapter's B (zero at the start) moved
    frozen = {n.replace(".base_layer", ""): p for n, p in lm.state_dict().items() if "lora_" not in n}
    assert frozen.keys() == base.keys() and all(torch.equal(frozen[k], base[k]) for k in base)
    assert any(float(p.detach().abs().max()) > 0 for n, p in adapter.items() if "lora_B" in n)
    assert all(math.isfinite(r["loss"]) for r in history.rows) and history.rows[-1]["kl_ref"] > 0


# paper-index: lora.attach
def test_no_second_copy_of_the_base_and_optimizer_state_for_the_adapter_only(standin_dir):
    lm = models.load(str(standin_dir))
    n_all = models.count_parameters(lm)
    lm = lora.attach(lm, rank=4, alpha=8.0, target="all-linear")
    cfg = lora_cfg()
    ref = rl.reference_model(lm, None, cfg)
    assert isinstance(ref, lora.AdapterOff) and list(ref.parameters()) == [] and ref.state_dict() == {}
    optimizer = rl.make_optimizer(lm, None, cfg)
    trainable = [p for p in lm.parameters() if p.requires_grad]
    assert optimizer.param_groups[0]["params"] == trainable
    rl.update_minibatch(lm, optimizer, one_batch(lm, AutoTokenizer.from_pretrained(str(standin_dir))), cfg,
                        beta=0.0)
    held = evaluation.memory_held(lm, optimizer, ref)
    adapter_bytes = sum(p.numel() * 4 for p in trainable)
    assert held["memory_reference_bytes"] == 0  # a full copy would be the policy's bytes
    assert held["memory_grad_bytes"] == adapter_bytes
    assert held["memory_optimizer_bytes"] == 2 * adapter_bytes + 4 * len(trainable)  # two moments + a step count
    assert sum(p.numel() for p in trainable) < 0.2 * n_all  # 8,192 of 122,816 on the stand-in
    # without LoRA the reference is a deep copy: as many bytes as the policy
    plain = models.load(str(standin_dir))
    full_ref = rl.reference_model(plain, None, cfg)
    assert evaluation.memory_held(plain, None, full_ref)["memory_reference_bytes"] == 4 * n_all


def one_batch(model, tok) -> rl.RLBatch:
    torch.manual_seed(1)
    r = decoding.generate(model, tok, PROMPTS[:2], 2, 6)
    with torch.no_grad():
        old = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens) * r.completion_mask
    return rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                      completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=old,
                      advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]))


def test_the_reference_log_probs_are_the_base_models(standin_dir):
    lm, tok, _ = train(standin_dir, lora_cfg(), attach_first=True)
    base = models.load(str(standin_dir))
    ref = lora.AdapterOff(lm)
    torch.manual_seed(0)
    r = decoding.generate(lm, tok, PROMPTS, 2, 8)
    args = (r.input_ids, r.attention_mask, r.n_prompt_tokens)
    with torch.no_grad():
        got, want, policy = (rollout.token_logprobs(m, *args) for m in (ref, base, lm))
    assert torch.equal(got, want)  # bit for bit: the same frozen weights, the adapter's branch skipped
    assert float((policy - want).abs().max()) > 1e-3  # the trained adapter does change the policy


def test_the_saved_adapter_loads_back_with_the_same_logits(standin_dir, tmp_path):
    lm, _, _ = train(standin_dir, lora_cfg(), output_dir=tmp_path)
    saved = sorted(p.name for p in (tmp_path / checkpoint.POLICY).iterdir())
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved  # the adapter only
    loaded = models.load(str(tmp_path / checkpoint.POLICY))
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, lm(input_ids=ids).logits)


def test_a_lora_run_resumes_exactly(standin_dir, tmp_path):
    timing = ("time", "time_generate", "time_optimise")

    def rows(history):
        return [{k: v for k, v in r.items() if k not in timing} for r in history.rows]

    _, _, whole = train(standin_dir, lora_cfg(steps=3))
    train(standin_dir, lora_cfg(steps=1, checkpoint_every=1), output_dir=tmp_path)
    _, _, resumed = train(standin_dir, lora_cfg(steps=3), resume_from=tmp_path / "checkpoint-1")
    assert rows(resumed) == rows(whole)


# paper-index: memory.lora_parameter_count
def test_memory_plan_counts_the_adapter_and_no_reference():
    qcfg = Qwen3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, vocab_size=50)
    for target in ("all-linear", "q_proj,v_proj", "down_proj"):
        peft_model = lora.attach(Qwen3ForCausalLM(qcfg), rank=4, alpha=8.0, target=target)
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert memory.lora_parameter_count(qcfg, rank=4, target=target) == trainable
    # by hand, "q_proj,v_proj": 2 layers x 4 x ((32 + 32) + (32 + 16)) = 896
    assert memory.lora_parameter_count(qcfg, rank=4, target="q_proj,v_proj") == 896
    kw = dict(prompts_per_step=1, group_size=2, max_new_tokens=8, num_minibatches=1, beta=0.04)
    full = memory.memory_plan(qcfg, config.make_config("grpo", **kw), prompt_tokens=8)
    low = memory.memory_plan(qcfg, config.make_config("grpo", lora_rank=4, lora_target_modules="q_proj,v_proj",
                                                      **kw), prompt_tokens=8)
    N = memory.parameter_count(qcfg)
    assert (full["grads"], full["optimizer"], full["reference"]) == (4 * N, 8 * N, 4 * N)
    assert (low["grads"], low["optimizer"], low["reference"], low["weights"]) == (4 * 896, 8 * 896, 0,
                                                                                  4 * (N + 896))
    assert low["trainable"] == 896 and low["activations"] == full["activations"]
    with pytest.raises(ValueError, match="not Qwen3 linear layers"):
        memory.lora_parameter_count(qcfg, rank=4, target="lm_head")


def test_memory_plan_activations_hold_under_lora_on_the_real_vocabulary_model():
    from test_real_model import saved_activation_bytes

    qcfg = Qwen3Config(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, vocab_size=151_936, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM._from_config(qcfg, attn_implementation="sdpa", dtype=torch.float32)
    model = lora.attach(model, rank=8, alpha=16.0, target="all-linear").train()
    b, P, T = 2, 16, 32
    ids = torch.randint(3, 151_936, (b, P + T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    measured = saved_activation_bytes(model, ids, mask, P)
    cfg = config.make_config("grpo", prompts_per_step=1, group_size=b, max_new_tokens=T, num_minibatches=1,
                             lora_rank=8)
    planned = memory.memory_plan(qcfg, cfg, prompt_tokens=P)["activations"]
    # measured 40,022,272 bytes (without LoRA 40,305,280: frozen weights save a little less), planned 0.7% more
    assert abs(planned - measured) / measured < 0.02


def test_lora_settings_are_checked():
    for bad, match in ((dict(lora_rank=-1), "lora_rank"), (dict(lora_alpha=0.0), "lora_alpha"),
                       (dict(lora_target_modules=""), "lora_target_modules"),
                       (dict(lora_target_modules="q_proj,,v_proj"), "lora_target_modules")):
        with pytest.raises(ValueError, match=match):
            config.make_config("grpo", **bad)
    with pytest.raises(ValueError, match="critic"):
        config.make_config("ppo", lora_rank=8)
    with pytest.raises(ValueError, match="peft model"):
        lora.AdapterOff(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="holds no weights"):
        lora.AdapterOff(lora.attach(Qwen3ForCausalLM(Qwen3Config(
            hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, vocab_size=20)), rank=2, alpha=2.0, target="all-linear")
        ).load_state_dict({"w": torch.zeros(1)})
    assert lora.attach(torch.nn.Linear(2, 2), rank=0, alpha=1.0, target="all-linear").__class__ is torch.nn.Linear


def test_without_peft_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"\[lora\]"):
        lora.attach(torch.nn.Linear(2, 2), rank=4, alpha=8.0, target="all-linear")


def test_the_adapter_initialisation_is_seeded_and_leaves_the_global_random_state_alone():
    qcfg = Qwen3Config(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=8, vocab_size=20)
    adapters = []
    for draws in (0, 5):
        torch.manual_seed(123)
        model = Qwen3ForCausalLM(qcfg)
        torch.rand(draws)  # whatever ran before
        state = torch.get_rng_state()
        peft_model = lora.attach(model, rank=2, alpha=2.0, target="all-linear", seed=7)
        assert torch.equal(torch.get_rng_state(), state)
        adapters.append({n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_A" in n})
    assert all(torch.equal(adapters[0][n], adapters[1][n]) for n in adapters[0])


def test_the_cli_trains_a_lora_adapter_with_tensorboard(standin_dir, tmp_path):
    from minirl import __main__ as cli

    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    assert cli.main(["train", "--model", str(standin_dir), "--steps", "1", "--prompts-per-step", "2",
                     "--group-size", "2", "--max-new-tokens", "4", "--lora-rank", "4", "--beta", "0.04",
                     "--report-to", "tensorboard", "--out", str(out)]) == 0
    assert (out / "policy" / "adapter_model.safetensors").is_file() and any((out / "tensorboard").iterdir())


@pytest.mark.parametrize("moe,settings", [
    (False, dict(precision="bf16-autocast", gradient_checkpointing=True, logprob_batch_size=2, micro_batch_size=2)),
    (True, dict(routing_replay=True, gradient_checkpointing=True)),  # peft adapts the router and experts too
], ids=["dense-autocast-checkpointing", "moe-r2-checkpointing"])
def test_lora_runs_with_the_real_scale_settings(tmp_path, moe, settings):
    from test_real_model import save_standin

    from minirl.tokenizer import build_tokenizer

    path = save_standin(tmp_path / "m", moe=moe)
    cfg = lora_cfg(**settings)
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4=", "5+6="]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = rl.train_rl(models.load(str(path)), build_tokenizer(), cfg, data, reward_fn=ids_reward)
    assert all(math.isfinite(r["loss"]) for r in history.rows) and history.rows[-1]["kl_ref"] > 0


def test_a_callers_trained_adapter_is_the_reference_not_the_bare_base(standin_dir, tmp_path):
    """Issue 47 item 5: a peft model handed in with a trained adapter starts the run, so at an lr too small to move
    it the KL to the reference is 0 at step 1 (it was 0.0115: the reference was the base, the adapter switched off).
    TRL 1.16 copies such an adapter into a frozen "ref" adapter; so does ``lora.AdapterCopy``."""
    lm = lora.attach(models.load(str(standin_dir)), rank=4, alpha=8.0, target="all-linear")
    with torch.no_grad():  # "trained": every B away from 0
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.3)
    trainable = [n for n, p in lm.named_parameters() if p.requires_grad]
    _, _, history = train(standin_dir, lora_cfg(steps=2, lr=1e-12, checkpoint_every=1), model=lm,
                          output_dir=tmp_path)
    assert [r["kl_ref"] for r in history.rows] == [0.0, 0.0]  # measured exactly 0: the same weights, the same sums
    assert trainable == [n for n, p in lm.named_parameters() if p.requires_grad]  # the copy stays frozen
    assert not (tmp_path / checkpoint.POLICY / lora.REFERENCE_ADAPTER).exists()  # the policy's adapter only
    ref = rl.reference_model(lm, None, lora_cfg())
    assert isinstance(ref, lora.AdapterCopy) and len(ref.state_dict()) == len(trainable)
    # the adapter train_rl attaches itself (B = 0) is the base exactly: switched off, nothing copied
    fresh = lora.attach(models.load(str(standin_dir)), rank=4, alpha=8.0, target="all-linear")
    assert isinstance(rl.reference_model(fresh, None, lora_cfg()), lora.AdapterOff)
    fresh.base_model.model.lm_head.weight.requires_grad_(True)  # a base weight that moves: no frozen reference
    with pytest.raises(ValueError, match="outside its adapter"):
        rl.reference_model(fresh, None, lora_cfg())


def test_a_saved_adapter_names_its_relative_base_by_its_absolute_path(standin_dir, tmp_path, monkeypatch):
    """Issue 47 item 10: a base loaded from a relative folder (``--model m``) is found again by ``models.load`` of
    the saved policy from another working directory, offline (it was taken for a hub name)."""
    import huggingface_hub

    (tmp_path / "m").symlink_to(standin_dir)
    monkeypatch.chdir(tmp_path)
    lm = lora.attach(models.load("m"), rank=4, alpha=8.0, target="all-linear")
    checkpoint.save_policy(lm, AutoTokenizer.from_pretrained("m"), "out/policy")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import
    loaded = models.load(str(tmp_path / "out" / "policy"))
    ids = torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, lm(input_ids=ids).logits)

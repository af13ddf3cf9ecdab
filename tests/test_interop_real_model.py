"""The real-model settings of RLConfig in TRL 1.16 and verl 0.9.1 (issue 36): precision, gradient checkpointing,
GDPO's aggregation, LoRA, the batch sizes and TensorBoard reach the engines' configs, or are left out with the
reason (``interop.real_model``)."""

import io
import warnings
import zipfile
from pathlib import Path

import pytest

from minirl import config, interop, lora, models
from minirl.interop import real_model

trl = pytest.importorskip("trl")
VERL_WHEEL = Path(__file__).resolve().parent.parent / ".cache" / "verl" / "verl-0.9.1-py3-none-any.whl"


@pytest.mark.parametrize("precision,bf16,dtype", [("fp32", False, "float32"), ("bf16-autocast", True, "float32"),
                                                  ("bf16", True, "bfloat16")])
def test_precision_and_checkpointing_reach_grpoconfig(tmp_path, precision, bf16, dtype):
    for checkpointing in (False, True):
        cfg = config.make_config("grpo", precision=precision, gradient_checkpointing=checkpointing)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # transformers 5's names, not the deprecated aliases
            args = interop.to_trl(cfg, output_dir=str(tmp_path), use_cpu=True)
        assert (args.bf16, args.model_init_kwargs) == (bf16, {"dtype": dtype})
        assert args.activation_checkpointing is checkpointing and args.gradient_checkpointing is checkpointing
        assert args.activation_checkpointing_kwargs == ({"use_reentrant": False} if checkpointing else None)
    # TRL's own defaults: bfloat16 autocast and checkpointing on, which a minirl fp32 run without checkpointing
    # must state (TRL loads a named model in float32 unless model_init_kwargs says otherwise)
    plain = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert (plain.gradient_checkpointing, plain.model_init_kwargs) == (True, None)


def test_rloo_gets_the_same_precision_settings():
    kwargs = interop.rloo_trl_kwargs(config.make_config("rloo", precision="bf16-autocast",
                                                        gradient_checkpointing=True))
    assert (kwargs["bf16"], kwargs["model_init_kwargs"], kwargs["activation_checkpointing"]) == \
        (True, {"dtype": "float32"}, True)


def test_gdpo_reaches_grpoconfig_and_verl_refuses_it(tmp_path):
    gdpo = config.make_config("grpo", multi_objective_aggregation="normalize_then_sum")
    args = interop.to_trl(gdpo, output_dir=str(tmp_path), use_cpu=True, reward_weights=[1.0, 0.5])
    assert (args.multi_objective_aggregation, args.reward_weights) == ("normalize_then_sum", [1.0, 0.5])
    assert interop.to_trl(config.make_config("grpo"), output_dir=str(tmp_path),
                          use_cpu=True).multi_objective_aggregation == "sum_then_normalize"
    with pytest.raises(NotImplementedError, match="multi_objective_aggregation='normalize_then_sum'"):
        interop.to_verl(gdpo)


def test_lora_is_trls_peft_config_with_the_same_trainable_tensors(tmp_path, tok):
    pytest.importorskip("peft")
    import datasets

    from minirl import tasks

    assert real_model.trl_peft_config(config.make_config("grpo")) is None
    cfg = config.make_config("grpo", lora_rank=4, lora_alpha=8.0, lora_target_modules="q_proj,v_proj",
                             prompts_per_step=2, group_size=2, num_minibatches=1)
    peft_config = real_model.trl_peft_config(cfg)
    assert (peft_config.r, peft_config.lora_alpha, peft_config.lora_dropout) == (4, 8.0, 0.0)
    assert set(peft_config.target_modules) == {"q_proj", "v_proj"}
    ckpt = tmp_path / "ckpt"
    models.tiny_dense(tok).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="], "answer": ["3", "7"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl.GRPOTrainer(model=models.load(str(ckpt)), reward_funcs=tasks.running_sums_reward,
                                  args=interop.to_trl(cfg, output_dir=str(tmp_path / "out"), use_cpu=True,
                                                      report_to="none"),
                                  train_dataset=data, processing_class=tok, peft_config=peft_config)
    ours = lora.attach(models.load(str(ckpt)), rank=4, alpha=8.0, target="q_proj,v_proj")
    theirs = {n.replace("base_model.model.", "", 1) for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert theirs == {n.replace("base_model.model.", "", 1) for n, p in ours.named_parameters() if p.requires_grad}
    # TRL's reference under LoRA is the adapter switched off, as minirl's: it holds no second model
    assert cfg.beta > 0 and trainer.ref_model is None


def test_verl_overrides_for_the_real_model_settings():
    default = interop.verl_overrides(config.make_config("grpo"))
    for part in ("actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
                 "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=False"):
        assert part in default  # verl's defaults (bf16 forwards, checkpointing on) differ from minirl's: stated
    assert not any("lora" in o or "max_num_seqs" in o or "log_prob_micro" in o or "logger" in o for o in default)
    real = interop.verl_overrides(config.make_config(
        "grpo", precision="bf16-autocast", gradient_checkpointing=True, generation_batch_size=64,
        logprob_batch_size=8, lora_rank=16, lora_alpha=32.0, lora_target_modules="q_proj,v_proj",
        report_to="tensorboard"))
    for part in ("actor_rollout_ref.ref.fsdp_config.model_dtype=fp32",
                 "+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=True",
                 "actor_rollout_ref.rollout.max_num_seqs=64",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
                 "actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora_alpha=32.0",
                 "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", "trainer.logger=[console,tensorboard]"):
        assert part in real
    bf16 = interop.verl_overrides(config.make_config("grpo", precision="bf16", lora_rank=8))
    assert "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16" in bf16
    assert "actor_rollout_ref.model.target_modules=all-linear" in bf16


# paper-index: interop.verl_settings
def test_every_key_verl_overrides_writes_is_in_verls_generated_config():
    """Each key without Hydra's "+" is in verl 0.9.1's _generated_ppo_trainer.yaml; the "+" ones are fields of its
    engine config dataclass (mixed_precision) that the yaml leaves out."""
    if not VERL_WHEEL.is_file():
        pytest.skip("verl's wheel is not in .cache/verl: pip download verl==0.9.1 --no-deps -d .cache/verl")
    yaml = pytest.importorskip("yaml")
    with zipfile.ZipFile(VERL_WHEEL) as wheel:
        tree = yaml.safe_load(io.TextIOWrapper(wheel.open("verl/trainer/config/_generated_ppo_trainer.yaml")))
        engine = wheel.read("verl/workers/config/engine.py").decode()
    cfg = config.make_config("grpo", precision="bf16-autocast", gradient_checkpointing=True, generation_batch_size=64,
                             logprob_batch_size=8, lora_rank=16, report_to="tensorboard")
    for override in real_model.verl_settings(cfg):
        key = override.split("=", 1)[0]
        if key.startswith("+"):
            assert "mixed_precision: Optional[dict[str, Any]] = None" in engine and ".mixed_precision." in key
            continue
        node = tree
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, (key, part)
            node = node[part]


def test_what_is_not_mapped_says_why():
    assert set(real_model.NOT_MAPPED["trl"]) == {"generation_batch_size", "logprob_batch_size",
                                                 "completion_only_head", "report_to"}
    assert all(len(why) > 40 for engine in real_model.NOT_MAPPED.values() for why in engine.values())

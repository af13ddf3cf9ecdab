"""Issue 36's acceptance figures, measured on the offline stand-ins: ``python notebooks/results/real_model.py`` writes
real_model.json (about 2 minutes on 2 cores, one thread).

- the traps, before and after: a right-padded prompt's first-token distribution; rows that end in the checkpoint's
  second EOS; how often the checkpointed layers run in eval mode (before) and in the update's train mode (after);
  routing replay under checkpointing; the share of weights one update at lr 1e-6 moves per precision;
- ``memory_plan`` against the saved-tensor bytes of a 1-layer model with the real 151,936-token vocabulary (eager,
  sdpa, and sdpa under LoRA);
- the peak resident memory of the no-grad log-prob forward of 16 rows against ``logprob_batch_size`` (the peak RSS
  the kernel reports, reset before each size: the CPU has no allocator statistics), beside the plan's chunk;
- ``models.load`` of a trained policy's folder against the policy's logits, and resume after 2 of 4 steps against
  the uninterrupted run, for full training and for LoRA, on the chat stand-in.

"Before" is the old behaviour called directly (the tokenizer's EOS alone, the model left in eval mode, the replay
hooks removed before the backward, bfloat16 weights without a master copy), not an old commit.
"""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from standins import save_chat_standin  # noqa: E402
from test_real_model import PROMPTS, grads, moved_share, rl_batch, save_standin, saved_activation_bytes  # noqa: E402

from minirl import checkpoint, config, lora, memory, models, precision, rl, decoding, rollout  # noqa: E402
from minirl.moe import replay_routing  # noqa: E402
from minirl.tokenizer import build_tokenizer  # noqa: E402


def kl(p, q) -> float:
    return float((p.exp() * (p - q)).sum())


def padding_trap(path) -> dict:
    lm, tok = models.load(str(path)), build_tokenizer()

    def first_token_logp(prompts):
        enc = tok(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = lm(input_ids=enc.input_ids, attention_mask=enc.attention_mask, logits_to_keep=1,
                     position_ids=rollout.position_ids_from_mask(enc.attention_mask))
        return out.logits[:, -1].log_softmax(-1)

    alone, other = first_token_logp(PROMPTS[:1])[0], first_token_logp(PROMPTS[1:])[0]
    tok.padding_side = "right"
    right = first_token_logp(PROMPTS)[0]
    try:
        decoding.generate(lm, tok, PROMPTS, 2, 4)
        after = "accepted"
    except ValueError as err:
        after = f"ValueError: {str(err)[:80]}..."
    return {"kl_nats_alone_vs_right_padded_in_a_batch": kl(alone, right),
            "kl_nats_alone_vs_another_prompt": kl(alone, other), "after": after}


def eos_trap(path) -> dict:
    lm, tok = models.load(str(path)), build_tokenizer()
    second = tok.convert_tokens_to_ids("#")
    hook = lm.lm_head.register_forward_hook(lambda m, i, o: o + 30.0 * F.one_hot(torch.tensor(second), o.shape[-1]))
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = enc.input_ids.repeat_interleave(2, 0), enc.attention_mask.repeat_interleave(2, 0)
    torch.manual_seed(0)
    tokens, _ = decoding.sample_tokens(lm, ids, mask, 8, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    before = rollout.completion_mask(tokens, tok.eos_token_id).sum(-1)  # the tokenizer's EOS only
    torch.manual_seed(0)
    after = decoding.generate(lm, tok, PROMPTS, 2, 8).lengths
    hook.remove()
    return {"lengths_before": before.tolist(), "lengths_after": after.tolist(),
            "eos_ids_after": rollout.eos_token_ids(tok, lm)}


def checkpointing_trap(path, moe_path) -> dict:
    cfg = config.make_config("grpo", beta=0.0, lr=1e-6, progress=False)
    out = {}
    for mode in ("eval (before)", "train (after)"):
        lm, tok = models.load(str(path)), build_tokenizer()
        precision.prepare(lm, precision="fp32", lr=cfg.lr, gradient_checkpointing=True)
        batch, count = rl_batch(lm, tok), []
        for layer in lm.model.layers:
            layer.mlp.register_forward_pre_hook(lambda m, a, count=count: count.append(1))
        if mode.startswith("eval"):  # the old update: the model as loaded, in eval mode
            logprobs = rollout.token_logprobs(lm, batch.input_ids, batch.attention_mask, batch.n_prompt_tokens)
            (logprobs * batch.advantages[:, None]).sum().backward()
        else:
            rl.update_minibatch(lm, rl.make_optimizer(lm, None, cfg), batch, cfg, beta=0.0)
        out[f"mlp_calls_{mode.split()[0]}_2_layers"] = len(count)
    gradients = []
    for on in (False, True):
        lm, tok = models.load(str(path)), build_tokenizer()
        precision.prepare(lm, precision="fp32", lr=cfg.lr, gradient_checkpointing=on)
        rl.update_minibatch(lm, rl.make_optimizer(lm, None, cfg), rl_batch(lm, tok), cfg, beta=0.0)
        gradients.append(grads(lm))
    out["grad_max_abs_diff_with_vs_without"] = max(float((a - b).abs().max()) for a, b in zip(*gradients, strict=True))
    # routing replay: the old update removed the replay hooks before the backward
    moe_cfg = config.make_config("grpo", beta=0.0, lr=1e-6, routing_replay=True, progress=False)
    moe, tok = models.load(str(moe_path)), build_tokenizer()
    precision.prepare(moe, precision="fp32", lr=1e-6, gradient_checkpointing=True)
    batch = rl_batch(moe, tok, routes=True)
    try:
        with precision.train_mode(moe):
            with replay_routing(moe, batch.routes):
                logprobs = rollout.token_logprobs(moe, batch.input_ids, batch.attention_mask, batch.n_prompt_tokens)
            (logprobs * batch.advantages[:, None]).sum().backward()
        out["replay_before"] = "no error"
    except Exception as err:  # torch.utils.checkpoint.CheckpointError
        out["replay_before"] = f"{type(err).__name__}: {str(err).splitlines()[0][:90]}"
    moe_grads = []
    for on in (False, True):
        moe, tok = models.load(str(moe_path)), build_tokenizer()
        precision.prepare(moe, precision="fp32", lr=1e-6, gradient_checkpointing=on)
        rl.update_minibatch(moe, rl.make_optimizer(moe, None, moe_cfg), rl_batch(moe, tok, routes=True), moe_cfg,
                            beta=0.0)
        moe_grads.append(grads(moe))
    out["replay_after_grad_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(*moe_grads, strict=True))
    return out


def precision_trap(path) -> dict:
    out = {}
    for name in ("fp32", "bf16-autocast", "bf16"):
        lm = models.load(str(path))
        cfg = config.make_config("grpo", beta=0.0, lr=1e-6, precision=name, progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            precision.prepare(lm, precision=name, lr=cfg.lr)
        out[f"moved_share_{name}"] = moved_share(lm, cfg)
    return out


def plan_vs_saved() -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    qcfg = Qwen3Config(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, vocab_size=151_936, tie_word_embeddings=True)
    b, P, T = 2, 16, 32
    ids = torch.randint(3, 151_936, (b, P + T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    out = {}
    for name, attention, rank in (("eager", "eager", 0), ("sdpa", "sdpa", 0), ("sdpa_lora_r8", "sdpa", 8)):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM._from_config(qcfg, attn_implementation=attention, dtype=torch.float32)
        model = lora.attach(model, rank=rank, alpha=16.0, target="all-linear").train()
        measured = saved_activation_bytes(model, ids, mask, P)
        cfg = config.make_config("grpo", prompts_per_step=1, group_size=b, max_new_tokens=T, num_minibatches=1,
                                 lora_rank=rank)
        planned = memory.memory_plan(qcfg, cfg, prompt_tokens=P, attention=attention)["activations"]
        out[name] = {"measured_bytes": measured, "planned_bytes": planned, "relative_error": (planned - measured) /
                     measured}
    return out


def _proc_bytes(field: str) -> int:
    import re

    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def logprob_peak(rows: int = 16, P: int = 16, T: int = 64) -> dict:
    """The peak resident memory above the resident memory before, of one no-grad log-prob forward over ``rows``
    rows, per ``logprob_batch_size`` (Linux: /proc/self/clear_refs resets the peak, VmHWM reads it)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    qcfg = Qwen3Config(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, vocab_size=151_936, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM._from_config(qcfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    ids = torch.randint(3, 151_936, (rows, P + T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():  # warm-up: kernels, allocator
        rollout.token_logprobs(model, ids[:1], mask[:1], P)
    out = {}
    for name in ("fp32", "bf16-autocast"):
        for size in (16, 8, 4, 2, 1):
            Path("/proc/self/clear_refs").write_text("5")
            base = _proc_bytes("VmRSS")
            with torch.no_grad(), precision.autocast(model, name):
                rollout.token_logprobs(model, ids, mask, P, return_entropy=True, batch_size=size)
            cfg = config.make_config("grpo", prompts_per_step=rows // 2, group_size=2, max_new_tokens=T,
                                     num_minibatches=1, logprob_batch_size=size, precision=name)
            out[f"{name}_{size}"] = {"peak_increase_bytes": _proc_bytes("VmHWM") - base, "planned_logits_chunk_bytes":
                                     memory.memory_plan(qcfg, cfg, prompt_tokens=P)["logits_chunk"]}
    return out


def reload_and_resume() -> dict:
    import datasets
    from transformers import AutoTokenizer

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = save_chat_standin(tmp / "standin")
        tok = AutoTokenizer.from_pretrained(str(path))
        data = datasets.Dataset.from_dict({"prompt": ["Tom has 3 apples.", "What is 2 times 6?",
                                                      "A box holds 12 pens.", "Sam gives away 5 pens."]})

        def reward(completion_ids, **_):
            return [float(sum(ids) % 7) for ids in completion_ids]

        def run(name, steps, rank, **kwargs):
            cfg = config.make_config("grpo", steps=steps, prompts_per_step=2, group_size=4, max_new_tokens=8,
                                     lr=1e-3, beta=0.04, num_minibatches=2, checkpoint_every=2, lora_rank=rank,
                                     lora_alpha=8.0, progress=False)
            model = lora.attach_for(models.load(str(path)), cfg)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                history = rl.train_rl(model, tok, cfg, data, reward_fn=reward, output_dir=tmp / name, **kwargs)
            rows = [{k: v for k, v in r.items() if not k.startswith("time")} for r in history.rows]
            return model, rows

        for label, rank in (("full", 0), ("lora_r4", 4)):
            model, whole = run(f"{label}-whole", 4, rank)
            _, resumed = run(f"{label}-resumed", 4, rank, resume_from=tmp / f"{label}-whole" / "checkpoint-2")
            loaded = models.load(str(tmp / f"{label}-whole" / checkpoint.POLICY))
            ids = tok(["Tom has 3 apples.", "What is 2 times 6? 12"], return_tensors="pt", padding=True)
            with torch.no_grad():
                diff = float((loaded(**ids).logits - model.eval()(**ids).logits).abs().max())
            out[label] = {"resumed_rows_equal_uninterrupted": resumed == whole, "rows": len(whole),
                          "reload_logits_max_abs_diff": diff,
                          "policy_files": sorted(p.name for p in (tmp / f"{label}-whole" / "policy").iterdir())}
    return out


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        dense, moe = save_standin(Path(tmp) / "d"), save_standin(Path(tmp) / "m", moe=True)
        result = {"padding": padding_trap(dense), "eos": eos_trap(dense),
                  "checkpointing": checkpointing_trap(dense, moe), "precision": precision_trap(dense)}
    result["memory_plan_vs_saved_tensors"] = plan_vs_saved()
    result["logprob_forward_peak_vs_batch_size"] = logprob_peak()
    result["reload_and_resume"] = reload_and_resume()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    result.update(command="python notebooks/results/real_model.py", commit=commit.stdout.strip(),
                  wall_seconds=round(time.time() - t0, 1), machine=platform.processor() or platform.machine(),
                  torch=torch.__version__, threads=torch.get_num_threads(),
                  peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    (Path(__file__).with_suffix(".json")).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""``memory_plan``: the peak memory of one RL step, predicted term by term from a model config and an RLConfig.

Nothing is instantiated: the terms are formulas of the config's sizes, so a plan for Qwen3-0.6B runs on a laptop.
The activation formula is exact for a Qwen3 decoder in float32 (tests/test_real_model.py checks it against the
saved tensors torch records on a 1-layer model with the real 151,936-token vocabulary); under bfloat16 it counts
every activation at 2 bytes, an underestimate of about a tenth because RMSNorm computes in float32. Run
``python -m minirl.memory`` for the Qwen3-0.6B table.
"""

from __future__ import annotations

from .config import RLConfig

GB = 1e9


def parameter_count(model_config) -> int:
    """Parameters of a Qwen3 / Qwen3-MoE (or Llama-style) decoder from its config, tied embeddings counted once.

    Per layer: q, k, v, o projections (H x nh*hd, 2 x H x nkv*hd, nh*hd x H; + biases with ``attention_bias``),
    Qwen3's q/k RMSNorms (2 hd), two RMSNorms (2 H) and the MLP: 3 H I (gate, up, down) or, for an MoE layer,
    E x 3 H I_moe + the router (H E). Plus the embedding (V H), the final norm (H) and an untied LM head (V H).
    """
    c = model_config
    H, nh, nkv, V = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size
    hd = getattr(c, "head_dim", None) or H // nh
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
    attn += (nh * hd + 2 * nkv * hd) if getattr(c, "attention_bias", False) else 0
    attn += 2 * hd if c.model_type.startswith("qwen3") else 0  # q_norm, k_norm
    if getattr(c, "num_experts", None):
        mlp = c.num_experts * 3 * H * c.moe_intermediate_size + H * c.num_experts
    else:
        mlp = 3 * H * c.intermediate_size
    head = 0 if c.tie_word_embeddings else V * H
    return c.num_hidden_layers * (attn + mlp + 2 * H) + V * H + H + head


def lora_parameter_count(model_config, *, rank: int, target: str = "all-linear") -> int:
    """Parameters of a LoRA adapter of rank r: r (in + out) for each adapted linear layer of every decoder layer.

    The linear layers of a Qwen3 decoder layer and their (in, out): q_proj (H, nh hd), k_proj and v_proj (H, nkv hd),
    o_proj (nh hd, H), and the MLP's gate_proj and up_proj (H, I), down_proj (I, H). "all-linear" adapts all
    seven (peft picks the same, never the LM head).

    Raises:
        ValueError: for a name that is not one of the seven (``lora.QWEN3_LINEAR``), or an MoE config: peft 0.21
            also adapts an MoE's 3-d expert weights and its router, in a layout of its own, so count the peft
            model's trainable parameters instead.

    Source: Hu et al. 2021, "LoRA", section 4.1 (A is r x in, B is out x r).
    """
    from .lora import QWEN3_LINEAR, target_modules

    c = model_config
    H, nh, nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // nh
    if getattr(c, "num_experts", None):
        raise ValueError("lora_parameter_count counts dense decoders; for an MoE, count the peft model's trainable "
                         "parameters (peft adapts its experts and router in a layout of its own)")
    names = target_modules(target)
    names = QWEN3_LINEAR if names == "all-linear" else names
    unknown = set(names) - set(QWEN3_LINEAR)
    if unknown:
        raise ValueError(f"lora target modules {sorted(unknown)} are not Qwen3 linear layers {QWEN3_LINEAR}")
    inter = c.intermediate_size
    shapes = {"q_proj": (H, nh * hd), "k_proj": (H, nkv * hd), "v_proj": (H, nkv * hd), "o_proj": (nh * hd, H),
              "gate_proj": (H, inter), "up_proj": (H, inter), "down_proj": (inter, H)}
    per_layer = sum(rank * (shapes[n][0] + shapes[n][1]) for n in names)
    return c.num_hidden_layers * per_layer


def layer_activation_elements(model_config, rows: int, length: int, *, attention: str = "sdpa") -> int:
    """Elements one decoder layer saves for the backward, for ``rows`` sequences of ``length`` tokens (n = rows x L).

    4 n I (MLP: gate, up, SiLU(gate), their product; for an MoE layer about k n I_moe, its top-k experts') + 6 n H (two
    RMSNorms: input, normalised, output) + 6 n nh hd (q and its norm, rotated q, the expanded k and v, the attention
    output) + 2 n nkv hd (k and its norm) + n (2 + nh + nkv) (the norms' reciprocal RMS) + the attention kernel's own:
    rows x nh x L^2 probabilities ("eager") or rows x nh x L log-sum-exps plus the rows x L^2 mask ("sdpa").
    """
    c = model_config
    H, nh, nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // nh
    n = rows * length
    mlp = (c.num_experts_per_tok * c.moe_intermediate_size if getattr(c, "num_experts", None)
           else c.intermediate_size)
    kernel = rows * nh * length ** 2 if attention == "eager" else rows * nh * length + rows * length ** 2
    return 4 * n * mlp + 6 * n * H + 6 * n * nh * hd + 2 * n * nkv * hd + n * (2 + nh + nkv) + kernel


def memory_plan(model_config, cfg: RLConfig, *, prompt_tokens: int = 128, attention: str = "sdpa") -> dict:
    """Predict the peak memory (bytes) of one RL step of ``cfg`` on a model of ``model_config``.

    B = prompts_per_step x group_size rows of L = P + T tokens (P = ``prompt_tokens``, T = max_new_tokens);
    b_gen, b_lp, b_mb = the generation, log-prob and training micro-batch rows (``generation_batch_size``,
    ``logprob_batch_size``, ``micro_batch_size``; None: all B, or the minibatch's B / num_minibatches rows; never
    more than those).
    w = bytes per weight (4, or 2 under "bf16"); a = bytes per activation (4 under "fp32", else 2); N parameters;
    N_train the trainable ones: N, or under LoRA (``lora_rank`` > 0) the adapter's (``lora_parameter_count``).

    Terms (each a key of the result):
        weights         (N + the adapter's) w
        grads           N_train w          (kept between steps: zero_grad sets them to None only at the update)
        optimizer       2 N_train w        (AdamW's two moments, in the weights' dtype)
        reference       N w when beta > 0  (a second copy of the policy; 0 under LoRA: the adapter switched off)
        kv_cache        2 layers b_gen L nkv hd a   (decoding: keys and values of every position)
        logits_chunk    b_lp (T + 1) V 4 + b_lp T V 4   (a no-grad log-prob forward: the LM head's output on the
                        completion positions in float32 and its copy / temperature; under bf16 autocast the head's
                        bfloat16 output is freed once copied. The peak resident memory of a 1-layer model with the
                        real vocabulary, 16 rows of 64 tokens: 1.254 GB in float32, 1.245 GB under bf16 autocast,
                        1.254 GB planned; within 1% from 4 to 16 rows, notebooks/results/real_model.json)
        activations     layers x layer_activation_elements(b_mb rows) a + b_mb (T + 1) H a + b_mb T V 4 + 2 n H a
                        + 2 b_mb L hd 4 (what the training forward saves: every layer, the LM head's input, the
                        float32 logits the selective log-softmax keeps, the final norm, RoPE's cos and sin); with
                        gradient checkpointing, layers x n H a (each layer's input) + one layer's activations
        backward_head   2 b_mb T V 4 + b_mb (T + 1) V a   (the backward through the LM head: softmax and gradient
                        of the float32 logits, gradient of the head's output; b_mb L V a for the head's output
                        without ``completion_only_head``)
    Under LoRA the activation terms are the full model's: measured within 1% on the 1-layer real-vocabulary model
    (a frozen weight saves a little less, the adapter's rank-r products a little more).
    The peak is weights + grads + optimizer + reference + the largest stage: generation (kv_cache), the log-prob
    forwards (logits_chunk) or the update (activations + backward_head).

    Args:
        model_config: a transformers config (Qwen3, Qwen3-MoE or Llama-style sizes); no weights are built.
        cfg: the RLConfig of the run (sizes, micro-batches, precision, beta, gradient_checkpointing).
        prompt_tokens: P, the padded prompt length.
        attention: "sdpa" (default, memory-efficient kernels) or "eager" (saves the L x L probabilities).

    Returns:
        dict of the terms above in bytes, plus ``peak`` (bytes), ``peak_stage`` ("generation", "logprob_forward"
        or "update"), ``parameters`` (N) and ``trainable`` (N_train).

    Raises:
        ValueError: for an unknown attention kind or prompt_tokens < 1 (and ``lora_parameter_count``'s).
    """
    if attention not in ("sdpa", "eager") or prompt_tokens < 1:
        raise ValueError(f"need attention 'sdpa' or 'eager' and prompt_tokens >= 1, got {attention!r}, {prompt_tokens}")
    c = model_config
    H, V, layers, nkv = c.hidden_size, c.vocab_size, c.num_hidden_layers, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // c.num_attention_heads
    N = parameter_count(c)
    adapter = lora_parameter_count(c, rank=cfg.lora_rank, target=cfg.lora_target_modules) if cfg.lora_rank else 0
    trainable = adapter if cfg.lora_rank else N
    w = 2 if cfg.precision == "bf16" else 4
    a = 4 if cfg.precision == "fp32" else 2
    B, T = cfg.prompts_per_step * cfg.group_size, cfg.max_new_tokens
    L = prompt_tokens + T
    b_gen, b_lp = min(cfg.generation_batch_size or B, B), min(cfg.logprob_batch_size or B, B)
    b_mb = min(cfg.micro_batch_size or B, B // cfg.num_minibatches)  # a chunk never holds more rows than there are
    n = b_mb * L
    if cfg.gradient_checkpointing:
        layer_saved = layers * n * H + layer_activation_elements(c, b_mb, L, attention=attention)
    else:
        layer_saved = layers * layer_activation_elements(c, b_mb, L, attention=attention)
    plan = {
        "weights": (N + adapter) * w, "grads": trainable * w, "optimizer": 2 * trainable * w,
        "reference": N * w if cfg.beta > 0 and not cfg.lora_rank else 0,
        "kv_cache": 2 * layers * b_gen * L * nkv * hd * a,
        "logits_chunk": b_lp * (T + 1) * V * 4 + b_lp * T * V * 4,
        "activations": (layer_saved + b_mb * (T + 1) * H + 2 * n * H) * a + b_mb * T * V * 4 + 2 * b_mb * L * hd * 4,
        "backward_head": 2 * b_mb * T * V * 4 + b_mb * ((T + 1) if cfg.completion_only_head else L) * V * a,
    }
    stages = {"generation": plan["kv_cache"], "logprob_forward": plan["logits_chunk"],
              "update": plan["activations"] + plan["backward_head"]}
    stage = max(stages, key=stages.get)
    static = plan["weights"] + plan["grads"] + plan["optimizer"] + plan["reference"]
    return {**plan, "peak": static + stages[stage], "peak_stage": stage, "parameters": N, "trainable": trainable}


def memory_table(model_config, cfg: RLConfig, **kwargs) -> str:
    """``memory_plan`` as a two-column text table (GB = 1e9 bytes), the peak's stage named."""
    plan = memory_plan(model_config, cfg, **kwargs)
    B = cfg.prompts_per_step * cfg.group_size
    lines = [f"{cfg.prompts_per_step} prompts x {cfg.group_size} samples x {cfg.max_new_tokens} tokens "
             f"({B} rows), precision {cfg.precision}, micro-batch {cfg.micro_batch_size or 'all'}, log-prob batch "
             f"{cfg.logprob_batch_size or 'all'}, generation batch {cfg.generation_batch_size or 'all'}, "
             f"checkpointing {cfg.gradient_checkpointing}, beta {cfg.beta}"
             + (f", LoRA rank {cfg.lora_rank} ({plan['trainable'] / 1e6:.1f} M trainable)" if cfg.lora_rank else "")
             + f"; {plan['parameters'] / 1e6:.0f} M params"]
    for key in ("weights", "grads", "optimizer", "reference", "kv_cache", "logits_chunk", "activations",
                "backward_head", "peak"):
        lines.append(f"  {key:<14} {plan[key] / GB:8.2f} GB")
    lines[-1] += f"  (at the {plan['peak_stage']})"
    return "\n".join(lines)


def qwen3_0_6b_config():
    """Qwen3-0.6B's published sizes as a transformers ``Qwen3Config`` (no weights): hidden 1024, 28 layers, 16
    heads, 8 key-value heads, head_dim 128, intermediate 3072, vocabulary 151,936, tied embeddings."""
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=40960)


#: The settings ``fit_table`` compares, each on top of the GRPO preset with one minibatch: the defaults, then the
#: changes a real model needs one at a time (``docs``: notebooks/real_model.md reads this table).
FIT_SETTINGS = {
    "defaults (fp32, every row at once)": dict(),
    "bf16 autocast, generation 64 / log-prob 8 / micro-batch 4 rows": dict(
        precision="bf16-autocast", generation_batch_size=64, logprob_batch_size=8, micro_batch_size=4,
        completion_only_head=True),
    "+ gradient checkpointing": dict(precision="bf16-autocast", generation_batch_size=64, logprob_batch_size=8,
                                     micro_batch_size=4, completion_only_head=True, gradient_checkpointing=True),
    "+ LoRA rank 16 (the reference: adapter off)": dict(
        precision="bf16-autocast", generation_batch_size=64, logprob_batch_size=8, micro_batch_size=4,
        completion_only_head=True, gradient_checkpointing=True, lora_rank=16),
    "+ beta 0 instead of LoRA (no reference)": dict(
        precision="bf16-autocast", generation_batch_size=64, logprob_batch_size=8, micro_batch_size=4,
        completion_only_head=True, gradient_checkpointing=True, beta=0.0),
    "checkpointing with larger chunks: generation 256 / log-prob 32 / micro-batch 16 rows": dict(
        precision="bf16-autocast", generation_batch_size=256, logprob_batch_size=32, micro_batch_size=16,
        completion_only_head=True, gradient_checkpointing=True),
}
#: (prompts, samples per prompt, completion tokens) of the issue's two batches.
FIT_BATCHES = ((32, 16, 512), (8, 8, 512))


def fit_table(model_config, *, prompt_tokens: int = 128, gpus_gb=(24, 80)) -> str:
    """A markdown table: the planned peak (GB) of each ``FIT_SETTINGS`` row at each ``FIT_BATCHES`` batch, and
    whether it fits each GPU size of ``gpus_gb`` (the plan's peak below the card's memory; allocator slack,
    CUDA context and fragmentation take another 1-2 GB in practice)."""
    from .config import make_config

    head = ["setting (GRPO, beta 0.04, one minibatch)"]
    for p, g, t in FIT_BATCHES:
        head += [f"{p}x{g}x{t} peak", *(f"fits {gb} GB" for gb in gpus_gb)]
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, settings in FIT_SETTINGS.items():
        cells = [name]
        for p, g, t in FIT_BATCHES:
            cfg = make_config("grpo", prompts_per_step=p, group_size=g, max_new_tokens=t, num_minibatches=1,
                              **settings)
            peak = memory_plan(model_config, cfg, prompt_tokens=prompt_tokens)["peak"] / GB
            cells += [f"{peak:,.1f} GB", *("yes" if peak < gb else "no" for gb in gpus_gb)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    from .config import make_config

    qwen = qwen3_0_6b_config()
    print("Qwen3-0.6B, prompts of 128 tokens: the planned peak of one GRPO step\n")
    print(fit_table(qwen), end="\n\n")
    for prompts, group, tokens in FIT_BATCHES:
        for name in [list(FIT_SETTINGS)[i] for i in (0, 2, 3)]:  # the defaults, checkpointing, LoRA
            cfg = make_config("grpo", prompts_per_step=prompts, group_size=group, max_new_tokens=tokens,
                              num_minibatches=1, **FIT_SETTINGS[name])
            print(memory_table(qwen, cfg, prompt_tokens=128), end="\n\n")

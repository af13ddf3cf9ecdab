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
    ``logprob_batch_size``, ``micro_batch_size``; None: all B, or the minibatch's B / num_minibatches rows).
    w = bytes per weight (4, or 2 under "bf16"); a = bytes per activation (4 under "fp32", else 2); N parameters.

    Terms (each a key of the result):
        weights         N w
        grads           N w                (kept between steps: zero_grad sets them to None only at the update)
        optimizer       2 N w              (AdamW's two moments, in the weights' dtype)
        reference       N w when beta > 0  (a second copy of the policy)
        kv_cache        2 layers b_gen L nkv hd a   (decoding: keys and values of every position)
        logits_chunk    b_lp (T + 1) V a + 2 b_lp T V 4   (a no-grad log-prob forward: the LM head's output on the
                        completion positions, its float32 copy and that copy / temperature)
        activations     layers x layer_activation_elements(b_mb rows) a + b_mb (T + 1) H a + b_mb T V 4 + 2 n H a
                        + 2 b_mb L hd 4 (what the training forward saves: every layer, the LM head's input, the
                        float32 logits the selective log-softmax keeps, the final norm, RoPE's cos and sin); with
                        gradient checkpointing, layers x n H a (each layer's input) + one layer's activations
        backward_head   2 b_mb T V 4 + b_mb (T + 1) V a   (the backward through the LM head: softmax and gradient
                        of the float32 logits, gradient of the head's output; b_mb L V a for the head's output
                        without ``completion_only_head``)
    The peak is weights + grads + optimizer + reference + the largest stage: generation (kv_cache), the log-prob
    forwards (logits_chunk) or the update (activations + backward_head).

    Args:
        model_config: a transformers config (Qwen3, Qwen3-MoE or Llama-style sizes); no weights are built.
        cfg: the RLConfig of the run (sizes, micro-batches, precision, beta, gradient_checkpointing).
        prompt_tokens: P, the padded prompt length.
        attention: "sdpa" (default, memory-efficient kernels) or "eager" (saves the L x L probabilities).

    Returns:
        dict of the terms above in bytes, plus ``peak`` (bytes), ``peak_stage`` ("generation", "logprob_forward"
        or "update") and ``parameters`` (N).

    Raises:
        ValueError: for an unknown attention kind or prompt_tokens < 1.
    """
    if attention not in ("sdpa", "eager") or prompt_tokens < 1:
        raise ValueError(f"need attention 'sdpa' or 'eager' and prompt_tokens >= 1, got {attention!r}, {prompt_tokens}")
    c = model_config
    H, V, layers, nkv = c.hidden_size, c.vocab_size, c.num_hidden_layers, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // c.num_attention_heads
    N = parameter_count(c)
    w = 2 if cfg.precision == "bf16" else 4
    a = 4 if cfg.precision == "fp32" else 2
    B, T = cfg.prompts_per_step * cfg.group_size, cfg.max_new_tokens
    L = prompt_tokens + T
    b_gen, b_lp = cfg.generation_batch_size or B, cfg.logprob_batch_size or B
    b_mb = cfg.micro_batch_size or B // cfg.num_minibatches
    n = b_mb * L
    if cfg.gradient_checkpointing:
        layer_saved = layers * n * H + layer_activation_elements(c, b_mb, L, attention=attention)
    else:
        layer_saved = layers * layer_activation_elements(c, b_mb, L, attention=attention)
    plan = {
        "weights": N * w, "grads": N * w, "optimizer": 2 * N * w, "reference": N * w if cfg.beta > 0 else 0,
        "kv_cache": 2 * layers * b_gen * L * nkv * hd * a,
        "logits_chunk": b_lp * (T + 1) * V * a + 2 * b_lp * T * V * 4,
        "activations": (layer_saved + b_mb * (T + 1) * H + 2 * n * H) * a + b_mb * T * V * 4 + 2 * b_mb * L * hd * 4,
        "backward_head": 2 * b_mb * T * V * 4 + b_mb * ((T + 1) if cfg.completion_only_head else L) * V * a,
    }
    stages = {"generation": plan["kv_cache"], "logprob_forward": plan["logits_chunk"],
              "update": plan["activations"] + plan["backward_head"]}
    stage = max(stages, key=stages.get)
    static = plan["weights"] + plan["grads"] + plan["optimizer"] + plan["reference"]
    return {**plan, "peak": static + stages[stage], "peak_stage": stage, "parameters": N}


def memory_table(model_config, cfg: RLConfig, **kwargs) -> str:
    """``memory_plan`` as a two-column text table (GB = 1e9 bytes), the peak's stage named."""
    plan = memory_plan(model_config, cfg, **kwargs)
    B = cfg.prompts_per_step * cfg.group_size
    lines = [f"{cfg.prompts_per_step} prompts x {cfg.group_size} samples x {cfg.max_new_tokens} tokens "
             f"({B} rows), precision {cfg.precision}, micro-batch {cfg.micro_batch_size or 'all'}, log-prob batch "
             f"{cfg.logprob_batch_size or 'all'}, generation batch {cfg.generation_batch_size or 'all'}, "
             f"checkpointing {cfg.gradient_checkpointing}, beta {cfg.beta}; {plan['parameters'] / 1e6:.0f} M params"]
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


if __name__ == "__main__":
    from .config import make_config

    qwen = qwen3_0_6b_config()
    for prompts, group in ((32, 16), (8, 8)):
        for settings in (dict(), dict(precision="bf16-autocast", micro_batch_size=4, logprob_batch_size=8,
                                      generation_batch_size=64, gradient_checkpointing=True)):
            cfg = make_config("grpo", prompts_per_step=prompts, group_size=group, max_new_tokens=512,
                              num_minibatches=1, **settings)
            print(memory_table(qwen, cfg, prompt_tokens=128), end="\n\n")

"""``memory_plan``: the peak memory of one RL step, predicted term by term from a model config and an RLConfig.

Nothing is instantiated: the terms are formulas of the config's sizes, so a plan for Qwen3-0.6B runs on a laptop.
Each term counts the dtype the run's precision really holds: under "bf16-autocast" the float32 master weights,
autocast's bfloat16 copy of each of them, float32 keys in the KV cache, and a float32 residual stream beside the
bfloat16 activations. The activation formula is exact for a Qwen3 decoder in each precision (tests/test_real_model.py
checks it against the saved tensors torch records, one model with the real 151,936-token vocabulary); the stages'
peaks are checked against the CPU allocator's events. Run ``python -m minirl.memory`` for the Qwen3-0.6B table.
"""

from __future__ import annotations

from .checks import choice
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


def matmul_parameter_count(model_config) -> int:
    """Parameters used as the weight of a matrix product (every linear layer, the router and the LM head): N less
    the RMSNorms' weights and, with an untied head, the input embedding (a lookup, never a matrix product). Under
    ``torch.autocast`` these are the weights cast to bfloat16; the norms run in float32. An MoE's experts are all
    counted: transformers indexes its fused expert weights, so an expert's cast is never cached and lives only for
    its product in a no-grad forward (an upper bound there), while the update saves the cast of each expert hit."""
    c = model_config
    H, V = c.hidden_size, c.vocab_size
    hd = getattr(c, "head_dim", None) or H // c.num_attention_heads
    norms = c.num_hidden_layers * (2 * H + (2 * hd if c.model_type.startswith("qwen3") else 0)) + H
    return parameter_count(c) - norms - (0 if c.tie_word_embeddings else V * H)


def layer_activation_bytes(model_config, rows: int, length: int, *, precision: str = "fp32",
                           attention: str = "sdpa") -> int:
    """Bytes one Qwen3 decoder layer saves for the backward, for ``rows`` sequences of ``length`` tokens
    (n = rows x L), in ``precision`` (``precision.PRECISIONS``); a = 4 bytes under "fp32", else 2 (bfloat16).

    - MLP: 4 n I a (gate, up, SiLU(gate), their product; for an MoE layer about k n I_moe, its top-k experts').
    - The two RMSNorms and the inputs of the linear layers they feed. "fp32": 6 n H 4 (each norm's input, its
      normalised input and its output). "bf16-autocast": the residual stream stays float32 (the embedding is
      float32, and float32 + bfloat16 adds in float32), so 4 n H 4 for the norms, and autocast casts a norm's
      output to bfloat16 once per linear layer it feeds (q, k, v; gate, up): 5 n H 2. "bf16": each norm keeps
      its input upcast to float32 (Qwen3RMSNorm computes in float32) and a bfloat16 normalised copy, and its
      output feeds the linear layers: 2 n H 4 + 4 n H 2.
    - Attention: the q and k RMSNorms' input and normalised input, the kernel's q, k and v (k and v expanded to nh
      heads) and its output. "fp32": (6 n nh hd + 2 n nkv hd) 4. Otherwise a norm keeps its float32 upcast input
      and a bfloat16 normalised copy, (n nh hd + n nkv hd)(4 + 2), and the kernel's four are bfloat16: 4 n nh hd 2.
    - The norms' reciprocal RMS: n (2 + nh + nkv) 4, float32 in every precision.
    - The attention kernel's own: "sdpa" rows x nh x L log-sum-exps (float32) and the rows x L^2 mask (a);
      "eager" the rows x nh x L^2 probabilities in float32, plus outside "fp32" their bfloat16 copy (4 + 2).

    These are the bytes autograd saves on a Qwen3 in each precision and attention, to the byte (measured by
    tests/test_real_model.py with saved-tensor hooks).
    """
    from .precision import PRECISIONS

    choice("precision", precision, PRECISIONS)
    c = model_config
    H, nh, nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // nh
    n = rows * length
    a = 4 if precision == "fp32" else 2
    inter = (c.num_experts_per_tok * c.moe_intermediate_size if getattr(c, "num_experts", None)
             else c.intermediate_size)
    norms_and_inputs = {"fp32": 6 * n * H * 4, "bf16-autocast": 4 * n * H * 4 + 5 * n * H * 2,
                        "bf16": 2 * n * H * 4 + 4 * n * H * 2}[precision]
    heads = ((6 * n * nh * hd + 2 * n * nkv * hd) * 4 if precision == "fp32"
             else (n * nh * hd + n * nkv * hd) * 6 + 4 * n * nh * hd * 2)
    if attention == "eager":
        kernel = rows * nh * length ** 2 * (4 if precision == "fp32" else 6)
    else:
        kernel = rows * nh * length * 4 + rows * length ** 2 * a
    return 4 * n * inter * a + norms_and_inputs + heads + n * (2 + nh + nkv) * 4 + kernel


def memory_plan(model_config, cfg: RLConfig, *, prompt_tokens: int = 128, attention: str = "sdpa") -> dict:
    """Predict the peak memory (bytes) of one RL step of ``cfg`` on a model of ``model_config``, in the precision
    ``cfg.precision`` runs it.

    B = prompts_per_step x group_size rows of L = P + T tokens (P = ``prompt_tokens``, T = max_new_tokens);
    b_gen, b_lp, b_mb = the generation, log-prob and training micro-batch rows (``generation_batch_size``,
    ``logprob_batch_size``, ``micro_batch_size``; None: all B, or the minibatch's B / num_minibatches rows; never
    more than those).
    Bytes per element by precision (``precision.py``): w, the weights: 4 ("fp32"; "bf16-autocast" keeps float32
    master weights) or 2 ("bf16"); a, the bfloat16 activations: 4 under "fp32", else 2; r, the residual stream: 2
    under "bf16", else 4 (under autocast the embedding is float32 and float32 + bfloat16 adds in float32).
    N parameters; N_train the trainable ones: N, or under LoRA (``lora_rank`` > 0) the adapter's
    (``lora_parameter_count``); N_mm the matrix-product weights (``matmul_parameter_count``).

    Terms (each a key of the result):
        weights         (N + the adapter's) w
        grads           N_train w          (kept between steps: zero_grad sets them to None only at the update)
        optimizer       2 N_train w        (AdamW's two moments, in the weights' dtype)
        reference       N w when beta > 0  (a second copy of the policy; 0 under LoRA: the adapter switched off)
        autocast_copies 2 N_mm under "bf16-autocast" (2 N_train under LoRA), else 0: ``torch.autocast`` caches the
                        bfloat16 copy of each trainable float32 weight it casts until the outermost autocast block
                        closes, and each stage runs in one block (the decode loop, the pi_old forwards, the update's
                        forward; without checkpointing the update's saved tensors hold them through its backward).
                        Qwen3-0.6B: 1.19 GB.
        kv_cache        layers b_gen L nkv hd (r + a)   (decoding: keys and values of every position; under
                        autocast the keys leave Qwen3's k RMSNorm, float32 weight times bfloat16, in float32 and
                        the values v_proj in bfloat16: 4 + 2 bytes)
        logits_chunk    b_lp (T + 1) V 4 + b_lp T V 4   (a no-grad log-prob forward: the LM head's output on the
                        completion positions in float32 and its copy / temperature; under bf16 autocast the head's
                        bfloat16 output is freed once copied. The peak resident memory of a 1-layer model with the
                        real vocabulary, 16 rows of 64 tokens: 1.254 GB in float32, 1.245 GB under bf16 autocast,
                        1.254 GB planned (the stage adds the 0.039 GB of copies under autocast); within 1% from 4 to
                        16 rows, notebooks/results/real_model.json)
        activations     layers x layer_activation_bytes(b_mb rows) + b_mb (T + 1) H a + b_mb T V 4 + n H (r + 4)
                        + 2 b_mb L hd r (what the training forward saves: every layer, the LM head's input, the
                        float32 logits the selective log-softmax keeps, the final norm's input and normalised
                        input, RoPE's cos and sin); with gradient checkpointing, layers x n H r (each layer's input)
                        + one layer's activations. Under LoRA with autocast, plus 2 bytes for each frozen weight
                        the backward needs (a frozen weight is cast at each use, never cached, and the update saves
                        the cast): the LM head and every layer's matrices, or one layer's with checkpointing
        backward_head   2 b_mb T V 4 + b_mb (T + 1) V a   (the backward through the LM head: softmax and gradient
                        of the float32 logits, gradient of the head's output; b_mb L V a for the head's output
                        without ``completion_only_head``)
    Under LoRA the other activation terms are the full model's: measured within 1% on the 1-layer real-vocabulary
    model (a frozen weight saves a little less, the adapter's rank-r products a little more).
    The peak is weights + grads + optimizer + reference + the largest stage, each with autocast_copies:
    generation (kv_cache; under LoRA with autocast also the frozen LM head's cast, 2 V H, made at each step), the
    log-prob forwards (logits_chunk) or the update (activations + backward_head, an upper bound: backward_head's
    float32 (b, T, V) tensors never all live beside every saved activation, and with checkpointing the layers'
    weight copies are gone by the backward).
    Measured on CPU in each precision (tests/test_real_model.py): the saved activations and the weight copies to
    the byte but the final norm's reciprocal RMS (n 4) and the input ids; the KV cache to the byte. And the
    allocator's peak of each stage (tests/test_real_sizes.py, torch's profiler): the log-prob forwards within 2%,
    the decode loop 9-17% above the plan on an 8-layer model (the growing cache's torch.cat holds one layer's keys
    twice, and the step's logits), the plan 8-11% above the update's peak, 1.4-1.8x with checkpointing.

    Args:
        model_config: a transformers config (Qwen3, Qwen3-MoE or Llama-style sizes); no weights are built.
        cfg: the RLConfig of the run (sizes, micro-batches, precision, beta, gradient_checkpointing).
        prompt_tokens: P, the padded prompt length.
        attention: "sdpa" (default, memory-efficient kernels) or "eager" (saves the L x L probabilities).

    Returns:
        dict of the terms above in bytes, plus ``peak`` (bytes), ``peak_stage`` ("generation", "logprob_forward"
        or "update"), ``stages`` (each stage's bytes above the static terms), ``parameters`` (N) and ``trainable``
        (N_train).

    Raises:
        ValueError: for an unknown attention kind or precision, or prompt_tokens < 1 (and
            ``lora_parameter_count``'s).
    """
    if attention not in ("sdpa", "eager") or prompt_tokens < 1:
        raise ValueError(f"need attention 'sdpa' or 'eager' and prompt_tokens >= 1, got {attention!r}, {prompt_tokens}")
    c = model_config
    H, V, layers, nkv = c.hidden_size, c.vocab_size, c.num_hidden_layers, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or H // c.num_attention_heads
    N = parameter_count(c)
    adapter = lora_parameter_count(c, rank=cfg.lora_rank, target=cfg.lora_target_modules) if cfg.lora_rank else 0
    trainable = adapter if cfg.lora_rank else N
    w = 2 if cfg.precision == "bf16" else 4  # weights: float32 masters under "bf16-autocast"
    a = 4 if cfg.precision == "fp32" else 2  # the bfloat16 activations
    r = 2 if cfg.precision == "bf16" else 4  # the residual stream: float32 under autocast
    autocast = cfg.precision == "bf16-autocast"
    B, T = cfg.prompts_per_step * cfg.group_size, cfg.max_new_tokens
    L = prompt_tokens + T
    b_gen, b_lp = min(cfg.generation_batch_size or B, B), min(cfg.logprob_batch_size or B, B)
    b_mb = min(cfg.micro_batch_size or B, B // cfg.num_minibatches)  # a chunk never holds more rows than there are
    n = b_mb * L
    layer = layer_activation_bytes(c, b_mb, L, precision=cfg.precision, attention=attention)
    layer_saved = layers * n * H * r + layer if cfg.gradient_checkpointing else layers * layer
    final_norm = n * H * (r + 4)  # its input and normalised input (float32 in "fp32" and under autocast)
    mm = matmul_parameter_count(c)
    frozen_casts = 0  # LoRA under autocast: a frozen weight is cast at each use, and the update saves each cast
    if autocast and cfg.lora_rank:
        frozen_casts = 2 * (V * H + (mm - V * H) // layers * (1 if cfg.gradient_checkpointing else layers))
    plan = {
        "weights": (N + adapter) * w, "grads": trainable * w, "optimizer": 2 * trainable * w,
        "reference": N * w if cfg.beta > 0 and not cfg.lora_rank else 0,
        "autocast_copies": 2 * (adapter if cfg.lora_rank else mm) if autocast else 0,
        "kv_cache": layers * b_gen * L * nkv * hd * (r + a),
        "logits_chunk": b_lp * (T + 1) * V * 4 + b_lp * T * V * 4,
        "activations": (layer_saved + b_mb * (T + 1) * H * a + final_norm + b_mb * T * V * 4 + 2 * b_mb * L * hd * r
                        + frozen_casts),
        "backward_head": 2 * b_mb * T * V * 4 + b_mb * ((T + 1) if cfg.completion_only_head else L) * V * a,
    }
    head_cast = 2 * V * H if autocast and cfg.lora_rank else 0  # the frozen head's cast at each decoding step
    stages = {"generation": plan["kv_cache"] + head_cast, "logprob_forward": plan["logits_chunk"],
              "update": plan["activations"] + plan["backward_head"]}
    stages = {k: v + plan["autocast_copies"] for k, v in stages.items()}
    stage = max(stages, key=stages.get)
    static = plan["weights"] + plan["grads"] + plan["optimizer"] + plan["reference"]
    return {**plan, "peak": static + stages[stage], "peak_stage": stage, "stages": stages, "parameters": N,
            "trainable": trainable}


def memory_table(model_config, cfg: RLConfig, **kwargs) -> str:
    """``memory_plan`` as a two-column text table (GB = 1e9 bytes), the peak's stage named, then each stage's
    bytes above the static terms (its terms plus autocast_copies)."""
    plan = memory_plan(model_config, cfg, **kwargs)
    B = cfg.prompts_per_step * cfg.group_size
    lines = [f"{cfg.prompts_per_step} prompts x {cfg.group_size} samples x {cfg.max_new_tokens} tokens "
             f"({B} rows), precision {cfg.precision}, micro-batch {cfg.micro_batch_size or 'all'}, log-prob batch "
             f"{cfg.logprob_batch_size or 'all'}, generation batch {cfg.generation_batch_size or 'all'}, "
             f"checkpointing {cfg.gradient_checkpointing}, beta {cfg.beta}"
             + (f", LoRA rank {cfg.lora_rank} ({plan['trainable'] / 1e6:.1f} M trainable)" if cfg.lora_rank else "")
             + f"; {plan['parameters'] / 1e6:.0f} M params"]
    for key in ("weights", "grads", "optimizer", "reference", "autocast_copies", "kv_cache", "logits_chunk",
                "activations", "backward_head", "peak"):
        lines.append(f"  {key:<15} {plan[key] / GB:8.2f} GB")
    lines[-1] += f"  (at the {plan['peak_stage']})"
    lines.append("  stages above the static terms: "
                 + ", ".join(f"{stage} {held / GB:.2f} GB" for stage, held in plan["stages"].items()))
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

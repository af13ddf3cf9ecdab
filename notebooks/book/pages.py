"""The book's generated pages: one per preset of ``config.ALGORITHMS``, one per estimator family (KL estimators,
importance corrections, preference losses), one per one-file algorithm (``minirl/minimal/``, shown whole) and the
paper index, written from the code at every build.

Nothing here is typed by hand that the code already says: the problem a function solves is its docstring's first
paragraph, the papers and equation numbers are its ``Source:`` line (split by ``tests/paper_index.py``, the parser
of README's index), the switches are ``ALGORITHMS``, the engines' names are what ``minirl.interop`` answers
(refusals included), the tests are the ``# paper-index:`` markers and the lessons are the notebook sections whose
code cells use the function. The one thing added is ``EQUATIONS``: each function's key equation in LaTeX, as minirl
computes it (the docstrings write it in plain text).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import json
import re
import textwrap
from pathlib import Path

from myst_parser.mdit_to_docutils.base import default_slugify

from minirl import config, interop
from minirl.preference_loop import PrefConfig

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("paper_index", ROOT / "tests" / "paper_index.py")
paper_index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_index)

#: Key equations in LaTeX, by ``module.function``, in notebooks/notation.md's symbols: rho_t = pi_theta / pi_old of a
#: sampled token, r_t a per-token reward, A its advantage,
#: sg[.] stops the gradient, mu the sampler's policy, |y| a completion's length.
EQUATIONS = {
    "advantages.group_advantages": r"\hat A_i = \frac{R_i - \operatorname{mean}(R_1, \dots, R_G)}"
                                   r"{\operatorname{std}(R_1, \dots, R_G) + \epsilon}"
                                   r"\qquad\text{(Dr. GRPO: } \hat A_i = R_i - \operatorname{mean}(R_1, \dots, R_G))",
    "advantages.gae": r"\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t), \qquad "
                      r"\hat A_t = \sum_{l \ge 0} (\gamma\lambda)^l \, \delta_{t+l}",
    "advantages.rloo_advantages": r"\hat A_i = R_i - \frac{1}{G-1} \sum_{j \ne i} R_j",
    "advantages.reinforce_pp_advantages": r"\hat A_i = \frac{R_i - \operatorname{mean}_{\text{batch}}(R)}"
                                          r"{\operatorname{std}_{\text{batch}}(R) + \epsilon}",
    "advantages.reinforce_pp_baseline_advantages": r"c_i = R_i - \operatorname{mean}_{\text{group}}(R), \qquad "
                                                   r"\hat A_i = \frac{c_i}{\operatorname{std}_{\text{batch}}(c) + "
                                                   r"\epsilon}",
    "advantages.whiten": r"\hat A_t \leftarrow \frac{\hat A_t - \operatorname{mean}(\hat A)}"
                         r"{\sqrt{\operatorname{var}(\hat A) + \epsilon}}",
    "losses.token_clip_loss": r"\ell_t = -\min\big(\rho_t \hat A_t,\ \operatorname{clip}(\rho_t, "
                              r"1 - \varepsilon_{\text{low}}, 1 + \varepsilon_{\text{high}}) \, \hat A_t\big), \qquad "
                              r"\rho_t = \frac{\pi_\theta(y_t \mid x, y_{<t})}{\pi_{\text{old}}(y_t \mid x, y_{<t})}",
    "losses.gspo_loss": r"s_i = \exp\Big(\frac{1}{|y_i|} \sum_t \log \rho_{i,t}\Big), \qquad "
                        r"\ell_i = -\min\big(s_i \hat A_i,\ \operatorname{clip}(s_i, 1 - \varepsilon_{\text{low}}, "
                        r"1 + \varepsilon_{\text{high}}) \, \hat A_i\big)",
    "losses.gspo_token_loss": r"s_{i,t} = \operatorname{sg}[s_i] \, \frac{\pi_\theta(y_{i,t})}"
                              r"{\operatorname{sg}[\pi_\theta(y_{i,t})]}, \qquad "
                              r"\ell_{i,t} = -\min\big(s_{i,t} \hat A_{i,t},\ \operatorname{clip}(s_{i,t}, "
                              r"1 - \varepsilon_{\text{low}}, 1 + \varepsilon_{\text{high}}) \, \hat A_{i,t}\big)",
    "losses.cispo_loss": r"\ell_t = -\operatorname{sg}[w_t] \, \hat A_t \log \pi_\theta(y_t), \qquad "
                         r"w_t = \operatorname{clip}(\rho_t, 1 - \varepsilon_{\text{low}}, "
                         r"1 + \varepsilon_{\text{high}})\ \text{or (one-sided)}\ "
                         r"\min(\rho_t, 1 + \varepsilon_{\text{high}})",
    "losses.sapo_loss": r"\ell_t = -\frac{4}{\tau} \, \sigma\big(\tau (\rho_t - 1)\big) \, \hat A_t, \qquad "
                        r"\tau = \tau_{\text{pos}} \text{ if } \hat A_t > 0 \text{ else } \tau_{\text{neg}}",
    "losses.gmpo_loss": r"\ell_i = -\hat A_i \exp\Big(\frac{1}{|y_i|} \sum_t u_{i,t}\Big), \qquad "
                        r"u_{i,t} = \begin{cases} \min(\log \rho_{i,t}, c_{i,t}) & \hat A_i > 0 \\ "
                        r"\max(\log \rho_{i,t}, c_{i,t}) & \hat A_i < 0 \end{cases}, \quad "
                        r"c_{i,t} = \operatorname{clip}(\log \rho_{i,t}, -\varepsilon_{\text{low}}, "
                        r"\varepsilon_{\text{high}})",
    "losses.aggregate": r"\text{token-mean: } \frac{\sum_{i,t} \ell_{i,t}}{\sum_i |y_i|}, \quad "
                        r"\text{seq-mean-token-mean: } \frac{1}{B} \sum_i \frac{1}{|y_i|} \sum_t \ell_{i,t}, \quad "
                        r"\text{seq-mean-token-sum-norm: } \frac{1}{B \, T_{\max}} \sum_{i,t} \ell_{i,t}",
    "losses.value_loss": r"\frac{1}{2} \max\Big( (V_t - R_t)^2,\ \big(V^{\text{old}}_t + \operatorname{clip}(V_t - "
                         r"V^{\text{old}}_t, -c, c) - R_t\big)^2 \Big)",
    "kl.k1": r"k_1 = \log \frac{\pi_\theta(y_t)}{\pi_{\text{ref}}(y_t)}",
    "kl.k2": r"k_2 = \frac{1}{2} \Big(\log \frac{\pi_\theta(y_t)}{\pi_{\text{ref}}(y_t)}\Big)^2",
    "kl.k3": r"k_3 = \frac{\pi_{\text{ref}}(y_t)}{\pi_\theta(y_t)} - 1 - \log \frac{\pi_{\text{ref}}(y_t)}"
             r"{\pi_\theta(y_t)}",
    "kl.kl_in_reward": r"r_t \leftarrow r_t - \beta \, \operatorname{sg}[k(t)] \quad \text{(detached, before the "
                       r"advantages)}",
    "kl.kl_in_loss": r"L \leftarrow L + \beta \operatorname{agg}_t k(t) \quad \text{(differentiated)}",
    "rewards.overlong_penalty": r"R_{\text{length}}(y) = \begin{cases} 0 & |y| \le L_{\max} - L_{\text{cache}} \\ "
                                r"\frac{(L_{\max} - L_{\text{cache}}) - |y|}{L_{\text{cache}}} & L_{\max} - "
                                r"L_{\text{cache}} < |y| \le L_{\max} \\ -1 & L_{\max} < |y| \end{cases}",
    "group_filter.has_signal": r"0 < \big|\{ y_i : y_i \text{ correct} \}\big| < G",
    "importance.token_tis_weights": r"w_t = \min\Big(\frac{\pi_{\text{old}}(y_t)}{\mu(y_t)}, C\Big)",
    "importance.token_mis_weights": r"w_t = v_t \, \mathbb{1}[C_{\min} \le v_t \le C_{\max}], \qquad "
                                    r"v_t = \frac{\pi_{\text{old}}(y_t)}{\mu(y_t)}",
    "importance.seq_tis_weights": r"w_i = \min\Big(\prod_t \frac{\pi_{\text{old}}(y_{i,t})}{\mu(y_{i,t})}, C\Big)",
    "importance.seq_mis_weights": r"w_i = W_i \; \mathbb{1}[C_{\min} \le W_i \le C_{\max}], \qquad "
                                  r"W_i = \prod_t \frac{\pi_{\text{old}}(y_{i,t})}{\mu(y_{i,t})}",
    "preference.dpo_loss": r"-\log \sigma\Big(\beta \log \frac{\pi_\theta(y_w)}{\pi_{\text{ref}}(y_w)} - \beta \log "
                           r"\frac{\pi_\theta(y_l)}{\pi_{\text{ref}}(y_l)}\Big)",
    "preference.ipo_loss": r"\Big(\log \frac{\pi_\theta(y_w) \, \pi_{\text{ref}}(y_l)}{\pi_\theta(y_l) \, "
                           r"\pi_{\text{ref}}(y_w)} - \frac{1}{2\tau}\Big)^2",
    "preference.kto_loss": r"\lambda_D \big(1 - \sigma(\beta (r_\theta(y) - z_0))\big) \text{ (desirable)}, \quad "
                           r"\lambda_U \big(1 - \sigma(\beta (z_0 - r_\theta(y)))\big) \text{ (undesirable)}, \quad "
                           r"r_\theta = \log \frac{\pi_\theta(y)}{\pi_{\text{ref}}(y)}",
    "preference.simpo_loss": r"-\log \sigma\Big(\frac{\beta}{|y_w|} \log \pi_\theta(y_w) - \frac{\beta}{|y_l|} \log "
                             r"\pi_\theta(y_l) - \gamma\Big)",
}

#: Why each preset exists: the problem it answers, in a paragraph (an algorithm page opens with it).
WHY = {
    "ppo": "PPO (Schulman et al. 2017) reuses one batch of samples for several gradient steps and keeps each step "
           "near the policy that sampled the batch by clipping the ratio $\\rho_t$: once a token's ratio has left the "
           "clip range in the direction its advantage pushes, its gradient stops. For language models (Ziegler et "
           "al. 2019, InstructGPT) a reward arrives once, at the end of a completion, so PPO trains a critic $V$ "
           "that predicts the reward still to come at every token; "
           "GAE turns the final reward into a per-token advantage with it. A KL penalty to a frozen reference is "
           "subtracted from the reward so the policy does not drift into text the reward was never checked on. "
           "The price: a second network as large as the policy, trained beside it, and its errors in the "
           "advantages.",
    "grpo": "GRPO (Shao et al. 2024) drops PPO's critic: it samples $G$ completions of the same prompt and judges "
            "each against its group, the advantage being its reward minus the group's mean, divided by the group's "
            "standard deviation. No value network to hold or train, and a reward that speaks only at the end is "
            "enough. It keeps PPO's clipped ratio and puts the KL to the reference in the loss, estimated per token "
            "with $k_3$; each completion's tokens are averaged first, then the completions.",
    "dr_grpo": "Liu et al. 2025 found two biases in GRPO. Dividing by the group's standard deviation gives the most "
               "weight to prompts that are nearly always right or nearly always wrong; averaging each completion "
               "over its own length makes a long wrong answer cost less per token than a short one, so wrong "
               "answers grow long. Dr. GRPO removes both: the advantage is the reward minus the group mean, and the "
               "loss sums over tokens and divides by a constant (rows times the generation budget), so every token "
               "weighs the same.",
    "dapo": "DAPO (Yu et al. 2025) gathers four changes from long chain-of-thought training. Clip-higher raises "
            "the upper clip ($\\epsilon_\\text{high}$ 0.28 against 0.2) so unlikely tokens can grow and the entropy "
            "does not collapse; dynamic sampling samples again until every group of the batch holds different "
            "rewards (a group of equal rewards has zero advantage and teaches nothing); the token-mean loss "
            "weighs every token the same, whatever its completion's length; overlong shaping penalises answers "
            "that run into the length limit, softly from a margin before it. No KL term.",
    "gspo": "GSPO (Zheng et al. 2025) argues that the token ratio is the wrong unit when the reward belongs to the "
            "whole completion: a few noisy token ratios, frequent in a Mixture-of-Experts model whose routing "
            "changes between sampling and training, make the update unstable. It takes one ratio per completion, "
            "the geometric mean of its token ratios, and clips that. A mean of many log-ratios moves little, so "
            "the clip range is narrow (3e-4 / 4e-4). In the paper's MoE training it made routing replay "
            "unnecessary.",
    "gspo_token": "GSPO-token is GSPO with room for a per-token advantage: each token's ratio takes the value of "
                  "its completion's sequence ratio, with the token's own gradient path. With the same advantage on "
                  "every token of a completion it equals GSPO, in value and gradient (tested); it exists for "
                  "advantages that differ along a completion.",
    "cispo": "CISPO (MiniMax 2025) observes that PPO's clip removes the gradient of exactly the tokens whose "
             "probability moved most, often rare tokens that start a new line of reasoning. It keeps every "
             "token's REINFORCE gradient and clips the importance weight instead, detached: the weight is capped "
             "(here at $1 + 4$, one-sided) but the token still learns.",
    "sapo": "SAPO (Gao et al. 2025) replaces the clip's hard edge with a smooth gate: a token's gradient is "
            "weighted by a sigmoid-shaped function of its ratio that is 1 at ratio 1 and decays as the ratio moves "
            "away, faster for negative advantages ($\\tau_\\text{neg} > \\tau_\\text{pos}$). Off-policy tokens are "
            "damped, not cut, and a completion with a few bad tokens keeps the gradient of the others.",
    "gmpo": "GMPO (Zhao et al. 2025) maximises the geometric mean of a completion's token terms instead of their "
            "arithmetic mean, so one outlier token ratio moves the objective much less. The token ratios are "
            "clipped in log space, with a wider range than PPO's (0.4).",
    "rloo": "RLOO (Ahmadian et al. 2024, after Kool et al. 2019) is REINFORCE with a baseline that never sees the "
            "completion it judges: each completion's baseline is the mean reward of the other $G - 1$ completions "
            "of its prompt, which keeps the gradient unbiased (GRPO's group mean includes the completion itself). "
            "One update per batch, so the ratio is 1 and no clip acts; no division by a standard deviation.",
    "reinforce_pp": "REINFORCE++ (Hu et al. 2025) normalises the rewards over the whole batch, not per group: the "
                    "mean and standard deviation over every completion of the step, argued to be more stable than "
                    "statistics of a few samples of one prompt. PPO's clip is kept.",
    "reinforce_pp_baseline": "REINFORCE++ with a baseline (Hu et al. 2025): the group mean is subtracted first, a "
                             "per-prompt baseline for prompts of different difficulty, then the result is divided "
                             "by the batch's standard deviation.",
    "grpo_no_ref": "GRPO without its KL term, and without holding a reference model at all: recent recipes for "
                   "verifiable rewards (DAPO, Dr. GRPO) drop the KL to the starting model, whose drift is not "
                   "harmful in itself when the reward is checked by a rule. Not holding the reference saves a "
                   "model's memory and a forward pass per step; lesson 04 measures how far the policy drifts "
                   "without it.",
}

#: Where to read each paper an algorithm page cites: the start of its name in the ``Source:`` lines -> its address.
PAPER_LINKS = {
    "Schulman et al. 2017": "https://arxiv.org/abs/1707.06347",
    "Schulman et al. 2016": "https://arxiv.org/abs/1506.02438",
    "Schulman 2020": "http://joschu.net/blog/kl-approx.html",
    "Shao et al. 2024": "https://arxiv.org/abs/2402.03300",
    "Liu et al. 2025 (Dr. GRPO)": "https://arxiv.org/abs/2503.20783",
    "Yu et al. 2025": "https://arxiv.org/abs/2503.14476",
    "Zheng et al. 2025": "https://arxiv.org/abs/2507.18071",
    "MiniMax 2025": "https://arxiv.org/abs/2506.13585",
    "SAPO 2025": "https://arxiv.org/abs/2511.20347",
    "GMPO 2025": "https://arxiv.org/abs/2507.20673",
    "Ahmadian et al. 2024": "https://arxiv.org/abs/2402.14740",
    "Hu et al. 2025": "https://arxiv.org/abs/2501.03262",
    "Rafailov et al. 2023": "https://arxiv.org/abs/2305.18290",
    "Azar et al. 2023": "https://arxiv.org/abs/2310.12036",
    "Ethayarajh et al. 2024": "https://arxiv.org/abs/2402.01306",
    "Meng, Xia & Chen 2024": "https://arxiv.org/abs/2405.14734",
    "Yao et al. 2025": "https://fengyao.notion.site/off-policy-rl",
    "Ziegler et al. 2019": "https://arxiv.org/abs/1909.08593",
    "Ouyang et al. 2022": "https://arxiv.org/abs/2203.02155",
    "Huang et al. 2022": "https://iclr-blog-track.github.io/2022/03/25/ppo-implementation-details/",
    "Tang & Munos 2025": "https://arxiv.org/abs/2506.09477",
}


def paper_link(paper: str) -> str:
    """``paper`` as a Markdown link when PAPER_LINKS knows where to read it, else as written."""
    url = next((u for start, u in PAPER_LINKS.items() if paper.startswith(start)), None)
    return f"[{paper}]({url})" if url else paper


#: The estimator families: (page name, title, the functions it documents).
FAMILIES = [
    ("kl_estimators", "KL estimators: k1, k2, k3",
     ["kl.k1", "kl.k2", "kl.k3", "kl.kl_in_reward", "kl.kl_in_loss"]),
    ("importance_corrections", "Importance corrections: TIS and MIS, token and sequence",
     ["importance.token_tis_weights", "importance.token_mis_weights", "importance.seq_tis_weights",
      "importance.seq_mis_weights", "importance.is_weights"]),
    ("preference_losses", "Preference losses: DPO, IPO, KTO, SimPO",
     ["preference.dpo_loss", "preference.ipo_loss", "preference.kto_loss", "preference.simpo_loss"]),
]


ADVANTAGE_STEPS = {  # stage 3 of rl.compute_advantages, by (advantage, adv_scale); R_i. the rewards of group i
    ("group", "group"): [("A_ij = (R_ij - mean R_i.) / (std R_i. + eps)", "group_advantages")],
    ("group", "none"): [("A_ij = R_ij - mean R_i.", "group_advantages, no std")],
    ("rloo", "none"): [("A_ij = R_ij - mean of the other G - 1 rewards of x_i", "rloo_advantages")],
    ("reinforce_pp", "none"): [("A_ij = (R_ij - mean R) / (std R + eps)", "over the batch: reinforce_pp_advantages")],
    ("reinforce_pp_baseline", "none"): [("c_ij = R_ij - mean R_i.", "the group's mean first"),
                                        ("A_ij = c_ij / (std c + eps)", "std over the batch")],
}


def pseudocode(name: str) -> str:
    """One RL step of ``rl.train_rl`` for a preset, read off its switches: the five stages of ``rl.py``, with the
    function or setting that does each line. Raises ValueError past 100 columns (the book's code width)."""
    cfg = config.make_config(name)
    gae = cfg.advantage == "gae"
    kl_reward, kl_loss = cfg.beta > 0 and cfg.kl_placement == "reward", cfg.beta > 0 and cfg.kl_placement == "loss"
    eps = f"eps_low {cfg.eps_low}, eps_high {cfg.eps_high}"
    rows = [("for step in 1 .. steps:", ""),
            ("  # 1. rollout", ""),
            ("  x_1 .. x_n = the next prompts", f"n = prompts_per_step = {cfg.prompts_per_step}"),
            ("  y_i1 .. y_iG ~ pi_old( . | x_i)", f"G = group_size = {cfg.group_size}; pi_old: the weights now"),
            ("  logp_old_t = log pi_old(y_t)", "per token, no gradient")]
    if cfg.beta > 0:
        rows.append(("  logp_ref_t = log pi_ref(y_t)", "the frozen reference"))
    rows += [("  # 2. reward", ""), ("  R_ij = reward(x_i, y_ij)", "the reward functions, weighted")]
    if cfg.dynamic_sampling:
        rows += [("  keep groups with 0 < #correct < G", "has_signal, on the task's reward"),
                 ("  repeat 1-2 until n groups are kept", f"at most max_gen_batches = {cfg.max_gen_batches} rounds")]
    if cfg.overlong_shaping:
        rows.append(("  R_ij += overlong_penalty(|y_ij|)", f"cache zone {cfg.overlong_cache_len} tokens"))
    rows.append(("  # 3. advantages", ""))
    if gae:
        rows.append(("  r_t = R_i at the last token, else 0", "token_level_rewards"))
        if kl_reward:
            rows += [(f"  {cfg.kl_estimator}_t = {cfg.kl_estimator}(logp_old_t, logp_ref_t)", f"kl.{cfg.kl_estimator}"),
                     (f"  r_t = r_t - beta * {cfg.kl_estimator}_t", f"beta = {cfg.beta}, detached: kl_in_reward")]
        rows += [("  V_t = critic(x, y_<t)", "the value model"),
                 ("  A_t, returns_t = GAE(r, V)", f"gae: gamma {cfg.gamma}, lam {cfg.lam}")]
        if cfg.whiten_advantages:
            rows.append(("  A_t = (A_t - mean A) / sqrt(var A + 1e-8)", "whiten, over the batch's tokens"))
    else:
        rows += [("  " + code, note) for code, note in ADVANTAGE_STEPS[(cfg.advantage, cfg.adv_scale)]]
    rows += [("  # 4. optimise", ""), (f"  for epoch in 1 .. {cfg.num_iterations}:", "num_iterations"),
             (f"    for each of {cfg.num_minibatches} minibatches:", "num_minibatches")]
    ratio = ("      rho_t = exp(log pi_theta(y_t) - logp_old_t)", "with gradient")
    seq_ratio = ("      s_i = exp(mean_t (log pi_theta(y_it) - logp_old_it))", "the sequence ratio")
    if cfg.loss_mode == "cispo":
        rows += [ratio, ("      w_t = sg[min(rho_t, 1 + eps_high)]", f"detached, eps_high {cfg.eps_high}"),
                 ("      l_t = -w_t * A * log pi_theta(y_t)", "cispo_loss")]
    elif cfg.loss_mode == "sapo":
        rows += [ratio, ("      tau = tau_pos if A > 0 else tau_neg", f"{cfg.tau_pos}, {cfg.tau_neg}"),
                 ("      l_t = -(4 / tau) sigmoid(tau (rho_t - 1)) A", "sapo_loss: a soft gate")]
    elif cfg.loss_mode == "gmpo":
        rows += [ratio, ("      c_t = clip(log rho_t, -eps_low, eps_high)", eps),
                 ("      u_t = min(log rho_t, c_t) if A > 0 else max(log rho_t, c_t)", "the pessimistic side"),
                 ("      l_i = -A_i exp(mean_t u_t)", "gmpo_loss: the geometric mean")]
    elif cfg.level == "sequence":
        rows += [seq_ratio, ("      l_i = -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i)", "gspo_loss"),
                 ("", eps)]
    elif cfg.level == "sequence-token":
        rows += [seq_ratio, ("      s_it = sg[s_i] pi_theta(y_t) / sg[pi_theta(y_t)]", "the token's gradient"),
                 ("      l_it = -min(s_it A_it, clip(s_it, 1-eps_low, 1+eps_high) A_it)", ""), ("", eps)]
    else:
        rows += [ratio, ("      l_t = -min(rho_t A, clip(rho_t, 1-eps_low, 1+eps_high) A)", "token_clip_loss"),
                 ("", eps)]
    rows.append(("      L = aggregate(l)", f"agg = {cfg.agg!r}"))
    if kl_loss:
        rows += [(f"      {cfg.kl_estimator}_t = {cfg.kl_estimator}(log pi_theta(y_t), logp_ref_t)",
                  f"kl.{cfg.kl_estimator}, with gradient"),
                 (f"      L = L + beta * aggregate({cfg.kl_estimator}_t)", f"beta = {cfg.beta}: kl_in_loss")]
    if gae:
        rows += [("      L = L + value_loss(V, returns)", f"the critic's own loss; value_clip {cfg.value_clip}"),
                 ("      one AdamW step on grad L", f"policy and critic, each norm clipped at {cfg.max_grad_norm}")]
    else:
        rows.append(("      theta <- AdamW step on grad L", f"grad norm clipped at {cfg.max_grad_norm}"))
    rows.append(("  # 5. log one row of metrics", "History"))
    width = 48  # the notes' column; a longer line keeps its note two spaces after it
    lines = [f"{code:<{width - 2}}  # {note}" if note else code for code, note in rows]
    too_wide = [line for line in lines if len(line) > 100]
    if too_wide:
        raise ValueError(f"pseudocode of {name!r} runs past 100 columns: {too_wide}")
    return "\n".join(lines)


def copy_with(fn) -> list[str]:
    """The names of a docstring's "Copy with:" line: what its author says a copy of the function needs."""
    line = re.search(r"^\s*Copy with:(.*(?:\n\s{6,}\S.*)*)", inspect.getdoc(fn) or "", re.M)
    return re.findall(r"\w+", line.group(1)) if line else []


def helpers(fn) -> tuple[list, list[tuple[str, object]]]:
    """What ``fn`` needs beside it to be copied: (the minirl functions it calls by name from its own module or
    from ``checks``, or names on its "Copy with:" line, then theirs, in order of first use; the constants that
    line names, as (name, value))."""
    found, constants, todo = [], [], [fn]
    while todo:
        current = todo.pop(0)
        named = []
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(current)))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                named.append(current.__globals__.get(node.func.id))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name)):
                module = current.__globals__.get(node.func.value.id)
                if inspect.ismodule(module) and module.__name__ in ("minirl.checks", current.__module__):
                    named.append(getattr(module, node.func.attr, None))
        for name in copy_with(current):
            value = current.__globals__.get(name)
            if inspect.isfunction(value):
                named.append(value)
            elif value is not None and not inspect.ismodule(value) and name not in dict(constants):
                constants.append((name, value))
        for target in named:
            if (inspect.isfunction(target) and target.__module__.startswith("minirl.")
                    and target is not fn and target not in found):
                found.append(target)
                todo.append(target)
    return found, constants


def preset_functions(name: str) -> list[str]:
    """The functions a preset runs, read off its switches the way ``rl.py`` and ``losses.policy_loss`` pick them."""
    cfg = config.make_config(name)
    adv = {"group": "group_advantages", "gae": "gae"}.get(cfg.advantage, f"{cfg.advantage}_advantages")
    if cfg.loss_mode != "clip":
        loss = f"{cfg.loss_mode}_loss"
    else:
        loss = {"token": "token_clip_loss", "sequence": "gspo_loss", "sequence-token": "gspo_token_loss"}[cfg.level]
    out = [f"advantages.{adv}", f"losses.{loss}", "losses.aggregate"]
    if cfg.advantage == "gae":
        out += ["losses.value_loss"] + (["advantages.whiten"] if cfg.whiten_advantages else [])
    if cfg.beta > 0:
        out += [f"kl.{cfg.kl_estimator}", f"kl.kl_in_{cfg.kl_placement}"]
    if cfg.dynamic_sampling:
        out += ["group_filter.has_signal", "group_filter.dynamic_sampling"]
    if cfg.overlong_shaping:
        out.append("rewards.overlong_penalty")
    for qualname in out:  # a renamed function fails the build here, not silently on the page
        resolve(qualname)
    return out


def resolve(qualname: str):
    module, name = qualname.split(".")
    return getattr(importlib.import_module(f"minirl.{module}"), name)


def defined(qualname: str) -> str:
    """Where a function is defined, as ``module.function``: the key of the paper index and of the tests' markers
    (``losses.cispo_loss`` is re-exported from ``clip_alternatives``)."""
    fn = resolve(qualname)
    return f"{fn.__module__.removeprefix('minirl.')}.{fn.__name__}"


def anchor(qualname: str) -> str:
    """The anchor of a function's section (its heading, as MyST slugs it)."""
    return default_slugify(qualname)


def summary(doc: str) -> str:
    """A docstring's first paragraph, on one line."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


@functools.cache
def _sources() -> dict[str, str]:
    return {f"{m}.{n}": t for m, n, t in paper_index.sources()}


@functools.cache
def _notebooks() -> list[tuple[str, list[dict]]]:
    return [(p.stem, json.loads(p.read_text())["cells"]) for p in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))]


def notebook_sections(word: str) -> list[tuple[str, str, str]]:
    """(notebook stem, section title, anchor) of every notebook section with a code cell that mentions ``word``."""
    pattern = re.compile(rf"\b{re.escape(word)}\b" if word[0].isalnum() else re.escape(word))
    out = []
    for stem, cells in _notebooks():
        heading = ("", "")
        for cell in cells:
            text = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                for line in text.splitlines():
                    if m := re.match(r"^(#{1,3})\s+(.+?)\s*$", line):
                        title = re.sub(r"[`*]", "", m.group(2))
                        words = re.sub(r"\$[^$]*\$", "", title)  # MyST's anchor leaves a heading's maths out
                        heading = (title, "" if m.group(1) == "#" else default_slugify(words))
            elif pattern.search(text) and (stem, *heading) not in out:
                out.append((stem, *heading))
    return out


def _sections_md(sections: list[tuple[str, str, str]]) -> str:
    lines = []
    for stem, title, anchor in sections:
        target = f"../../{stem}.ipynb" + (f"#{anchor}" if anchor else "")
        lines.append(f"- [{stem}: {title or stem}]({target})")
    return "\n".join(lines) or "- (no lesson calls it directly)"


def function_md(qualname: str, tests: dict[str, list[str]]) -> str:
    """The section of a page about one function: problem, equation and papers, its code in full with the helpers
    it calls, tests, lessons."""
    fn = resolve(qualname)
    doc = inspect.getdoc(fn) or ""
    parts = [f"### `{qualname}`", "", summary(doc), ""]
    if qualname in EQUATIONS:
        parts += ["$$", EQUATIONS[qualname], "$$", ""]
    cited = paper_index.entries(_sources().get(defined(qualname), ""))
    if cited:
        parts += ["| paper | equation |", "|---|---|"] + [f"| {paper_link(p)} | {e} |" for p, e in cited] + [""]
    parts += ["```python", inspect.getsource(fn).rstrip(), "```", ""]
    called, constants = helpers(fn)
    if called or constants:
        parts += ["What it needs beside it, to copy it (the helpers it calls, `minirl.checks`' argument checks and "
                  "what its \"Copy with:\" line names): " + ", ".join(
                      [f"`{h.__module__.removeprefix('minirl.')}.{h.__name__}`" for h in called]
                      + [f"`{name}`" for name, _ in constants]) + ".", ""]
        if constants:
            parts += ["```python", *(f"{name} = {value!r}" for name, value in constants), "```", ""]
        for h in called:
            parts += ["```python", inspect.getsource(h).rstrip(), "```", ""]
    parts += ["**Tests that check it:** " +
              (", ".join(f"`tests/{t}`" for t in tests.get(defined(qualname), [])) or "none marked"), "",
              "**In the lessons:**", "", _sections_md(notebook_sections(qualname.split(".")[1])), ""]
    return "\n".join(parts)


def _preset_comment(name: str) -> str:
    """The comment above a preset in config.py: the paper and what the preset changes."""
    lines = inspect.getsource(config).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ALGORITHMS"))
    at = next(i for i in range(start, len(lines)) if lines[i].strip().startswith(f'"{name}": dict('))
    comment = []
    while lines[at - 1].strip().startswith("#"):
        at -= 1
        comment.insert(0, lines[at].strip().lstrip("#").strip())
    return " ".join(comment)


def _field_comments() -> dict[str, str]:
    """RLConfig field -> its inline comment (what the switch does)."""
    out, last = {}, None
    for line in inspect.getsource(config.RLConfig).splitlines():
        if m := re.match(r"^    (\w+): [^=]+=[^#]*(?:#\s*(.*))?$", line):
            last = m.group(1)
            out[last] = m.group(2) or ""
        elif last and re.match(r"^    #\s", line) and not line.strip().startswith("# ---"):
            out[last] += " " + line.strip().lstrip("#").strip()
        else:
            last = None
    return out


def algorithm_page(name: str, tests: dict[str, list[str]]) -> str:
    switches = config.ALGORITHMS[name]
    defaults = config.RLConfig()
    comments = _field_comments()
    engines = interop.engine_equivalents()[name]
    functions = preset_functions(name)
    minimal = ROOT / "minirl" / "minimal" / f"{name}.py"
    cited = list(dict.fromkeys(p for q in functions for p, _ in paper_index.entries(_sources().get(defined(q), ""))))
    cited.sort(key=lambda paper: paper.split(" (")[0] not in _preset_comment(name))  # the preset's own first
    lines = [f"# `{name}`: {_preset_comment(name).split(',')[0]}", "",
             "## Why", "", WHY[name], "", f"In `config.py`'s words: {_preset_comment(name)}.", "",
             "## One step, in pseudocode", "",
             f"What `rl.train_rl` does at every step under `make_config({name!r})`, read off the preset's switches "
             "(`rl.py`'s five stages; each note names the function or setting; the sizes are `RLConfig`'s defaults, "
             "which a profile or the command line may change):", "",
             "```text", pseudocode(name), "```", "", "## The equations", ""]
    for q in functions:
        if q in EQUATIONS:
            lines += [f"[`{q}`](#{anchor(q)}):", "", "$$", EQUATIONS[q], "$$", ""]
    lines += ["## The papers", ""] + [f"- {paper_link(p)}" for p in cited] + ["", "## The code", ""]
    if minimal.exists():
        lines += [f"The whole algorithm in one file, to read top to bottom and to copy: "
                  f"[`minirl/minimal/{name}.py`](minimal_{name}.md) (torch, transformers and the standard library "
                  f"only; a test runs it beside the library's loop and compares every step).", ""]
    lines += ["Each function the preset runs is shown in full below, with the helpers it calls; what each one "
              "solves, in its docstring's words:", ""]
    lines += [f"- [`{q}`](#{anchor(q)}): {summary(inspect.getdoc(resolve(q)))}"
              for q in functions]
    lines += ["", "## The switches", "", f"`make_config({name!r})` sets these fields of `RLConfig` (every other "
              "field keeps its default):", ""]
    lines += [f"- `{k} = {v!r}` (default `{getattr(defaults, k)!r}`)" + (f": {comments[k]}" if comments.get(k) else "")
              for k, v in switches.items()]
    lines += ["", "## In TRL and verl", "", "What `minirl.interop.engine_equivalents()` answers for this preset "
              "(`interop.to_trl` / `interop.to_verl` give the full, runnable settings):", ""]
    for engine, label in (("trl", f"TRL {interop.TRL_VERSION}"), ("verl", f"verl {interop.VERL_VERSION}")):
        text = engines[engine]
        if text.startswith("not "):
            lines += [":::{warning}", f"**{label}**: {text}", ":::", ""]
        else:
            lines += [f"**{label}**:", "", "```text", text, "```", ""]
    lines += ["## In the lessons", "", f"Notebook sections whose code uses the preset `{name!r}`:", "",
              _sections_md(notebook_sections(f'"{name}"')), "", "## The functions", ""]
    lines += [function_md(q, tests) for q in functions]
    lines += ["---", "", f"*Generated from `minirl/config.py` (`ALGORITHMS[{name!r}]`), the functions it runs and "
              f"their docstrings; the paragraph of why is written beside the generator (`notebooks/book/pages.py`).*"]
    return "\n".join(lines)


def _ask(f) -> str:
    """What the bridge answers, as inline code, or its refusal (NotImplementedError, ValueError) as such."""
    try:
        return f"`{f()}`"
    except (NotImplementedError, ValueError) as e:
        return f"refused: {e}"


def _family_engines(page: str) -> list[str]:
    """The TRL and verl names for each member of a family, as the bridge answers (refusals shown as such)."""
    rows = []

    def pick(mapping: dict, *names: str) -> dict:
        return {k: v for k, v in mapping.items() if k.startswith(names)}

    def overrides(cfg, word: str) -> str:
        return " ".join(o for o in interop.verl_overrides(cfg) if word in o)

    if page == "kl_estimators":
        for est in ("k1", "k2", "k3"):
            for placement in ("reward", "loss"):
                cfg = config.make_config("grpo", kl_estimator=est, kl_placement=placement)
                trl = _ask(lambda cfg=cfg: pick(interop.trl_kwargs(cfg), "beta", "use_bias_correction_kl"))
                verl = _ask(lambda cfg=cfg: overrides(cfg, "kl"))
                rows.append((f"`kl_estimator={est!r}, kl_placement={placement!r}`", trl, verl))
    elif page == "importance_corrections":
        for corr in ("token_tis", "token_mis", "seq_tis", "seq_mis"):
            cfg = config.make_config("grpo", is_correction=corr, is_cap_low=0.5 if corr.endswith("mis") else None)
            trl = _ask(lambda cfg=cfg: pick(interop.trl_kwargs(cfg), "vllm_importance"))
            verl = _ask(lambda cfg=cfg: overrides(cfg, "rollout_correction"))
            rows.append((f"`is_correction={corr!r}, is_cap={cfg.is_cap}, is_cap_low={cfg.is_cap_low}`", trl, verl))
    else:
        keep = ("loss_type", "beta", "simpo_gamma", "cpo_alpha", "desirable_weight", "undesirable_weight")
        for settings in (dict(method="dpo"), dict(method="ipo"), dict(method="ipo", reduction="mean"),
                         dict(method="kto"), dict(method="simpo")):
            def trl(settings=settings):
                trainer, kw = interop.pref_trl_kwargs(PrefConfig(**settings))
                return f"{trainer}(" + ", ".join(f"{k}={kw[k]!r}" for k in keep if k in kw) + ")"
            args = ", ".join(f"{k}={v!r}" for k, v in settings.items())
            rows.append((f"`PrefConfig({args})`", _ask(trl), "no preference trainer is mapped to verl"))
    return [f"- {setting}\n  - TRL {interop.TRL_VERSION}: {trl}\n  - verl {interop.VERL_VERSION}: {verl}"
            for setting, trl, verl in rows]


def family_page(page: str, title: str, functions: list[str], tests: dict[str, list[str]]) -> str:
    lines = [f"# {title}", "", "*Generated from the docstrings of the functions below and `minirl.interop`.*", "",
             "## What each one solves", ""]
    lines += [f"- [`{q}`](#{anchor(q)}): {summary(inspect.getdoc(resolve(q)))}"
              for q in functions]
    lines += ["", "## In TRL and verl", "", "What the bridge (`minirl.interop`) answers; a refusal names what the "
              "engine lacks.", ""] + _family_engines(page)
    lines += ["", "## The functions", ""] + [function_md(q, tests) for q in functions]
    return "\n".join(lines)


def paper_index_page(documented: dict[str, str]) -> str:
    """The paper index (paper -> equation -> function -> test -> notebook cell): a section per paper, so a paper
    can be linked and found by search, each function linked to the book page that documents it."""
    lines = ["# Paper index", "", "*Generated from the `Source:` lines of minirl's docstrings by "
             "`tests/paper_index.py`, the rows of notebooks/paper_index.md: for each paper, the equation, the "
             "minirl function that implements it, the test that checks it and the first notebook cell that uses it.*"]
    paper_now = None
    for paper, eq, fn, test, cell in paper_index.rows():
        if paper != paper_now:
            lines += ["", f"## {paper}", ""]
            paper_now = paper
        qualname = fn.strip("`")
        if qualname in documented:
            fn = f"[{fn}]({documented[qualname]}.md#{anchor(qualname)})"
        cell = cell.replace("](notebooks/", "](../../")
        lines.append(f"- {eq if eq != '-' else '(no equation number)'}: {fn}; test {test}; notebook {cell}")
    return "\n".join(lines)


#: The key equation of each one-file algorithm, in LaTeX beside the file (the file writes it in plain text).
MINIMAL_EQUATIONS = {
    "grpo": r"\mathcal{L} = -\frac{1}{G}\sum_{i=1}^{G}\frac{1}{|y_i|}\sum_{t}\Big[\min\big(\rho_{i,t}A_i,\ "
            r"\operatorname{clip}(\rho_{i,t}, 1-\varepsilon, 1+\varepsilon)A_i\big) - \beta\,k_3\Big],\quad "
            r"A_i = \frac{r_i - \operatorname{mean}(r)}{\operatorname{std}(r) + \varepsilon_A},\quad "
            r"\rho_{i,t} = \frac{\pi_\theta(y_{i,t})}{\pi_\text{old}(y_{i,t})}",
    "ppo": r"\mathcal{L} = -\frac{1}{N_\text{tok}}\sum_{i,t}\min\big(\rho_{i,t}\hat A_{i,t},\ "
           r"\operatorname{clip}(\rho_{i,t}, 1-\varepsilon, 1+\varepsilon)\hat A_{i,t}\big),\quad "
           r"\hat A_t = \sum_{l \ge 0}(\gamma\lambda)^l\delta_{t+l},\quad "
           r"\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t),\quad "
           r"r_t = [t = T]\,R - \beta\,(\log\pi_\text{old}(y_t) - \log\pi_\text{ref}(y_t));\quad "
           r"\mathcal{L}_V = \frac{1}{2N_\text{tok}}\sum_{i,t}\max\big((V - \hat R)^2,\ "
           r"(V_\text{old} + \operatorname{clip}(V - V_\text{old}, -c, c) - \hat R)^2\big)",
    "dpo": r"\mathcal{L} = -\frac{1}{b}\sum_{(x, y_w, y_l)}\log\sigma\Big(\beta\Big[\log"
           r"\frac{\pi_\theta(y_w \mid x)}{\pi_\text{ref}(y_w \mid x)} - \log"
           r"\frac{\pi_\theta(y_l \mid x)}{\pi_\text{ref}(y_l \mid x)}\Big]\Big)",
    "distill": r"\mathcal{L} = -\frac{1}{N_\text{tok}}\sum_{i,t}\operatorname{sg}(A_{i,t})\log p_\theta(y_{i,t}),"
               r"\quad A_{i,t} = \sum_{s \ge t}\gamma^{s-t}\big(\log q(y_{i,s}) - \log p_\theta(y_{i,s})\big),"
               r"\quad y \sim p_\theta",
}
#: What each one-file algorithm is, in the words its page opens with (the files say the rest themselves).
MINIMAL = {"grpo": "GRPO", "ppo": "PPO with a critic, GAE and the KL in the reward", "dpo": "DPO",
           "distill": "On-policy distillation"}


def minimal_page(path: Path) -> str:
    """The page of one file of ``minirl/minimal/``: how to run it, its key equation, then the whole file."""
    name = path.stem
    source = path.read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    lines = [f"# {MINIMAL.get(name, name)} in one file: `minirl/minimal/{name}.py`", "",
             f"*The whole algorithm, {len(source.splitlines())} lines, read top to bottom; it imports torch, "
             f"transformers and the standard library only, so a copy of the file runs on its own. "
             f"`tests/test_minimal*.py` runs it beside minirl's library loop from the same weights, data and seed "
             f"and checks that both compute the same loss, gradient norm and weights after every optimiser "
             f"step.*", "", "```text", doc, "```", ""]
    if name in MINIMAL_EQUATIONS:
        lines += ["The loss it minimises:", "", "$$", MINIMAL_EQUATIONS[name], "$$", ""]
    lines += ["## The file", "", "```python", source.rstrip(), "```"]
    return "\n".join(lines)


def write_all(out: Path) -> list[Path]:
    """Write every generated page into ``out`` (removing stale ones); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.md"):
        old.unlink()
    tests = paper_index.marked_tests()
    pages: dict[str, str] = {}
    documented: dict[str, str] = {}
    for name in config.ALGORITHMS:
        pages[f"algo_{name}"] = algorithm_page(name, tests)
        for q in preset_functions(name):
            documented.setdefault(q, f"algo_{name}")
    for page, title, functions in FAMILIES:
        pages[page] = family_page(page, title, functions, tests)
        documented.update({q: page for q in functions})
    pages["paper_index"] = paper_index_page(documented)
    files = sorted((ROOT / "minirl" / "minimal").glob("[!_]*.py"), key=lambda f: list(MINIMAL).index(f.stem)
                   if f.stem in MINIMAL else len(MINIMAL))
    for f in files:
        pages[f"minimal_{f.stem}"] = minimal_page(f)
    pages["minimal"] = "\n".join([
        "# One file per algorithm", "", "Each algorithm of the library, written again as one file to read from top "
        "to bottom and to copy: the settings, the data, the reward, sampling, log-probs, advantages, the loss with "
        "its equation, the update and the evaluation, in that order. The library proves them: a test runs each "
        "file beside the library's loop and compares every step.", "",
        *(f"- [{MINIMAL.get(f.stem, f.stem)}](minimal_{f.stem}.md): `python -m minirl.minimal.{f.stem}`"
          for f in files), "", "```{toctree}", ":hidden:", "", *(f"minimal_{f.stem}" for f in files), "```"])
    table = config.algorithms_table()
    algo_links = "\n".join(f"- [`{n}`: {_preset_comment(n).split(',')[0]}](algo_{n}.md)" for n in config.ALGORITHMS)
    pages["algorithms"] = "\n".join([
        "# Algorithms", "", "Each algorithm is a preset of `RLConfig` switches (`minirl.config.ALGORITHMS`); one "
        "loop runs them all. The switches, side by side (`config.algorithms_table()`):", "", table, "",
        algo_links, "", "```{toctree}", ":hidden:", "", *(f"algo_{n}" for n in config.ALGORITHMS), "```"])
    pages["estimators"] = "\n".join([
        "# Estimator families", "", *(f"- [{title}]({page}.md)" for page, title, _ in FAMILIES), "",
        "```{toctree}", ":hidden:", "", *(page for page, _, _ in FAMILIES), "```"])
    written = []
    for name, text in pages.items():
        path = out / f"{name}.md"
        path.write_text(text + "\n")
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_all(Path(__file__).resolve().parent / "generated"):
        print(p.relative_to(ROOT))

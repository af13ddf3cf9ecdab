"""Draw the opening diagram of every lesson: ``python notebooks/figures/draw.py`` rewrites notebooks/figures/*.png.

Each lesson opens with one picture of its idea (STYLE.md, "Notebooks: lessons, not lab records"), shown by a markdown
cell as ``![...](figures/NN_name.png)``, so it renders in Jupyter, on the code host and in the book. The pictures are
boxes, arrows and a few formulas, no measured result: a figure a lesson quotes comes from a cell, never from here.
Deterministic: the same matplotlib and Pillow give the same bytes (a 256-colour palette PNG, no timestamp or version
in its metadata).
"""

import io
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

OUT = Path(__file__).resolve().parent
# one colour per role, the same in every diagram
TRAINED, FROZEN, RULE, CRITIC, DATA, NOTE = "#cfe2f3", "#e6e6e6", "#d9ead3", "#fce5cd", "#ffffff", "#fff2cc"


def canvas(width, height):
    """A figure whose data coordinates are inches, so a box of width 2 is 2 inches wide at any size."""
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    return fig, ax


def box(ax, x, y, w, h, text, color=DATA, size=9, weight="normal"):
    """A rounded box with its lower-left corner at (x, y); returns its centre."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03,rounding_size=0.08", fc=color, ec="#444444",
                                lw=1.0))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight, linespacing=1.3)
    return x + w / 2, y + h / 2


def arrow(ax, start, end, text="", color="#444444", style="-|>", offset=(0, 0.12), size=8, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, lw=1.2,
                                 connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text, ha="center",
                va="bottom", fontsize=size, color=color)


def title(ax, width, height, text):
    ax.text(width / 2, height - 0.18, text, ha="center", va="top", fontsize=11, weight="bold")


def task_and_models():
    fig, ax = canvas(10, 3.4)
    title(ax, 10, 3.4, "One task, one reward rule, and a warm start for RL to improve")
    p = box(ax, 0.2, 1.9, 1.4, 0.6, "prompt\n7+5+9=")
    m = box(ax, 2.2, 1.9, 1.8, 0.6, "tiny Qwen3\n(dense or MoE)", TRAINED)
    c = box(ax, 4.6, 1.9, 2.6, 0.6, "completion, one token per character\n7+5=12;12+9=21#21")
    r = box(ax, 7.8, 1.9, 2.0, 0.6, "reward rule\n1 if the answer after # is right", RULE, size=8)
    arrow(ax, (1.6, p[1]), (2.2, m[1]))
    arrow(ax, (4.0, m[1]), (4.6, c[1]), "sample")
    arrow(ax, (7.2, c[1]), (7.8, r[1]))
    s = box(ax, 0.6, 0.35, 3.6, 0.8, "stage 1: SFT warm start\nlearns the format; stops at a target\n"
            "sampled accuracy, not at a step count", NOTE, size=8)
    t = box(ax, 5.6, 0.35, 3.6, 0.8, "stage 2: RL (lessons 01 on)\nraises the share of right answers\n"
            "from the reward alone", NOTE, size=8)
    arrow(ax, (4.2, s[1]), (5.6, t[1]), "partial on purpose:\nroom to improve", offset=(0, 0.08))
    return fig


def policy_gradient():
    fig, ax = canvas(10, 3.0)
    title(ax, 10, 3.0, "From REINFORCE to PPO's clip: each step fixes one problem of the last")
    steps = [("REINFORCE", "weight grad log pi(a)\nby the reward r(a)", "unbiased,\nvariance ~ 1/G"),
             ("+ a baseline b", "weight by r(a) - b", "same mean,\nanother variance"),
             ("b from the group", "mean of G rewards (GRPO)\nor of the others (RLOO)", "group mean: scale (G-1)/G\n"
              "leave-one-out: exact"),
             ("+ reused samples", "ratio pi / pi_old,\nclipped to [1-eps, 1+eps]", "PPO: a moved token\nstops pulling")]
    for i, (head, body, note) in enumerate(steps):
        x = 0.2 + i * 2.45
        box(ax, x, 1.25, 2.05, 1.05, f"{head}\n\n{body}", TRAINED if i == 3 else DATA, size=8)
        box(ax, x + 0.1, 0.25, 1.85, 0.7, note, NOTE, size=7.5)
        if i:
            arrow(ax, (x - 0.4, 1.77), (x, 1.77))
    return fig


def ppo_four_models():
    fig, ax = canvas(10, 4.2)
    title(ax, 10, 4.2, "PPO for language models: four models, two of them trained")
    box(ax, 0.2, 2.7, 2.0, 0.8, "policy pi_theta\ntrained", TRAINED, weight="bold")
    box(ax, 0.2, 1.4, 2.0, 0.8, "old policy pi_old\nthe policy at rollout time:\nsamples, fixes the ratio", FROZEN,
        size=7.5)
    box(ax, 3.4, 2.45, 2.2, 0.7, "reward\na rule here (tasks.score),\na learned model in RLHF", RULE, size=7.5)
    box(ax, 3.4, 1.4, 2.2, 0.8, "reference pi_ref\nfrozen: the KL penalty\nper token", FROZEN, size=7.5)
    box(ax, 3.4, 0.15, 2.2, 0.8, "critic V_phi\ntrained: the value of\neach prefix", CRITIC, size=7.5)
    box(ax, 6.8, 1.4, 1.6, 0.8, "GAE\nadvantage of\nevery token", NOTE, size=8)
    box(ax, 6.8, 2.8, 2.9, 0.7, "clipped surrogate\nmin(rho A, clip(rho) A), rho = pi_theta / pi_old", NOTE, size=7.5)
    arrow(ax, (1.2, 2.7), (1.2, 2.2), "snapshot", offset=(0.45, -0.08))
    arrow(ax, (5.6, 2.8), (6.8, 2.0), "score on the last token", offset=(0.25, 0.0), size=7)
    arrow(ax, (5.6, 1.8), (6.8, 1.8), "- beta k1", offset=(0, 0.05))
    arrow(ax, (5.6, 0.75), (6.8, 1.55), "values V_t", offset=(-0.3, 0.0), size=7)
    arrow(ax, (7.6, 2.2), (7.6, 2.8))
    arrow(ax, (6.8, 3.35), (2.2, 3.35), "update the policy", offset=(0, 0.0))
    arrow(ax, (7.3, 1.4), (5.6, 0.35), "", rad=-0.25)
    ax.text(6.7, 0.2, "returns: the critic's target", fontsize=7, color="#444444")
    ax.text(8.6, 0.55, "GRPO (03) drops the critic;\nat beta = 0 also the reference", fontsize=8, ha="center",
            style="italic")
    return fig


def grpo_group():
    fig, ax = canvas(10, 3.6)
    title(ax, 10, 3.6, "GRPO: the group of G answers to one prompt is the baseline")
    box(ax, 0.2, 1.5, 1.4, 0.7, "one prompt\n2+1+2+1+2=")
    rewards = [1, 0, 0, 0]  # notebook 03's worked example: mean 0.25, unbiased std 0.5
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    adv = [f"{(r - mean) / (std + 1e-4):+.2f}" for r in rewards]
    for i, (r, a) in enumerate(zip(rewards, adv, strict=True)):
        y = 2.55 - i * 0.7
        box(ax, 2.3, y, 1.7, 0.5, f"completion {i + 1}", TRAINED, size=8)
        box(ax, 4.5, y, 0.8, 0.5, f"r = {r}", RULE, size=8)
        box(ax, 7.6, y, 1.1, 0.5, f"A = {a}", NOTE, size=8)
        arrow(ax, (1.6, 1.85), (2.3, y + 0.25))
        arrow(ax, (4.0, y + 0.25), (4.5, y + 0.25))
        arrow(ax, (6.9, y + 0.25), (7.6, y + 0.25))
    box(ax, 5.6, 0.55, 1.3, 2.5, f"group\nmean {mean:g}\nstd {std:g}\n\nA = (r - mean)\n/ (std + eps)", DATA, size=8)
    for i in range(4):
        arrow(ax, (5.3, 2.8 - i * 0.7), (5.6, 2.8 - i * 0.7))
    ax.text(9.35, 1.8, "every token of\na completion\ngets its A;\nno critic", ha="center", va="center", fontsize=8,
            style="italic")
    ax.text(3.15, 0.2, "G = 4 samples (8 in the runs)", ha="center", fontsize=8)
    ax.text(7.6, 0.2, "all rewards equal: A = 0 for the whole group", ha="center", fontsize=8)
    return fig


def kl_placements():
    fig, ax = canvas(10, 3.6)
    title(ax, 10, 3.6, "The same KL estimate k, two places to put it, two different gradients")
    box(ax, 0.2, 1.45, 1.9, 0.8, "k per token\nk1 = l, k2 = l^2/2,\nk3 = e^-l - 1 + l", DATA, size=8)
    box(ax, 2.9, 2.35, 2.6, 0.8, "in the reward (detached)\nr_t - beta k_t, then advantages", RULE, size=8)
    box(ax, 2.9, 0.45, 2.6, 0.8, "in the loss (differentiated)\nloss + beta aggregate(k)", CRITIC, size=8)
    box(ax, 6.0, 2.35, 2.0, 0.8, "E[ k grad log pi ]\nscore-function half", NOTE, size=8)
    box(ax, 6.0, 0.45, 2.0, 0.8, "E[ grad k ]\npathwise half", NOTE, size=8)
    arrow(ax, (2.1, 2.0), (2.9, 2.75))
    arrow(ax, (2.1, 1.7), (2.9, 0.85))
    arrow(ax, (5.5, 2.75), (6.0, 2.75))
    arrow(ax, (5.5, 0.85), (6.0, 0.85))
    ax.text(9.0, 2.75, "k1 here: the KL's\ntrue gradient\nk3 here: neither KL", ha="center", va="center", fontsize=8)
    ax.text(9.0, 0.85, "k3 here (GRPO):\nthe forward KL's\nk1 here: zero", ha="center", va="center", fontsize=8)
    ax.text(1.15, 0.9, "l = log pi - log pi_ref\nof a sampled token", ha="center", fontsize=7.5, style="italic")
    return fig


def dapo_changes():
    fig, ax = canvas(10, 4.4)
    title(ax, 10, 4.4, "DAPO's four changes and Dr. GRPO's two, each one switch of GRPO")
    g = box(ax, 4.1, 1.55, 1.8, 0.8, "GRPO\n(notebook 03)", TRAINED, size=10, weight="bold")
    dapo = [("clip-higher", "eps_high 0.2 -> 0.28:\nrare tokens may rise more"),
            ("dynamic sampling", "drop groups whose rewards\nare all equal; sample more"),
            ("token-mean", "every token weighs the same,\nwhatever its answer's length"),
            ("overlong shaping", "a length penalty that ramps\nto -1 at the budget")]
    for i, (head, body) in enumerate(dapo):
        c = box(ax, 0.2, 2.75 - i * 0.82, 2.9, 0.7, f"{head}\n{body}", RULE, size=7.5)
        arrow(ax, (4.1, g[1]), (3.1, c[1]))
    for i, (head, body) in enumerate([("no std division", "A = r - group mean"),
                                      ("constant normaliser", "sum over tokens / max length")]):
        c = box(ax, 6.9, 2.4 - i * 1.2, 2.9, 0.7, f"{head}\n{body}", CRITIC, size=7.5)
        arrow(ax, (5.9, g[1]), (6.9, c[1]))
    ax.text(1.65, 3.62, "DAPO (Yu et al. 2025)", ha="center", fontsize=8.5, weight="bold")
    ax.text(8.35, 3.62, "Dr. GRPO (Liu et al. 2025)", ha="center", fontsize=8.5, weight="bold")
    return fig


def gspo_moe():
    fig, ax = canvas(10, 3.8)
    title(ax, 10, 3.8, "MoE: an update can change a token's experts; two answers to it")
    ax.text(2.45, 3.1, "one token, one layer: top-2 of 8 experts", ha="center", fontsize=8.5)
    for row, (label, chosen, y) in enumerate([("at rollout", {2, 5}, 2.45), ("after an update", {2, 7}, 1.65),
                                              ("Routing Replay", {2, 5}, 0.85)]):
        ax.text(0.2, y + 0.18, label, fontsize=8, va="center")
        for e in range(8):
            color = ("#9fc5e8" if row < 2 else "#b4a7d6") if e in chosen else "#ffffff"
            box(ax, 1.5 + e * 0.42, y, 0.34, 0.36, str(e), color, size=7)
    ax.text(2.45, 0.35, "replay forces the rollout's experts;\nthe mixing weights stay live",
            ha="center", fontsize=7.5, style="italic")
    box(ax, 5.6, 2.2, 4.2, 0.9, "GRPO: one ratio per token\nr_t = pi_theta(y_t) / pi_old(y_t)\n"
        "a changed expert moves it a lot", TRAINED, size=8)
    box(ax, 5.6, 0.8, 4.2, 0.9, "GSPO: one ratio per answer\ns = (pi_theta(y) / pi_old(y))^(1/|y|)\n"
        "a geometric mean: calm, clip range 3e-4 / 4e-4", RULE, size=8)
    arrow(ax, (7.7, 2.2), (7.7, 1.7))
    return fig


def dpo_derivation():
    fig, ax = canvas(10, 3.4)
    title(ax, 10, 3.4, "DPO in four lines: from the KL-regularised optimum to a loss on pairs")
    steps = [("1. the optimum (notebook 04)", r"$\pi^*(y) = \pi_{ref}(y)\, e^{r(y)/\beta} / Z$"),
             ("2. solve for the reward", r"$r(y) = \beta \log \frac{\pi^*(y)}{\pi_{ref}(y)} + \beta \log Z$"),
             ("3. Bradley-Terry on a pair", r"$p(y_w \succ y_l) = \sigma(r(y_w) - r(y_l))$" + "\n"
              r"$\beta \log Z$ cancels"),
             ("4. maximum likelihood", r"$\mathcal{L} = -\log \sigma(\beta h)$" + "\n"
              r"$h = \log\frac{\pi_\theta(y_w)}{\pi_{ref}(y_w)} - \log\frac{\pi_\theta(y_l)}{\pi_{ref}(y_l)}$")]
    for i, (head, body) in enumerate(steps):
        x = 0.15 + i * 2.47
        box(ax, x, 0.7, 2.2, 1.9, "", TRAINED if i == 3 else DATA)
        ax.text(x + 1.1, 2.35, head, ha="center", va="center", fontsize=8, weight="bold")
        ax.text(x + 1.1, 1.45, body, ha="center", va="center", fontsize=8.5 if i < 3 else 7.5, linespacing=1.6)
        if i:
            arrow(ax, (x - 0.27, 1.65), (x, 1.65))
    ax.text(5, 0.25, "no reward model and no sampling: the policy's own log-ratio is the reward, up to beta",
            ha="center", fontsize=8.5, style="italic")
    return fig


def to_trl():
    fig, ax = canvas(10, 3.6)
    title(ax, 10, 3.6, "One preset, three engines: the same switches under other names")
    box(ax, 0.2, 1.35, 2.1, 1.0, "minirl\nmake_config(\"grpo\")\nRLConfig switches", TRAINED, size=8.5)
    box(ax, 3.2, 2.2, 2.5, 0.85, "interop.to_trl\n-> trl.GRPOConfig", RULE, size=8.5)
    box(ax, 3.2, 0.55, 2.5, 0.85, "interop.verl_overrides\n-> verl main_ppo key=value", CRITIC, size=8.5)
    arrow(ax, (2.3, 2.0), (3.2, 2.6))
    arrow(ax, (2.3, 1.7), (3.2, 0.95))
    rows = ["adv_scale -> scale_rewards / norm_adv_by_std_in_grpo",
            "eps_low, eps_high -> epsilon, epsilon_high / clip_ratio_low, _high",
            "agg -> loss_type / loss_agg_mode",
            "beta, k3 in the loss -> beta / kl_loss_coef, low_var_kl"]
    ax.text(6.0, 3.15, "minirl switch -> TRL name / verl key", fontsize=8, va="center", weight="bold")
    for i, row in enumerate(rows):
        ax.text(6.0, 2.75 - i * 0.42, row, fontsize=7.5, va="center")
    ax.text(6.0, 0.95, "a switch the engine lacks (critic in TRL,\nKL in the reward, routing replay):\n"
            "NotImplementedError naming it", fontsize=7.5, va="center", style="italic")
    return fig


def sampler_mismatch():
    fig, ax = canvas(10, 3.8)
    title(ax, 10, 3.8, "The sampler is not the trainer: pi_old / mu is not 1 before any update")
    box(ax, 0.2, 2.1, 2.3, 0.9, "sampler mu\ninference engine: bf16,\nother kernels", FROZEN, size=8)
    box(ax, 3.3, 2.1, 2.3, 0.9, "tokens y\nand log mu(y)", DATA, size=8)
    box(ax, 6.4, 2.1, 2.3, 0.9, "trainer pi_old\nrecomputes log pi_old(y)\non the same tokens", TRAINED, size=8)
    arrow(ax, (2.5, 2.55), (3.3, 2.55), "samples")
    arrow(ax, (5.6, 2.55), (6.4, 2.55))
    box(ax, 0.2, 0.3, 4.4, 1.2, "dense or MoE: re-weight the samples\nTIS: min(pi_old / mu, C)\n"
        "MIS: pi_old / mu inside [C_min, C_max], else 0", RULE, size=8)
    box(ax, 5.2, 0.3, 4.6, 1.2, "MoE only: whose experts does the trainer use?\n"
        "R2: its own pi_old routes (notebook 07)\nR3: the sampler's routes, recorded at sampling", CRITIC, size=8)
    arrow(ax, (7.55, 2.1), (2.4, 1.5), "ratio pi_old / mu", offset=(0, -0.05), rad=0.1)
    arrow(ax, (7.55, 2.1), (7.5, 1.5))
    return fig


def reward_models():
    fig, ax = canvas(10, 4.0)
    title(ax, 10, 4.0, "A learned reward stands in for the true one; optimising it hard finds where they disagree")
    pol = box(ax, 0.2, 2.3, 1.6, 0.8, "policy\n(warm start)", TRAINED)
    box(ax, 2.4, 2.3, 2.2, 0.8, "8 samples a prompt;\ngold checker pairs\na right one with a wrong one", DATA, size=8)
    box(ax, 5.2, 2.3, 2.1, 0.8, "reward model\nscore r(x, y)\nBradley-Terry loss", CRITIC, size=8)
    box(ax, 7.9, 2.3, 1.9, 0.8, "proxy reward\nfor RL or\nbest-of-n", RULE, size=8)
    arrow(ax, (1.8, 2.7), (2.4, 2.7))
    arrow(ax, (4.6, 2.7), (5.2, 2.7), "pairs")
    arrow(ax, (7.3, 2.7), (7.9, 2.7))
    arrow(ax, (8.85, 2.3), (pol[0], 2.3), "optimise the policy against the proxy", offset=(0, -0.35), rad=-0.25)
    box(ax, 0.2, 0.25, 4.2, 0.95, "gold reward: the task's exact checker\n(never seen by the policy; "
        "measures every point)", NOTE, size=8)
    v = [i / 60 for i in range(61)]
    ax.plot([5.6 + 4.2 * t for t in v], [0.35 + 0.95 * t for t in v], color="#3c78d8", lw=1.5)
    ax.plot([5.6 + 4.2 * t for t in v], [0.35 + 2.2 * t * (1 - t) for t in v], color="#cc4125", lw=1.5)
    ax.text(9.8, 1.33, "proxy", color="#3c78d8", fontsize=8, ha="right", va="bottom")
    ax.text(9.8, 0.45, "gold", color="#cc4125", fontsize=8, ha="right")
    ax.text(7.7, 0.05, "distance from the start, d = sqrt(KL)  (schematic)", fontsize=8, ha="center")
    return fig


DIAGRAMS = {"00_task_and_models": task_and_models, "01_policy_gradient": policy_gradient,
            "02_ppo": ppo_four_models, "03_grpo": grpo_group, "04_kl_estimators": kl_placements,
            "05_dapo": dapo_changes, "07_gspo_moe": gspo_moe, "08_preference": dpo_derivation,
            "10_to_trl": to_trl, "11_sampler_mismatch": sampler_mismatch,
            "15_reward_models": reward_models}


def main():
    for name, draw in DIAGRAMS.items():
        fig = draw()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        # boxes, arrows and text need few colours: a 256-colour palette, undithered, is a third of the bytes (every
        # lesson's figure travels with the tree a GPU check carries); PIL writes no version or time: the same bytes
        Image.open(buffer).convert("RGB").quantize(256, dither=Image.Dither.NONE).save(OUT / f"{name}.png",
                                                                                      optimize=True)
        plt.close(fig)
        print(f"notebooks/figures/{name}.png")


if __name__ == "__main__":
    main()

"""Draw notebooks/figures/06_entropy.png, the opening diagram of notebooks/06_entropy.ipynb.

Left: a softmax policy over three answers before and after one policy-gradient step, when the likely answer is the
rewarded one (entropy falls) and when a rare one is (entropy rises), with the entropies computed exactly by
minirl.entropy_toy. Right: the chain the lesson follows, from the covariance to what pass@k loses.
Run: python notebooks/scripts/draw_06_entropy.py (deterministic; no randomness).
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from minirl import entropy_toy  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "figures" / "06_entropy.png"
Z = torch.tensor([math.log(2), 0.0, 0.0], dtype=torch.float64)  # pi = 1/2, 1/4, 1/4
STEP = 0.6  # a natural step large enough to see in the bars, small enough that the rare case still rises


def main() -> None:
    fig = plt.figure(figsize=(12, 4.2))
    cases = [("the likely answer is right", torch.tensor([1.0, 0, 0], dtype=torch.float64)),
             ("a rare answer is right", torch.tensor([0.0, 1, 0], dtype=torch.float64))]
    for k, (title, rewards) in enumerate(cases):
        ax = fig.add_axes([0.06 + 0.23 * k, 0.15, 0.19, 0.68])
        after = Z + entropy_toy.logit_step(Z, rewards, step=STEP)
        for shift, z, label, color in ((-0.2, Z, "before", "#9e9e9e"), (0.2, after, "after one step", "#1f77b4")):
            ax.bar(torch.arange(3) + shift, z.softmax(-1), width=0.4, color=color, label=label)
        h0, h1 = float(entropy_toy.softmax_entropy(Z)), float(entropy_toy.softmax_entropy(after))
        ax.set_xticks(range(3), ["a (likely)", "b (rare)", "c (rare)"])
        ax.set_ylim(0, 1)
        ax.set_title(f"{title}\nentropy {h0:.2f} -> {h1:.2f} nats", fontsize=10)
        ax.set_ylabel("probability" if k == 0 else "")
        if k == 0:
            ax.legend(fontsize=8, loc="upper right")
    ax = fig.add_axes([0.52, 0.05, 0.46, 0.9])
    ax.axis("off")
    boxes = ["policy-gradient step raises the logits of answers with A > 0",
             "dH = -step x Cov(log pi, A): likely AND good lowers the entropy",
             "on an LM the covariance is mostly positive: entropy falls",
             "fewer distinct answers: pass@1 rises, pass@k at large k may fall",
             "controls: bonus, target, clip-higher, Clip-Cov, KL-Cov, top-entropy tokens"]
    for i, text in enumerate(boxes):
        y = 0.9 - i * 0.2
        ax.text(0.5, y, text, ha="center", va="center", fontsize=9.5, wrap=True,
                bbox=dict(boxstyle="round,pad=0.5", fc="#eef4fb" if i < 4 else "#fdf1e6", ec="#555"))
        if i < len(boxes) - 1:
            ax.annotate("", xy=(0.5, y - 0.13), xytext=(0.5, y - 0.07), arrowprops=dict(arrowstyle="->"))
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

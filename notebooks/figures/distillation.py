"""Draw notebooks/figures/09_distillation.png, the opening diagram of notebooks/09_distillation.ipynb:
``python notebooks/figures/distillation.py`` (matplotlib only; the same picture on every machine).

Three ways to learn from a stronger model or a task, one row each: who samples the completion, and how many numbers
of feedback each completion brings back."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

OUT = Path(__file__).with_name("09_distillation.png")
TOKENS = list("4+1=5;5+3=9#9")  # a completion of the prompt "4+1+3=", with a slip at 5+3
ROWS = [  # label, who samples, colour of the sampled tokens, what comes back per token (None: one number at the end)
    ("RL (GRPO)", "student samples", "tab:blue", None, "1 number per completion:\nright or wrong"),
    ("on-policy distillation", "student samples", "tab:blue",
     [0.1, 0.0, 0.0, 0.1, 0.2, 0.0, 0.1, 0.0, 0.0, 0.1, -2.3, 0.0, 0.3],
     "1 number per token:\nlog q - log p, the teacher's grade"),
    ("SFT on teacher samples", "teacher samples", "tab:orange", None,
     "imitate every token, on states\nthe student may never reach"),
]


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for row, (label, who, colour, grades, note) in enumerate(ROWS):
        y = 2 - row
        ax.text(-0.3, y + 0.05, label, ha="right", va="center", fontsize=11, weight="bold")
        ax.text(-0.3, y - 0.25, who, ha="right", va="center", fontsize=9, color=colour)
        for i, token in enumerate(TOKENS if row < 2 else list("4+1=5;5+3=8#8")):  # the teacher's own, right
            ax.add_patch(FancyBboxPatch((i * 0.55, y - 0.18), 0.45, 0.36, boxstyle="round,pad=0.02",
                                        fc="white", ec=colour, lw=1.5))
            ax.text(i * 0.55 + 0.225, y, token, ha="center", va="center", fontsize=11, family="monospace")
            if grades is not None and row == 1:
                g = grades[i]
                ax.text(i * 0.55 + 0.225, y + 0.3, f"{g:+.1f}", ha="center", fontsize=8,
                        color="tab:green" if g >= 0 else "tab:red")
        if row == 0:
            ax.text(len(TOKENS) * 0.55 + 0.05, y, "-> 0", va="center", fontsize=11, color="tab:red")
        ax.text(len(TOKENS) * 0.55 + 0.6, y, note, va="center", fontsize=9.5)
    ax.text(10 * 0.55 + 0.225, 1.48, "5+3=9? the teacher disagrees", ha="center", fontsize=8, color="tab:red")
    ax.text(0, 2.45, 'prompt "4+1+3="', fontsize=9, color="gray")
    ax.set_xlim(-3.2, 11.5)
    ax.set_ylim(-0.6, 2.6)
    ax.axis("off")
    ax.set_title("Who samples, and how much each completion tells the student", fontsize=12)
    fig.savefig(OUT, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()

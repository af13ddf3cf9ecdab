"""Draw notebooks/figures/14_multi_turn.png, the opening diagram of notebooks/14_multi_turn.ipynb:
``python notebooks/figures/multi_turn.py`` (matplotlib only; the same picture on every machine).

One episode of the retry environment, token by token (the toy's tokenizer: one character, one token), coloured by
who wrote it, with the loss mask and the turn of each token under it."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).with_name("14_multi_turn.png")
COLORS = {"prompt": "#dddddd", "model": "#9ecae1", "environment": "#fdae6b"}
# (tokens, author, turn): the prompt, turn 1 (wrong), the environment's retry with a hint, turn 2 (right)
EPISODE = [(["<bos>", *"7+5+9="], "prompt", "-"),
           ([*"7+5=13;13+9=22#22", "<eos>"], "model", "1"),
           (["<bos>", *"7+5+9=7+5=12;"], "environment", "1"),
           ([*"12+9=21#21", "<eos>"], "model", "2")]


def main() -> None:
    tokens = [(t, who, turn) for toks, who, turn in EPISODE for t in toks]
    width = [0.9 if len(t) == 1 else 1.9 for t, _, _ in tokens]
    fig, ax = plt.subplots(figsize=(16, 2.9))
    x = 0.0
    for (t, who, turn), w in zip(tokens, width, strict=True):
        ax.add_patch(plt.Rectangle((x, 2), w, 0.8, facecolor=COLORS[who], edgecolor="white", lw=0.6))
        ax.text(x + w / 2, 2.4, t, ha="center", va="center", fontsize=7.5, family="monospace")
        in_loss = "1" if who == "model" else "0"
        ax.text(x + w / 2, 1.45, in_loss, ha="center", va="center", fontsize=7.5,
                color="black" if in_loss == "1" else "#aaaaaa")
        ax.text(x + w / 2, 0.85, turn, ha="center", va="center", fontsize=7.5, color="#555555")
        x += w
    ax.text(-0.4, 1.45, "loss mask", ha="right", va="center", fontsize=8.5)
    ax.text(-0.4, 0.85, "turn", ha="right", va="center", fontsize=8.5)
    x = 0.0
    for toks, who, turn in EPISODE:
        w = sum(0.9 if len(t) == 1 else 1.9 for t in toks)
        text = {"prompt": "prompt (no loss)", "model": f"model, turn {turn}: in the loss",
                "environment": "environment: read, never trained on"}[who]
        ax.annotate("", xy=(x + 0.05, 3.05), xytext=(x + w - 0.05, 3.05),
                    arrowprops=dict(arrowstyle="<->", color="#555555", lw=0.8))
        ax.text(x + w / 2, 3.3, text, ha="center", va="bottom", fontsize=8.5)
        x += w
    ax.text(x / 2, 0.15, "reward: 0 for turn 1, 0.5 for turn 2 (decay 0.5 per retry), on the last model token of "
            "each turn; the episode's advantage on every model token", ha="center", fontsize=8.5)
    ax.set_xlim(-5.5, x + 0.5)
    ax.set_ylim(0, 3.9)
    ax.axis("off")
    ax.set_title("one episode of the retry environment: who wrote each token, and which tokens carry loss", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print("wrote", OUT)


if __name__ == "__main__":
    main()

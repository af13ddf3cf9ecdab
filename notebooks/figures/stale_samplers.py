"""Draw notebooks/figures/12_stale_samplers.png, the opening diagram of notebooks/12_stale_samplers.ipynb:
``python notebooks/figures/stale_samplers.py`` (matplotlib only; the same picture on every machine)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).with_name("12_stale_samplers.png")


def main() -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.35, 1]})
    # left: a sampler that reloads the weights every k = 4 trainer updates
    for t in range(9):
        left.plot(t, 1, "o", color="tab:blue", ms=9)
        left.text(t, 1.18, rf"$\theta_{t}$", ha="center", fontsize=10)
    for t in (0, 4, 8):
        left.annotate("", xy=(t, 0.12), xytext=(t, 0.88), arrowprops=dict(arrowstyle="->", color="tab:green"))
        left.plot(t, 0, "s", color="tab:green", ms=10)
        left.text(t + 0.08, 0.45, "sync", color="tab:green", fontsize=9)
    for t in (1, 2, 3):
        arrow = dict(arrowstyle="->", color="tab:orange", alpha=0.8, connectionstyle="arc3,rad=-0.2")
        left.annotate("", xy=(t, 0.9), xytext=(0.15, 0.05), arrowprops=arrow)
    left.text(1.3, -0.42, r"rollouts of $\mu = \pi_{\theta_0}$ train $\theta_1, \theta_2, \theta_3$:"
              "\n" r"the sampler is 0-3 updates behind", fontsize=9, color="tab:orange")
    left.text(-0.3, 1.45, "trainer", color="tab:blue", fontsize=10)
    left.text(-0.3, -0.2, "sampler", color="tab:green", fontsize=10)
    left.set_xlim(-0.6, 8.6)
    left.set_ylim(-0.7, 1.7)
    left.axis("off")
    left.set_title("stale: a sampler k updates behind (asynchronous RL)", fontsize=10)
    # right: a top-p sampler keeps the smallest top set of mass >= p and renormalises it
    probs = [0.38, 0.24, 0.16, 0.09, 0.06, 0.04, 0.02, 0.01]
    kept = [True, True, True, True, False, False, False, False]  # top-p 0.8: mass S = 0.87
    S = sum(p for p, k in zip(probs, kept, strict=True) if k)
    xs = range(len(probs))
    right.bar([x - 0.2 for x in xs], probs, width=0.4, color="tab:blue", label=r"trainer $\pi$")
    right.bar([x + 0.2 for x in xs], [p / S if k else 0 for p, k in zip(probs, kept, strict=True)], width=0.4,
              color="tab:orange", label=r"sampler $\mu = \pi / S$ on the kept set")
    right.axvspan(3.5, 7.6, color="grey", alpha=0.15)
    right.text(4.0, 0.16, "dropped:\nnever sampled", fontsize=9)
    right.text(4.0, 0.30, rf"kept mass S = {S:.2f}:" "\n" r"$\pi / \mu$ = S on every" "\n" "kept token", fontsize=9)
    right.set_xticks(list(xs))
    right.set_xlabel("token (sorted by probability)")
    right.set_ylabel("probability")
    right.set_ylim(0, 0.58)
    right.legend(fontsize=8, loc="upper right", bbox_to_anchor=(1.0, 0.9))
    right.set_title("truncated: a top-p sampler (p = 0.8)", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)


if __name__ == "__main__":
    main()

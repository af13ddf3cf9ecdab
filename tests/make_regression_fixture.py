"""Write tests/data/loss_regression.json: values and gradients of the losses on seeded random inputs.

Run once BEFORE a refactor of losses / kl / advantages (``python tests/make_regression_fixture.py``);
tests/test_loss_regression.py then checks that the refactored code gives the same numbers to 1e-7.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minirl import advantages, kl, losses

OUT = Path(__file__).parent / "data" / "loss_regression.json"


def inputs(seed: int):
    """Seeded random inputs: B = 6 sequences of T = 7 tokens, ragged masks (one row fully masked)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logprobs = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    ref = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    lengths = torch.tensor([7, 3, 5, 1, 0, 6])
    mask = (torch.arange(T) < lengths[:, None]).double()
    adv_seq = torch.randn(B, generator=g, dtype=torch.float64)
    adv_tok = torch.randn(B, T, generator=g, dtype=torch.float64)
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    values = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    return dict(logprobs=logprobs, old=old, ref=ref, mask=mask, adv_seq=adv_seq, adv_tok=adv_tok, rewards=rewards,
                values=values)


def cases(x):
    """(name, function of logprobs returning a scalar) for every loss configuration."""
    out = []
    for level in losses.LEVELS:
        for agg in losses.AGGREGATIONS:
            if level == "sequence" and agg != "seq-mean-token-mean":
                continue
            for adv_name in ("adv_seq", "adv_tok"):
                if level == "sequence" and adv_name == "adv_tok":
                    continue
                for eps_low, eps_high, dual in ((0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 3.0)):
                    name = f"policy_loss/{level}/{agg}/{adv_name}/{eps_low}-{eps_high}-{dual}"
                    out.append((name, lambda lp, level=level, agg=agg, a=adv_name, el=eps_low, eh=eps_high, d=dual:
                                losses.policy_loss(lp, x["old"], x[a], x["mask"], eps_low=el, eps_high=eh,
                                                   level=level, agg=agg, dual_clip=d,
                                                   max_tokens=8)[0]))
    for est in kl.ESTIMATORS:
        out.append((f"kl_in_loss/{est}", lambda lp, e=est: (kl.kl_in_loss(lp, x["ref"],
                                                                          estimator=e) * x["mask"]).sum()))
    out.append(("value_loss", lambda lp: losses.value_loss(lp, x["old"], x["ref"], x["mask"], clip=0.2)[0]))
    return out


def compute(seed: int) -> dict:
    x = inputs(seed)
    res = {}
    for name, fn in cases(x):
        lp = x["logprobs"].clone().requires_grad_(True)
        value = fn(lp)
        value.backward()
        res[name] = {"value": float(value.detach()), "grad": lp.grad.flatten().tolist()}
    res["group_advantages/group"] = advantages.group_advantages(x["rewards"], 3, scale="group").tolist()
    res["group_advantages/none"] = advantages.group_advantages(x["rewards"], 2, scale="none").tolist()
    a, r = advantages.gae(x["adv_tok"], x["values"], x["mask"], gamma=1.0, lam=0.95)
    res["gae"] = [a.flatten().tolist(), r.flatten().tolist()]
    return res


if __name__ == "__main__":
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({str(s): compute(s) for s in (0, 1, 2)}))
    print(f"wrote {OUT}")

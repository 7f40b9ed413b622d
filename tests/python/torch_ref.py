# SPDX-License-Identifier: MIT
"""What torch_rank.py and torch_share.py check collectives against: every
rank's input, which any rank can rebuild from (rank, dtype, op), and the
expected result computed from all of them. Small integers, so that every
reduction is exact in every dtype and order."""
import torch
import torch.distributed as dist

R = dist.ReduceOp
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MIN": R.MIN, "MAX": R.MAX, "AVG": R.AVG}


def name(dt):
    return str(dt).replace("torch.", "")


def data(r, dt, op, n):
    """Rank r's input of n elements."""
    g = torch.Generator().manual_seed(1000 * r + 10 * DTYPES.index(dt) + list(OPS).index(op))
    lo, hi = ((-1 if dt != torch.uint8 else 1), 3) if op == "PRODUCT" else \
        ((-5 if dt != torch.uint8 else 0), 10)
    return torch.randint(lo, hi, (n,), generator=g).to(dt)


def reference(dt, op, n, world):
    """The result of reducing the inputs of ranks 0..world-1 with op."""
    wide = torch.float64 if dt.is_floating_point else torch.int64
    x = torch.stack([data(r, dt, op, n).to(wide) for r in range(world)])
    if op == "AVG":
        s = x.sum(0)
        return (s / world if dt.is_floating_point else torch.div(s, world, rounding_mode="trunc")).to(dt)
    return {"SUM": x.sum(0), "PRODUCT": x.prod(0), "MIN": x.min(0).values,
            "MAX": x.max(0).values}[op].to(dt)


def same(a, b, dt, op):
    if op == "AVG" and dt.is_floating_point:  # kcolld rounds the sum, then the quotient
        return torch.allclose(a.double(), b.double(), rtol=2.0 ** -7)
    return torch.equal(a, b)

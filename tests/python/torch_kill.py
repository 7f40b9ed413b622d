# SPDX-License-Identifier: MIT
"""One rank of t_python.sh's "kcolld killed mid-training" check. Run by
launch.py with KCOLL_TEST_KILL_PID set: it trains a small model (DDP, or
all_reduce of each gradient by hand: KCOLL_TEST_KILL_MODE=ddp|manual) step
after step, writing its step count to KCOLL_TEST_PROGRESS, until launch.py
kills the kcolld behind the group. The next collective must raise
RuntimeError (no hang, no crash); the rank writes when it raised."""
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import Report  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kcoll.torch  # noqa: E402,F401

rep = Report()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mode = os.environ.get("KCOLL_TEST_KILL_MODE", "manual")
progress = os.environ["KCOLL_TEST_PROGRESS"]
dist.init_process_group("kcoll", init_method="env://", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=30))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
net = torch.nn.parallel.DistributedDataParallel(model) if mode == "ddp" else model
opt = torch.optim.SGD(net.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
err, step, end = None, 0, time.monotonic() + 120
try:
    while time.monotonic() < end:
        x, y = torch.randn(32, 64, generator=g), torch.randn(32, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        if mode == "manual":
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        step += 1
        with open(progress, "w") as f:
            f.write(f"{step}\n")
except RuntimeError as e:
    err = e
with open(progress, "a") as f:
    f.write(f"raised {time.time()}\n")
rep.check(err is not None, f"kcolld killed mid-training ({mode}): the next step raises RuntimeError",
          f"after {step} steps: {err!r}" if err else f"no error in {step} steps")
rep.check(err is not None and "kcolld" in str(err),
          f"kcolld killed mid-training ({mode}): the error names kcolld", repr(err))
# The group is broken: exit without destroy_process_group's collective.
sys.exit(0)

# SPDX-License-Identifier: MIT
"""One rank of t_python.sh's "kcolld killed mid-training" check. Run by
launch.py with KCOLL_TEST_KILL_PID set: it trains a small model (DDP, or
all_reduce of each gradient by hand: KCOLL_TEST_KILL_MODE=ddp|manual) step
after step, writing its step count to KCOLL_TEST_PROGRESS, until launch.py
kills the kcolld behind the group. The next collective must raise
RuntimeError (no hang, no crash); the rank writes when it raised.

On the netns cluster (t_python_cluster.sh) launch.py kills one host's
kcolld, KCOLL_TEST_KILL_HOST (KCOLL_CLUSTER_HOST is each rank's host): the
ranks there and on the other hosts must all raise (the former's error
names kcolld, the others' blames a rank of the killed host), and then every rank enters
dist.new_group of the ranks on the surviving hosts, whose all_reduce must
give their sum (the surviving kcollds, and the ranks' connections to them,
still work)."""
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
kill_host = os.environ.get("KCOLL_TEST_KILL_HOST")
my_host = os.environ.get("KCOLL_CLUSTER_HOST")
hosts = int(os.environ.get("KCOLL_CLUSTER_HOSTS", "1"))
on_killed = kill_host is None or my_host == kill_host
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
if on_killed:
    rep.check(err is not None and "kcolld" in str(err),
              f"kcolld killed mid-training ({mode}): the error names kcolld", repr(err))
else:
    rep.skip(f"kcolld killed mid-training ({mode}): the error names kcolld",
             f"the kcolld of host {kill_host} was killed, not this rank's (host {my_host})")
if kill_host is not None:
    dead = [r for r in range(world) if str(r % hosts) == kill_host]
    what = f"kcolld killed mid-training ({mode}): on the other hosts the error blames a rank of the killed one"
    if on_killed:
        rep.skip(what, f"rank {rank} is on the killed host")
    else:
        rep.check(err is not None and any(f"rank {r} blamed" in str(err) for r in dead), what,
                  f"want 'rank {dead} blamed': {err!r}")
    # Every rank enters new_group (torch's rule); the ranks on the killed
    # host are no members.
    survivors = [r for r in range(world) if r not in dead]
    what = f"kcolld killed ({mode}): a new group of the ranks on the surviving hosts {survivors}"
    try:
        sub = dist.new_group(ranks=survivors, backend="kcoll", timeout=datetime.timedelta(seconds=30))
        if rank in survivors:
            t = torch.full((1000,), float(rank + 1))
            dist.all_reduce(t, group=sub)
            want = float(sum(r + 1 for r in survivors))
            rep.check(bool((t == want).all()), what + ": all_reduce gives their sum",
                      f"got {t[0].item()}, want {want}")
        else:
            rep.skip(what + ": all_reduce gives their sum", f"rank {rank} is on the killed host")
    except RuntimeError as e:
        rep.check(False, what + ": all_reduce gives their sum", repr(e))
# The group is broken: exit without destroy_process_group's collective.
sys.exit(0)

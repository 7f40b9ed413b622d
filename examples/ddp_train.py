#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train a small model with DistributedDataParallel over kcoll (or gloo).

    build/bin/kcolld -f -s /tmp/kcolld.sock &
    export KCOLL_SOCKET=/tmp/kcolld.sock PYTHONPATH=user/python
    /usr/bin/python3 examples/ddp_train.py --backend kcoll --nprocs 2
    /usr/bin/python3 examples/ddp_train.py --backend gloo --nprocs 2   # same numbers

Under a launcher (RANK and WORLD_SIZE set, with MASTER_ADDR/MASTER_PORT:
torchrun, or a script starting one process per rank) it is that one rank;
otherwise it starts --nprocs ranks itself (multiprocessing, env:// on a
free local port). Rank 0 prints the loss per epoch and a checksum of the
final parameters, which is the same for both backends.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["kcoll", "gloo"], default="kcoll")
    p.add_argument("--nprocs", type=int, default=2, help="ranks to start when not under a launcher")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--samples", type=int, default=4096)
    return p.parse_args()


def train(args):
    if args.backend == "kcoll":
        import kcoll.torch  # noqa: F401  registers the "kcoll" backend
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, init_method="env://", rank=rank, world_size=world)

    # The same synthetic regression task on every rank; each trains on its
    # share (DistributedSampler) and DDP averages the gradients.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(args.samples, 1, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    t0 = time.monotonic()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(xb), yb)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(total)  # the epoch's mean loss over all ranks
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0] / total[1]:.5f}", flush=True)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(f"{args.backend}, {world} ranks: {time.monotonic() - t0:.2f} s, "
              f"parameter checksum {checksum:.6f}")
    dist.destroy_process_group()


def spawned(rank, args, world, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(args)


def main():
    args = parse()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        train(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(spawned, args=(args, args.nprocs, port), nprocs=args.nprocs)


if __name__ == "__main__":
    main()

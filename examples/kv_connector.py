#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Disaggregated prefill/decode in the shape of a serving engine's KV
connector, with kcoll.kv (docs/python.md "KV-cache transfers").

Each worker holds a paged KV cache pool in kcolld-mapped memory, or with
--device cuda in GPU memory as engines keep it (a torch CUDA tensor),
    pool[layer][block][K|V][token][head][dim]     (bf16 as 16-bit integers)
registered as one segment. The descriptors travel through DIR (a real
engine sends them over its own RPC); everything else goes through kcolld:

  decode  -> prefill   notification "alloc:<req>:<b0>,<b1>,..."  the decode
                       blocks assigned to a request (its scheduler's job)
  prefill -> decode    one write batch per layer, every block of the request
                       (K and V of a block are adjacent: one entry, merged
                       further where blocks are consecutive on both sides);
                       the last layer's batch carries "done:<req>"
  decode               waits for "done:<req>", checks every page of every
                       layer, frees the blocks

"done" arrives after every layer's bytes: one import's notifications come
in order and after the batches before them (docs/kv.md "Notifications").

  kv_connector.py decode DIR [options]    one side (two hosts: one each)
  kv_connector.py prefill DIR [options]
  kv_connector.py both DIR [options]      both on this host (decode forked)
options: --layers 4 --blocks 128 --block-tokens 16 --heads 4 --head-dim 64
         --requests 16 --max-tokens 512 --inflight 4 --seed 1 --device cpu|cuda
Needs kcolld ($KCOLL_SOCKET) and PYTHONPATH=user/python; --device cuda needs
torch with a GPU, and a GPU in kcolld (docs/kv.md "Device memory"). Prints "ok - ..." /
"not ok - ..." lines; exit 0 when every page arrived intact.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import kcoll.kv as kv


def geometry(a):
    page = a.block_tokens * a.heads * a.head_dim          # elements of K (or V) of one block
    return (a.layers, a.blocks, 2, a.block_tokens, a.heads, a.head_dim), page


def request_tokens(a):
    rng = np.random.default_rng(a.seed)
    return rng.integers(1, a.max_tokens + 1, a.requests)


def pages(a, req, layer, nblk):
    """What prefill computes for request req: (nblk, 2, tokens, heads, dim)."""
    _, page = geometry(a)
    base = np.arange(2 * page, dtype=np.uint32).reshape(1, 2, a.block_tokens, a.heads, a.head_dim)
    i = np.arange(nblk, dtype=np.uint32).reshape(-1, 1, 1, 1, 1)
    return ((base * 3 + i * 7919 + req * 131 + layer * 17) & 0xFFFF).astype(np.uint16)


class Pool:
    """The paged pool and its segment: numpy in kcolld-mapped memory, or a
    torch CUDA tensor (16-bit pages either way; numpy pages in and out)."""

    def __init__(self, agent, a, shape):
        self.cuda = a.device == "cuda"
        if not self.cuda:
            self.t, self.seg = agent.alloc(shape, np.uint16)
            return
        import torch
        self.torch = torch
        self.t = torch.zeros(shape, dtype=torch.int16, device="cuda")
        self.seg = agent.register(self.t)

    def put(self, layer, blk, pages):
        if not self.cuda:
            self.t[layer, blk] = pages
            return
        self.t[layer, blk] = self.torch.from_numpy(pages.view(np.int16)).to("cuda")
        # kcolld copies the blocks with the GPU once the batch is queued:
        # the work that wrote them must be done.
        self.torch.cuda.current_stream().synchronize()

    def get(self, layer, blk):
        v = self.t[layer, blk]
        return v.cpu().numpy().view(np.uint16) if self.cuda else v

    def clear(self, blk):
        self.t[:, blk] = 0
        if self.cuda:   # done before the blocks are handed out again
            self.torch.cuda.current_stream().synchronize()


def put_file(d, name, data):
    with open(os.path.join(d, name + ".tmp"), "wb") as f:
        f.write(data)
    os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))


def get_file(d, name, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(os.path.join(d, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            time.sleep(0.05)
    raise TimeoutError(f"{name} did not appear in {d}")


def result(ok, what):
    print(f"{'ok' if ok else 'not ok'} - {what}", flush=True)
    return ok


def decode(a):
    shape, page = geometry(a)
    agent = kv.Agent("decode")
    pool = Pool(agent, a, shape)
    pool.clear(slice(None))
    seg = pool.seg
    put_file(a.dir, "decode.desc", seg.desc)
    prefill = agent.import_desc(get_file(a.dir, "prefill.desc"))
    tokens = request_tokens(a)
    free = list(range(a.blocks))
    waiting = {}            # req -> (blocks, t0)
    bad, lat, nbytes, nxt = 0, [], 0, 0
    while nxt < a.requests or waiting:
        while nxt < a.requests and len(waiting) < a.inflight:
            n = -(-int(tokens[nxt]) // a.block_tokens)
            if n > len(free):
                break
            blk, free = free[:n], free[n:]
            waiting[nxt] = (blk, time.monotonic())
            agent.send_notif(seg, prefill, f"alloc:{nxt}:{','.join(map(str, blk))}").wait()
            nxt += 1
        done = None
        while done is None:
            for r in list(waiting):
                if agent.wait_notif(f"done:{r}", timeout=0):
                    done = r
                    break
            else:
                seg.wait_notifs(0.05)
        blk, t0 = waiting.pop(done)
        lat.append(time.monotonic() - t0)
        for layer in range(a.layers):
            bad += int((pool.get(layer, blk) != pages(a, done, layer, len(blk))).sum())
        nbytes += len(blk) * a.layers * 2 * page * 2
        pool.clear(blk)       # freed: a later request's pages must arrive anew
        free += blk
    lat_ms = sorted(x * 1000 for x in lat)
    print(f"# decode ({a.device}): {a.requests} requests, {nbytes / 2**20:.1f} MiB, per request "
          f"median {lat_ms[len(lat_ms) // 2]:.2f} ms, max {lat_ms[-1]:.2f} ms "
          "(alloc sent to done taken)", flush=True)
    ok = result(bad == 0, f"decode: every page of every layer of {a.requests} requests intact "
                f"({bad} elements differ)")
    put_file(a.dir, "decode.done", b"1")
    prefill.close()
    agent.close()
    return ok


def prefill(a):
    shape, page = geometry(a)
    agent = kv.Agent("prefill")
    pool = Pool(agent, a, shape)
    seg = pool.seg
    put_file(a.dir, "prefill.desc", seg.desc)
    dec = agent.import_desc(get_file(a.dir, "decode.desc"))
    blk_bytes = 2 * page * 2                                  # K and V, bf16
    layer_bytes = a.blocks * blk_bytes
    free = list(range(a.blocks))
    inflight = []            # (req, local blocks, [XferRequest per layer])
    served, failed = 0, 0
    while served < a.requests:
        for n in agent.get_notifs().values():
            for m in n:
                kind, req, blist = m.decode().split(":")
                rblk = np.array([int(b) for b in blist.split(",")], np.int64)
                while len(free) < len(rblk):       # wait for our own pages back
                    r, lblk, reqs = inflight.pop(0)
                    failed += sum(q.wait() is not True for q in reqs)
                    free += lblk
                lblk, free = free[:len(rblk)], free[len(rblk):]
                lb = np.array(lblk, np.int64)
                reqs = []
                for layer in range(a.layers):
                    pool.put(layer, lblk, pages(a, int(req), layer, len(lblk)))   # "compute"
                    blocks = (layer * layer_bytes + lb * blk_bytes,
                              layer * layer_bytes + rblk * blk_bytes, blk_bytes)
                    tag = f"done:{req}" if layer == a.layers - 1 else None
                    reqs.append(agent.write(seg, dec, blocks, msg=tag))
                inflight.append((int(req), lblk, reqs))
                served += 1
        if served < a.requests:
            seg.wait_notifs(0.05)
    for r, lblk, reqs in inflight:
        failed += sum(q.wait() is not True for q in reqs)
    ok = result(failed == 0, f"prefill: {a.requests} requests x {a.layers} layer batches written")
    get_file(a.dir, "decode.done", 120)
    dec.close()
    agent.close()
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("role", choices=["decode", "prefill", "both"])
    p.add_argument("dir")
    for name, v in (("layers", 4), ("blocks", 128), ("block-tokens", 16), ("heads", 4),
                    ("head-dim", 64), ("requests", 16), ("max-tokens", 512), ("inflight", 4),
                    ("seed", 1)):
        p.add_argument("--" + name, type=int, default=v)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the KV pools live (cuda: torch CUDA tensors)")
    a = p.parse_args()
    if -(-a.max_tokens // a.block_tokens) > a.blocks:
        p.error("--max-tokens needs more blocks than --blocks")
    if a.device == "cuda":
        # Asked in a child process: this one must not touch CUDA before
        # "both" forks.
        r = subprocess.run([sys.executable, "-c", "import torch, sys\n"
                            "print(torch.__version__, end='')\n"
                            "sys.exit(0 if torch.cuda.is_available() else 3)"],
                           capture_output=True, text=True)
        if r.returncode == 3:
            p.error(f"--device cuda: torch {r.stdout} sees no GPU (use --device cpu)")
        if r.returncode:
            p.error(f"--device cuda needs torch with CUDA: {r.stderr.strip().splitlines()[-1:]}")
    os.makedirs(a.dir, exist_ok=True)
    if a.role == "both":
        pid = os.fork()
        if pid == 0:
            os._exit(0 if decode(a) else 1)
        ok = prefill(a)
        _, st = os.waitpid(pid, 0)
        return 0 if ok and st == 0 else 1
    return 0 if (decode(a) if a.role == "decode" else prefill(a)) else 1


if __name__ == "__main__":
    sys.exit(main())

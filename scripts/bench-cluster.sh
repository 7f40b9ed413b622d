#!/usr/bin/env bash
# kcoll across hosts, side by side with its anchors, in one run on the netns
# cluster: raw TCP ring capacity (kcoll-tcpcap), kcoll (kcoll-bench --hosts,
# one kcolld per host), Open MPI and Gloo; f32 sum all-reduce, 1 KiB..256 MiB,
# 4 hosts x 1 rank, ROUNDS rounds with the order rotating.
#   scripts/bench-cluster.sh [BUILD]          (BUILD defaults to build; needs root)
# Writes docs/perf/allreduce-cluster-<date>.json (every raw run, best and
# median per point) and .md (busbw per library, kcoll / best anchor, kcoll /
# ring bound), draws docs/perf/allreduce-cluster.png. It is
# scripts/cluster-anchors.sh --kcoll: the environment knobs are listed there.
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/bench-lib.sh"
bench_opts "$@"
bench_build_dir "$top/${1:-build}" "${1:-build}"
exec "$top/scripts/cluster-anchors.sh" --kcoll "$@"

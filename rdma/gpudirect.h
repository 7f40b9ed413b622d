/* SPDX-License-Identifier: MIT */
/*
 * GPUDirect RDMA registration: GPU memory handed to the NIC through dma-buf
 * (or peer memory), or the reason it must be staged through host memory.
 * docs/gpu.md has the decision; gpu/kcoll_gpu.h the loader it asks.
 */
#ifndef KCOLL_RDMA_GPUDIRECT_H
#define KCOLL_RDMA_GPUDIRECT_H

#include <stddef.h>

#include "kcoll_gpu.h"

struct ibv_mr;

/*
 * Register the device buffer [dptr, dptr + len) with RDMA device dev along
 * the path the probe planned for its GPU (kcoll_gpu_info's path, or a
 * device's): dma-buf asks the loader for a dma-buf fd and registers it with
 * ibv_reg_dmabuf_mr; peermem registers the device pointer with ibv_reg_mr
 * (nvidia-peermem resolves it). Returns 0 with *mr (cached like
 * kcoll_rdma_mr_get's; kcoll_rdma_mr_invalidate drops it), or -EOPNOTSUPP
 * when the buffer must go through pinned host memory: *path then says
 * staging and why the reason, which is also logged (info). *path is set in
 * every case.
 */
int kcoll_rdma_mr_get_dmabuf(int dev, struct kcoll_gpu *g, enum kcoll_gpu_path planned,
			     void *dptr, size_t len, struct ibv_mr **mr,
			     enum kcoll_gpu_path *path, char *why, size_t whylen);

#endif /* KCOLL_RDMA_GPUDIRECT_H */

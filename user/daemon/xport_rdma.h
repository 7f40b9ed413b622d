/* SPDX-License-Identifier: MIT */
/* The daemon's RDMA transport (xport_rdma.c). */
#ifndef KCOLLD_XPORT_RDMA_H
#define KCOLLD_XPORT_RDMA_H

#include <stddef.h>

#include "mh.h"
#include "rdma.h"

/* The path (flow label, traffic class) of QP qp to host. */
struct kcoll_rdma_path kd_rdma_path_for(struct kd_mh *mh, uint32_t host, uint32_t qp);

#endif /* KCOLLD_XPORT_RDMA_H */

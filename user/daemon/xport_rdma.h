/* SPDX-License-Identifier: MIT */
/* The daemon's RDMA transport (xport_rdma.c). */
#ifndef KCOLLD_XPORT_RDMA_H
#define KCOLLD_XPORT_RDMA_H

#include <stdint.h>

#include "rdma.h"

/* The path (flow label, traffic class, local port) of QP qp to host, from
 * the KCOLL_IB_* path knobs; comm names the communicator in warnings. */
struct kcoll_rdma_path kd_rdma_path_for(const char *comm, uint32_t host, uint32_t qp);

#endif /* KCOLLD_XPORT_RDMA_H */

/* SPDX-License-Identifier: MIT */
/* The daemon's RDMA transport (xport_rdma.c) and the choice of transport. */
#ifndef KCOLLD_XPORT_RDMA_H
#define KCOLLD_XPORT_RDMA_H

#include <stddef.h>

#include "net.h"
#include "rdma.h"

extern const struct kd_xport_ops kd_xport_rdma;

/* The transport new communicators use (KCOLL_NET_XPORT; auto: RDMA when a
 * device is present, else TCP, logging why once). */
const struct kd_xport_ops *kd_xport_default(void);

/* The path (flow label, traffic class) of QP qp to host. */
struct kcoll_rdma_path kd_rdma_path_for(struct kd_mh *mh, uint32_t host, uint32_t qp);

#endif /* KCOLLD_XPORT_RDMA_H */

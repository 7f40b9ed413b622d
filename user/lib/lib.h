/* SPDX-License-Identifier: MIT */
/* libkcoll internals shared by its files (not installed, not exported). */
#ifndef KCOLL_LIB_H
#define KCOLL_LIB_H

#include <kcoll/kcoll.h>

/* One control round trip (kcoll.c ctl_call). */
int kcoll_priv_ctl(struct kcoll *k, void *msg, size_t len, int fd, void *reply, size_t cap,
		   int *reply_fd, int timeout_ms);
/* Queue one SQE as a request (kcoll.c submit). */
int kcoll_priv_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req);
/* 1 while the daemon is there. */
int kcoll_priv_alive(struct kcoll *k);

#endif /* KCOLL_LIB_H */

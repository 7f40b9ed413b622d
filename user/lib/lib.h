/* SPDX-License-Identifier: MIT */
/* libkcoll internals shared by its files (not installed, not exported). */
#ifndef KCOLL_LIB_H
#define KCOLL_LIB_H

#include <stdint.h>

#include <kcoll/kcoll.h>

/* One control round trip (kcoll.c ctl_call). */
int kcoll_priv_ctl(struct kcoll *k, void *msg, size_t len, int fd, void *reply, size_t cap,
		   int *reply_fd, int timeout_ms);
/* Queue one SQE as a request (kcoll.c submit). */
int kcoll_priv_submit(struct kcoll *k, struct kcoll_sqe *sqe, struct kcoll_req **req);
/* 1 while the daemon is there. */
int kcoll_priv_alive(struct kcoll *k);

/* Lanes (lane.c): small all-reduces run by the ranks, one rank per host.
 * Hosts are the ranks here (err_host is a rank). */
#define KCOLL_LANES_MAX_HOSTS 8
struct kc_lanes;
/* fds[h] for every h != self (taken, set to -1). */
int kc_lanes_new(uint32_t nhosts, uint32_t self, int *fds, uint32_t max_bytes, int timeout_ms,
		 int64_t spin_ns, struct kc_lanes **out);
void kc_lanes_free(struct kc_lanes *l);
/* Our daemon is gone: shut the lanes down so the other ranks see it. */
void kc_lanes_kill(struct kc_lanes *l, int err);
int kc_lanes_fit(const struct kc_lanes *l, size_t bytes);
/* The sticky error (0: none) and the host it names. */
int kc_lanes_error(const struct kc_lanes *l, uint32_t *err_host);
/* Start an all-reduce (sends go out during progress): 0, or the sticky error. */
int kc_lanes_start(struct kc_lanes *l, const void *send, void *recv, size_t count, int dtype, int op);
/* Move the op on for up to timeout_ms (0: one pass, < 0: until done):
 * 1 done (*res, *err_host), 0 still running. */
int kc_lanes_progress(struct kc_lanes *l, int timeout_ms, int daemon_fd, int *res, uint32_t *err_host);

#endif /* KCOLL_LIB_H */

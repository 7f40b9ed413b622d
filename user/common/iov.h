/* SPDX-License-Identifier: MIT */
/* Walking an iovec array across partial sendmsg/recvmsg calls. */
#ifndef KCOLL_IOV_H
#define KCOLL_IOV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/*
 * Consume done bytes from the front of *iov (*n entries), then skip empty
 * entries (a recvmsg of nothing would read as "closed"). Returns the
 * entries left.
 */
static inline size_t kcoll_iov_advance(struct iovec **iov, size_t *n, size_t done)
{
	struct iovec *v = *iov;

	while (*n && done >= v->iov_len) {
		done -= v->iov_len;
		v++;
		(*n)--;
	}
	if (done) {
		v->iov_base = (uint8_t *)v->iov_base + done;
		v->iov_len -= done;
	}
	while (*n && !v->iov_len) {
		v++;
		(*n)--;
	}
	*iov = v;
	return *n;
}

/*
 * Send (out) or receive n iovecs whole on a stream socket, IOV_MAX at a time
 * (consumes the array): one system call for many blocks rather than one per
 * block. more: send with MSG_MORE while further iovecs follow. 0, -errno of
 * the failed call (-EAGAIN: a socket timeout ran out), or -ECONNRESET when
 * the peer closed.
 */
int kcoll_io_iovs(int fd, struct iovec *iov, size_t n, bool out, bool more);

#endif /* KCOLL_IOV_H */

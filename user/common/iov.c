// SPDX-License-Identifier: MIT
/* Whole iovec arrays over stream sockets (iov.h). */
#include <errno.h>
#include <sys/socket.h>

#include "iov.h"

#define IOV_BATCH 1024	/* IOV_MAX on Linux */

int kcoll_io_iovs(int fd, struct iovec *iov, size_t n, bool out, bool more)
{
	for (;;) {
		struct msghdr mh = { 0 };
		ssize_t k;

		if (!kcoll_iov_advance(&iov, &n, 0))
			return 0;
		mh.msg_iov = iov;
		mh.msg_iovlen = n < IOV_BATCH ? n : IOV_BATCH;
		k = out ? sendmsg(fd, &mh, MSG_NOSIGNAL | (more && n > IOV_BATCH ? MSG_MORE : 0)) :
		    recvmsg(fd, &mh, MSG_WAITALL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -ECONNRESET;
		kcoll_iov_advance(&iov, &n, (size_t)k);
	}
}

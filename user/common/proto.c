// SPDX-License-Identifier: MIT
/* Control-message framing over SOCK_SEQPACKET with optional SCM_RIGHTS. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcoll/proto.h>

int kcoll_msg_send(int sock, const void *msg, size_t len, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

ssize_t kcoll_msg_recv(int sock, void *buf, size_t cap, int *fd)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf),
	};
	const struct kcoll_msg_hdr *h = buf;
	struct cmsghdr *c;
	int got = -1;
	ssize_t n;

	if (fd)
		*fd = -1;
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	/* Collect passed descriptors first so none leaks on the error paths. */
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (got < 0 && fd)
				got = f;
			else
				close(f);
		}
	}
	if (n == 0)
		goto err_close;
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)n < sizeof(*h) ||
	    h->magic != KCOLL_PROTO_MAGIC || h->len != (size_t)n) {
		n = -EBADMSG;
		goto err_close;
	}
	if (fd)
		*fd = got;
	return n;

err_close:
	if (got >= 0)
		close(got);
	return n;
}

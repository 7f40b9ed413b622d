// SPDX-License-Identifier: MIT
/*
 * The KV engine's RDMA connections (kv_rdma.h; docs/kv.md). Built on the
 * verbs layer (rdma/rdma.h): its device table, GID choice and endpoint
 * connect; the PD is this file's own, one per connection, so that an rkey
 * handed to one peer for one segment reaches nothing else.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "config.h"
#include "kv_rdma.h"

#define KV_RDMA_SQ	256
#define KV_RDMA_RQ	16

struct kv_rdma {
	struct kcoll_rdma_ep *ep;	/* one QP, its own CQ and channel */
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *base;
	bool remote;
};

bool kv_rdma_wanted(char *why, size_t whylen, bool *loud)
{
	const char *want = kcoll_knob_str("KCOLL_NET_XPORT");

	*loud = !strcmp(want, "rdma");
	if (!strcmp(want, "tcp")) {
		snprintf(why, whylen, "KCOLL_NET_XPORT=tcp");
		return false;
	}
	if (!*loud && strcmp(want, "auto")) {
		snprintf(why, whylen, "KCOLL_NET_XPORT='%s' is not auto, rdma or tcp", want);
		return false;
	}
	if (kcoll_rdma_init()) {
		snprintf(why, whylen, "%s", kcoll_rdma_why());
		return false;
	}
	return true;
}

static int mr_reg(struct kv_rdma *k, void *base, size_t len)
{
	int acc = IBV_ACCESS_LOCAL_WRITE;

	if (k->remote)
		acc |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	k->mr = ibv_reg_mr(k->pd, base, len, acc);
	if (!k->mr)
		return errno ? -errno : -EIO;
	k->base = base;
	return 0;
}

int kv_rdma_set_mr(struct kv_rdma *k, void *base, size_t len)
{
	if (k->mr)
		ibv_dereg_mr(k->mr);
	k->mr = NULL;
	return mr_reg(k, base, len);
}

int kv_rdma_create(int fd, void *base, size_t len, bool remote, struct kv_rdma **out, char *why,
		   size_t whylen)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	struct kcoll_rdma_port port;
	struct ibv_context *ctx;
	struct kv_rdma *k;
	struct kcoll_rdma_ep *ep;
	int r;

	if (getsockname(fd, (struct sockaddr *)&sa, &sl) || sa.sin_family != AF_INET) {
		snprintf(why, whylen, "the connection to the peer is not IPv4");
		return -EAFNOSUPPORT;
	}
	r = kcoll_rdma_pick_gid(sa.sin_addr.s_addr, &port, why, whylen);
	if (r)
		return r;
	k = calloc(1, sizeof(*k));
	ep = calloc(1, sizeof(*ep));
	if (!k || !ep) {
		free(k);
		free(ep);
		return -ENOMEM;
	}
	k->ep = ep;
	k->remote = remote;
	ctx = kcoll_rdma_ctx(port.dev);
	ep->port = port;
	ep->nqp = 1;
	ep->send_depth = KV_RDMA_SQ;
	ep->recv_depth = KV_RDMA_RQ;
	r = -EIO;
	k->pd = ibv_alloc_pd(ctx);
	if (!k->pd)
		goto err;
	ep->ch = ibv_create_comp_channel(ctx);
	if (!ep->ch)
		goto err;
	fcntl(ep->ch->fd, F_SETFL, fcntl(ep->ch->fd, F_GETFL) | O_NONBLOCK);
	ep->cq = ibv_create_cq(ctx, KV_RDMA_SQ + KV_RDMA_RQ, NULL, ep->ch, 0);
	if (!ep->cq)
		goto err;
	ep->own_cq = true;
	{
		struct ibv_qp_init_attr qa = {
			.send_cq = ep->cq, .recv_cq = ep->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = KV_RDMA_SQ, .max_recv_wr = KV_RDMA_RQ,
				 .max_send_sge = 1, .max_recv_sge = 1 },
		};
		/* The initiator's QP accepts no remote access at all. */
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port.port,
			.qp_access_flags = remote ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0,
		};

		ep->qp[0] = ibv_create_qp(k->pd, &qa);
		if (!ep->qp[0])
			goto err;
		if (ibv_modify_qp(ep->qp[0], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			goto err;
	}
	ep->local.version = KCOLL_RDMA_ADDR_VERSION;
	ep->local.nqp = 1;
	ep->local.gid = port.gid;
	ep->local.qgid[0] = port.gid;	/* the QP's own GID (address version 2) */
	ep->local.mtu = port.mtu;
	ep->local.qpn[0] = ep->qp[0]->qp_num;
	ep->local.psn[0] = (uint32_t)(random() & 0xffffff);
	r = mr_reg(k, base, len);
	if (r)
		goto err;
	*out = k;
	return 0;
err:
	snprintf(why, whylen, "cannot set up an RDMA connection on %s: %s", kcoll_rdma_dev_name(port.dev),
		 strerror(r == -EIO && errno ? errno : -r));
	kv_rdma_destroy(k);
	return r;
}

void kv_rdma_hello_fill(struct kv_rdma *k, struct kv_rdma_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->addr = k->ep->local;
	if (k->remote && k->mr) {
		h->base = (uintptr_t)k->base;
		h->rkey = k->mr->rkey;
	}
}

int kv_rdma_connect(struct kv_rdma *k, const struct kv_rdma_hello *peer, uint32_t nrecv, char *why,
		    size_t whylen)
{
	int r;

	for (uint32_t i = 0; i < nrecv && i < KV_RDMA_RQ; i++) {
		r = kcoll_rdma_post_recv(k->ep, 0, i);
		if (r) {
			snprintf(why, whylen, "cannot post a receive: %s", strerror(-r));
			return r;
		}
	}
	return kcoll_rdma_ep_connect(k->ep, &peer->addr, why, whylen);
}

void kv_rdma_fail(struct kv_rdma *k)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	if (k && k->ep && k->ep->qp[0])
		ibv_modify_qp(k->ep->qp[0], &a, IBV_QP_STATE);
}

void kv_rdma_revoke(struct kv_rdma *k)
{
	if (!k)
		return;
	kv_rdma_fail(k);
	if (k->mr)
		ibv_dereg_mr(k->mr);
	k->mr = NULL;
}

void kv_rdma_destroy(struct kv_rdma *k)
{
	if (!k)
		return;
	/* QP, then its CQ and channel (every event was acknowledged). */
	kcoll_rdma_ep_destroy(k->ep);
	if (k->mr)
		ibv_dereg_mr(k->mr);
	if (k->pd)
		ibv_dealloc_pd(k->pd);
	free(k);
}

int kv_rdma_post(struct kv_rdma *k, bool write, uint64_t loff, uint64_t len, uint64_t raddr,
		 uint32_t rkey, const uint32_t *imm, uint64_t wr_id)
{
	if (!k->mr && len)
		return -EIDRM;
	if (write)
		return kcoll_rdma_write(k->ep, 0, k->mr, k->base + loff, len, raddr, rkey, imm, wr_id);
	return kcoll_rdma_read(k->ep, 0, k->mr, k->base + loff, len, raddr, rkey, wr_id);
}

int kv_rdma_post_recv(struct kv_rdma *k, uint64_t wr_id)
{
	return kcoll_rdma_post_recv(k->ep, 0, wr_id);
}

int kv_rdma_poll(struct kv_rdma *k, struct ibv_wc *wc, int n)
{
	int got = ibv_poll_cq(k->ep->cq, n, wc);

	return got < 0 ? -EIO : got;
}

int kv_rdma_arm(struct kv_rdma *k)
{
	return ibv_req_notify_cq(k->ep->cq, 0) ? -EIO : 0;
}

int kv_rdma_fd(struct kv_rdma *k)
{
	return k->ep->ch->fd;
}

void kv_rdma_ack_event(struct kv_rdma *k)
{
	struct ibv_cq *cq;
	void *ctx;

	if (!ibv_get_cq_event(k->ep->ch, &cq, &ctx))
		ibv_ack_cq_events(cq, 1);
}

const char *kv_rdma_dev(struct kv_rdma *k)
{
	return kcoll_rdma_dev_name(k->ep->port.dev);
}

int kv_rdma_wc_err(const struct ibv_wc *wc)
{
	switch (wc->status) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR:
		return -EACCES;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -EHOSTUNREACH;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

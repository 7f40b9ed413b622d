// SPDX-License-Identifier: MIT
/*
 * The verbs layer: devices, RoCE v2 GID selection, RC endpoints, the
 * registration cache and one-sided posts (rdma.h has the contract).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <net/if.h>

#include "config.h"
#include "log.h"
#include "rdma.h"

#define MAX_DEVS	8
#define MAX_MRS		256

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	char name[IBV_SYSFS_NAME_MAX];
	uint8_t nports;
	uint32_t port_down;		/* bit p: port p reported an error (async event) */
	bool fatal;
	char path[IBV_SYSFS_PATH_MAX];	/* its uverbs node in sysfs */
	bool gone;			/* that node vanished: the device is being removed */
	int eps;			/* endpoints on it */
	bool dmabuf_refused;		/* ibv_reg_dmabuf_mr is not supported: asked once */
};

struct mrc {
	int dev;
	uintptr_t lo, hi;
	struct ibv_mr *mr;
	int access;			/* IBV_ACCESS_* it was registered with */
};

#define FULL_ACCESS	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct {
	pthread_mutex_t lock;
	bool inited;
	int ndev;
	struct dev dev[MAX_DEVS];
	char why[KCOLL_RDMA_WHY];
	struct mrc mr[MAX_MRS];
	size_t nmr;
} rd = { .lock = PTHREAD_MUTEX_INITIALIZER };

const char *kcoll_rdma_why(void)
{
	return rd.why;
}

int kcoll_rdma_ndevs(void)
{
	return rd.ndev;
}

const char *kcoll_rdma_dev_name(int d)
{
	return d >= 0 && d < rd.ndev ? rd.dev[d].name : "?";
}

static bool hca_wanted(const char *name);

/*
 * Is device d going away? The kernel removes a device's uverbs node
 * (/sys/class/infiniband_verbs/uverbsN) first, then, for drivers that cannot
 * revoke user contexts (rdma_rxe), waits until every process has closed the
 * device; no async event comes first. Called with rd.lock held.
 */
static bool dev_gone_locked(struct dev *d)
{
	if (!d->ctx)
		return true;
	if (!d->gone && d->path[0] && access(d->path, F_OK) && errno == ENOENT) {
		d->gone = true;
		kc_warn("rdma: %s is being removed (its uverbs node %s is gone: 'rdma link delete' or a driver "
			"unload): kcolld fails the transfers on it and closes it once its communicators have "
			"ended", d->name, d->path);
	}
	return d->gone;
}

/* Open list entry dev into slot d (rd.lock held). */
static int dev_open(struct dev *d, struct ibv_device *dev)
{
	const char *name = ibv_get_device_name(dev);
	struct ibv_device_attr da;

	d->ctx = ibv_open_device(dev);
	if (!d->ctx) {
		kc_warn("rdma: cannot open %s: %s", name, strerror(errno));
		return -ENODEV;
	}
	if (ibv_query_device(d->ctx, &da) || !(d->pd = ibv_alloc_pd(d->ctx))) {
		kc_warn("rdma: %s: query/alloc_pd failed: %s", name, strerror(errno));
		ibv_close_device(d->ctx);
		d->ctx = NULL;
		return -ENODEV;
	}
	snprintf(d->name, sizeof(d->name), "%s", name);
	snprintf(d->path, sizeof(d->path), "%s", dev->dev_path);
	d->nports = da.phys_port_cnt;
	d->port_down = 0;
	d->fatal = false;
	d->gone = false;
	d->eps = 0;
	/* async events are read when a transfer checks its port */
	fcntl(d->ctx->async_fd, F_SETFL, fcntl(d->ctx->async_fd, F_GETFL) | O_NONBLOCK);
	return 0;
}

int kcoll_rdma_reap(void)
{
	int n = 0;

	pthread_mutex_lock(&rd.lock);
	for (int i = 0; i < rd.ndev; i++) {
		struct dev *d = &rd.dev[i];
		int r;

		if (!d->ctx || !dev_gone_locked(d) || d->eps)
			continue;
		for (size_t k = 0; k < rd.nmr;) {
			if (rd.mr[k].dev == i) {
				ibv_dereg_mr(rd.mr[k].mr);
				rd.mr[k] = rd.mr[--rd.nmr];
			} else {
				k++;
			}
		}
		r = ibv_dealloc_pd(d->pd);
		if (r) {
			kc_warn("rdma: cannot release %s: its protection domain is still in use (%s): memory "
				"registered outside kcolld's cache still holds it", d->name, strerror(r));
			continue;
		}
		ibv_close_device(d->ctx);
		d->ctx = NULL;
		d->pd = NULL;
		kc_info("rdma: closed %s (being removed); its removal can complete", d->name);
		n++;
	}
	pthread_mutex_unlock(&rd.lock);
	return n;
}

bool kcoll_rdma_dev_gone(int dev)
{
	bool gone = true;

	pthread_mutex_lock(&rd.lock);
	if (dev >= 0 && dev < rd.ndev)
		gone = dev_gone_locked(&rd.dev[dev]);
	pthread_mutex_unlock(&rd.lock);
	return gone;
}

int kcoll_rdma_rescan(void)
{
	struct ibv_device **list;
	int n = 0, got = 0;

	pthread_mutex_lock(&rd.lock);
	if (!rd.inited)
		goto out;
	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		int slot = -1;

		if (!hca_wanted(name))
			continue;
		for (int d = 0; d < rd.ndev && slot < 0; d++)
			if (!strcmp(rd.dev[d].name, name))
				slot = d;
		if (slot >= 0 && rd.dev[slot].ctx)
			continue;	/* open (if it is being removed, its new self comes later) */
		if (slot < 0 && rd.ndev == MAX_DEVS)
			continue;
		if (!dev_open(&rd.dev[slot < 0 ? rd.ndev : slot], list[i])) {
			kc_info("rdma: opened %s (it appeared after kcolld started)", name);
			rd.ndev += slot < 0;
			got++;
		}
	}
	if (list)
		ibv_free_device_list(list);
out:
	pthread_mutex_unlock(&rd.lock);
	return got;
}

struct ibv_context *kcoll_rdma_ctx(int d)
{
	return rd.dev[d].ctx;
}

struct ibv_pd *kcoll_rdma_pd(int d)
{
	return rd.dev[d].pd;
}

/* KCOLL_IB_HCA: comma-separated device names; empty: all. */
static bool hca_wanted(const char *name)
{
	const char *list = kcoll_knob_str("KCOLL_IB_HCA");
	size_t n = strlen(name);

	if (!*list)
		return true;
	for (const char *p = list; *p;) {
		size_t l = strcspn(p, ",");

		if (l == n && !strncmp(p, name, n))
			return true;
		p += l;
		if (*p)
			p++;
	}
	return false;
}

int kcoll_rdma_init(void)
{
	struct ibv_device **list;
	int n = 0, r = 0;

	pthread_mutex_lock(&rd.lock);
	if (rd.inited) {
		r = rd.ndev ? 0 : -ENODEV;
		goto out;
	}
	r = kcoll_ibv_load(rd.why, sizeof(rd.why));
	if (r)
		goto out;
	rd.inited = true;
	list = ibv_get_device_list(&n);
	if (!list || !n) {
		snprintf(rd.why, sizeof(rd.why),
			 "no RDMA device (libibverbs lists none%s): load a NIC driver or Soft-RoCE "
			 "(modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IF)",
			 access("/sys/class/infiniband", F_OK) ? "; the kernel has no RDMA subsystem" : "");
		if (list)
			ibv_free_device_list(list);
		r = -ENODEV;
		goto out;
	}
	for (int i = 0; i < n && rd.ndev < MAX_DEVS; i++) {
		if (!hca_wanted(ibv_get_device_name(list[i])))
			continue;
		if (!dev_open(&rd.dev[rd.ndev], list[i]))
			rd.ndev++;
	}
	ibv_free_device_list(list);
	if (!rd.ndev) {
		snprintf(rd.why, sizeof(rd.why),
			 "no usable RDMA device (%d listed, none opened%s): check KCOLL_IB_HCA='%s' against "
			 "ibv_devices", n, *kcoll_knob_str("KCOLL_IB_HCA") ? " or matched KCOLL_IB_HCA" : "",
			 kcoll_knob_str("KCOLL_IB_HCA"));
		r = -ENODEV;
	}
out:
	pthread_mutex_unlock(&rd.lock);
	return r;
}

void kcoll_rdma_fini(void)
{
	pthread_mutex_lock(&rd.lock);
	for (size_t i = 0; i < rd.nmr; i++)
		ibv_dereg_mr(rd.mr[i].mr);
	rd.nmr = 0;
	for (int i = 0; i < rd.ndev; i++) {
		if (!rd.dev[i].ctx)
			continue;
		ibv_dealloc_pd(rd.dev[i].pd);
		ibv_close_device(rd.dev[i].ctx);
		rd.dev[i].ctx = NULL;
	}
	rd.ndev = 0;
	rd.inited = false;
	pthread_mutex_unlock(&rd.lock);
}

static const char *gid_type_name(uint32_t t)
{
	return t == IBV_GID_TYPE_ROCE_V2 ? "v2" : t == IBV_GID_TYPE_ROCE_V1 ? "v1" : "ib";
}

static void gid_str(const union ibv_gid *g, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, g->raw, buf, len))
		snprintf(buf, len, "?");
}

static bool gid_is_ip4(const union ibv_gid *g, uint32_t ip)
{
	static const uint8_t pfx[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return !memcmp(g->raw, pfx, 12) && !memcmp(g->raw + 12, &ip, 4);
}

static int fill_port(int d, uint8_t p, const struct ibv_gid_entry *e, struct kcoll_rdma_port *out)
{
	struct ibv_port_attr pa;

	if (ibv_query_port(rd.dev[d].ctx, p, &pa))
		return -errno;
	*out = (struct kcoll_rdma_port){ .dev = d, .port = p, .gid_index = (int)e->gid_index,
					 .gid = e->gid, .mtu = pa.active_mtu };
	return 0;
}

static int pick_gid(uint32_t ip, long long want, struct kcoll_rdma_port *out, char *why, size_t whylen);

int kcoll_rdma_pick_gid(uint32_t ip, struct kcoll_rdma_port *out, char *why, size_t whylen)
{
	return pick_gid(ip, kcoll_knob_ll("KCOLL_IB_GID_INDEX"), out, why, whylen);
}

int kcoll_rdma_pick_gid_ip(uint32_t ip, struct kcoll_rdma_port *out, char *why, size_t whylen)
{
	return pick_gid(ip, -1, out, why, whylen);
}

static int pick_gid_locked(uint32_t ip, long long want, struct kcoll_rdma_port *out, char *why,
			   size_t whylen);

static int pick_gid(uint32_t ip, long long want, struct kcoll_rdma_port *out, char *why, size_t whylen)
{
	int r;

	pthread_mutex_lock(&rd.lock);
	r = pick_gid_locked(ip, want, out, why, whylen);
	pthread_mutex_unlock(&rd.lock);
	return r;
}

static int pick_gid_locked(uint32_t ip, long long want, struct kcoll_rdma_port *out, char *why,
			   size_t whylen)
{
	char ipb[INET_ADDRSTRLEN], seen[300] = "";
	size_t sl = 0;

	inet_ntop(AF_INET, &ip, ipb, sizeof(ipb));
	for (int d = 0; d < rd.ndev; d++) {
		if (dev_gone_locked(&rd.dev[d]))
			continue;	/* closed, or being removed */
		for (uint8_t p = 1; p <= rd.dev[d].nports; p++) {
			struct ibv_port_attr pa;

			if (ibv_query_port(rd.dev[d].ctx, p, &pa))
				continue;
			for (int i = 0; i < pa.gid_tbl_len; i++) {
				struct ibv_gid_entry e;
				char g[INET6_ADDRSTRLEN];

				if (ibv_query_gid_ex(rd.dev[d].ctx, p, i, &e, 0))
					continue;	/* empty entry */
				if (want >= 0) {
					if (i == want)
						return fill_port(d, p, &e, out);
					continue;
				}
				if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && gid_is_ip4(&e.gid, ip)) {
					if (pa.state != IBV_PORT_ACTIVE) {
						snprintf(why, whylen, "%s port %u carries %s (GID %d) but is %s: "
							 "bring its netdev up", rd.dev[d].name, p, ipb, i,
							 ibv_port_state_str(pa.state));
						return -ENETDOWN;
					}
					return fill_port(d, p, &e, out);
				}
				gid_str(&e.gid, g, sizeof(g));
				if (sl < sizeof(seen) - 1)
					sl += snprintf(seen + sl, sizeof(seen) - sl, "%s%s/%u[%d]=%s(%s)",
						       sl ? " " : "", rd.dev[d].name, p, i, g,
						       gid_type_name(e.gid_type));
			}
		}
	}
	if (want >= 0)
		snprintf(why, whylen, "KCOLL_IB_GID_INDEX=%lld names no GID on %s: list them with "
			 "'ibv_devinfo -v'", want, *kcoll_knob_str("KCOLL_IB_HCA") ? kcoll_knob_str("KCOLL_IB_HCA") :
			 "any device");
	else
		snprintf(why, whylen, "no RoCE v2 GID carries %s, the address this daemon uses for the peer "
			 "(GIDs: %s): add an RDMA device on the netdev with that address "
			 "(rdma link add NAME type rxe netdev IF) or set KCOLL_IB_HCA/KCOLL_IB_GID_INDEX",
			 ipb, sl ? seen : "none");
	return -EADDRNOTAVAIL;
}

int kcoll_rdma_async_fd(int d)
{
	return d >= 0 && d < rd.ndev && rd.dev[d].ctx ? rd.dev[d].ctx->async_fd : -1;
}

int kcoll_rdma_port_check(int d, uint8_t port, char *why, size_t whylen)
{
	struct dev *dv = &rd.dev[d];
	struct ibv_async_event ev;
	int r = 0;

	pthread_mutex_lock(&rd.lock);
	if (dev_gone_locked(dv)) {
		snprintf(why, whylen, "%s is being removed ('rdma link delete' or a driver unload): its "
			 "transfers fail; kcolld closes it once its communicators end", dv->name);
		pthread_mutex_unlock(&rd.lock);
		return -ENODEV;
	}
	while (!ibv_get_async_event(dv->ctx, &ev)) {
		switch (ev.event_type) {
		case IBV_EVENT_PORT_ERR:
			dv->port_down |= 1u << (ev.element.port_num & 31);
			kc_warn("rdma: %s port %d went down (IBV_EVENT_PORT_ERR)", dv->name, ev.element.port_num);
			break;
		case IBV_EVENT_PORT_ACTIVE:
			dv->port_down &= ~(1u << (ev.element.port_num & 31));
			kc_info("rdma: %s port %d is active again", dv->name, ev.element.port_num);
			break;
		case IBV_EVENT_DEVICE_FATAL:
			dv->fatal = true;
			kc_warn("rdma: %s reported a fatal error (IBV_EVENT_DEVICE_FATAL)", dv->name);
			break;
		default:
			break;	/* QP and CQ events show up as failed completions too */
		}
		ibv_ack_async_event(&ev);
	}
	if (dv->fatal || (dv->port_down & (1u << (port & 31)))) {
		snprintf(why, whylen, "%s port %u %s: check 'rdma link' and the netdev under it (ip link)",
			 dv->name, port, dv->fatal ? "had a fatal error" : "is down");
		r = dv->fatal ? -EIO : -ENETDOWN;
	}
	pthread_mutex_unlock(&rd.lock);
	return r;
}

/* ---- endpoints -------------------------------------------------------- */

int kcoll_rdma_ep_create(const struct kcoll_rdma_port *port, uint32_t nqp, struct ibv_cq *cq,
			 uint32_t send_depth, uint32_t recv_depth, struct kcoll_rdma_ep **out)
{
	struct dev *d = &rd.dev[port->dev];
	struct kcoll_rdma_ep *ep;
	int r;

	if (!nqp || nqp > KCOLL_RDMA_MAX_QPS || port->dev < 0 || port->dev >= rd.ndev)
		return -EINVAL;
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -ENOMEM;
	pthread_mutex_lock(&rd.lock);
	if (dev_gone_locked(d)) {
		pthread_mutex_unlock(&rd.lock);
		free(ep);
		return -ENODEV;
	}
	d->eps++;	/* keeps it open (kcoll_rdma_reap) */
	pthread_mutex_unlock(&rd.lock);
	ep->port = *port;
	ep->nqp = nqp;
	ep->send_depth = send_depth;
	ep->recv_depth = recv_depth;
	if (cq) {
		ep->cq = cq;
	} else {
		ep->ch = ibv_create_comp_channel(d->ctx);
		if (!ep->ch) {
			r = -errno;
			goto err_free;
		}
		ep->cq = ibv_create_cq(d->ctx, (int)(nqp * (send_depth + recv_depth)), NULL, ep->ch, 0);
		if (!ep->cq) {
			r = -errno;
			goto err_destroy_channel;
		}
		ep->own_cq = true;
	}
	for (uint32_t i = 0; i < nqp; i++) {
		struct ibv_qp_init_attr qa = {
			.send_cq = ep->cq, .recv_cq = ep->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = send_depth, .max_recv_wr = recv_depth,
				 .max_send_sge = 2, .max_recv_sge = 1 },
		};
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port->port,
			.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ,
		};

		ep->qp[i] = ibv_create_qp(d->pd, &qa);
		if (!ep->qp[i]) {
			r = -errno;
			goto err_destroy_qps;
		}
		r = ibv_modify_qp(ep->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS);
		if (r) {
			r = -r;
			goto err_destroy_qps;
		}
		ep->local.qpn[i] = ep->qp[i]->qp_num;
		ep->local.psn[i] = (uint32_t)(random() & 0xffffff);
	}
	ep->local.version = KCOLL_RDMA_ADDR_VERSION;
	ep->local.nqp = nqp;
	ep->local.gid = port->gid;
	ep->local.mtu = port->mtu;
	for (uint32_t i = 0; i < nqp; i++)
		ep->local.qgid[i] = port->gid;
	*out = ep;
	return 0;

err_destroy_qps:
	for (uint32_t i = 0; i < nqp; i++)
		if (ep->qp[i])
			ibv_destroy_qp(ep->qp[i]);
	if (ep->own_cq)
		ibv_destroy_cq(ep->cq);
err_destroy_channel:
	if (ep->ch)
		ibv_destroy_comp_channel(ep->ch);
err_free:
	pthread_mutex_lock(&rd.lock);
	d->eps--;
	pthread_mutex_unlock(&rd.lock);
	free(ep);
	return r ? r : -EIO;
}

int kcoll_rdma_ep_connect(struct kcoll_rdma_ep *ep, const struct kcoll_rdma_addr *rem, char *why, size_t whylen)
{
	enum ibv_mtu mtu;

	if (rem->version != KCOLL_RDMA_ADDR_VERSION || rem->nqp != ep->nqp) {
		snprintf(why, whylen, "the peer runs another RDMA setup (version %u, %u QPs; ours %u, %u): "
			 "run the same kcolld and KCOLL_IB_QPS on every host", rem->version, rem->nqp,
			 KCOLL_RDMA_ADDR_VERSION, ep->nqp);
		return -EPROTO;
	}
	ep->remote = *rem;
	for (uint32_t i = 0; i < ep->nqp; i++) {
		const struct kcoll_rdma_port *lp = kcoll_rdma_ep_qp_port(ep, i);

		mtu = rem->mtu < lp->mtu ? (enum ibv_mtu)rem->mtu : lp->mtu;
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = rem->qpn[i],
			.rq_psn = rem->psn[i], .max_dest_rd_atomic = 4, .min_rnr_timer = 12,
			.ah_attr = {
				.is_global = 1, .port_num = lp->port,
				.grh = { .dgid = rem->qgid[i], .sgid_index = (uint8_t)lp->gid_index,
					 .hop_limit = 64, .flow_label = ep->path[i].flow_label & 0xfffff,
					 .traffic_class = ep->path[i].traffic_class },
			},
		};
		int r = ibv_modify_qp(ep->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				      IBV_QP_MIN_RNR_TIMER);

		if (r) {
			snprintf(why, whylen, "QP %u to RTR: %s (is the peer's GID reachable from %s port %u "
				 "GID %d?)", i, strerror(r), rd.dev[lp->dev].name, lp->port, lp->gid_index);
			return -r;
		}
		/* KCOLL_IB_TIMEOUT: 1..31 (the field's range) */
		long long tmo = kcoll_knob_ll("KCOLL_IB_TIMEOUT");

		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .retry_cnt = 7,
					  .timeout = (uint8_t)(tmo < 1 ? 1 : tmo > 31 ? 31 : tmo),
					  .rnr_retry = 7, .sq_psn = ep->local.psn[i], .max_rd_atomic = 4 };
		r = ibv_modify_qp(ep->qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
		if (r) {
			snprintf(why, whylen, "QP %u to RTS: %s", i, strerror(r));
			return -r;
		}
	}
	return 0;
}

const struct kcoll_rdma_port *kcoll_rdma_ep_qp_port(const struct kcoll_rdma_ep *ep, uint32_t i)
{
	return i < ep->nqp && ep->path[i].own_port ? &ep->path[i].port : &ep->port;
}

int kcoll_rdma_ep_set_path(struct kcoll_rdma_ep *ep, uint32_t i, const struct kcoll_rdma_path *path, char *why,
			   size_t whylen)
{
	if (i >= ep->nqp) {
		snprintf(why, whylen, "QP %u: the endpoint has %u QPs", i, ep->nqp);
		return -EINVAL;
	}
	if (path->own_port && path->port.dev != ep->port.dev) {
		snprintf(why, whylen, "QP %u: %s is another device than the endpoint's %s (its CQ and PD): "
			 "give each device its own endpoint", i, rd.dev[path->port.dev].name,
			 rd.dev[ep->port.dev].name);
		return -EINVAL;
	}
	if (path->own_port && path->port.port != kcoll_rdma_ep_qp_port(ep, i)->port) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = path->port.port };
		int r = ibv_modify_qp(ep->qp[i], &a, IBV_QP_STATE | IBV_QP_PORT);

		if (r) {
			snprintf(why, whylen, "QP %u: cannot move to port %u: %s", i, path->port.port, strerror(r));
			return -r;
		}
	}
	ep->path[i] = *path;
	ep->local.qgid[i] = kcoll_rdma_ep_qp_port(ep, i)->gid;
	return 0;
}

void kcoll_rdma_ep_destroy(struct kcoll_rdma_ep *ep)
{
	if (!ep)
		return;
	for (uint32_t i = 0; i < ep->nqp; i++)
		if (ep->qp[i])
			ibv_destroy_qp(ep->qp[i]);
	if (ep->own_cq)
		ibv_destroy_cq(ep->cq);
	if (ep->ch)
		ibv_destroy_comp_channel(ep->ch);
	pthread_mutex_lock(&rd.lock);
	rd.dev[ep->port.dev].eps--;
	pthread_mutex_unlock(&rd.lock);
	free(ep);
}

void kcoll_rdma_ep_quiesce(struct kcoll_rdma_ep *ep)
{
	for (uint32_t i = 0; ep && i < ep->nqp; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		if (ep->qp[i] && ibv_modify_qp(ep->qp[i], &a, IBV_QP_STATE))
			kc_dbg("rdma: QP %u to the error state: %s", i, strerror(errno));
	}
}

int kcoll_rdma_ep_qp_state(struct kcoll_rdma_ep *ep, uint32_t i)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int r;

	if (i >= ep->nqp)
		return -EINVAL;
	r = ibv_query_qp(ep->qp[i], &a, IBV_QP_STATE, &ia);
	return r ? -r : (int)a.qp_state;
}

const char *kcoll_rdma_qp_state_name(int s)
{
	static const char *const n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

	return s >= 0 && s < (int)(sizeof(n) / sizeof(n[0])) ? n[s] : "?";
}

uint16_t kcoll_rdma_udp_sport(uint32_t fl, uint32_t lqpn, uint32_t rqpn)
{
	if (!fl) {
		uint64_t v = (uint64_t)lqpn * rqpn;

		v ^= v >> 20;
		v ^= v >> 40;
		fl = (uint32_t)(v & 0xfffff);
	}
	return (uint16_t)(((fl & 0x3fff) ^ ((fl & 0xfc000) >> 14)) | 0xc000);
}

uint32_t kcoll_rdma_flow_label_for_sport(uint16_t sport)
{
	/* High 6 bits 0: the XOR leaves the low 14 as they are. Port 0xC000
	 * would need label 0, which means "derive one": 0x4001 folds to 0. */
	return sport & 0x3fff ? sport & 0x3fffu : 0x4001u;
}

/* ---- registration cache ----------------------------------------------- */

static int mr_get(int dev, void *addr, size_t len, int dmabuf_fd, int access, struct ibv_mr **out);

int kcoll_rdma_mr_get(int dev, void *addr, size_t len, struct ibv_mr **out)
{
	return mr_get(dev, addr, len, -1, FULL_ACCESS, out);
}

int kcoll_rdma_mr_get_fd(int dev, void *addr, size_t len, int dmabuf_fd, struct ibv_mr **out)
{
	return mr_get(dev, addr, len, dmabuf_fd, FULL_ACCESS, out);
}

int kcoll_rdma_mr_get_local(int dev, void *addr, size_t len, struct ibv_mr **out)
{
	return mr_get(dev, addr, len, -1, 0, out);
}

int kcoll_rdma_mr_get_local_fd(int dev, void *addr, size_t len, int dmabuf_fd, struct ibv_mr **out)
{
	return mr_get(dev, addr, len, dmabuf_fd, 0, out);
}

bool kcoll_rdma_dmabuf_refused(int dev)
{
	bool refused;

	if (dev < 0 || dev >= rd.ndev)
		return false;
	pthread_mutex_lock(&rd.lock);
	refused = rd.dev[dev].dmabuf_refused;
	pthread_mutex_unlock(&rd.lock);
	return refused;
}

static int mr_get(int dev, void *addr, size_t len, int dmabuf_fd, int access, struct ibv_mr **out)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;
	struct ibv_mr *mr;
	int r = 0;

	if (dev < 0 || dev >= rd.ndev || !len)
		return -EINVAL;
	pthread_mutex_lock(&rd.lock);
	if (dev_gone_locked(&rd.dev[dev])) {
		r = -ENODEV;
		goto out;
	}
	for (size_t i = 0; i < rd.nmr; i++)
		if (rd.mr[i].dev == dev && rd.mr[i].lo <= lo && hi <= rd.mr[i].hi &&
		    (rd.mr[i].access & access) == access) {
			*out = rd.mr[i].mr;
			goto out;
		}
	if (rd.nmr == MAX_MRS) {
		r = -ENOSPC;
		goto out;
	}
	if (dmabuf_fd >= 0 && rd.dev[dev].dmabuf_refused) {
		r = -EOPNOTSUPP;
		goto out;
	}
	if (dmabuf_fd >= 0)	/* the NIC maps the exporter's pages: iova = addr */
		mr = ibv_reg_dmabuf_mr(rd.dev[dev].pd, 0, len, (uint64_t)lo, dmabuf_fd, access);
	else
		mr = ibv_reg_mr(rd.dev[dev].pd, addr, len, access);
	if (!mr) {
		r = -errno;
		if (dmabuf_fd >= 0 && (r == -EOPNOTSUPP || r == -EPROTONOSUPPORT || r == -ENOSYS)) {
			rd.dev[dev].dmabuf_refused = true;
			kc_info("RDMA device %s refuses dma-buf memory regions (ibv_reg_dmabuf_mr: %s): "
				"buffers reachable only through a dma-buf (kcoll.ko registrations, GPU "
				"memory) are sent through the copy path; a NIC whose driver implements "
				"reg_user_mr_dmabuf sends from them directly", rd.dev[dev].name, strerror(-r));
			r = -EOPNOTSUPP;
		}
		goto out;
	}
	rd.mr[rd.nmr++] = (struct mrc){ dev, lo, hi, mr, access };
	*out = mr;
out:
	pthread_mutex_unlock(&rd.lock);
	return r;
}

void kcoll_rdma_mr_invalidate(void *addr, size_t len)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;

	pthread_mutex_lock(&rd.lock);
	for (size_t i = 0; i < rd.nmr;) {
		if (rd.mr[i].lo < hi && lo < rd.mr[i].hi) {
			ibv_dereg_mr(rd.mr[i].mr);
			rd.mr[i] = rd.mr[--rd.nmr];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&rd.lock);
}

size_t kcoll_rdma_mr_count(void)
{
	size_t n;

	pthread_mutex_lock(&rd.lock);
	n = rd.nmr;
	pthread_mutex_unlock(&rd.lock);
	return n;
}

/* ---- one-sided operations --------------------------------------------- */

int kcoll_rdma_write(struct kcoll_rdma_ep *ep, uint32_t qpi, struct ibv_mr *mr, const void *laddr,
		     size_t len, uint64_t raddr, uint32_t rkey, const uint32_t *imm, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = (uint32_t)len, .lkey = mr ? mr->lkey : 0 };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0,
		.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;

	if (qpi >= ep->nqp || len > UINT32_MAX || (len && !mr))
		return -EINVAL;
	if (imm)
		wr.imm_data = htonl(*imm);
	return -ibv_post_send(ep->qp[qpi], &wr, &bad);
}

int kcoll_rdma_write_sg(struct kcoll_rdma_ep *ep, uint32_t qpi, const struct ibv_sge *sge, int nsge,
			uint64_t raddr, uint32_t rkey, const uint32_t *imm, uint64_t wr_id)
{
	struct ibv_sge sg[2];
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = sg, .num_sge = nsge,
		.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;
	uint64_t total = 0;

	if (qpi >= ep->nqp || nsge < 1 || nsge > 2 || !sge)
		return -EINVAL;
	for (int i = 0; i < nsge; i++) {
		sg[i] = sge[i];
		total += sge[i].length;
	}
	if (total > UINT32_MAX)
		return -EINVAL;
	if (imm)
		wr.imm_data = htonl(*imm);
	return -ibv_post_send(ep->qp[qpi], &wr, &bad);
}

int kcoll_rdma_read(struct kcoll_rdma_ep *ep, uint32_t qpi, struct ibv_mr *mr, void *laddr, size_t len,
		    uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = (uint32_t)len, .lkey = mr ? mr->lkey : 0 };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;

	if (qpi >= ep->nqp || !len || len > UINT32_MAX || !mr)
		return -EINVAL;
	return -ibv_post_send(ep->qp[qpi], &wr, &bad);
}

int kcoll_rdma_post_recv(struct kcoll_rdma_ep *ep, uint32_t qpi, uint64_t wr_id)
{
	struct ibv_recv_wr wr = { .wr_id = wr_id }, *bad;

	if (qpi >= ep->nqp)
		return -EINVAL;
	return -ibv_post_recv(ep->qp[qpi], &wr, &bad);
}

int kcoll_rdma_poll(struct kcoll_rdma_ep *ep, struct ibv_wc *wc, int n, int timeout_ms)
{
	for (;;) {
		int got = ibv_poll_cq(ep->cq, n, wc);
		struct ibv_cq *evcq;
		void *evctx;

		if (got)
			return got < 0 ? -EIO : got;
		if (!timeout_ms || !ep->ch)
			return 0;
		if (ibv_req_notify_cq(ep->cq, 0))
			return -EIO;
		got = ibv_poll_cq(ep->cq, n, wc);	/* what came before the request */
		if (got)
			return got < 0 ? -EIO : got;
		struct pollfd pfd = { .fd = ep->ch->fd, .events = POLLIN };
		int r = poll(&pfd, 1, timeout_ms);

		if (r < 0)
			return -errno;
		if (!r)
			return 0;
		if (!ibv_get_cq_event(ep->ch, &evcq, &evctx))
			ibv_ack_cq_events(evcq, 1);
		timeout_ms = 0;	/* one sleep, then report what is there */
	}
}

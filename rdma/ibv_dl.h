/* SPDX-License-Identifier: MIT */
/*
 * libibverbs at run time, the way gpu/ loads libcuda: kcoll_ibv_load()
 * dlopens libibverbs.so.1 (KCOLL_IB_LIB overrides the path) and resolves
 * every verbs function kcoll calls into one table, so that kcolld and the
 * test programs do not link libibverbs and start where rdma-core is not
 * installed (the daemon then uses TCP and says why).
 *
 * Include it after <infiniband/verbs.h> (rdma.h does): the names below then
 * call through the table and the call sites read like plain verbs. Calls
 * that verbs.h inlines into the provider's ops (ibv_post_send, ibv_poll_cq,
 * ibv_req_notify_cq) need no symbol and stay as they are. Every name here
 * may be called only after kcoll_ibv_load() succeeded (kcoll_rdma_init()
 * loads it first). A program that links libibverbs itself (a raw verbs
 * tool) defines KCOLL_IBV_LINKED to keep the real names.
 */
#ifndef KCOLL_IBV_DL_H
#define KCOLL_IBV_DL_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#ifndef KCOLL_IBV_LINKED

/*
 * The library's functions kcoll calls: return type, table member, symbol,
 * parameters. dlsym finds a symbol's default version, the one a link
 * against libibverbs would bind (IBVERBS_1.1 for the calls older than it).
 * verbs.h turns ibv_query_port, ibv_query_gid_ex and ibv_reg_mr into inline
 * code that calls query_port, _ibv_query_gid_ex and reg_mr_iova2: the
 * kcoll_ibv_* functions below do the same through the table.
 */
#define KCOLL_IBV_FNS(X) \
	X(struct ibv_device **, get_device_list, "ibv_get_device_list", (int *num)) \
	X(void, free_device_list, "ibv_free_device_list", (struct ibv_device **list)) \
	X(const char *, get_device_name, "ibv_get_device_name", (struct ibv_device *dev)) \
	X(struct ibv_context *, open_device, "ibv_open_device", (struct ibv_device *dev)) \
	X(int, close_device, "ibv_close_device", (struct ibv_context *ctx)) \
	X(int, query_device, "ibv_query_device", (struct ibv_context *ctx, struct ibv_device_attr *attr)) \
	X(int, query_port, "ibv_query_port", \
	  (struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr)) \
	X(int, query_gid_ex, "_ibv_query_gid_ex", \
	  (struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *entry, \
	   uint32_t flags, size_t entry_size)) \
	X(int, get_async_event, "ibv_get_async_event", (struct ibv_context *ctx, struct ibv_async_event *ev)) \
	X(void, ack_async_event, "ibv_ack_async_event", (struct ibv_async_event *ev)) \
	X(struct ibv_pd *, alloc_pd, "ibv_alloc_pd", (struct ibv_context *ctx)) \
	X(int, dealloc_pd, "ibv_dealloc_pd", (struct ibv_pd *pd)) \
	X(struct ibv_mr *, reg_mr, "ibv_reg_mr", (struct ibv_pd *pd, void *addr, size_t len, int access)) \
	X(struct ibv_mr *, reg_mr_iova2, "ibv_reg_mr_iova2", \
	  (struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, unsigned int access)) \
	X(struct ibv_mr *, reg_dmabuf_mr, "ibv_reg_dmabuf_mr", \
	  (struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access)) \
	X(int, dereg_mr, "ibv_dereg_mr", (struct ibv_mr *mr)) \
	X(struct ibv_comp_channel *, create_comp_channel, "ibv_create_comp_channel", (struct ibv_context *ctx)) \
	X(int, destroy_comp_channel, "ibv_destroy_comp_channel", (struct ibv_comp_channel *ch)) \
	X(struct ibv_cq *, create_cq, "ibv_create_cq", \
	  (struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch, int vector)) \
	X(int, destroy_cq, "ibv_destroy_cq", (struct ibv_cq *cq)) \
	X(int, get_cq_event, "ibv_get_cq_event", \
	  (struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)) \
	X(void, ack_cq_events, "ibv_ack_cq_events", (struct ibv_cq *cq, unsigned int nevents)) \
	X(struct ibv_qp *, create_qp, "ibv_create_qp", (struct ibv_pd *pd, struct ibv_qp_init_attr *init)) \
	X(int, modify_qp, "ibv_modify_qp", (struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)) \
	X(int, query_qp, "ibv_query_qp", \
	  (struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)) \
	X(int, destroy_qp, "ibv_destroy_qp", (struct ibv_qp *qp)) \
	X(const char *, wc_status_str, "ibv_wc_status_str", (enum ibv_wc_status status)) \
	X(const char *, port_state_str, "ibv_port_state_str", (enum ibv_port_state state))

struct kcoll_ibv_fns {
#define KCOLL_IBV_MEMBER(ret, name, sym, args) ret (*name) args;
	KCOLL_IBV_FNS(KCOLL_IBV_MEMBER)
#undef KCOLL_IBV_MEMBER
};

/* Filled by a successful kcoll_ibv_load(); NULL members before that. */
extern struct kcoll_ibv_fns kcoll_ibv;

/*
 * dlopen libibverbs and resolve the table. Idempotent: the first result
 * stays. 0, or -ENOENT (no library: why says to install rdma-core) or
 * -EOPNOTSUPP (a library that lacks a function: why names it), why filled.
 * A library without ibv_reg_dmabuf_mr (rdma-core < 34) loads: that call
 * then fails with EOPNOTSUPP, as on a device without dma-buf support.
 */
int kcoll_ibv_load(char *why, size_t whylen);

/* The path kcoll_ibv_load() opens: KCOLL_IB_LIB, or libibverbs.so.1. */
const char *kcoll_ibv_lib(void);

/* ibv_query_port as verbs.h inlines it: the provider's op, else the library's. */
int kcoll_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);

static inline int kcoll_ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
					 struct ibv_gid_entry *entry, uint32_t flags)
{
	return kcoll_ibv.query_gid_ex(ctx, port, index, entry, flags, sizeof(*entry));
}

/*
 * ibv_reg_mr as verbs.h inlines it: access flags of the optional range
 * (relaxed ordering) go to ibv_reg_mr_iova2, which drops those the kernel
 * does not support.
 */
static inline struct ibv_mr *kcoll_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
					      unsigned int access)
{
	if (access & IBV_ACCESS_OPTIONAL_RANGE)
		return kcoll_ibv.reg_mr_iova2(pd, addr, len, (uintptr_t)addr, access);
	return kcoll_ibv.reg_mr(pd, addr, len, (int)access);
}

#undef ibv_get_device_list
#define ibv_get_device_list		kcoll_ibv.get_device_list
#define ibv_free_device_list		kcoll_ibv.free_device_list
#define ibv_get_device_name		kcoll_ibv.get_device_name
#define ibv_open_device			kcoll_ibv.open_device
#define ibv_close_device		kcoll_ibv.close_device
#define ibv_query_device		kcoll_ibv.query_device
#undef ibv_query_port
#define ibv_query_port			kcoll_ibv_query_port
#define ibv_query_gid_ex		kcoll_ibv_query_gid_ex
#define ibv_get_async_event		kcoll_ibv.get_async_event
#define ibv_ack_async_event		kcoll_ibv.ack_async_event
#define ibv_alloc_pd			kcoll_ibv.alloc_pd
#define ibv_dealloc_pd			kcoll_ibv.dealloc_pd
#undef ibv_reg_mr
#define ibv_reg_mr			kcoll_ibv_reg_mr
#define ibv_reg_dmabuf_mr		kcoll_ibv.reg_dmabuf_mr
#define ibv_dereg_mr			kcoll_ibv.dereg_mr
#define ibv_create_comp_channel		kcoll_ibv.create_comp_channel
#define ibv_destroy_comp_channel	kcoll_ibv.destroy_comp_channel
#define ibv_create_cq			kcoll_ibv.create_cq
#define ibv_destroy_cq			kcoll_ibv.destroy_cq
#define ibv_get_cq_event		kcoll_ibv.get_cq_event
#define ibv_ack_cq_events		kcoll_ibv.ack_cq_events
#define ibv_create_qp			kcoll_ibv.create_qp
#define ibv_modify_qp			kcoll_ibv.modify_qp
#define ibv_query_qp			kcoll_ibv.query_qp
#define ibv_destroy_qp			kcoll_ibv.destroy_qp
#define ibv_wc_status_str		kcoll_ibv.wc_status_str
#define ibv_port_state_str		kcoll_ibv.port_state_str

#endif /* KCOLL_IBV_LINKED */
#endif /* KCOLL_IBV_DL_H */

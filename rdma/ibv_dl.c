// SPDX-License-Identifier: MIT
/*
 * The libibverbs loader (ibv_dl.h): dlopen, one dlsym per table entry, and
 * a reason in words when either fails. Like gpu/gpu.c's CUDA loader, it
 * keeps the library mapped for the life of the process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "ibv_dl.h"

struct kcoll_ibv_fns kcoll_ibv;

static const struct {
	const char *sym;
	size_t off;
} ibv_syms[] = {
#define KCOLL_IBV_SYM(ret, name, sym, args) { sym, offsetof(struct kcoll_ibv_fns, name) },
	KCOLL_IBV_FNS(KCOLL_IBV_SYM)
#undef KCOLL_IBV_SYM
};

static struct {
	pthread_once_t once;
	int rc;
	char why[512];
} ld = { .once = PTHREAD_ONCE_INIT };

/* Stands in for ibv_reg_dmabuf_mr where the library predates it. */
static struct ibv_mr *no_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
				   int access)
{
	errno = EOPNOTSUPP;
	return NULL;
}

const char *kcoll_ibv_lib(void)
{
	const char *lib = kcoll_knob_str("KCOLL_IB_LIB");

	return *lib ? lib : "libibverbs.so.1";
}

static void load(void)
{
	const char *lib = kcoll_ibv_lib();
	struct kcoll_ibv_fns fns;
	void *dl;

	dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!dl) {
		snprintf(ld.why, sizeof(ld.why),
			 "cannot load libibverbs (%s): install rdma-core's libibverbs1 to use RDMA", dlerror());
		ld.rc = -ENOENT;
		return;
	}
	for (size_t i = 0; i < sizeof(ibv_syms) / sizeof(ibv_syms[0]); i++) {
		void *sym = dlsym(dl, ibv_syms[i].sym);

		if (!sym && ibv_syms[i].off == offsetof(struct kcoll_ibv_fns, reg_dmabuf_mr)) {
			struct ibv_mr *(*stub)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int) =
				no_dmabuf_mr;

			memcpy(&sym, &stub, sizeof(sym));
		}
		if (!sym) {
			snprintf(ld.why, sizeof(ld.why),
				 "%s has no %s (too old, or not libibverbs): install rdma-core 32 or later", lib,
				 ibv_syms[i].sym);
			dlclose(dl);
			ld.rc = -EOPNOTSUPP;
			return;
		}
		memcpy((char *)&fns + ibv_syms[i].off, &sym, sizeof(sym));
	}
	kcoll_ibv = fns;
	ld.rc = 0;
}

int kcoll_ibv_load(char *why, size_t whylen)
{
	pthread_once(&ld.once, load);
	if (ld.rc && why && whylen)
		snprintf(why, whylen, "%s", ld.why);
	return ld.rc;
}

int kcoll_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);

	if (!vctx) {
		memset(attr, 0, sizeof(*attr));
		return kcoll_ibv.query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
	}
	return vctx->query_port(ctx, port, attr, sizeof(*attr));
}

// SPDX-License-Identifier: MIT
/*
 * Device buffers through kcolld (docs/gpu.md "Device buffers in the ring ABI"):
 * ranks pass CUDA device pointers to the collectives, libkcoll registers each
 * allocation with kcolld (CUDA IPC), kcolld maps it, reduces on the GPU when
 * every buffer of an op is there (kcoll_gpu_reduce_n + device-to-device
 * copies) and stages through host memory otherwise.
 *
 * Two runs of the same checks, in this order:
 *  - "GPU": the real driver and build/lib/libkcoll_gpu.so, when this machine
 *    has a usable GPU; otherwise each check prints ok N # SKIP needs a GPU.
 *  - "fake": the program re-executes itself with $(TBIN)/fixtures/
 *    libcuda-fake.so as libcuda.so.1 (LD_LIBRARY_PATH) and as the kernels
 *    library (KCOLL_GPU_LIB), for itself and for the kcolld it starts. The
 *    fake's device memory is shared memory another process maps through an
 *    IPC handle, its kernels table runs reduce_core.h on the CPU, and it
 *    insists on a current context per thread: kcolld's own code runs as it
 *    would on a GPU (no fake-only branch anywhere in kcolld or libkcoll).
 *
 * Each run starts a private kcolld with the GPU, and one without (its kernels
 * library points nowhere), under /tmp/gpu-ring-<pid>/. CUDA is only ever
 * initialised in forked children: a process must not fork after cuInit.
 *
 * One program of about 1000 lines, on purpose: both runs are this program
 * (the second an exec of it, carrying the TAP count on), over one case table
 * and one shared board; a second program would split the same checks.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kcoll_gpu.h"
#include "rawclient.h"
#include "reduce.h"
#include "gpu_kcolld.h"
#include "test_util.h"

#define NR		2
#define MAX_CASES	170
#define BUF_BYTES	(4u << 20)	/* each device buffer of a rank */
#define REUSE_BYTES	(1u << 20)

enum { K_DEV, K_INPLACE, K_MIXED };	/* both ranks device / in place / rank 1 host */

struct tcase {
	int opcode, dtype, op, kind, root;
	size_t count;
};

struct shared {
	int bad[MAX_CASES][NR];		/* 0 ok, else -errno or 1 (wrong bytes) */
	char why[MAX_CASES][NR][96];
	int reuse_rc[NR], reuse_same_addr[NR], past_rc[NR], dereg_rc[NR][3];
	int loop_rc[NR], loop_done[NR];	/* the 100 staged all-reduces */
	int fault_rc[2];			/* an injected copy failure, then the next op */
	struct kcoll_gpu_ipc foreign;	/* exported by a child for the -EPERM check */
	int foreign_ready, foreign_done;
};

static struct tcase cases[MAX_CASES];
static int ncases;
static struct shared *sh;
static char exe_dir[PATH_MAX], dir[PATH_MAX];
static const char *run_name;

TEST_CUDA_SAN_DEFAULTS

static const int dtypes[] = { KCOLL_F32, KCOLL_F16, KCOLL_BF16, KCOLL_F64, KCOLL_I32, KCOLL_U8,
			      KCOLL_I64 };
static const int ops[] = { KCOLL_SUM, KCOLL_PROD, KCOLL_MIN, KCOLL_MAX, KCOLL_AVG };
static const size_t sizes[] = { 1, 1023, 200003 };

static void add(int opcode, int dtype, int op, int kind, size_t count, int root)
{
	if (ncases < MAX_CASES)
		cases[ncases++] = (struct tcase){ opcode, dtype, op, kind, root, count };
}

static void build_cases(void)
{
	for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
		for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
			for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
				add(KCOLL_OP_ALLREDUCE, dtypes[d], ops[o], K_DEV, sizes[s], 0);
	for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
		add(KCOLL_OP_ALLREDUCE, dtypes[d], KCOLL_SUM, K_INPLACE, 70001, 0);
		add(KCOLL_OP_ALLREDUCE, dtypes[d], KCOLL_MAX, K_MIXED, 70001, 0);
		add(KCOLL_OP_REDUCE_SCATTER, dtypes[d], KCOLL_SUM, K_DEV, 100003, 0);
		add(KCOLL_OP_ALLGATHER, dtypes[d], 0, K_DEV, 100003, 0);
		add(KCOLL_OP_BROADCAST, dtypes[d], 0, K_DEV, 100003, 1);
		add(KCOLL_OP_REDUCE_SCATTER, dtypes[d], KCOLL_MAX, K_INPLACE, 30001, 0);
		add(KCOLL_OP_ALLGATHER, dtypes[d], 0, K_INPLACE, 30001, 0);
	}
	add(KCOLL_OP_REDUCE_SCATTER, KCOLL_F32, KCOLL_MIN, K_MIXED, 5000, 0);
	add(KCOLL_OP_ALLGATHER, KCOLL_I64, 0, K_MIXED, 5000, 0);
	add(KCOLL_OP_BROADCAST, KCOLL_U8, 0, K_MIXED, 5000, 0);
	/* Many chunks and pinned slabs (64 KiB), tails unaligned to both. */
	add(KCOLL_OP_ALLREDUCE, KCOLL_F32, KCOLL_SUM, K_MIXED, 1000003, 0);
	add(KCOLL_OP_ALLGATHER, KCOLL_U8, 0, K_MIXED, 1048577, 0);
	add(KCOLL_OP_REDUCE_SCATTER, KCOLL_I64, KCOLL_MAX, K_MIXED, 250001, 0);
	add(KCOLL_OP_ALLREDUCE, KCOLL_BF16, KCOLL_SUM, K_DEV, 1000003, 0);
}

/* Finite values (no NaN: the GPU's NaN payload may differ, docs/gpu.md). */
static void fill(void *buf, int dtype, size_t count, int rank, int salt)
{
	fill_range(buf, dtype, count, rank, salt, 1000, 8.0, 1.0);
}

/* ---- kcolld ---- */
static const char *kcolld_fail_copy;	/* KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC for the next start */

/* The pinned pool holds 16 slabs (KD_DEV_SLABS): a pool that did not reuse
 * them would run out, and exiting with any still allocated makes kcolld
 * exit 70. */
static pid_t kcolld_start(const char *sock, const char *log, int gpu, int loopback)
{
	struct gpu_kcolld o = { exe_dir, dir, gpu, loopback, "16", kcolld_fail_copy };

	return gpu_kcolld_start(&o, sock, log);
}

/* ---- one rank of the collective groups ---- */
static size_t sbytes_of(const struct tcase *t, size_t esz)
{
	return coll_send_count(t->opcode, t->count, NR) * esz;
}

static size_t rbytes_of(const struct tcase *t, size_t esz)
{
	return coll_recv_count(t->opcode, t->count, NR) * esz;
}

/* What rank 'rank' must hold after case i. */
static void expect(const struct tcase *t, int i, int rank, uint8_t *want, uint8_t **in)
{
	size_t esz = kcoll_dtype_size(t->dtype);

	for (int r = 0; r < NR; r++)
		fill(in[r], t->dtype, sbytes_of(t, esz) / esz, r, i);
	coll_expected(t->opcode, t->dtype, t->op, t->count, t->root, NR, rank, in, want);
}

static void note(int i, int rank, int rc, const char *fmt, const char *detail)
{
	sh->bad[i][rank] = rc;
	snprintf(sh->why[i][rank], sizeof(sh->why[i][rank]), fmt, detail);
}

/* The subset run across two kcollds (multi-host path). */
static int cross_case(const struct tcase *t)
{
	return t->count >= 250001 || (t->count <= 100003 && (t->dtype == KCOLL_F32 ||
					t->dtype == KCOLL_BF16 || t->dtype == KCOLL_I64));
}

static int rank_main(int rank, const kcoll_unique_id_t *id, const char *sock, int cross)
{
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = sock };
	uint8_t *hin[NR], *want, *got, *hsend, *hrecv, *dsend, *drecv;
	struct kcoll_comm *comm;
	struct kcoll_req *req;
	struct kcoll *k;
	char why[KCOLL_GPU_TEXT];
	int r;

	if (gpu_dev_init(why, sizeof(why))) {
		fprintf(stderr, "# rank %d: no device: %s\n", rank, why);
		return 2;
	}
	for (int q = 0; q < NR; q++)
		hin[q] = malloc(BUF_BYTES);
	want = malloc(BUF_BYTES);
	got = malloc(BUF_BYTES);
	hsend = malloc(BUF_BYTES);
	hrecv = malloc(BUF_BYTES);
	dsend = gpu_dalloc(BUF_BYTES);
	drecv = gpu_dalloc(BUF_BYTES);
	if (!hin[0] || !hin[1] || !want || !got || !hsend || !hrecv || !dsend || !drecv)
		return 3;
	r = kcoll_connect(&o, &k);
	if (!r)
		r = kcoll_comm_init_rank(k, id, NR, rank, &comm);
	if (r) {
		fprintf(stderr, "# rank %d: join: %s\n", rank, kcoll_strerror(r));
		return 4;
	}
	for (int i = 0; i < ncases; i++) {
		const struct tcase *t = &cases[i];
		size_t esz = kcoll_dtype_size(t->dtype);
		size_t sb = sbytes_of(t, esz), rb = rbytes_of(t, esz);
		int host = t->kind == K_MIXED && rank == 1;
		uint8_t *send = host ? hsend : dsend, *recv = host ? hrecv : drecv;

		if (cross && !cross_case(t))
			continue;
		expect(t, i, rank, want, hin);
		if (t->kind == K_INPLACE && t->opcode == KCOLL_OP_ALLGATHER) {
			/* NCCL's in place: send is this rank's slot of recv */
			memset(got, 0xa5, rb);
			if (K->copy(drecv, got, rb) ||
			    K->copy(drecv + (size_t)rank * sb, hin[rank], sb)) {
				note(i, rank, -EIO, "filling device memory: %s", K->last_error());
				continue;
			}
			send = drecv + (size_t)rank * sb;
			recv = drecv;
			goto submit;
		}
		if (t->kind == K_INPLACE)
			recv = t->opcode == KCOLL_OP_REDUCE_SCATTER ? send + (size_t)rank * rb : send;
		if (host) {
			memcpy(hsend, hin[rank], sb);
			memset(hrecv, 0xa5, rb);
		} else {
			memset(got, 0xa5, rb);
			if (K->copy(dsend, hin[rank], sb) || (recv != send && K->copy(drecv, got, rb))) {
				note(i, rank, -EIO, "filling device memory: %s", K->last_error());
				continue;
			}
		}
submit:
		if (t->opcode == KCOLL_OP_BROADCAST)
			recv = send;	/* one buffer, the root's holds the data */
		r = submit_coll(comm, t->opcode, send, recv, t->count, t->dtype, t->op, t->root, &req);
		if (!r)
			r = kcoll_wait(req, 60000);
		if (r) {
			note(i, rank, r, "collective: %s", kcoll_strerror(r));
			continue;
		}
		if (host)
			memcpy(got, recv, rb);
		else if (K->copy(got, recv, rb)) {
			note(i, rank, -EIO, "reading device memory: %s", K->last_error());
			continue;
		}
		if (memcmp(got, want, rb)) {
			size_t at = 0;

			while (got[at] == want[at])
				at++;
			snprintf(sh->why[i][rank], sizeof(sh->why[i][rank]),
				 "wrong bytes from byte %zu of %zu", at, rb);
			sh->bad[i][rank] = 1;
		}
	}

	/* A freed allocation whose address comes back: the new one must be used. */
	if (!cross) {
		size_t n = REUSE_BYTES / sizeof(int32_t);
		int32_t *a = gpu_dalloc(REUSE_BYTES), *b;
		int32_t *h = (int32_t *)hsend, *w = (int32_t *)want, *o2 = (int32_t *)got;

		for (size_t x = 0; x < n; x++)
			h[x] = (int32_t)(x + 1000 * rank);
		r = a ? K->copy(a, h, REUSE_BYTES) : -ENOMEM;
		if (!r)
			r = kcoll_allreduce(comm, a, a, n, KCOLL_I32, KCOLL_SUM, &req);
		if (!r)
			r = kcoll_wait(req, 60000);
		K->mem_free(a);
		b = gpu_dalloc(REUSE_BYTES);
		sh->reuse_same_addr[rank] = b == a;
		for (size_t x = 0; x < n; x++) {
			h[x] = (int32_t)(7 * x + 3 + rank);
			w[x] = (int32_t)(7 * x + 3) * 2 + 1;
		}
		if (!r)
			r = b ? K->copy(b, h, REUSE_BYTES) : -ENOMEM;
		if (!r)
			r = kcoll_allreduce(comm, b, b, n, KCOLL_I32, KCOLL_SUM, &req);
		if (!r)
			r = kcoll_wait(req, 60000);
		if (!r)
			r = K->copy(o2, b, REUSE_BYTES);
		if (!r && memcmp(o2, w, REUSE_BYTES))
			r = 1;
		sh->reuse_rc[rank] = r;
		K->mem_free(b);
	}

	/*
	 * 100 staged all-reduces, rank 0 device, rank 1 host: 280004 bytes, one
	 * 256 KiB chunk (4 pinned slabs) and a tail of 17860 bytes. The pinned
	 * pool is reused, never grown past its bound (the fake refuses more).
	 */
	if (!cross) {
		size_t n = 70001;
		int32_t *h = (int32_t *)hsend, *w = (int32_t *)want, *o2 = (int32_t *)got;
		int32_t *sbuf = rank ? h : (int32_t *)dsend, *rbuf = rank ? (int32_t *)hrecv :
								 (int32_t *)drecv;

		r = 0;
		for (int it = 0; !r && it < 100; it++) {
			for (size_t x = 0; x < n; x++) {
				h[x] = (int32_t)(3 * x + it + rank);
				w[x] = (int32_t)(3 * x + it) * 2 + 1;
			}
			if (!rank)
				r = K->copy(dsend, h, n * 4);
			if (!r)
				r = kcoll_allreduce(comm, sbuf, rbuf, n, KCOLL_I32, KCOLL_SUM, &req);
			if (!r)
				r = kcoll_wait(req, 60000);
			if (!r && !rank)
				r = K->copy(o2, drecv, n * 4);
			else if (!r)
				memcpy(o2, hrecv, n * 4);
			if (!r && memcmp(o2, w, n * 4))
				r = 1;
			sh->loop_done[rank] = it + 1;
		}
		sh->loop_rc[rank] = r;
	}

	/* A count past the end of the allocation: refused before anything is sent. */
	if (!cross) {
		sh->past_rc[rank] = kcoll_allreduce(comm, dsend, drecv, BUF_BYTES / 4 + 1,
						    KCOLL_F32, KCOLL_SUM, &req);
		/* Dropping a registration: once, then it is gone; the next op registers again. */
		sh->dereg_rc[rank][0] = kcoll_mem_deregister(k, dsend);
		sh->dereg_rc[rank][1] = kcoll_mem_deregister(k, dsend);
		r = kcoll_allreduce(comm, dsend, drecv, 1000, KCOLL_F32, KCOLL_SUM, &req);
		sh->dereg_rc[rank][2] = r ? r : kcoll_wait(req, 60000);
	}
	kcoll_comm_destroy(comm);
	kcoll_disconnect(k);
	return 0;
}

static void report_groups(int ranks_ok)
{
	static const char *names[] = { "all-reduce, device send and recv",
				       "all-reduce in place on device buffers",
				       "one rank device, one host (staging)" };
	struct { int opcode, kind; const char *what; } groups[] = {
		{ KCOLL_OP_ALLREDUCE, K_DEV, NULL },
		{ KCOLL_OP_ALLREDUCE, K_INPLACE, NULL },
		{ -1, K_MIXED, NULL },
		{ KCOLL_OP_REDUCE_SCATTER, K_DEV, "reduce-scatter, device buffers" },
		{ KCOLL_OP_ALLGATHER, K_DEV, "all-gather, device buffers" },
		{ KCOLL_OP_BROADCAST, K_DEV, "broadcast from rank 1, device buffers" },
		{ KCOLL_OP_REDUCE_SCATTER, K_INPLACE, "reduce-scatter in place, device buffers" },
		{ KCOLL_OP_ALLGATHER, K_INPLACE, "all-gather in place, device buffers" },
	};

	for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
		int n = 0, bad = 0;

		for (int i = 0; i < ncases; i++) {
			const struct tcase *t = &cases[i];

			if (t->kind != groups[g].kind ||
			    (groups[g].opcode >= 0 && t->opcode != groups[g].opcode))
				continue;
			n++;
			for (int r = 0; r < NR; r++) {
				if (!sh->bad[i][r])
					continue;
				if (bad++ < 3)
					tap_diag("%s/%s count %zu kind %d rank %d: %s",
						 kcoll_dtype_name(t->dtype), kcoll_redop_name(t->op),
						 t->count, t->kind, r, sh->why[i][r]);
			}
		}
		tap_ok(ranks_ok && n && !bad, "%s: %s, 2 ranks, %d cases bit-exact against the CPU "
		       "reference (%d wrong)", run_name, groups[g].what ? groups[g].what : names[g],
		       n, bad);
	}
}

/* ---- raw-protocol checks: a hostile or buggy client ---- */
static int raw_comm(struct kcoll_raw *rc, const char *sock, uint32_t *comm_id)
{
	struct kcoll_id id;
	int r = kcoll_raw_open(rc, sock, 64);

	if (!r)
		r = kcoll_raw_unique_id(rc, &id);
	if (!r)
		r = kcoll_raw_comm_init(rc, &id, 1, 0, 10000, comm_id);
	return r;
}

static int raw_reg(struct kcoll_raw *rc, const void *base, size_t size,
		   const struct kcoll_gpu_ipc *h)
{
	struct kcoll_msg_mem_reg_dev m = { .hdr.type = KCOLL_MSG_MEM_REG_DEV };
	struct kcoll_msg_hdr rep;
	struct kcoll_gpu *g;

	kcoll_gpu_process(&g);
	m.addr = (uintptr_t)base;
	m.size = size;
	snprintf(m.pci_bus_id, sizeof(m.pci_bus_id), "%s", kcoll_gpu_info(g)->dev[0].pci_bus_id);
	memcpy(m.ipc, h, sizeof(*h));
	return kcoll_raw_call(rc, &m, sizeof(m), &rep, sizeof(rep), NULL, 10000);
}

/* A 1-rank all-reduce SQE of f32 over raw addresses; the CQE's result. */
static int raw_allreduce(struct kcoll_raw *rc, uint32_t comm_id, const void *send, void *recv,
			 size_t count, int mem)
{
	struct kcoll_sqe sqe = { .opcode = KCOLL_OP_ALLREDUCE, .user_data = 7 };
	struct kcoll_cqe cqe;
	int r;

	sqe.coll.comm_id = comm_id;
	sqe.coll.send_addr = (uintptr_t)send;
	sqe.coll.recv_addr = (uintptr_t)recv;
	sqe.coll.count = count;
	sqe.coll.dtype = KCOLL_F32;
	sqe.coll.redop = KCOLL_SUM;
	sqe.coll.send_mem = (uint8_t)mem;
	sqe.coll.recv_mem = (uint8_t)mem;
	r = kcoll_raw_run(rc, &sqe, &cqe, 60000);
	return r ? r : cqe.res;
}

enum { RAW_OK, RAW_UNREG, RAW_PAST, RAW_FOREIGN, RAW_PARTIAL, RAW_AFTER, RAW_N };
static const char *raw_names[RAW_N] = {
	"raw client: registered allocation, device all-reduce through the ring (result right)",
	"raw client: SQE naming an unregistered device address: -EFAULT",
	"raw client: SQE running past the registered allocation: -EFAULT",
	"raw client: registering another process's IPC handle: -EPERM",
	"raw client: a handle of part of an allocation, or of another size: -EINVAL",
	"raw client: kcolld still does device all-reduces after the bad inputs",
};

/* In a child: the raw checks against the kcolld with the GPU; exit status = bitmask of failures. */
static int raw_main(const char *sock)
{
	struct kcoll_raw rc;
	struct kcoll_gpu_ipc h, part;
	struct kcoll_gpu *g;
	char why[KCOLL_GPU_TEXT];
	size_t n = 65536, bytes = n * sizeof(float);
	float *host = malloc(bytes), *back = malloc(bytes);
	uint8_t *d, *other;
	uint32_t comm_id = 0;
	int fails = 0, r;

	if (!host || !back || gpu_dev_init(why, sizeof(why)))
		return 0x7f;
	d = gpu_dalloc(bytes);
	other = gpu_dalloc(bytes);	/* never registered */
	for (size_t i = 0; i < n; i++)
		host[i] = (float)i / 4;
	kcoll_gpu_process(&g);
	if (!d || !other || K->copy(d, host, bytes) ||
	    kcoll_gpu_ipc_export(g, d, bytes, &h, why, sizeof(why)) || raw_comm(&rc, sock, &comm_id))
		return 0x7f;

	r = raw_reg(&rc, d, bytes, &h);
	if (!r)
		r = raw_allreduce(&rc, comm_id, d, d + bytes / 2, n / 2, KCOLL_MEM_DEVICE);
	if (!r)
		r = K->copy(back, d + bytes / 2, bytes / 2);
	if (r || memcmp(back, host, bytes / 2))
		fails |= 1 << RAW_OK;
	r = raw_allreduce(&rc, comm_id, other, other, 16, KCOLL_MEM_DEVICE);
	if (r != -EFAULT)
		fails |= 1 << RAW_UNREG;
	r = raw_allreduce(&rc, comm_id, d + 4096, d + 4096, n - 1000, KCOLL_MEM_DEVICE);
	if (r != -EFAULT)
		fails |= 1 << RAW_PAST;
	for (int i = 0; i < 12000 && !__atomic_load_n(&sh->foreign_ready, __ATOMIC_ACQUIRE); i++)
		usleep(10000);	/* up to 120 s for the other child to start */
	r = raw_reg(&rc, other, bytes, &sh->foreign);
	__atomic_store_n(&sh->foreign_done, 1, __ATOMIC_RELEASE);
	if (r != -EPERM)
		fails |= 1 << RAW_FOREIGN;
	r = kcoll_gpu_ipc_export(g, other + 4096, 4096, &part, why, sizeof(why));
	if (r || raw_reg(&rc, other + 4096, 4096, &part) != -EINVAL)
		fails |= 1 << RAW_PARTIAL;
	r = kcoll_gpu_ipc_export(g, other, bytes, &part, why, sizeof(why));
	if (r || raw_reg(&rc, other, bytes - 4096, &part) != -EINVAL)
		fails |= 1 << RAW_PARTIAL;
	r = raw_allreduce(&rc, comm_id, d, d + bytes / 2, n / 2, KCOLL_MEM_DEVICE);
	if (!r)
		r = K->copy(back, d + bytes / 2, bytes / 2);
	if (r || memcmp(back, host, bytes / 2))
		fails |= 1 << RAW_AFTER;
	kcoll_raw_close(&rc);
	return fails;
}

/* In a child: export an allocation for the raw child to present as its own. */
static int foreign_main(void)
{
	char why[KCOLL_GPU_TEXT];
	struct kcoll_gpu *g;
	void *d;

	if (gpu_dev_init(why, sizeof(why)))
		return 1;
	d = gpu_dalloc(65536 * sizeof(float));
	kcoll_gpu_process(&g);
	if (!d || kcoll_gpu_ipc_export(g, d, 65536 * sizeof(float), &sh->foreign, why, sizeof(why)))
		return 2;
	__atomic_store_n(&sh->foreign_ready, 1, __ATOMIC_RELEASE);
	/* The handle stays valid until the raw child has presented it. */
	for (int i = 0; i < 12000 && !__atomic_load_n(&sh->foreign_done, __ATOMIC_ACQUIRE); i++)
		usleep(10000);
	return 0;
}

/* Connect to sock and make a one-rank communicator. */
static int join_alone(const char *sock, struct kcoll **k, struct kcoll_comm **comm)
{
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = sock };
	kcoll_unique_id_t id;
	int r = kcoll_connect(&o, k);

	if (!r)
		r = kcoll_get_unique_id(*k, &id);
	if (!r)
		r = kcoll_comm_init_rank(*k, &id, 1, 0, comm);
	return r;
}

/* In a child: device buffers against the kcolld without a GPU; exit status = failures. */
static int nogpu_main(const char *sock)
{
	struct kcoll_gpu_ipc h;
	struct kcoll_comm *comm;
	struct kcoll_req *req;
	struct kcoll_raw rc;
	struct kcoll_gpu *g;
	struct kcoll *k;
	char why[KCOLL_GPU_TEXT];
	uint32_t comm_id;
	uint8_t *d;
	int fails = 0, r;

	if (gpu_dev_init(why, sizeof(why)))
		return 0x7f;
	d = gpu_dalloc(65536);
	kcoll_gpu_process(&g);
	if (!d || kcoll_gpu_ipc_export(g, d, 65536, &h, why, sizeof(why)))
		return 0x7f;
	if (join_alone(sock, &k, &comm))
		return 0x7e;
	r = kcoll_allreduce(comm, d, d, 1024, KCOLL_F32, KCOLL_SUM, &req);
	if (r != -EOPNOTSUPP || !strstr(kcoll_strerror(r), "kcollctl gpu"))
		fails |= 1;
	r = kcoll_allreduce(comm, d, d, 0, KCOLL_F32, KCOLL_SUM, &req);	/* nothing to register */
	if (!r)
		r = kcoll_wait(req, 30000);
	if (r)
		fails |= 2;
	kcoll_comm_destroy(comm);
	kcoll_disconnect(k);
	r = raw_comm(&rc, sock, &comm_id);
	if (r)
		return 0x7d;
	if (raw_reg(&rc, d, 65536, &h) != -EOPNOTSUPP)
		fails |= 4;
	if (raw_allreduce(&rc, comm_id, d, d, 1024, KCOLL_MEM_DEVICE) != -EOPNOTSUPP)
		fails |= 8;
	kcoll_raw_close(&rc);
	return fails;
}

/*
 * In a child, against a kcolld whose fake driver fails its 3rd asynchronous
 * copy: a one-rank all-reduce from a device buffer (4 pinned slabs) into host
 * memory fails with that error; the next one works, bit-exact.
 */
static int fault_main(const char *sock)
{
	size_t n = 65536;
	struct kcoll_comm *comm;
	struct kcoll_req *req;
	struct kcoll *k;
	char why[KCOLL_GPU_TEXT];
	uint8_t *d, *h = malloc(n * 4), *w = malloc(n * 4);
	int r;

	if (!h || !w || gpu_dev_init(why, sizeof(why)))
		return 0x7f;
	d = gpu_dalloc(n * 4);
	if (!d)
		return 0x7f;
	if (join_alone(sock, &k, &comm))
		return 0x7e;
	for (int it = 0; it < 2; it++) {
		for (size_t x = 0; x < n * 4; x++)
			w[x] = (uint8_t)(x * 7 + it);
		memset(h, 0xa5, n * 4);
		r = K->copy(d, w, n * 4);
		if (!r)
			r = kcoll_allreduce(comm, d, h, n, KCOLL_F32, KCOLL_MAX, &req);
		if (!r)
			r = kcoll_wait(req, 60000);
		if (!r && memcmp(h, w, n * 4))
			r = 1;
		sh->fault_rc[it] = r;
	}
	kcoll_comm_destroy(comm);
	kcoll_disconnect(k);
	return 0;
}

static void run_fault(void)
{
	char sock[PATH_MAX + 16], log[PATH_MAX + 16];
	pid_t kd, child;
	int st, n;

	if (strcmp(run_name, "fake")) {
		for (int i = 0; i < 4; i++)
			tap_skip("%s: copy failure injection needs the fake driver", run_name);
		return;
	}
	snprintf(sock, sizeof(sock), "%s/%s-fault.sock", dir, run_name);
	snprintf(log, sizeof(log), "%s/%s-fault.log", dir, run_name);
	kcolld_fail_copy = "3";
	kd = kcolld_start(sock, log, 1, 0);
	kcolld_fail_copy = NULL;
	sh->fault_rc[0] = sh->fault_rc[1] = 0x100;
	child = kd < 0 ? -1 : fork();
	if (child == 0)
		_exit(fault_main(sock));
	st = wait_child(child);
	tap_ok(st == 0 && sh->fault_rc[0] == -EIO, "%s: an asynchronous device-to-host copy that "
	       "fails (injected) fails the op with its error, -EIO (child %d, op %d)", run_name, st,
	       sh->fault_rc[0]);
	tap_ok(st == 0 && sh->fault_rc[1] == 0, "%s: the same kcolld's next staged op works, "
	       "bit-exact (%d)", run_name, sh->fault_rc[1]);
	n = count_in_file(log, "asynchronous copy of 262144 bytes from the device failed");
	tap_ok(n > 0, "%s: kcolld logs the failed copy with the driver's error (%d lines)", run_name,
	       n);
	st = kcolld_stop(kd);
	tap_ok(st == 0, "%s: that kcolld exits 0 on SIGTERM, pinned pool freed (%d)", run_name, st);
}

static void run_cross(void);

#define RUN_CHECKS	(8 + 4 + RAW_N + 4 + 2 + 2 + 1 + 4)

static void run_all(void)
{
	char sock[PATH_MAX + 16], log[PATH_MAX + 16], sock0[PATH_MAX + 16], log0[PATH_MAX + 16];
	pid_t kd, kd0, ranks[NR], raw, foreign, nogpu;
	kcoll_unique_id_t id;
	struct kcoll_connect_opts o = { .size = sizeof(o) };
	struct kcoll *k = NULL;
	int ok = 1, st, n, want;

	snprintf(sock, sizeof(sock), "%s/%s.sock", dir, run_name);
	snprintf(log, sizeof(log), "%s/%s.log", dir, run_name);
	snprintf(sock0, sizeof(sock0), "%s/%s-nogpu.sock", dir, run_name);
	snprintf(log0, sizeof(log0), "%s/%s-nogpu.log", dir, run_name);
	memset(sh, 0, sizeof(*sh));
	kd = kcolld_start(sock, log, 1, 0);
	kd0 = kcolld_start(sock0, log0, 0, 0);
	o.socket_path = sock;
	if (kd < 0 || kd0 < 0 || kcoll_connect(&o, &k) || kcoll_get_unique_id(k, &id)) {
		for (int i = 0; i < RUN_CHECKS; i++)
			tap_ok(0, "%s: start the private kcollds (see %s)", run_name, dir);
		kcolld_stop(kd);
		kcolld_stop(kd0);
		if (k)
			kcoll_disconnect(k);
		return;
	}
	kcoll_disconnect(k);

	for (int r = 0; r < NR; r++) {
		ranks[r] = fork();
		if (ranks[r] == 0)
			_exit(rank_main(r, &id, sock, 0));
	}
	for (int r = 0; r < NR; r++) {
		st = wait_child(ranks[r]);
		if (st) {
			tap_diag("rank %d exited with %d", r, st);
			ok = 0;
		}
	}
	report_groups(ok);
	n = count_in_file(log, "runs on GPU");
	want = 0;
	for (int i = 0; i < ncases; i++)
		want += cases[i].kind != K_MIXED;
	tap_ok(n >= want, "%s: kcolld ran the all-device ops on the GPU (kcoll_gpu_reduce_n, "
	       "device-to-device copies): %d ops logged, %d cases need it", run_name, n, want);
	if (sh->reuse_same_addr[0] && sh->reuse_same_addr[1])
		tap_ok(ok && !sh->reuse_rc[0] && !sh->reuse_rc[1],
		       "%s: an allocation freed and made again at the same address: libkcoll sees the "
		       "new buffer id, re-registers, the result is the new data's (%d %d)",
		       run_name, sh->reuse_rc[0], sh->reuse_rc[1]);
	else
		tap_skip("%s: the allocator did not hand the freed address out again", run_name);
	tap_ok(ok && !sh->loop_rc[0] && !sh->loop_rc[1] && sh->loop_done[0] == 100 &&
	       sh->loop_done[1] == 100, "%s: 100 staged all-reduces (one rank device, one host) on "
	       "one kcolld, bit-exact (the fake driver also holds the pinned pool to 16 slabs) (%d %d, %d "
	       "%d done)", run_name, sh->loop_rc[0], sh->loop_rc[1], sh->loop_done[0],
	       sh->loop_done[1]);
	tap_ok(ok && sh->past_rc[0] == -EINVAL && sh->past_rc[1] == -EINVAL,
	       "%s: a count past the end of the device allocation: -EINVAL before submitting "
	       "(%d %d)", run_name, sh->past_rc[0], sh->past_rc[1]);

	tap_ok(ok && !sh->dereg_rc[0][0] && !sh->dereg_rc[1][0] && sh->dereg_rc[0][1] == -ENOENT &&
	       sh->dereg_rc[1][1] == -ENOENT && !sh->dereg_rc[0][2] && !sh->dereg_rc[1][2],
	       "%s: kcoll_mem_deregister of a device allocation: 0, then -ENOENT; the next op "
	       "registers it again and works (%d %d %d)", run_name, sh->dereg_rc[0][0],
	       sh->dereg_rc[0][1], sh->dereg_rc[0][2]);

	foreign = fork();
	if (foreign == 0)
		_exit(foreign_main());
	raw = fork();
	if (raw == 0)
		_exit(raw_main(sock));
	st = wait_child(raw);
	__atomic_store_n(&sh->foreign_done, 1, __ATOMIC_RELEASE);	/* whatever raw did */
	wait_child(foreign);
	for (int i = 0; i < RAW_N; i++)
		tap_ok(st >= 0 && st != 0x7f && !(st & (1 << i)), "%s: %s (child %d)", run_name,
		       raw_names[i], st);

	nogpu = fork();
	if (nogpu == 0)
		_exit(nogpu_main(sock0));
	st = wait_child(nogpu);
	tap_ok(st >= 0 && st < 0x7d && !(st & 1), "%s: kcolld without a GPU: an all-reduce of a "
	       "device buffer fails -EOPNOTSUPP, kcoll_strerror says to run kcollctl gpu (%d)",
	       run_name, st);
	tap_ok(st >= 0 && st < 0x7d && !(st & 2), "%s: kcolld without a GPU: host-only ops still "
	       "work for that client (%d)", run_name, st);
	tap_ok(st >= 0 && st < 0x7d && !(st & 12), "%s: kcolld without a GPU: a raw device "
	       "registration and a device SQE both get -EOPNOTSUPP (%d)", run_name, st);
	n = count_in_file(log0, "device buffers need a GPU in kcolld");
	tap_ok(n > 0, "%s: kcolld without a GPU logs why it refused (%d lines)", run_name, n);

	st = kcolld_stop(kd);
	tap_ok(st == 0, "%s: kcolld with the GPU drained and exited 0 on SIGTERM (%d)", run_name,
	       st);
	st = kcolld_stop(kd0);
	tap_ok(st == 0, "%s: kcolld without a GPU exited 0 on SIGTERM (%d)", run_name, st);
	run_fault();
	run_cross();
}

/*
 * Across two kcollds on loopback (each rank on its own daemon): the multi-host
 * path. A host whose rank is all on the GPU copies to and from the device
 * directly (mh.c's GPU path, tests/test_gpu_mh.c); the mixed cases' other
 * host reads and writes device buffers through kd_mem_dev, host staging.
 */
static void run_cross(void)
{
	char sk[2][PATH_MAX + 16], lg[2][PATH_MAX + 16];
	struct kcoll_connect_opts o = { .size = sizeof(o) };
	kcoll_unique_id_t id;
	struct kcoll *k = NULL;
	pid_t kd[2], ranks[NR];
	int ok = 1, n = 0, bad = 0, st[2];

	for (int h = 0; h < 2; h++) {
		snprintf(sk[h], sizeof(sk[h]), "%s/%s-host%d.sock", dir, run_name, h);
		snprintf(lg[h], sizeof(lg[h]), "%s/%s-host%d.log", dir, run_name, h);
		kd[h] = kcolld_start(sk[h], lg[h], 1, 1);
	}
	memset(sh, 0, sizeof(*sh));
	o.socket_path = sk[0];
	if (kd[0] < 0 || kd[1] < 0 || kcoll_connect(&o, &k) || kcoll_get_unique_id(k, &id)) {
		ok = 0;
	} else {
		for (int r = 0; r < NR; r++) {
			ranks[r] = fork();
			if (ranks[r] == 0)
				_exit(rank_main(r, &id, sk[r], 1));
		}
		for (int r = 0; r < NR; r++) {
			int rc = wait_child(ranks[r]);

			if (rc) {
				tap_diag("cross rank %d exited with %d", r, rc);
				ok = 0;
			}
		}
	}
	if (k)
		kcoll_disconnect(k);
	for (int i = 0; i < ncases; i++) {
		if (!cross_case(&cases[i]))
			continue;
		n++;
		for (int r = 0; r < NR; r++) {
			if (sh->bad[i][r] && bad++ < 3)
				tap_diag("across daemons: %s/%s count %zu kind %d rank %d: %s",
					 kcoll_dtype_name(cases[i].dtype), kcoll_redop_name(cases[i].op),
					 cases[i].count, cases[i].kind, r, sh->why[i][r]);
		}
	}
	tap_ok(ok && n && !bad, "%s: across two kcollds (one rank each, TCP on loopback): %d cases "
	       "of every collective on device buffers, bit-exact "
	       "(%d wrong)", run_name, n, bad);
	st[0] = kcolld_stop(kd[0]);
	st[1] = kcolld_stop(kd[1]);
	tap_ok(st[0] == 0 && st[1] == 0, "%s: both kcollds exited 0 on SIGTERM (%d %d)", run_name,
	       st[0], st[1]);
}

int main(int argc, char **argv)
{
	struct gpu_test t = { "TEST_GPU_RING", "gpu-ring", RUN_CHECKS, run_all, exe_dir, dir,
			      &run_name };

	build_cases();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	return gpu_test_main(&t, argv);
}

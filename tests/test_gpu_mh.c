// SPDX-License-Identifier: MIT
/*
 * The GPU path of multi-host ops (docs/multihost.md "Device buffers"): two
 * kcollds on loopback (two hosts), three ranks on each, every buffer a device
 * buffer on one GPU. kcolld then reduces the local ranks' inputs on the GPU
 * into one device buffer and copies that once to the host accumulator
 * (phase 1), and copies the result once to one rank's buffer and
 * device-to-device to the others (phase 3), instead of staging every rank's
 * buffer through host memory and reducing on the CPU.
 *
 * Checks: every collective, several dtypes and sizes (tails that are no
 * multiple of a piece), bit-exact against the CPU reference; one rank with
 * host buffers (the CPU path on its host, the GPU path on the other); and
 * that the GPU path ran, from kcolld's debug log ("local phases on GPU"):
 * exactly once per device op on each host whose ranks are all on the GPU;
 * and an injected copy failure in phase 1 and in phase 3 (fake only).
 *
 * Two runs, as tests/test_gpu_ring.c: the real driver when this machine has
 * a usable GPU (else SKIP), then the fake driver (gpu/fake_cuda.c), whose
 * device memory is host memory, so the results are checkable byte by byte.
 * CUDA is only ever initialised in forked children.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kcoll_gpu.h"
#include "reduce.h"
#include "gpu_kcolld.h"
#include "test_util.h"

#define NHOSTS		2
#define NR		6	/* rank r on host r % NHOSTS: three per host, interleaved */
#define MAX_CASES	128
#define BUF_BYTES	(2u << 20)
#define MIXED_RANK	1	/* host 1: its K_MIXED buffers are host memory */
#define RUN_CHECKS	13

enum { K_DEV, K_INPLACE, K_MIXED };

struct tcase {
	int opcode, dtype, op, kind, root;
	size_t count;
};

struct shared {
	int bad[MAX_CASES][NR];		/* 0 ok, else -errno or 1 (wrong bytes) */
	char why[MAX_CASES][NR][96];
};

static struct tcase cases[MAX_CASES];
static int ncases;
static struct shared *sh;
static char exe_dir[PATH_MAX], dir[PATH_MAX];
static const char *run_name;
static const char *fail_copy;	/* KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC for the next kcolld */
static int nrun;		/* cases the ranks run: ncases, or 1 (the fault run) */

TEST_CUDA_SAN_DEFAULTS

static const int dtypes[] = { KCOLL_F32, KCOLL_F16, KCOLL_BF16, KCOLL_F64, KCOLL_I32, KCOLL_I64 };
static const int ops[] = { KCOLL_SUM, KCOLL_MAX, KCOLL_AVG };
static const size_t sizes[] = { 1, 1023, 100003 };

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
		add(KCOLL_OP_REDUCE_SCATTER, dtypes[d], KCOLL_SUM, K_DEV, 30001, 0);
		add(KCOLL_OP_REDUCE_SCATTER, dtypes[d], KCOLL_MAX, K_INPLACE, 1023, 0);
		add(KCOLL_OP_ALLGATHER, dtypes[d], 0, K_DEV, 30001, 0);
		add(KCOLL_OP_ALLGATHER, dtypes[d], 0, K_INPLACE, 1023, 0);
		/* root 3 on host 1, root 2 on host 0 */
		add(KCOLL_OP_BROADCAST, dtypes[d], 0, K_DEV, 100003, d % 2 ? 2 : 3);
	}
	add(KCOLL_OP_ALLREDUCE, KCOLL_F32, KCOLL_SUM, K_MIXED, 70001, 0);
	add(KCOLL_OP_REDUCE_SCATTER, KCOLL_I32, KCOLL_MAX, K_MIXED, 30001, 0);
	add(KCOLL_OP_ALLGATHER, KCOLL_I64, 0, K_MIXED, 30001, 0);
	add(KCOLL_OP_BROADCAST, KCOLL_BF16, 0, K_MIXED, 5000, MIXED_RANK);
}

/*
 * Values whose sums over the six ranks are exact in every float type, in
 * any order (the hosts' reduction order differs from the reference's):
 * quarters in [-4, 4]. Integers: the hash (wrap-around sums are exact too).
 */
static void fill(void *buf, int dtype, size_t count, int rank, int salt)
{
	if (dtype != KCOLL_F64) {
		fill_range(buf, dtype, count, rank, salt, 16, 4.0, 1.0);
		return;
	}
	fill_range(buf, KCOLL_F32, count, rank, salt, 16, 4.0, 1.0);
	for (size_t i = count; i-- > 0;)
		((double *)buf)[i] = ((float *)buf)[i];
}

/* ---- kcolld ---- */
static pid_t kcolld_start(const char *sock, const char *log)
{
	struct gpu_kcolld o = { exe_dir, dir, 1, 1, NULL, fail_copy };

	return gpu_kcolld_start(&o, sock, log);
}

/* ---- one rank ---- */
static int rank_main(int rank, const kcoll_unique_id_t *id, const char *sock)
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
		if (!(hin[q] = malloc(BUF_BYTES)))
			return 3;
	want = malloc(BUF_BYTES);
	got = malloc(BUF_BYTES);
	hsend = malloc(BUF_BYTES);
	hrecv = malloc(BUF_BYTES);
	dsend = gpu_dalloc(BUF_BYTES);
	drecv = gpu_dalloc(BUF_BYTES);
	if (!want || !got || !hsend || !hrecv || !dsend || !drecv)
		return 3;
	r = kcoll_connect(&o, &k);
	if (!r)
		r = kcoll_comm_init_rank(k, id, NR, rank, &comm);
	if (r) {
		fprintf(stderr, "# rank %d: join: %s\n", rank, kcoll_strerror(r));
		return 4;
	}
	for (int i = 0; i < nrun; i++) {
		const struct tcase *t = &cases[i];
		size_t esz = kcoll_dtype_size(t->dtype);
		size_t sb = coll_send_count(t->opcode, t->count, NR) * esz;
		size_t rb = coll_recv_count(t->opcode, t->count, NR) * esz;
		int host = t->kind == K_MIXED && rank == MIXED_RANK;
		uint8_t *send = host ? hsend : dsend, *recv = host ? hrecv : drecv;

		for (int q = 0; q < NR; q++)
			fill(hin[q], t->dtype, sb / esz, q, i);
		coll_expected(t->opcode, t->dtype, t->op, t->count, t->root, NR, rank, hin, want);
		memset(got, 0xa5, rb);
		if (t->kind == K_INPLACE && t->opcode == KCOLL_OP_ALLGATHER) {
			/* NCCL's in place: send is this rank's slot of recv */
			send = drecv + (size_t)rank * sb;
			recv = drecv;
			if (K->copy(drecv, got, rb) || K->copy(send, hin[rank], sb))
				goto dev_fail;
		} else if (t->kind == K_INPLACE) {
			recv = t->opcode == KCOLL_OP_REDUCE_SCATTER ? send + (size_t)rank * rb : send;
			if (K->copy(send, hin[rank], sb))
				goto dev_fail;
		} else if (host) {
			memcpy(hsend, hin[rank], sb);
			memset(hrecv, 0xa5, rb);
		} else if (K->copy(dsend, hin[rank], sb) || K->copy(drecv, got, rb)) {
			goto dev_fail;
		}
		if (t->opcode == KCOLL_OP_BROADCAST)
			recv = send;	/* one buffer, the root's holds the data */
		r = submit_coll(comm, t->opcode, send, recv, t->count, t->dtype, t->op, t->root, &req);
		if (!r)
			r = kcoll_wait(req, 60000);
		if (r) {
			sh->bad[i][rank] = r;
			snprintf(sh->why[i][rank], sizeof(sh->why[i][rank]), "collective: %s",
				 kcoll_strerror(r));
			continue;
		}
		if (host)
			memcpy(got, recv, rb);
		else if (K->copy(got, recv, rb))
			goto dev_fail;
		if (memcmp(got, want, rb)) {
			size_t at = 0;

			while (got[at] == want[at])
				at++;
			snprintf(sh->why[i][rank], sizeof(sh->why[i][rank]),
				 "wrong bytes from byte %zu of %zu", at, rb);
			sh->bad[i][rank] = 1;
		}
		continue;
dev_fail:
		sh->bad[i][rank] = -EIO;
		snprintf(sh->why[i][rank], sizeof(sh->why[i][rank]), "device memory: %s",
			 K->last_error());
	}
	kcoll_comm_destroy(comm);
	kcoll_disconnect(k);
	return 0;
}

/* Cases of one kind and opcode (-1: any): how many, how many ranks wrong. */
static int report(int opcode, int kind, const char *what, int ranks_ok)
{
	int n = 0, bad = 0;

	for (int i = 0; i < ncases; i++) {
		const struct tcase *t = &cases[i];

		if (t->kind != kind || (opcode >= 0 && t->opcode != opcode))
			continue;
		n++;
		for (int r = 0; r < NR; r++) {
			if (!sh->bad[i][r])
				continue;
			if (bad++ < 3)
				tap_diag("case %d %s/%s count %zu kind %d rank %d: %s", i,
					 kcoll_dtype_name(t->dtype), kcoll_redop_name(t->op), t->count,
					 t->kind, r, sh->why[i][r]);
		}
	}
	tap_ok(ranks_ok && n && !bad, "%s: %s, %d hosts x %d ranks, %d cases bit-exact against the "
	       "CPU reference (%d wrong)", run_name, what, NHOSTS, NR / NHOSTS, n, bad);
	return n;
}

/* Start a kcolld per host (host 0's with fail_copy) and the NR ranks, each
 * running the first nrun cases; 1 when every rank exited 0. */
static int run_ranks(const char *tag, pid_t *kd, char (*lg)[PATH_MAX + 16])
{
	char sk[NHOSTS][PATH_MAX + 16];
	struct kcoll_connect_opts o = { .size = sizeof(o) };
	kcoll_unique_id_t id;
	struct kcoll *k = NULL;
	pid_t ranks[NR];
	int ok = 1;

	memset(sh, 0, sizeof(*sh));
	for (int h = 0; h < NHOSTS; h++) {
		snprintf(sk[h], sizeof(sk[h]), "%s/%s-%s%d.sock", dir, run_name, tag, h);
		snprintf(lg[h], sizeof(lg[h]), "%s/%s-%s%d.log", dir, run_name, tag, h);
		kd[h] = kcolld_start(sk[h], lg[h]);
		fail_copy = NULL;
	}
	o.socket_path = sk[0];
	if (kd[0] < 0 || kd[1] < 0 || kcoll_connect(&o, &k) || kcoll_get_unique_id(k, &id)) {
		tap_diag("%s: starting the kcollds failed (logs in %s)", run_name, dir);
		ok = 0;
	} else {
		for (int r = 0; r < NR; r++) {
			ranks[r] = fork();
			if (ranks[r] == 0)
				_exit(rank_main(r, &id, sk[r % NHOSTS]));
		}
		for (int r = 0; r < NR; r++) {
			int rc = wait_child(ranks[r]);

			if (rc) {
				tap_diag("%s: rank %d exited with %d", run_name, r, rc);
				ok = 0;
			}
		}
	}
	if (k)
		kcoll_disconnect(k);
	return ok;
}

static void run_cases(void)
{
	char lg[NHOSTS][PATH_MAX + 16];
	pid_t kd[NHOSTS];
	int ok, ndev = 0, nmixed, st[NHOSTS], seen[NHOSTS];

	nrun = ncases;
	ok = run_ranks("host", kd, lg);
	ndev += report(KCOLL_OP_ALLREDUCE, K_DEV, "all-reduce sum/max/avg, device buffers", ok);
	ndev += report(KCOLL_OP_ALLREDUCE, K_INPLACE, "all-reduce in place, device buffers", ok);
	ndev += report(KCOLL_OP_REDUCE_SCATTER, K_DEV, "reduce-scatter, device buffers", ok);
	ndev += report(KCOLL_OP_REDUCE_SCATTER, K_INPLACE, "reduce-scatter in place", ok);
	ndev += report(KCOLL_OP_ALLGATHER, K_DEV, "all-gather, device buffers", ok);
	ndev += report(KCOLL_OP_ALLGATHER, K_INPLACE, "all-gather in place", ok);
	ndev += report(KCOLL_OP_BROADCAST, K_DEV, "broadcast from a rank of either host", ok);
	nmixed = report(-1, K_MIXED, "one rank with host buffers (its host: the CPU path)", ok);

	/* The GPU path ran: once per op where every local buffer is on the GPU. */
	st[0] = kcolld_stop(kd[0]);
	st[1] = kcolld_stop(kd[1]);
	for (int h = 0; h < NHOSTS; h++)
		seen[h] = count_in_file(lg[h], "local phases on GPU");
	tap_ok(ok && seen[0] == ndev + nmixed && seen[1] == ndev && st[0] == 0 && st[1] == 0,
	       "%s: the local phases ran on the GPU for every op whose local buffers all are "
	       "device buffers (host 0: %d of %d ops, host 1: %d of %d), and both kcollds exited "
	       "0 (%d %d)", run_name, seen[0], ndev + nmixed, seen[1], ndev, st[0], st[1]);
}

/*
 * Host 0's Nth asynchronous copy fails (the fake's injection) in the first
 * case, an all-reduce: the 1st is phase 1's copy of the reduction to the
 * host, and then the op must fail on all six ranks, on both hosts (no hang);
 * the 2nd is phase 3's copy to the device, and then it fails on host 0's
 * three ranks only. kcolld must name the comm, op, phase and step.
 */
static void run_fault(const char *nth, int phase)
{
	char lg[NHOSTS][PATH_MAX + 16], needle[96];
	pid_t kd[NHOSTS];
	int ok, right = 0, n, st[NHOSTS];

	if (strcmp(run_name, "fake")) {
		for (int i = 0; i < 2; i++)
			tap_skip("%s: copy failure injection needs the fake driver", run_name);
		return;
	}
	nrun = 1;
	fail_copy = nth;
	ok = run_ranks(phase == 1 ? "fault1-" : "fault3-", kd, lg);
	/* Phase 3: host 1's ranks complete, bit-exact (sh->bad 0). */
	for (int r = 0; r < NR; r++)
		right += phase == 1 || r % NHOSTS == 0 ? sh->bad[0][r] < 0 : !sh->bad[0][r];
	tap_ok(ok && right == NR, "%s: a failed copy in phase %d on host 0 fails the op on %s "
	       "(%d of %d ranks as expected)", run_name, phase,
	       phase == 1 ? "all ranks of both hosts" : "host 0's ranks, host 1's complete", right,
	       NR);
	st[0] = kcolld_stop(kd[0]);
	st[1] = kcolld_stop(kd[1]);
	snprintf(needle, sizeof(needle), "GPU 0 phase %d copy to the %s failed: CUDA_ERROR_UNKNOWN",
		 phase, phase == 1 ? "host" : "device");
	n = count_in_file(lg[0], needle);
	tap_ok(n > 0 && st[0] == 0 && st[1] == 0, "%s: kcolld names the comm, op and step of "
	       "the failed GPU copy in phase %d (%d lines) and both exited 0 (%d %d)", run_name,
	       phase, n, st[0], st[1]);
}

static void run_all(void)
{
	run_cases();
	run_fault("1", 1);
	run_fault("2", 3);
}

int main(int argc, char **argv)
{
	struct gpu_test t = { "TEST_GPU_MH", "gpu-mh", RUN_CHECKS, run_all, exe_dir, dir,
			      &run_name };

	build_cases();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	return gpu_test_main(&t, argv);
}

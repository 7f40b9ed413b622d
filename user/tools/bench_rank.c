/* SPDX-License-Identifier: MIT */
/*
 * One rank of kcoll-bench, whichever process it runs in (a forked child, a
 * launched --hosts worker, a process under mpirun): join the communicator,
 * all-gather the ranks' host names, then for every size an optional checked
 * pass, warmup, a barrier and the timed iterations (each submitted and waited
 * for, bounded by KCOLL_TIMEOUT_MS + KB_WAIT_SLACK_MS), and an all-gather of
 * every rank's mean and wrong count. Rank 0 sends the slowest mean and the
 * total to its parent as "host" and "row" lines, or under mpirun to the
 * report itself; any rank's failure is a "fail" line (kb_say_fail).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcoll-bench.h"
#include "launch.h"

bool kb_to_parent;

/* What one rank needs to run the collective. */
struct bench_rank {
	const struct kbench_opts *o;
	struct kcoll *k;
	struct kcoll_comm *comm;
	int rank;
	int wait_ms;
	void *send, *recv;
	char *xbuf;			/* exchanges: KB_NAME_BYTES out, then nranks slots in */
	struct report *rep;		/* rank 0 under mpirun: print here; else NULL */
};

int __attribute__((format(printf, 4, 5)))
kb_say_fail(int rank, int err, int blamed, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (kb_to_parent) {
		for (char *p = msg; *p; p++)
			if (*p == '\n')
				*p = ' ';
		printf("fail %d %d %d %s %s: %s\n", rank, err, blamed, kb_my_host, msg,
		       kcoll_strerror(err));
		fflush(stdout);
	} else {
		fprintf(stderr, "%s: rank %d (%s): %s: %s\n", KB_PROG, rank, kb_my_host, msg,
			kcoll_strerror(err));
	}
	return err;
}

/*
 * In place follows kcoll.h (as NCCL): recv holds the whole vector, and this
 * rank's slice of it is the all-gather input or the reduce-scatter output.
 */
static void *rank_slice(const struct bench_rank *b, size_t param)
{
	return bench_rank_slice(&b->o->b, b->recv, b->rank, param);
}

static int wait_req(struct bench_rank *b, struct kcoll_req *req, const char *what)
{
	struct kcoll_status st;
	int r = kcoll_wait_status(req, b->wait_ms, &st);

	if (r == 0)
		return kb_say_fail(b->rank, -ETIMEDOUT, -1, "%s still pending after %d s", what,
				   b->wait_ms / 1000);
	if (r < 0)
		return kb_say_fail(b->rank, r, -1, "%s: wait failed", what);
	if (st.result && st.err_rank >= 0)
		return kb_say_fail(b->rank, st.result, st.err_rank, "%s failed (daemon blames rank %d)", what,
				   st.err_rank);
	if (st.result)
		return kb_say_fail(b->rank, st.result, -1, "%s failed", what);
	return 0;
}

static int run_coll(struct bench_rank *b, bool inplace, size_t param)
{
	const struct kbench_opts *o = b->o;
	struct kcoll_req *req;
	int r;

	switch (o->b.coll) {
	case BENCH_ALLREDUCE:
		r = kcoll_allreduce(b->comm, inplace ? b->recv : b->send, b->recv, param,
				    o->dtype, o->op, &req);
		break;
	case BENCH_REDUCESCATTER:
		r = kcoll_reduce_scatter(b->comm, inplace ? b->recv : b->send,
					 inplace ? rank_slice(b, param) : b->recv, param,
					 o->dtype, o->op, &req);
		break;
	case BENCH_ALLGATHER:
		r = kcoll_allgather(b->comm, inplace ? rank_slice(b, param) : b->send, b->recv,
				    param, o->dtype, &req);
		break;
	default:
		/* kcoll_broadcast has one buffer: both columns time the same call */
		r = kcoll_broadcast(b->comm, b->recv, param, o->dtype, o->b.root, &req);
		break;
	}
	if (r)
		return kb_say_fail(b->rank, r, -1, "submitting %s of %zu elements",
				   bench_coll_name(o->b.coll), param);
	return wait_req(b, req, bench_coll_name(o->b.coll));
}

static int barrier(struct bench_rank *b)
{
	struct kcoll_req *req;
	int r = kcoll_barrier(b->comm, &req);

	if (r)
		return kb_say_fail(b->rank, r, -1, "submitting a barrier");
	return wait_req(b, req, "barrier");
}

/* All-gather len bytes (at most KB_NAME_BYTES) of every rank; rank r's are at *all + r * len. */
static int exchange(struct bench_rank *b, const void *mine, size_t len, const char **all,
		    const char *what)
{
	struct kcoll_req *req;
	int r;

	memcpy(b->xbuf, mine, len);
	r = kcoll_allgather(b->comm, b->xbuf, b->xbuf + KB_NAME_BYTES, len, KCOLL_U8, &req);
	if (r)
		return kb_say_fail(b->rank, r, -1, "submitting the all-gather of %s", what);
	r = wait_req(b, req, what);
	*all = b->xbuf + KB_NAME_BYTES;
	return r;
}

/* One column (out of place or in place) at one size: check, warm up, time. */
static int measure(struct bench_rank *b, bool inplace, const struct bench_counts *n,
		   struct rank_stat *st)
{
	const struct bench_opts *o = &b->o->b;
	long long wrong = -1;
	double t0;
	int r;

	if (o->check) {
		bench_check_prepare(o, b->rank, b->send, b->recv, inplace, n);
		r = run_coll(b, inplace, n->param);
		if (r)
			return r;
		wrong = bench_check_result(o, b->rank,
					   inplace && o->coll == BENCH_REDUCESCATTER ?
					   rank_slice(b, n->param) : b->recv, n);
	}
	for (int i = 0; i < o->warmup; i++) {
		r = run_coll(b, inplace, n->param);
		if (r)
			return r;
	}
	r = barrier(b);
	if (r)
		return r;
	t0 = launch_now_us();
	for (int i = 0; i < o->iters; i++) {
		r = run_coll(b, inplace, n->param);
		if (r)
			return r;
	}
	st->time_us[inplace] = (launch_now_us() - t0) / o->iters;
	st->wrong[inplace] = wrong;
	return 0;
}

/* Rank 0: every rank's host name, to the report or the parent. */
static void emit_hosts(struct bench_rank *b, const char *all)
{
	for (int r = 0; r < b->o->b.nranks; r++) {
		char name[KB_NAME_BYTES];

		memcpy(name, all + (size_t)r * KB_NAME_BYTES, KB_NAME_BYTES);
		name[KB_NAME_BYTES - 1] = '\0';
		if (b->rep)
			kb_report_host(b->rep, r, name);
		else
			printf("host %d %s\n", r, name[0] ? name : "?");
	}
	fflush(stdout);
}

/* Rank 0: size k from every rank's figures (the slowest mean, the wrong total). */
static void emit_row(struct bench_rank *b, int k, const char *all)
{
	struct rank_stat tot = { .wrong = { 0, 0 } };

	for (int r = 0; r < b->o->b.nranks; r++) {
		struct rank_stat s;

		memcpy(&s, all + (size_t)r * sizeof(s), sizeof(s));
		for (int c = 0; c < 2; c++) {
			if (s.time_us[c] > tot.time_us[c])
				tot.time_us[c] = s.time_us[c];
			tot.wrong[c] = s.wrong[c] < 0 || tot.wrong[c] < 0 ? -1 :
				       tot.wrong[c] + s.wrong[c];
		}
	}
	if (b->rep) {
		kb_report_row(b->rep, k, &tot);
		return;
	}
	printf("row %d %.17g %.17g %lld %lld\n", k, tot.time_us[0], tot.time_us[1],
	       (long long)tot.wrong[0], (long long)tot.wrong[1]);
	fflush(stdout);
}

static int alloc_buffers(struct bench_rank *b, size_t bytes)
{
	struct kcoll *k = b->k;
	int r;

	if (b->o->mem == MEM_SHM) {
		r = kcoll_mem_alloc(k, bytes, &b->send);
		if (!r)
			r = kcoll_mem_alloc(k, bytes, &b->recv);
		return r ? kb_say_fail(b->rank, r, -1, "kcoll_mem_alloc(%zu)", bytes) : 0;
	}
	bytes = (bytes + 4095) & ~(size_t)4095;
	b->send = aligned_alloc(4096, bytes);
	b->recv = aligned_alloc(4096, bytes);
	if (!b->send || !b->recv)
		return kb_say_fail(b->rank, -ENOMEM, -1, "allocating 2 x %zu bytes", bytes);
	if (b->o->mem == MEM_REG) {
		r = kcoll_mem_register(k, b->send, bytes);
		if (!r)
			r = kcoll_mem_register(k, b->recv, bytes);
		if (r)
			return kb_say_fail(b->rank, r, -1, "kcoll_mem_register(%zu)%s", bytes,
					   r == -ENODEV ? ": --mem reg needs kcoll.ko loaded" : "");
	}
	return 0;
}

static void free_buffers(struct bench_rank *b)
{
	struct kcoll *k = b->k;

	if (b->o->mem == MEM_SHM) {
		if (b->recv)
			kcoll_mem_free(k, b->recv);
		if (b->send)
			kcoll_mem_free(k, b->send);
		return;
	}
	if (b->o->mem == MEM_REG) {
		/* a buffer that was never registered: -EINVAL, harmless */
		if (b->send)
			kcoll_mem_deregister(k, b->send);
		if (b->recv)
			kcoll_mem_deregister(k, b->recv);
	}
	free(b->send);
	free(b->recv);
}

int kb_rank_main(const struct kbench_opts *o, struct kcoll *k, const kcoll_unique_id_t *id,
		 int rank, struct report *rep)
{
	struct bench_rank b = { .o = o, .k = k, .rank = rank, .rep = rep,
				.wait_ms = kb_timeout_ms() + KB_WAIT_SLACK_MS };
	int nranks = o->b.nranks, nrows = bench_count_rows(&o->b);
	size_t elt = bench_dtype_size(o->b.dtype);
	char name[KB_NAME_BYTES] = { 0 };
	struct bench_counts n;
	const char *all;
	int r;

	r = kcoll_comm_init_rank(k, id, nranks, rank, &b.comm);
	if (r)
		return kb_say_fail(rank, r, -1, "joining a %d-rank communicator", nranks);
	r = kcoll_mem_alloc(k, (size_t)KB_NAME_BYTES * (nranks + 1), (void **)&b.xbuf);
	if (r) {
		kb_say_fail(rank, r, -1, "kcoll_mem_alloc(%zu)",
			    (size_t)KB_NAME_BYTES * (nranks + 1));
		goto err_destroy;
	}
	snprintf(name, sizeof(name), "%s", kb_my_host);
	r = exchange(&b, name, KB_NAME_BYTES, &all, "host names");
	if (r)
		goto err_free;
	if (rank == 0)
		emit_hosts(&b, all);

	bench_counts(&o->b, o->b.max_bytes, &n);
	/* Both buffers hold the larger side, so in place fits in recv. */
	r = alloc_buffers(&b, n.bytes);
	if (r)
		goto err_free;
	/* Valid, finite inputs even when unchecked: denormals or NaNs would time differently. */
	bench_fill_input(&o->b, b.send, rank, n.bytes / elt);
	bench_fill_input(&o->b, b.recv, rank, n.bytes / elt);

	for (int row = 0; row < nrows; row++) {
		struct rank_stat st = { .wrong = { -1, -1 } };

		bench_counts(&o->b, kb_row_bytes(&o->b, row), &n);
		for (int ip = 0; ip <= (int)o->b.inplace; ip++) {
			r = measure(&b, ip, &n, &st);
			if (r)
				goto err_free;
		}
		r = exchange(&b, &st, sizeof(st), &all, "timings");
		if (r)
			goto err_free;
		if (rank == 0)
			emit_row(&b, row, all);
	}
	r = 0;
err_free:
	free_buffers(&b);
	if (b.xbuf)
		kcoll_mem_free(k, b.xbuf);
err_destroy:
	kcoll_comm_destroy(b.comm);
	return r;
}

int kb_connect_daemon(const struct kbench_opts *o, struct kcoll **k)
{
	struct kcoll_connect_opts copts = { .size = sizeof(copts), .socket_path = o->socket };

	return kcoll_connect(&copts, k);
}

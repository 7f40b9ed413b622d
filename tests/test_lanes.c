// SPDX-License-Identifier: MIT
/*
 * Lanes (user/lib/lane.c) without daemons: H "ranks" are threads of this
 * process, joined by a full mesh of unix stream socket pairs where kcolld
 * would hand them TCP connections, each with a socket pair standing for its
 * daemon's control socket (closing the far end is the daemon dying).
 *
 * Checked: results against a reference for recursive doubling (H = 2, 4, 8)
 * and the single exchange (H = 3, 5), in place and not, several dtypes and
 * ops, counts 0..4099; a mismatched call (another count on one rank) fails
 * every rank with EBADMSG instead of hanging or mixing data; a rank that
 * never starts the op is named by every other rank after the timeout, also
 * those in later recursive-doubling steps that wait for a rank that waits for
 * it; a rank that closes its lanes is named with ECONNRESET; a rank whose
 * daemon dies gets ENOTCONN and the others ECONNRESET naming it; errors are
 * sticky.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "../user/lib/lib.h"
#include "reduce.h"

#define MAXH 8

enum role { R_NORMAL, R_ABSENT, R_CLOSE, R_DAEMON_DIES, R_OTHER_COUNT, R_LATE };

struct rank {
	uint32_t h, nh;
	struct kc_lanes *l;
	int daemon[2];		/* [0] ours (the "control socket"), [1] the daemon's end */
	enum role role;
	int dtype, op;
	size_t count;
	bool in_place;
	void *send, *recv;
	int res, res2;
	uint32_t err_host, err_host2;
	int64_t ms;
	int delay_ms;		/* start this late */
};

static struct rank rk[MAXH];

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int mesh(uint32_t nh, int timeout_ms)
{
	int fds[MAXH][MAXH];

	for (uint32_t a = 0; a < nh; a++) {
		fds[a][a] = -1;
		for (uint32_t b = a + 1; b < nh; b++) {
			int sv[2];

			if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
				return -errno;
			fds[a][b] = sv[0];
			fds[b][a] = sv[1];
		}
	}
	for (uint32_t a = 0; a < nh; a++) {
		memset(&rk[a], 0, sizeof(rk[a]));
		rk[a].h = a;
		rk[a].nh = nh;
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rk[a].daemon))
			return -errno;
		if (kc_lanes_new(nh, a, fds[a], 64 << 10, timeout_ms, 20000, &rk[a].l))
			return -ENOMEM;
	}
	return 0;
}

static void unmesh(uint32_t nh)
{
	for (uint32_t a = 0; a < nh; a++) {
		kc_lanes_free(rk[a].l);
		close(rk[a].daemon[0]);
		if (rk[a].daemon[1] >= 0)
			close(rk[a].daemon[1]);
		free(rk[a].send);
		free(rk[a].recv);
	}
}

/* Element i of rank h's input: small integers, exact in every dtype. */
static void fill(void *p, int dtype, size_t count, uint32_t h)
{
	for (size_t i = 0; i < count; i++) {
		int v = (int)((i * 7 + h * 13) % 11) - (dtype == KCOLL_U8 ? 0 : 5);
		switch (dtype) {
		case KCOLL_F32: ((float *)p)[i] = (float)v; break;
		case KCOLL_F64: ((double *)p)[i] = v; break;
		case KCOLL_I32: ((int32_t *)p)[i] = v; break;
		case KCOLL_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
		case KCOLL_BF16: ((uint16_t *)p)[i] = kcoll_f32_to_bf16((float)v); break;
		}
	}
}

static void *rank_main(void *arg)
{
	struct rank *r = arg;
	int64_t t0 = now_ms();
	int res;

	switch (r->role) {
	case R_ABSENT:
		return NULL;	/* never starts: a frozen rank */
	case R_CLOSE:
		kc_lanes_free(r->l);	/* a rank that died: its lanes close */
		r->l = NULL;
		return NULL;
	case R_DAEMON_DIES:
		close(r->daemon[1]);
		r->daemon[1] = -1;
		break;
	default:
		break;
	}
	if (r->delay_ms)
		usleep(r->delay_ms * 1000);
	res = kc_lanes_start(r->l, r->in_place ? r->recv : r->send, r->recv,
			     r->role == R_OTHER_COUNT ? r->count + 1 : r->count, r->dtype, r->op);
	if (res) {
		r->res = res;
		return NULL;
	}
	while (!kc_lanes_progress(r->l, 50, r->daemon[0], &r->res, &r->err_host))
		;
	r->ms = now_ms() - t0;
	/* After a failure the next op fails at once, the same way. */
	if (r->res) {
		r->res2 = kc_lanes_start(r->l, r->send, r->recv, r->count, r->dtype, r->op);
		kc_lanes_error(r->l, &r->err_host2);
	}
	return NULL;
}

static void run(uint32_t nh)
{
	pthread_t t[MAXH];

	for (uint32_t a = 0; a < nh; a++)
		pthread_create(&t[a], NULL, rank_main, &rk[a]);
	for (uint32_t a = 0; a < nh; a++)
		pthread_join(t[a], NULL);
}

static void setup_op(uint32_t nh, int dtype, int op, size_t count, bool in_place)
{
	size_t bytes = (count + 1) * kcoll_dtype_size(dtype) + 1;	/* R_OTHER_COUNT: one more */

	for (uint32_t a = 0; a < nh; a++) {
		rk[a].dtype = dtype;
		rk[a].op = op;
		rk[a].count = count;
		rk[a].in_place = in_place;
		rk[a].send = malloc(bytes);
		rk[a].recv = malloc(bytes);
		fill(rk[a].send, dtype, count, a);
		if (in_place)
			memcpy(rk[a].recv, rk[a].send, bytes);
		else
			memset(rk[a].recv, 0xa5, bytes);
	}
}

static void results(void)
{
	static const int dtypes[] = { KCOLL_F32, KCOLL_F64, KCOLL_I32, KCOLL_U8, KCOLL_BF16 };
	static const int ops[] = { KCOLL_SUM, KCOLL_MAX, KCOLL_MIN, KCOLL_PROD };
	static const uint32_t hosts[] = { 2, 3, 4, 5, 8 };
	static const size_t counts[] = { 0, 1, 7, 1000, 4099 };

	for (size_t hi = 0; hi < sizeof(hosts) / sizeof(hosts[0]); hi++) {
		uint32_t nh = hosts[hi];
		int bad = 0, runs = 0;
		char what[200] = "";

		for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++)
			for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++)
				for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
					int dt = dtypes[di], op = ops[oi];
					size_t count = counts[ci];
					size_t esz = kcoll_dtype_size(dt);
					const void *in[MAXH];
					void *ref;

					if (count * esz > (64 << 10))
						continue;
					if (mesh(nh, 5000)) {
						bad++;
						continue;
					}
					setup_op(nh, dt, op, count, (ci + oi) & 1);
					ref = malloc(count * esz + 1);
					for (uint32_t a = 0; a < nh; a++)
						in[a] = rk[a].send;
					kcoll_reduce_ref(dt, op, ref, in, nh, count);
					run(nh);
					runs++;
					for (uint32_t a = 0; a < nh; a++)
						if (rk[a].res || memcmp(rk[a].recv, ref, count * esz)) {
							if (!bad++)
								snprintf(what, sizeof(what), " (first: %s/%s count %zu%s rank %u: res %d)",
									 kcoll_dtype_name(dt), kcoll_redop_name(op), count,
									 rk[a].in_place ? " in place" : "", a, rk[a].res);
							break;
						}
					free(ref);
					unmesh(nh);
				}
		tap_ok(!bad, "%u ranks (%s): %d all-reduces (f32 f64 i32 u8 bf16 x sum max min prod x counts "
		       "0..4099, in place and not) match the reference%s", nh,
		       nh & (nh - 1) ? "one exchange" : "recursive doubling", runs, what);
	}
}

/* Every rank but the odd one fails with want, naming culprit; the next op too. */
static void faults(uint32_t nh, uint32_t odd, enum role role, int want, uint32_t culprit, const char *label,
		   int timeout_ms)
{
	char got[300] = "", naming[160];
	size_t n = 0;
	int bad = 0;
	int64_t worst = 0;

	if (mesh(nh, timeout_ms)) {
		tap_ok(0, "%s: set up", label);
		return;
	}
	setup_op(nh, KCOLL_F32, KCOLL_SUM, 1000, false);
	rk[odd].role = role;
	/* The daemon dies while its rank waits in the op (the others come late). */
	for (uint32_t a = 0; a < nh && role == R_DAEMON_DIES; a++)
		rk[a].delay_ms = a == odd ? 0 : 200;
	/* It comes once the others gave up (timeout plus the grace of every
	 * step), their data in its sockets: it must fail as they did. */
	if (role == R_LATE)
		rk[odd].delay_ms = 2 * timeout_ms + 1000;
	run(nh);
	for (uint32_t a = 0; a < nh; a++) {
		bool ok;

		if (a == odd && (role == R_ABSENT || role == R_CLOSE))
			continue;
		if (a == odd && role == R_DAEMON_DIES)
			ok = rk[a].res == -ENOTCONN && rk[a].res2 == -ENOTCONN;
		else if (role == R_OTHER_COUNT)	/* either side of a mismatch may be named */
			ok = rk[a].res == want && rk[a].res2 == want;
		else
			ok = rk[a].res == want && rk[a].err_host == culprit && rk[a].res2 == want &&
			     rk[a].err_host2 == culprit;
		if (rk[a].ms > worst)
			worst = rk[a].ms;
		if (!ok) {
			bad++;
			if (n < sizeof(got))
				n += snprintf(got + n, sizeof(got) - n, " rank %u: %d/%d next %d/%d;", a, rk[a].res,
					      (int)rk[a].err_host, rk[a].res2, (int)rk[a].err_host2);
		}
	}
	if (role == R_OTHER_COUNT)
		snprintf(naming, sizeof(naming), "every rank fails with %s", kcoll_strerror(want));
	else
		snprintf(naming, sizeof(naming), "every %srank fails with %s naming rank %u",
			 role == R_LATE ? "" : "other ", kcoll_strerror(want), culprit);
	tap_ok(!bad, "%s: %s, and so does its next op (slowest %lld ms)%s", label, naming, (long long)worst,
	       got);
	unmesh(nh);
}

int main(void)
{
	results();
	faults(4, 1, R_OTHER_COUNT, -EBADMSG, 1, "4 ranks, rank 1 calls with another count", 5000);
	faults(3, 0, R_OTHER_COUNT, -EBADMSG, 0, "3 ranks, rank 0 calls with another count", 5000);
	faults(4, 2, R_ABSENT, -ETIMEDOUT, 2, "4 ranks, rank 2 never starts (timeout 1000 ms)", 1000);
	faults(8, 5, R_ABSENT, -ETIMEDOUT, 5, "8 ranks, rank 5 never starts (timeout 1000 ms)", 1000);
	faults(3, 1, R_ABSENT, -ETIMEDOUT, 1, "3 ranks, rank 1 never starts (timeout 1000 ms)", 1000);
	faults(4, 3, R_CLOSE, -ECONNRESET, 3, "4 ranks, rank 3 closes its lanes", 5000);
	faults(5, 2, R_CLOSE, -ECONNRESET, 2, "5 ranks, rank 2 closes its lanes", 5000);
	faults(4, 0, R_DAEMON_DIES, -ECONNRESET, 0, "4 ranks, rank 0's daemon dies (it gets ENOTCONN)", 5000);
	faults(4, 2, R_LATE, -ETIMEDOUT, 2, "4 ranks, rank 2 comes after the others timed out (500 ms)", 500);
	faults(8, 7, R_LATE, -ETIMEDOUT, 7, "8 ranks, rank 7 comes after the others timed out (500 ms)", 500);
	faults(3, 1, R_LATE, -ETIMEDOUT, 1, "3 ranks, rank 1 comes after the others timed out (500 ms)", 500);
	return tap_done();
}

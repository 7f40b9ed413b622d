// SPDX-License-Identifier: MIT
/*
 * One rank of the C4 cluster tests (tests/t_c4.sh starts one per host in its
 * network namespace). Not a test_* program: tests/run.sh does not run it alone.
 *
 *   c4_rank id                               print a fresh unique id, hex
 *   c4_rank loop ID NRANKS RANK SECONDS BYTES [DELAY_MS]
 *       in-place f32 sum all-reduces of BYTES on kcoll_mem_alloc memory for
 *       SECONDS (or until one fails), sleeping DELAY_MS before each submission
 *       (a straggler). Prints, every 500 ms of its own clock:
 *         t_ms=T ops=N busbw=B    (busbw of the ops in that interval, MB/s)
 *       and at the end: done ops=N err=E. Rank 0 decides when time is up
 *       (element 1 of the buffer carries its vote), so every rank stops after
 *       the same op.
 * Exit status: 0 every op succeeded and had the right sum, 1 an op failed,
 * 2 could not set up.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static int parse_id(const char *hex, kcoll_unique_id_t *id)
{
	if (strlen(hex) != 2 * sizeof(id->bytes))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(id->bytes); i++) {
		unsigned b;

		if (sscanf(hex + 2 * i, "%2x", &b) != 1)
			return -EINVAL;
		id->bytes[i] = (uint8_t)b;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct kcoll *k;
	struct kcoll_comm *comm;
	kcoll_unique_id_t id;
	float *buf;
	int r, n, rank, delay = 0;
	double secs;
	size_t bytes, count;
	int64_t t0, tlast, end;
	unsigned long ops = 0, ops_last = 0;

	if (argc == 2 && !strcmp(argv[1], "id")) {
		if ((r = kcoll_connect(NULL, &k))) {
			fprintf(stderr, "c4_rank: %s\n", kcoll_strerror(r));
			return 2;
		}
		r = kcoll_get_unique_id(k, &id);
		kcoll_disconnect(k);
		if (r) {
			fprintf(stderr, "c4_rank: %s\n", kcoll_strerror(r));
			return 2;
		}
		for (size_t i = 0; i < sizeof(id.bytes); i++)
			printf("%02x", id.bytes[i]);
		printf("\n");
		return 0;
	}
	if (argc < 7 || strcmp(argv[1], "loop") || parse_id(argv[2], &id)) {
		fprintf(stderr, "usage: c4_rank id | c4_rank loop ID NRANKS RANK SECONDS BYTES [DELAY_MS]\n");
		return 2;
	}
	n = atoi(argv[3]);
	rank = atoi(argv[4]);
	secs = atof(argv[5]);
	bytes = strtoull(argv[6], NULL, 0);
	if (argc > 7)
		delay = atoi(argv[7]);
	count = bytes / sizeof(float);
	if (n < 1 || rank < 0 || rank >= n || count < 2) {
		fprintf(stderr, "c4_rank: bad NRANKS, RANK or BYTES (8 at least)\n");
		return 2;
	}
	if ((r = kcoll_connect(NULL, &k))) {
		printf("done ops=0 err=%d connect: %s\n", r, kcoll_strerror(r));
		return 2;
	}
	if ((r = kcoll_comm_init_rank(k, &id, n, rank, &comm))) {
		printf("done ops=0 err=%d comm init: %s\n", r, kcoll_strerror(r));
		kcoll_disconnect(k);
		return 2;
	}
	if ((r = kcoll_mem_alloc(k, count * sizeof(float), (void **)&buf))) {
		printf("done ops=0 err=%d kcoll_mem_alloc: %s\n", r, kcoll_strerror(r));
		kcoll_comm_destroy(comm);
		kcoll_disconnect(k);
		return 2;
	}
	t0 = tlast = now_ms();
	end = t0 + (int64_t)(secs * 1000);
	r = 0;
	for (;;) {
		struct kcoll_req *req;
		int64_t t;

		/* Every rank's element i is rank + 1 at the start of each op: the
		 * sum is n(n+1)/2 everywhere, exactly. */
		for (size_t i = 0; i < count; i += 1024)
			buf[i] = (float)(rank + 1);
		if (count > 1)
			buf[1] = rank == 0 && now_ms() >= end ? 1.0f : 0.0f;
		if (delay)
			usleep(delay * 1000);
		r = kcoll_allreduce(comm, buf, buf, count, KCOLL_F32, KCOLL_SUM, &req);
		if (!r)
			r = kcoll_wait(req, 120000);
		if (r)
			break;
		for (size_t i = 0; i < count; i += 1024)
			if (buf[i] != (float)(n * (n + 1) / 2)) {
				printf("# op %lu: element %zu is %g, expected %d\n", ops, i, buf[i], n * (n + 1) / 2);
				r = -EBADMSG;
				break;
			}
		if (r)
			break;
		ops++;
		if (count > 1 && buf[1] != 0.0f)
			break;	/* rank 0 says time is up: everyone stops after this op */
		t = now_ms();
		if (t - tlast >= 500) {
			/* ring all-reduce bus bandwidth: 2 (n - 1) / n of the bytes per op */
			double bw = (double)(ops - ops_last) * bytes * 2 * (n - 1) / n / ((t - tlast) / 1e3) / 1e6;

			printf("t_ms=%lld ops=%lu busbw=%.1f\n", (long long)t, ops, bw);
			fflush(stdout);
			tlast = t;
			ops_last = ops;
		}
	}
	printf("done ops=%lu err=%d\n", ops, r);
	kcoll_mem_free(k, buf);
	kcoll_comm_destroy(comm);
	kcoll_disconnect(k);
	return r ? 1 : 0;
}

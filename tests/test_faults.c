// SPDX-License-Identifier: MIT
/*
 * Bad input and faults, one check per rule, each with the exact errno (and
 * the blamed rank where the daemon defines one):
 *   1-2  validation: the library's local checks, then raw SQEs through the
 *        ring with one field broken at a time; count overflow
 *   3-4  cross-rank: a rank's unmapped buffer, overlaps, mismatched ops
 *   5-6  hostile clients: random SQEs, forged ring indices, garbage control
 *        messages, wrong protocol/ABI versions, ring header checks
 *   7-8  a rank that dies (also mid-copy) or stalls; a client that leaves
 *        takes its ring and shared buffers with it
 *   9,11 a second private kcolld killed, or drained with SIGTERM
 *   10   another uid cannot reach root's communicators, rings or handles
 *
 * Ranks are child processes sharing a "board" (anonymous shared memory): the
 * parent moves them through phases with go[], they record results there.
 * Every wait is bounded; every child gets alarm() and is SIGKILLed at the end.
 *
 * One program of about 2000 lines, on purpose: every group drives its ranks
 * through the same fixture (the board, the children's bookkeeping, alarm and
 * phase helpers, the checked all-reduce: the first 400 lines), and the
 * groups are each a few hundred lines; split by theme, each program would
 * carry that fixture or a shared object only these programs link.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "rawclient.h"
#include "test_util.h"

#define NSLOT		8
#define NVAL		16
#define NPATHS		16
#define CHILD_ALARM_S	25
#define TEST_ALARM_S	28
#define NOBODY		65534

struct slot {
	int phase;		/* child progress, parent polls it */
	int nval;
	int res[NVAL];
	int err_rank[NVAL];
	int64_t t_ns[NVAL];	/* when res[i] was known */
	int bad;		/* child-side check failures */
	long iters;
	char why[160];
};

struct board {
	kcoll_unique_id_t id[3];
	char sock[108];		/* socket for the ranks; "" = $KCOLL_SOCKET */
	int go[NSLOT];		/* parent -> child phase */
	int stop;
	uint32_t dpid;
	int npaths;
	char paths[NPATHS][64];
	struct slot s[NSLOT];
};

static struct board *B;
static pid_t kids[64];
static int nkids;
static uint32_t dpid;			/* the shared kcolld */
static struct kcoll *K;			/* parent's library connection */
static struct kcoll_comm *C1;		/* ... and its 1-rank communicator */
static struct kcoll_raw RC;		/* parent's raw client */
static uint32_t rc_comm;		/* ... and its 1-rank communicator */
static uint64_t tag;

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t rng = 0x6b636f6c6c2d6675ull;	/* fixed seed */

static uint64_t rnd(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

/* ------------------------------------------------------------------ children */

static void kill_kids(void)
{
	for (int i = 0; i < nkids; i++) {
		if (kids[i] > 0) {
			kill(kids[i], SIGKILL);
			waitpid(kids[i], NULL, 0);
			kids[i] = 0;
		}
	}
	nkids = 0;
}

static void on_alarm(int sig)
{
	static const char msg[] = "Bail out! test_faults: overall time limit hit\n";

	for (int i = 0; i < nkids; i++)
		if (kids[i] > 0)
			kill(kids[i], SIGKILL);
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(2);
	_exit(1);
}

static void kid_forget(pid_t pid)
{
	for (int i = 0; i < nkids; i++)
		if (kids[i] == pid)
			kids[i] = 0;
}

/* Wait for pid at most timeout_ms; SIGKILL it past that. Returns the wait
 * status, or -ETIMEDOUT. */
static int wait_kid(pid_t pid, int timeout_ms)
{
	int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid) {
			kid_forget(pid);
			return st;
		}
		if (r < 0) {
			kid_forget(pid);
			return -ECHILD;
		}
		if (now_ns() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			kid_forget(pid);
			return -ETIMEDOUT;
		}
		usleep(2000);
	}
}

static void kid_add(pid_t pid)
{
	if (pid > 0 && nkids < (int)(sizeof(kids) / sizeof(kids[0])))
		kids[nkids++] = pid;
}

/* In a fresh child: no inherited sockets (ours, raw clients) may keep a
 * peer alive, and nothing outlives the test. */
static void child_setup(void)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	signal(SIGALRM, SIG_DFL);
	alarm(CHILD_ALARM_S);
}

static pid_t spawn(void (*fn)(int me), int me)
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		child_setup();
		fn(me);
		_exit(0);
	}
	kid_add(pid);
	return pid;
}

static void board_reset(void)
{
	memset(B, 0, sizeof(*B));
}

static int load(int *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void store(int *p, int v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static void ch_phase(int me, int p)
{
	store(&B->s[me].phase, p);
}

/* Child: wait for the parent's go (bounded: a lost parent ends the child). */
static void ch_wait_go(int me, int g)
{
	int64_t deadline = now_ns() + 20 * 1000000000LL;

	while (load(&B->go[me]) < g) {
		if (now_ns() > deadline)
			_exit(3);
		usleep(500);
	}
}

static void ch_rec(int me, int res, int err_rank)
{
	struct slot *s = &B->s[me];

	if (s->nval < NVAL) {
		s->res[s->nval] = res;
		s->err_rank[s->nval] = err_rank;
		s->t_ns[s->nval] = now_ns();
		s->nval++;
	}
}

static void __attribute__((format(printf, 2, 3))) ch_bad(int me, const char *fmt, ...)
{
	struct slot *s = &B->s[me];
	va_list ap;

	if (!s->bad++) {
		va_start(ap, fmt);
		vsnprintf(s->why, sizeof(s->why), fmt, ap);
		va_end(ap);
	}
}

static struct kcoll *ch_connect(int me)
{
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = B->sock[0] ? B->sock : NULL };
	struct kcoll *k;
	int r = kcoll_connect(&o, &k);

	if (r) {
		ch_bad(me, "kcoll_connect: %s", en(r));
		_exit(4);
	}
	return k;
}

static struct kcoll_comm *ch_join(struct kcoll *k, int me, int id, int nranks, int rank)
{
	struct kcoll_comm *c;
	int r = kcoll_comm_init_rank(k, &B->id[id], nranks, rank, &c);

	if (r) {
		ch_bad(me, "kcoll_comm_init_rank: %s", en(r));
		_exit(4);
	}
	return c;
}

/* Parent: wait until slot me reached phase p. */
static bool wait_phase(int me, int p, int timeout_ms)
{
	int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000;

	while (load(&B->s[me].phase) < p) {
		if (now_ns() > deadline)
			return false;
		usleep(500);
	}
	return true;
}

static void go(int me, int g)
{
	store(&B->go[me], g);
}

/* ------------------------------------------------------------------ data */

static int32_t val(int rank, size_t i, int salt)
{
	return (int32_t)(i * 7 + rank * 1000 + salt);
}

/* A checked i32 SUM all-reduce on malloc'ed buffers: 0, -EIO on bad data,
 * or the operation's error. */
static int allreduce_checked(struct kcoll_comm *c, size_t count, int salt, int timeout_ms)
{
	int rank = kcoll_comm_rank(c), n = kcoll_comm_size(c);
	int32_t *s = malloc(count * 4), *d = malloc(count * 4);
	struct kcoll_req *rq;
	int r = -ENOMEM;

	if (!s || !d)
		goto out;
	for (size_t i = 0; i < count; i++) {
		s[i] = val(rank, i, salt);
		d[i] = -1;
	}
	r = kcoll_allreduce(c, s, d, count, KCOLL_I32, KCOLL_SUM, &rq);
	if (!r)
		r = kcoll_wait(rq, timeout_ms);
	for (size_t i = 0; !r && i < count; i++) {
		int64_t want = 0;

		for (int k = 0; k < n; k++)
			want += val(k, i, salt);
		if (d[i] != (int32_t)want)
			r = -EIO;
	}
out:
	free(s);
	free(d);
	return r;
}

/*
 * Wait for an op the library accepted (sub == 0) and return its result and
 * blamed rank (kcoll_wait_status; -ETIMEDOUT if still pending); a refused
 * submission is its own result. rq is read only after the submission ran,
 * hence the pointer.
 */
static int lib_wait(int sub, struct kcoll_req **rq, int timeout_ms, int *err_rank)
{
	struct kcoll_status st = { .reserved = { 7, 7 } };
	int r;

	*err_rank = -1;
	if (sub)
		return sub;
	r = kcoll_wait_status(*rq, timeout_ms, &st);
	if (r != 1)
		return r ? r : -ETIMEDOUT;
	if (st.reserved[0] || st.reserved[1] || (!st.result && st.err_rank != -1))
		return -EPROTO;	/* the status is not what kcoll.h promises */
	*err_rank = st.err_rank;
	return st.result;
}

/* Child: record an op's result and blamed rank (sub: its submission's). */
static void rec_wait(int me, int sub, struct kcoll_req **rq, int timeout_ms)
{
	int er, r = lib_wait(sub, rq, timeout_ms, &er);

	ch_rec(me, r, er);
}

/* Run a command with a time limit; its exit status (or -ETIMEDOUT) and stdout. */
static int run_cmd(char *const argv[], char *out, size_t cap, int timeout_ms)
{
	int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000;
	size_t len = 0;
	int p[2], st;
	pid_t pid;

	if (pipe(p))
		return -errno;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		child_setup();
		execv(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return -errno;
	}
	kid_add(pid);
	for (;;) {
		struct pollfd pf = { .fd = p[0], .events = POLLIN };
		int left = (int)((deadline - now_ns()) / 1000000);
		ssize_t n;

		if (left <= 0 || poll(&pf, 1, left) <= 0)
			break;
		n = read(p[0], out + len, cap - 1 - len);
		if (n <= 0)
			break;
		len += n;
		if (len == cap - 1)
			break;
	}
	out[len] = 0;
	close(p[0]);
	st = wait_kid(pid, (int)((deadline - now_ns()) / 1000000) + 10);
	return st < 0 ? st : WIFEXITED(st) ? WEXITSTATUS(st) : -EINTR;
}

static bool daemon_answers_status(void)
{
	char path[512], sock[256], out[4096];
	char *argv[] = { path, "-s", sock, "status", "--json", NULL };
	int r;

	snprintf(path, sizeof(path), "%s/bin/kcollctl", getenv("KCOLL_BUILD"));
	snprintf(sock, sizeof(sock), "%s", getenv("KCOLL_SOCKET"));
	r = run_cmd(argv, out, sizeof(out), 5000);
	return r == 0 && out[0] == '{' && strstr(out, "\"pid\"");
}

static bool shared_daemon_ok(void)
{
	return kill((pid_t)dpid, 0) == 0 && allreduce_checked(C1, 64, (int)rnd(), 5000) == 0;
}

/* ------------------------------------------------------------------ 1-2: validation */

static void lib_validation(void)
{
	int32_t a[16] = { 0 }, b[16];
	struct kcoll_req *rq = NULL;
	int r, er;

	r = kcoll_allreduce(C1, a, b, 16, KCOLL_DTYPE_MAX, KCOLL_SUM, &rq);
	tap_ok(r == -EINVAL, "lib: all-reduce dtype KCOLL_DTYPE_MAX -> EINVAL (got %s)", en(r));
	r = kcoll_allreduce(C1, a, b, 16, (enum kcoll_dtype)-1, KCOLL_SUM, &rq);
	tap_ok(r == -EINVAL, "lib: all-reduce dtype -1 -> EINVAL (got %s)", en(r));
	r = kcoll_allreduce(C1, a, b, 16, KCOLL_I32, KCOLL_REDOP_MAX, &rq);
	tap_ok(r == -EINVAL, "lib: all-reduce op KCOLL_REDOP_MAX -> EINVAL (got %s)", en(r));
	r = kcoll_allreduce(C1, a, b, 16, KCOLL_I32, (enum kcoll_redop)-1, &rq);
	tap_ok(r == -EINVAL, "lib: all-reduce op -1 -> EINVAL (got %s)", en(r));
	r = kcoll_reduce_scatter(C1, a, b, 16, KCOLL_I32, KCOLL_REDOP_MAX, &rq);
	tap_ok(r == -EINVAL, "lib: reduce-scatter unknown op -> EINVAL (got %s)", en(r));
	r = kcoll_allgather(C1, a, b, 16, KCOLL_DTYPE_MAX, &rq);
	tap_ok(r == -EINVAL, "lib: all-gather unknown dtype -> EINVAL (got %s)", en(r));
	r = kcoll_broadcast(C1, b, 16, KCOLL_I32, 1, &rq);
	tap_ok(r == -EINVAL, "lib: broadcast root == nranks -> EINVAL (got %s)", en(r));
	r = kcoll_broadcast(C1, b, 16, KCOLL_I32, -1, &rq);
	tap_ok(r == -EINVAL, "lib: broadcast root -1 -> EINVAL (got %s)", en(r));
	r = kcoll_allreduce(C1, NULL, b, 16, KCOLL_I32, KCOLL_SUM, &rq);
	tap_ok(r == -EFAULT, "lib: all-reduce NULL sendbuf, count 16 -> EFAULT (got %s)", en(r));
	r = kcoll_allreduce(C1, a, NULL, 16, KCOLL_I32, KCOLL_SUM, &rq);
	tap_ok(r == -EFAULT, "lib: all-reduce NULL recvbuf, count 16 -> EFAULT (got %s)", en(r));

	/* 2: count overflow, refused locally ... */
	r = kcoll_allreduce(C1, a, b, SIZE_MAX, KCOLL_I32, KCOLL_SUM, &rq);
	tap_ok(r == -EOVERFLOW, "lib: all-reduce count SIZE_MAX -> EOVERFLOW (got %s)", en(r));
	r = kcoll_allgather(C1, a, b, SIZE_MAX / 8, KCOLL_U8, &rq);
	tap_ok(r == -EOVERFLOW, "lib: all-gather count SIZE_MAX/8 -> EOVERFLOW (got %s)", en(r));
	/* ... and beyond the daemon's limit (2^40 f32 = 4 TiB) by the daemon */
	r = lib_wait(kcoll_allreduce(C1, a, b, 1ULL << 40, KCOLL_F32, KCOLL_SUM, &rq), &rq, 5000, &er);
	tap_ok(r == -EOVERFLOW && er == 0,
	       "lib: all-reduce count 2^40 f32 -> EOVERFLOW from kcolld, err_rank 0 (got %s, %d)",
	       en(r), er);

	/* Overlaps that are not NCCL's in-place forms (3). */
	{
		int32_t buf[256];

		for (int i = 0; i < 256; i++)
			buf[i] = i;
		r = lib_wait(kcoll_allreduce(C1, buf, buf + 1, 100, KCOLL_I32, KCOLL_SUM, &rq), &rq,
			     5000, &er);
		tap_ok(r == -EINVAL && er == 0,
		       "lib: all-reduce recvbuf = sendbuf + 1 (overlap) -> EINVAL, err_rank 0 (got %s, %d)",
		       en(r), er);
		r = lib_wait(kcoll_reduce_scatter(C1, buf + 1, buf, 100, KCOLL_I32, KCOLL_SUM, &rq),
			     &rq, 5000, &er);
		tap_ok(r == -EINVAL && er == 0,
		       "lib: reduce-scatter recvbuf = sendbuf - 1 (overlap) -> EINVAL (got %s, %d)",
		       en(r), er);
		r = lib_wait(kcoll_allgather(C1, buf + 3, buf, 100, KCOLL_I32, &rq), &rq, 5000, &er);
		tap_ok(r == -EINVAL && er == 0,
		       "lib: all-gather sendbuf = recvbuf + 3 (overlap) -> EINVAL (got %s, %d)",
		       en(r), er);
		r = lib_wait(kcoll_allreduce(C1, buf, buf, 100, KCOLL_I32, KCOLL_SUM, &rq), &rq, 5000,
			     &er);
		tap_ok(r == 0 && buf[99] == 99, "lib: all-reduce in place (NCCL form) accepted (got %s)",
		       en(r));
		r = lib_wait(kcoll_allgather(C1, buf, buf, 100, KCOLL_I32, &rq), &rq, 5000, &er);
		tap_ok(r == 0, "lib: all-gather in place, 1 rank (NCCL form) accepted (got %s)", en(r));
	}
}

static int32_t raw_send[64], raw_recv[64 * 2];

static struct kcoll_sqe raw_base(uint8_t opcode)
{
	struct kcoll_sqe s = { .opcode = opcode };

	s.coll.comm_id = rc_comm;
	if (opcode == KCOLL_OP_BARRIER || opcode == KCOLL_OP_NOP)
		return s;
	s.coll.dtype = KCOLL_I32;
	s.coll.count = 16;
	s.coll.send_addr = (uintptr_t)raw_send;
	s.coll.recv_addr = (uintptr_t)raw_recv;
	return s;
}

static void raw_check(const char *what, struct kcoll_sqe s, int want, uint32_t want_rank)
{
	struct kcoll_cqe cqe = { 0 };
	int r;

	s.user_data = 0xfa17000000000000ull | ++tag;
	r = kcoll_raw_run(&RC, &s, &cqe, 5000);
	tap_ok(r == 0 && cqe.user_data == s.user_data && cqe.res == want && cqe.err_rank == want_rank,
	       "raw sqe: %s -> %s, err_rank %d (got %s: res %s err_rank %d)", what, en(want),
	       (int)want_rank, en(r), en(cqe.res), (int)cqe.err_rank);
}

/* Raw SQEs, each breaking one field of a valid one. */
static void raw_validation(void)
{
	const uint32_t none = KCOLL_RANK_NONE;
	struct kcoll_sqe s;

	for (int i = 0; i < 64; i++)
		raw_send[i] = i;
	raw_check("valid NOP", raw_base(KCOLL_OP_NOP), 0, none);
	raw_check("valid all-reduce (baseline)", raw_base(KCOLL_OP_ALLREDUCE), 0, none);
	tap_ok(raw_recv[15] == 15, "raw sqe: baseline all-reduce delivered its data");
	raw_check("valid all-gather (baseline)", raw_base(KCOLL_OP_ALLGATHER), 0, none);
	raw_check("valid barrier (baseline)", raw_base(KCOLL_OP_BARRIER), 0, none);
	s = raw_base(KCOLL_OP_BROADCAST);
	raw_check("valid broadcast (baseline)", s, 0, none);

	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.opcode = KCOLL_OP_MAX;
	raw_check("opcode KCOLL_OP_MAX", s, -EINVAL, none);
	s.opcode = 0xff;
	raw_check("opcode 255", s, -EINVAL, none);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.flags = 0x02;
	raw_check("flags 0x02 (unknown)", s, -EINVAL, 0);
	s.flags = 0x80;
	raw_check("flags 0x80 (unknown)", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.reserved0 = 1;
	raw_check("reserved0 = 1", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.reserved1 = 0x80000000;
	raw_check("reserved1 = 0x80000000", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_NOP);
	s.reserved1 = 1;
	raw_check("NOP with reserved1 = 1", s, -EINVAL, none);
	for (int i = 0; i < 3; i++) {
		char what[48];

		s = raw_base(KCOLL_OP_ALLREDUCE);
		s.coll.reserved[i] = 1;
		snprintf(what, sizeof(what), "coll.reserved[%d] = 1", i);
		raw_check(what, s, -EINVAL, 0);
	}
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.dtype = KCOLL_DTYPE_MAX;
	raw_check("dtype KCOLL_DTYPE_MAX", s, -EINVAL, 0);
	s.coll.dtype = 0xff;
	raw_check("dtype 255", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.redop = KCOLL_REDOP_MAX;
	raw_check("redop KCOLL_REDOP_MAX", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLGATHER);
	s.coll.redop = KCOLL_MAX;
	raw_check("redop on all-gather", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_BROADCAST);
	s.coll.redop = KCOLL_PROD;
	raw_check("redop on broadcast", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_BARRIER);
	s.coll.redop = KCOLL_MIN;
	raw_check("redop on barrier", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.root = 1;
	raw_check("root 1 on all-reduce", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_BROADCAST);
	s.coll.root = 1;
	raw_check("broadcast root 1 of 1 rank", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.send_mem = KCOLL_MEM_DEVICE;
	raw_check("send_mem DEVICE", s, -EOPNOTSUPP, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.recv_mem = KCOLL_MEM_DEVICE;
	raw_check("recv_mem DEVICE", s, -EOPNOTSUPP, 0);
	tap_ok(strstr(kcoll_strerror(-EOPNOTSUPP), "kcollctl gpu") != NULL,
	       "kcoll_strerror(-EOPNOTSUPP) points at kcollctl gpu for device buffers");
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.send_mem = KCOLL_MEM_KIND_MAX;
	raw_check("send_mem KCOLL_MEM_KIND_MAX", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.recv_mem = 0xff;
	raw_check("recv_mem 255", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_BARRIER);
	s.coll.count = 1;
	raw_check("barrier with count 1", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_BARRIER);
	s.coll.recv_addr = (uintptr_t)raw_recv;
	raw_check("barrier with a recv buffer", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.send_addr = 0;
	raw_check("NULL send_addr, count 16", s, -EFAULT, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.recv_addr = 0;
	raw_check("NULL recv_addr, count 16", s, -EFAULT, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.flags = KCOLL_SQE_F_IN_PLACE;
	raw_check("IN_PLACE flag, send != recv", s, -EINVAL, 0);
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.recv_addr = s.coll.send_addr + 4;
	raw_check("recv overlaps send by all but one element", s, -EINVAL, 0);

	/* Transfers: the SQE-level rules (tests/test_kv.c covers the rest). */
	memset(&s, 0, sizeof(s));
	s.opcode = KCOLL_OP_XFER_WRITE;
	s.xfer.nr_entries = KCOLL_XFER_MAX_ENTRIES + 1;
	s.xfer.entries_addr = 4096;
	raw_check("XFER_WRITE nr_entries over the limit", s, -E2BIG, none);
	s.xfer.nr_entries = 1;
	s.xfer.entries_addr = 0;
	raw_check("XFER_WRITE NULL entry array", s, -EFAULT, none);
	s.xfer.entries_addr = 4096;
	s.xfer.reserved[1] = 1;
	raw_check("XFER_WRITE reserved field", s, -EINVAL, none);
	s.xfer.reserved[1] = 0;
	s.xfer.msg_len = KCOLL_NOTIF_MAX_BYTES + 1;
	s.xfer.msg_addr = 4096;
	raw_check("XFER_WRITE notification over the limit", s, -EMSGSIZE, none);
	s.xfer.msg_len = 8;
	s.xfer.msg_addr = 0;
	raw_check("XFER_WRITE NULL notification", s, -EFAULT, none);
	s.xfer.msg_len = 0;
	s.xfer.msg_addr = 4096;
	raw_check("XFER_WRITE notification address without a length", s, -EINVAL, none);
	s.xfer.msg_addr = 0;
	s.flags = KCOLL_SQE_F_IN_PLACE;
	raw_check("XFER_WRITE with a flag", s, -EINVAL, none);
	s.flags = 0;
	s.opcode = KCOLL_OP_XFER_READ;
	s.xfer.local_seg = 0x7fffffff;
	raw_check("XFER_READ local_seg not registered", s, -ENOENT, none);

	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.comm_id = 0;
	raw_check("comm_id 0", s, -EINVAL, none);
	s.coll.comm_id = rc_comm + 1;
	raw_check("comm_id not joined", s, -EINVAL, none);
	s.coll.comm_id = 1025;
	raw_check("comm_id 1025 (beyond the table)", s, -EINVAL, none);
	s.coll.comm_id = 0xffffffff;
	raw_check("comm_id 0xffffffff", s, -EINVAL, none);

	/* 2: count overflow through the ring */
	s = raw_base(KCOLL_OP_ALLREDUCE);
	s.coll.count = 1ULL << 62;
	raw_check("count 2^62", s, -EOVERFLOW, 0);
	s.coll.count = UINT64_MAX;
	raw_check("count 2^64-1", s, -EOVERFLOW, 0);
	s = raw_base(KCOLL_OP_ALLGATHER);
	s.coll.dtype = KCOLL_U8;
	s.coll.count = (1ULL << 40) + 1;
	raw_check("all-gather u8 count 2^40+1", s, -EOVERFLOW, 0);

	raw_check("valid all-reduce after all that", raw_base(KCOLL_OP_ALLREDUCE), 0, none);
}

/* ------------------------------------------------------------------ 3-4: cross-rank */

/* Ranks 0,1: one op per line below; the parent reads res[]/err_rank[]. */
static void sc_efault(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 2, me);
	size_t n = 1024;
	int32_t *s = calloc(2 * n, 4), *d = calloc(2 * n, 4);
	struct kcoll_req *rq;
	int r, er;

	/* op 0: rank 1 passes an unmapped buffer (in place) */
	r = me == 1 ? kcoll_allreduce(c, (void *)0x1000, (void *)0x1000, n, KCOLL_F32, KCOLL_SUM, &rq)
		    : kcoll_allreduce(c, s, d, n, KCOLL_F32, KCOLL_SUM, &rq);
	r = lib_wait(r, &rq, 10000, &er);
	ch_rec(me, r, er);
	/* op 1: rank 1's recv buffer only is unmapped (the write side) */
	r = kcoll_allreduce(c, s, me == 1 ? (void *)0x1000 : d, n, KCOLL_F32, KCOLL_SUM, &rq);
	r = lib_wait(r, &rq, 10000, &er);
	ch_rec(me, r, er);
	/* op 2: the communicator still works */
	ch_rec(me, allreduce_checked(c, n, 2, 10000), -1);
	/* op 3: all-gather in place, rank r's slice at recv + r * n */
	for (size_t i = 0; i < n; i++)
		d[me * n + i] = val(me, i, 3);
	r = lib_wait(kcoll_allgather(c, d + me * n, d, n, KCOLL_I32, &rq), &rq, 10000, &er);
	for (size_t i = 0; !r && i < 2 * n; i++)
		if (d[i] != val((int)(i / n), i % n, 3))
			r = -EIO;
	ch_rec(me, r, er);
	/* op 4: reduce-scatter in place, recv = send + rank * n */
	for (size_t i = 0; i < 2 * n; i++)
		s[i] = val(me, i, 4);
	r = lib_wait(kcoll_reduce_scatter(c, s, s + me * n, n, KCOLL_I32, KCOLL_SUM, &rq), &rq, 10000,
		     &er);
	for (size_t i = 0; !r && i < n; i++)
		if (s[me * n + i] != val(0, me * n + i, 4) + val(1, me * n + i, 4))
			r = -EIO;
	ch_rec(me, r, er);
	/* op 5: rank 1 reduce-scatters into rank 0's slot of its own send buffer */
	r = lib_wait(kcoll_reduce_scatter(c, s, s, n, KCOLL_I32, KCOLL_SUM, &rq), &rq, 10000, &er);
	ch_rec(me, r, er);
	/* op 6: still usable */
	ch_rec(me, allreduce_checked(c, n, 6, 10000), -1);
	ch_phase(me, 1);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	free(s);
	free(d);
}

static void sc_mismatch(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 2, me);
	float *s = calloc(512, 4), *d = calloc(1024, 4);
	struct kcoll_req *rq;
	int r;

	r = kcoll_allreduce(c, s, d, me ? 101 : 100, KCOLL_F32, KCOLL_SUM, &rq);
	rec_wait(me, r, &rq, 10000);
	r = kcoll_allreduce(c, s, d, 100, me ? KCOLL_I32 : KCOLL_F32, KCOLL_SUM, &rq);
	rec_wait(me, r, &rq, 10000);
	r = kcoll_allreduce(c, s, d, 100, KCOLL_F32, me ? KCOLL_MAX : KCOLL_SUM, &rq);
	rec_wait(me, r, &rq, 10000);
	r = kcoll_broadcast(c, d, 100, KCOLL_F32, me, &rq);
	rec_wait(me, r, &rq, 10000);
	r = me ? kcoll_allgather(c, s, d, 100, KCOLL_F32, &rq)
	       : kcoll_allreduce(c, s, d, 100, KCOLL_F32, KCOLL_SUM, &rq);
	rec_wait(me, r, &rq, 10000);
	/* rank 1 beyond the daemon's size limit: its error wins over the mismatch */
	r = kcoll_allreduce(c, s, d, me ? 1ULL << 39 : 100, KCOLL_F32, KCOLL_SUM, &rq);
	rec_wait(me, r, &rq, 10000);
	ch_rec(me, allreduce_checked(c, 300, 7, 10000), -1);
	ch_phase(me, 1);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	free(s);
	free(d);
}

/* Run fn as ranks 0..n-1 of one communicator named by B->id[0]; true when
 * all reached phase 1. */
static bool run_ranks(void (*fn)(int), int n, int timeout_ms)
{
	pid_t pid[NSLOT];
	bool ok = true;

	for (int i = 0; i < n; i++)
		pid[i] = spawn(fn, i);
	for (int i = 0; i < n; i++) {
		int st = wait_kid(pid[i], timeout_ms);

		if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) || load(&B->s[i].phase) < 1) {
			tap_diag("rank %d: exit status %d, phase %d: %s", i, st, B->s[i].phase,
				 B->s[i].why);
			ok = false;
		}
	}
	return ok;
}

static int new_id(kcoll_unique_id_t *id)
{
	return kcoll_get_unique_id(K, id);
}

static void cross_rank(void)
{
	static const char *const mm[] = {
		"count 100 vs 101", "dtype f32 vs i32", "op sum vs max", "broadcast root 0 vs 1",
		"all-reduce vs all-gather",
	};
	struct slot *s0 = &B->s[0], *s1 = &B->s[1];
	bool ok;

	board_reset();
	new_id(&B->id[0]);
	ok = run_ranks(sc_efault, 2, 20000);
	tap_ok(ok && s0->nval == 7 && s1->nval == 7, "efault: both ranks ran every step");
	for (int i = 0; i < 2; i++) {
		struct slot *s = &B->s[i];

		tap_ok(s->res[0] == -EFAULT && s->err_rank[0] == 1,
		       "efault: rank %d: rank 1 sendbuf 0x1000 -> EFAULT, err_rank 1 (got %s, %d)", i,
		       en(s->res[0]), s->err_rank[0]);
		tap_ok(s->res[1] == -EFAULT && s->err_rank[1] == 1,
		       "efault: rank %d: rank 1 recvbuf 0x1000 -> EFAULT, err_rank 1 (got %s, %d)", i,
		       en(s->res[1]), s->err_rank[1]);
		tap_ok(s->res[2] == 0,
		       "efault: rank %d: the communicator works after EFAULT (got %s)", i, en(s->res[2]));
		tap_ok(s->res[3] == 0, "overlap: rank %d: all-gather in place (send = recv + rank*n) (got %s)",
		       i, en(s->res[3]));
		tap_ok(s->res[4] == 0,
		       "overlap: rank %d: reduce-scatter in place (recv = send + rank*n) (got %s)", i,
		       en(s->res[4]));
		tap_ok(s->res[5] == -EINVAL && s->err_rank[5] == 1,
		       "overlap: rank %d: rank 1 reduce-scatter recv = send (not its slot) -> EINVAL, err_rank 1 (got %s, %d)",
		       i, en(s->res[5]), s->err_rank[5]);
		tap_ok(s->res[6] == 0, "overlap: rank %d: the communicator works after EINVAL (got %s)",
		       i, en(s->res[6]));
	}

	board_reset();
	new_id(&B->id[0]);
	ok = run_ranks(sc_mismatch, 2, 20000);
	tap_ok(ok && s0->nval == 7 && s1->nval == 7, "mismatch: both ranks ran every step");
	for (int op = 0; op < 5; op++)
		tap_ok(s0->res[op] == -EBADMSG && s1->res[op] == -EBADMSG,
		       "mismatch: %s -> EBADMSG on both ranks (got %s, %s)", mm[op], en(s0->res[op]),
		       en(s1->res[op]));
	tap_ok(s0->res[5] == -EOVERFLOW && s1->res[5] == -EOVERFLOW && s0->err_rank[5] == 1 &&
	       s1->err_rank[5] == 1,
	       "mismatch: rank 1 count 2^39 f32 -> EOVERFLOW on both, err_rank 1 (got %s/%d, %s/%d)",
	       en(s0->res[5]), s0->err_rank[5], en(s1->res[5]), s1->err_rank[5]);
	tap_ok(s0->res[6] == 0 && s1->res[6] == 0,
	       "mismatch: the communicator works after mismatches (got %s, %s)", en(s0->res[6]),
	       en(s1->res[6]));
}

/* ------------------------------------------------------------------ 5: hostile clients */

/*
 * Two ranks all-reducing until the parent says stop. They agree on when to
 * stop through the op itself: element 0 carries each rank's view of the stop
 * flag, so both see the same sum and leave after the same op. Then 10 more.
 */
static void sc_steady(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 2, me);
	size_t n = 4096;
	int32_t *s = malloc(n * 4), *d = malloc(n * 4);
	bool stop = false;

	ch_phase(me, 1);
	for (int it = 0; !stop; it++) {
		struct kcoll_req *rq;
		int r;

		for (size_t i = 1; i < n; i++)
			s[i] = val(me, i, it);
		s[0] = load(&B->stop);
		r = kcoll_allreduce(c, s, d, n, KCOLL_I32, KCOLL_SUM, &rq);
		if (!r)
			r = kcoll_wait(rq, 10000);
		if (r) {
			ch_bad(me, "op %d during the fuzz: %s", it, en(r));
			break;
		}
		for (size_t i = 1; i < n; i++) {
			if (d[i] != val(0, i, it) + val(1, i, it)) {
				ch_bad(me, "op %d: element %zu wrong", it, i);
				break;
			}
		}
		stop = d[0] != 0;
		B->s[me].iters++;
	}
	for (int it = 0; it < 10 && !B->s[me].bad; it++) {
		int r = allreduce_checked(c, n, 1000 + it, 10000);

		if (r)
			ch_bad(me, "op %d after the fuzz: %s", it, en(r));
	}
	ch_phase(me, 2);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
}

/*
 * Scratch memory for fuzzed addresses, framed by PROT_NONE guards: a span
 * that passes validation is clamped below GUARD_AFTER bytes, and the other
 * addresses are unmapped or not canonical, so the daemon can only ever
 * write inside the scratch area.
 */
#define SCRATCH		(1u << 20)
#define GUARD_BEFORE	(64u << 10)
#define GUARD_AFTER	(4u << 20)
#define MAX_SPAN	(2u << 20)
static uint8_t *scratch;

static uint64_t fuzz_addr(void)
{
	switch (rnd() % 8) {
	case 0: return 0;
	case 1: return 0x1000;
	case 2: return 0xffff800000000000ull | (rnd() & 0xffffffff);	/* kernel half */
	case 3: return (uintptr_t)scratch + SCRATCH - rnd() % 4096;	/* runs into the guard */
	case 4: return 0x8000000000000000ull | rnd();			/* mostly not canonical */
	default: return (uintptr_t)scratch + rnd() % SCRATCH;
	}
}

static uint64_t fuzz_count(uint8_t dtype)
{
	uint64_t esz = kcoll_dtype_size(dtype), n;

	switch (rnd() % 6) {
	case 0: return 0;
	case 1: n = rnd(); break;
	case 2: n = 1ULL << (rnd() % 63); break;
	default: n = rnd() % 70000; break;
	}
	/* Whatever passes the size check must stay short of the guard's end. */
	if (esz && n <= (1ULL << 40) / esz && n * esz > MAX_SPAN)
		n %= MAX_SPAN / esz;
	return n;
}

/* Mostly valid SQEs with a few fields randomized: reach past validation. */
static void fuzz_structured(struct kcoll_sqe *s, uint32_t comm)
{
	memset(s, 0, sizeof(*s));
	s->opcode = KCOLL_OP_ALLREDUCE + rnd() % 5;
	s->coll.comm_id = rnd() % 16 ? comm : rnd() % 4;
	s->coll.dtype = rnd() % KCOLL_DTYPE_MAX;
	if (s->opcode == KCOLL_OP_ALLREDUCE || s->opcode == KCOLL_OP_REDUCE_SCATTER)
		s->coll.redop = rnd() % KCOLL_REDOP_MAX;
	if (s->opcode != KCOLL_OP_BARRIER) {
		s->coll.count = fuzz_count(s->coll.dtype);
		s->coll.send_addr = fuzz_addr();
		s->coll.recv_addr = rnd() % 4 ? fuzz_addr() : s->coll.send_addr;
		if (s->coll.recv_addr == s->coll.send_addr && rnd() % 2)
			s->flags = KCOLL_SQE_F_IN_PLACE;
	}
	/* and now and then one field of the header or the reserved words */
	switch (rnd() % 16) {
	case 0: s->flags = rnd(); break;
	case 1: s->reserved0 = rnd(); break;
	case 2: s->coll.reserved[rnd() % 3] = rnd(); break;
	case 3: s->coll.root = rnd() % 3; break;
	case 4: s->coll.send_mem = rnd() % 3; break;
	case 5: s->opcode = rnd() % 10; break;
	default: break;
	}
}

/* One round: fill the SQ, publish it at once, collect one CQE per SQE.
 * Returns the number of SQEs answered, -1 on a bad CQE, -2 if disconnected. */
static int fuzz_round(struct kcoll_raw *rc, uint32_t comm, int round, bool structured)
{
	uint32_t n = rc->ring->sq_entries;
	uint8_t seen[KCOLL_RING_MAX_ENTRIES] = { 0 };
	uint32_t got = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct kcoll_sqe s;

		if (structured) {
			fuzz_structured(&s, comm);
		} else {
			for (size_t b = 0; b < sizeof(s); b += 8) {
				uint64_t v = rnd();

				memcpy((uint8_t *)&s + b, &v, 8);
			}
		}
		s.user_data = (uint64_t)round << 32 | i;
		kcoll_raw_sq_write(rc, i, &s);
	}
	kcoll_raw_sq_publish(rc, n);
	while (got < n) {
		struct kcoll_cqe cqe = { 0 };
		int r = kcoll_raw_cqe(rc, &cqe, 10000);
		uint32_t i = (uint32_t)cqe.user_data;

		if (r == -ENOTCONN)
			return -2;
		if (r) {
			tap_diag("fuzz round %d: %u of %u answered, then %s", round, got, n, en(r));
			return -1;
		}
		if (cqe.user_data >> 32 != (uint64_t)round || i >= n || seen[i]++ ||
		    cqe.res > 0 || cqe.res < -4095) {
			tap_diag("fuzz round %d: bad CQE user_data %#llx res %d", round,
				 (unsigned long long)cqe.user_data, cqe.res);
			return -1;
		}
		got++;
	}
	return (int)got;
}

/* A raw client that joined a fresh 1-rank communicator. */
static int raw_solo(struct kcoll_raw *rc, uint32_t sq_entries, uint32_t *comm)
{
	struct kcoll_id id;
	int r = kcoll_raw_open(rc, NULL, sq_entries);

	if (r)
		return r;
	r = kcoll_raw_unique_id(rc, &id);
	if (!r)
		r = kcoll_raw_comm_init(rc, &id, 1, 0, 5000, comm);
	if (r)
		kcoll_raw_close(rc);
	return r;
}

static void hostile_ring(void)
{
	struct kcoll_raw fz;
	uint32_t comm = 0;
	pid_t pid[2];
	int answered = 0, disconnects = 0, bad = 0, r;
	uint8_t *area;

	/* (a) random SQEs while another communicator works */
	area = mmap(NULL, GUARD_BEFORE + SCRATCH + GUARD_AFTER, PROT_NONE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (area == MAP_FAILED || mprotect(area + GUARD_BEFORE, SCRATCH, PROT_READ | PROT_WRITE)) {
		tap_ok(0, "fuzz: scratch memory: %s", strerror(errno));
		return;
	}
	scratch = area + GUARD_BEFORE;
	board_reset();
	new_id(&B->id[0]);
	pid[0] = spawn(sc_steady, 0);
	pid[1] = spawn(sc_steady, 1);
	tap_ok(wait_phase(0, 1, 10000) && wait_phase(1, 1, 10000),
	       "fuzz: a 2-rank communicator of two other processes formed");
	r = raw_solo(&fz, 64, &comm);
	tap_ok(r == 0, "fuzz: raw client joined a 1-rank communicator (%s)", en(r));
	for (int round = 0; !r && round < 16; round++) {
		int n = fuzz_round(&fz, comm, round, round % 2);

		if (n == -2) {
			disconnects++;
			kcoll_raw_close(&fz);
			r = raw_solo(&fz, 64, &comm);
		} else if (n < 0) {
			bad++;
			break;
		} else {
			answered += n;
		}
	}
	tap_ok(!r && !bad, "fuzz: 16 rounds of 64 random SQEs: every SQE answered by one CQE "
	       "or its client disconnected (%d answered, %d disconnects)", answered, disconnects);
	tap_ok(kill((pid_t)dpid, 0) == 0, "fuzz: kcolld is still running");
	store(&B->stop, 1);
	for (int i = 0; i < 2; i++) {
		int st = wait_kid(pid[i], 15000);

		tap_ok(st >= 0 && WIFEXITED(st) && !WEXITSTATUS(st) && !B->s[i].bad &&
		       load(&B->s[i].phase) == 2 && B->s[i].iters > 0,
		       "fuzz: rank %d of the other communicator: %ld correct all-reduces during the fuzz, 10 after (%s)",
		       i, B->s[i].iters, B->s[i].bad ? B->s[i].why : "ok");
	}
	tap_ok(daemon_answers_status(), "fuzz: kcollctl status --json still answers");
	if (fz.sock >= 0)
		kcoll_raw_close(&fz);
	munmap(area, GUARD_BEFORE + SCRATCH + GUARD_AFTER);

	/* (b) sq_tail forged far ahead of sq_head */
	r = raw_solo(&fz, 64, &comm);
	if (tap_ok(r == 0, "forged sq_tail: raw client ready (%s)", en(r))) {
		kcoll_raw_set_sq_tail(&fz, kcoll_load_acquire(&fz.ring->sq_head) + 100000);
		r = kcoll_raw_wait_closed(&fz, 3000);
		tap_ok(r == 0 && kcoll_raw_ring_dead(&fz),
		       "forged sq_tail = sq_head + 100000: ring marked DEAD and socket closed (%s, status %#x)",
		       en(r), fz.ring->status);
		kcoll_raw_close(&fz);
	}
	/* (c) cq_head forged */
	r = raw_solo(&fz, 64, &comm);
	if (tap_ok(r == 0, "forged cq_head: raw client ready (%s)", en(r))) {
		struct kcoll_sqe nop = { .opcode = KCOLL_OP_NOP };
		struct kcoll_cqe cqe;

		r = kcoll_raw_run(&fz, &nop, &cqe, 3000);
		tap_ok(r == 0 && cqe.res == 0, "forged cq_head: a NOP completes first (%s)", en(r));
		kcoll_raw_set_cq_head(&fz, kcoll_load_acquire(&fz.ring->cq_tail) + 100000);
		kcoll_raw_submit(&fz, &nop);
		r = kcoll_raw_wait_closed(&fz, 3000);
		tap_ok(r == 0 && kcoll_raw_ring_dead(&fz),
		       "forged cq_head = cq_tail + 100000: ring marked DEAD and socket closed (%s, status %#x)",
		       en(r), fz.ring->status);
		kcoll_raw_close(&fz);
	}
	tap_ok(shared_daemon_ok(), "forged indices: other clients unaffected (1-rank all-reduce ok)");
}

/* The daemon answered with an error or hung up: either is a refusal. */
static bool refused(struct kcoll_raw *rc)
{
	union {
		struct kcoll_msg_hdr hdr;
		char buf[512];
	} rep;
	ssize_t n = kcoll_raw_recv(rc, &rep, sizeof(rep), NULL, 3000);

	return n == 0 || n == -ECONNRESET || (n > 0 && rep.hdr.status < 0);
}

static void ctl_fresh(struct kcoll_raw *rc, bool hello)
{
	int r = hello ? kcoll_raw_open(rc, NULL, 8) : kcoll_raw_connect(rc, NULL);

	if (r)
		tap_diag("raw connect: %s", en(r));
}

static int ctl_call_hdr(struct kcoll_raw *rc, void *msg, size_t len)
{
	union {
		struct kcoll_msg_hdr hdr;
		char buf[512];
	} rep;

	return kcoll_raw_call(rc, msg, len, &rep, sizeof(rep), NULL, 3000);
}

static void hostile_control(void)
{
	struct kcoll_raw rc;
	struct kcoll_msg_hello hello = {
		.hdr.type = KCOLL_MSG_HELLO, .proto_version = KCOLL_PROTO_VERSION,
		.abi_version = KCOLL_ABI_VERSION, .sq_entries = 8,
	};
	struct kcoll_msg_hdr h;
	struct kcoll_msg_comm_init ci;
	struct kcoll_msg_comm_destroy cd;
	struct kcoll_msg_mem_reg mr;
	uint8_t junk[4096];
	int r;

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)rnd();

	ctl_fresh(&rc, false);
	kcoll_raw_send_bytes(&rc, junk, 64);
	tap_ok(refused(&rc), "control: 64 random bytes -> error reply or disconnect");
	kcoll_raw_close(&rc);

	ctl_fresh(&rc, false);
	h = (struct kcoll_msg_hdr){ .magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_HELLO, .len = 24 };
	kcoll_raw_send_bytes(&rc, &h, 8);
	tap_ok(refused(&rc), "control: 8 bytes of a header (truncated) -> error reply or disconnect");
	kcoll_raw_close(&rc);

	ctl_fresh(&rc, false);
	h = (struct kcoll_msg_hdr){ .magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_STATUS,
				    .len = sizeof(h) + 100 };
	kcoll_raw_send_bytes(&rc, &h, sizeof(h));
	tap_ok(refused(&rc), "control: header whose len exceeds the datagram -> error reply or disconnect");
	kcoll_raw_close(&rc);

	ctl_fresh(&rc, false);
	memcpy(junk, &(struct kcoll_msg_hdr){ .magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_STATUS,
					     .len = sizeof(junk) }, sizeof(h));
	kcoll_raw_send_bytes(&rc, junk, sizeof(junk));
	tap_ok(refused(&rc), "control: 4096-byte message -> error reply or disconnect");
	kcoll_raw_close(&rc);

	ctl_fresh(&rc, false);
	kcoll_raw_send_bytes(&rc, junk, 0);
	tap_ok(refused(&rc), "control: empty datagram -> error reply or disconnect");
	kcoll_raw_close(&rc);

	ctl_fresh(&rc, false);
	h = (struct kcoll_msg_hdr){ .type = KCOLL_MSG_UNIQUE_ID };
	r = ctl_call_hdr(&rc, &h, sizeof(h));
	tap_ok(r == -EPROTO, "control: UNIQUE_ID before HELLO -> EPROTO (got %s)", en(r));
	memset(&ci, 0, sizeof(ci));
	ci.hdr.type = KCOLL_MSG_COMM_INIT;
	r = ctl_call_hdr(&rc, &ci, sizeof(ci));
	tap_ok(r == -EPROTO, "control: COMM_INIT before HELLO -> EPROTO (got %s)", en(r));
	r = ctl_call_hdr(&rc, &hello, sizeof(h));
	tap_ok(r == -EPROTO, "control: HELLO cut to its header -> EPROTO (got %s)", en(r));
	kcoll_raw_close(&rc);

	ctl_fresh(&rc, true);
	r = ctl_call_hdr(&rc, &hello, sizeof(hello));
	tap_ok(r == -EPROTO, "control: repeated HELLO -> EPROTO (got %s)", en(r));
	{
		struct kcoll_sqe nop = { .opcode = KCOLL_OP_NOP, .user_data = 7 };
		struct kcoll_cqe cqe;

		r = rc.ring ? kcoll_raw_run(&rc, &nop, &cqe, 3000) : -ENOTCONN;
		tap_ok(r == 0 && cqe.res == 0 && cqe.user_data == 7,
		       "control: the first ring still works after a repeated HELLO (%s)", en(r));
	}
	h = (struct kcoll_msg_hdr){ .type = 99 };
	r = ctl_call_hdr(&rc, &h, sizeof(h));
	tap_ok(r == -EOPNOTSUPP, "control: message type 99 -> EOPNOTSUPP (got %s)", en(r));
	{
		struct kcoll_msg_c4 q = { .hdr = { .type = KCOLL_MSG_C4, .flags = KCOLL_C4_F_LOCAL << 1 },
					  .what = KCOLL_C4_ANOMALIES };

		r = ctl_call_hdr(&rc, &q, sizeof(q));
		tap_ok(r == -EOPNOTSUPP, "control: C4 request with an unknown flag -> EOPNOTSUPP (got %s)", en(r));
		q.hdr.flags = KCOLL_C4_F_JSON | KCOLL_C4_F_LOCAL;
		r = ctl_call_hdr(&rc, &q, sizeof(q));
		tap_ok(r == 0, "control: C4 request with JSON and LOCAL -> answered (got %s)", en(r));
	}
	h = (struct kcoll_msg_hdr){ .type = KCOLL_MSG_COMM_INIT };
	r = ctl_call_hdr(&rc, &h, sizeof(h));
	tap_ok(r == -EINVAL, "control: COMM_INIT cut to its header -> EINVAL (got %s)", en(r));
	memset(&ci, 0, sizeof(ci));
	ci.hdr.type = KCOLL_MSG_COMM_INIT;
	ci.nranks = 1;
	r = ctl_call_hdr(&rc, &ci, sizeof(ci));
	tap_ok(r == -EINVAL, "control: COMM_INIT with a zeroed id -> EINVAL (got %s)", en(r));
	r = kcoll_raw_unique_id(&rc, &ci.id);
	ci.nranks = 0;
	r = r ? r : ctl_call_hdr(&rc, &ci, sizeof(ci));
	tap_ok(r == -EINVAL, "control: COMM_INIT nranks 0 -> EINVAL (got %s)", en(r));
	ci.nranks = 2;
	ci.rank = 2;
	r = ctl_call_hdr(&rc, &ci, sizeof(ci));
	tap_ok(r == -EINVAL, "control: COMM_INIT rank == nranks -> EINVAL (got %s)", en(r));
	ci.nranks = 257;
	ci.rank = 0;
	r = ctl_call_hdr(&rc, &ci, sizeof(ci));
	tap_ok(r == -EINVAL, "control: COMM_INIT nranks 257 -> EINVAL (got %s)", en(r));
	memset(&mr, 0, sizeof(mr));
	mr.hdr.type = KCOLL_MSG_MEM_REG;
	mr.addr = 1 << 20;
	mr.size = 4096;
	r = ctl_call_hdr(&rc, &mr, sizeof(mr));
	tap_ok(r == -EINVAL, "control: MEM_REG without a memfd -> EINVAL (got %s)", en(r));
	{
		int fd = memfd_create("kcoll-test-unsealed", MFD_CLOEXEC);
		union {
			struct kcoll_msg_hdr hdr;
			char buf[512];
		} rep;

		r = fd < 0 || ftruncate(fd, 4096) ? -errno : kcoll_raw_send_msg(&rc, &mr, sizeof(mr), fd);
		if (!r) {
			ssize_t n = kcoll_raw_recv(&rc, &rep, sizeof(rep), NULL, 3000);

			r = n > 0 ? rep.hdr.status : n ? (int)n : -ENOTCONN;
		}
		tap_ok(r == -EPERM, "control: MEM_REG of an unsealed memfd -> EPERM (got %s)", en(r));
		if (fd >= 0)
			close(fd);
	}
	memset(&cd, 0, sizeof(cd));
	cd.hdr.type = KCOLL_MSG_COMM_DESTROY;
	r = ctl_call_hdr(&rc, &cd, sizeof(cd));
	tap_ok(r == -EINVAL, "control: COMM_DESTROY handle 0 -> EINVAL (got %s)", en(r));
	cd.comm_id = 5;
	r = ctl_call_hdr(&rc, &cd, sizeof(cd));
	tap_ok(r == -ENOENT, "control: COMM_DESTROY of a handle never given -> ENOENT (got %s)", en(r));
	kcoll_raw_close(&rc);

	tap_ok(kill((pid_t)dpid, 0) == 0 && daemon_answers_status() && shared_daemon_ok(),
	       "control: kcolld alive and serving after the bad messages");
}

/* ------------------------------------------------------------------ 6: versions */

static void versions(void)
{
	struct kcoll_msg_hello_reply rep;
	struct kcoll_raw rc;
	char want[32];
	int r;

	memset(&rep, 0, sizeof(rep));
	r = kcoll_raw_connect(&rc, NULL);
	if (!r)
		r = kcoll_raw_hello(&rc, KCOLL_PROTO_VERSION, 99, 8, &rep);
	snprintf(want, sizeof(want), "%u / %u", KCOLL_PROTO_VERSION, KCOLL_ABI_VERSION);
	tap_ok(r == -EPROTONOSUPPORT && !rc.ring, "abi: HELLO with abi_version 99 -> EPROTONOSUPPORT (got %s)",
	       en(r));
	tap_ok(strstr(rep.error, "99") && strstr(rep.error, want),
	       "abi: the refusal names both versions: \"%.*s\"", (int)sizeof(rep.error), rep.error);
	kcoll_raw_close(&rc);

	r = kcoll_raw_connect(&rc, NULL);
	if (!r)
		r = kcoll_raw_hello(&rc, 99, KCOLL_ABI_VERSION, 8, &rep);
	tap_ok(r == -EPROTONOSUPPORT && strstr(rep.error, "99") && strstr(rep.error, want),
	       "abi: HELLO with proto_version 99 -> EPROTONOSUPPORT naming both (got %s)", en(r));
	kcoll_raw_close(&rc);
}

static struct kcoll_ring_hdr good_hdr(void)
{
	struct kcoll_ring_hdr h = {
		.magic = KCOLL_RING_MAGIC, .abi_version = KCOLL_ABI_VERSION,
		.hdr_size = KCOLL_RING_HDR_SIZE, .sq_entries = 64, .cq_entries = 128,
		.sqe_size = sizeof(struct kcoll_sqe), .cqe_size = sizeof(struct kcoll_cqe),
	};

	h.sq_off = kcoll_ring_sq_off();
	h.cq_off = kcoll_ring_cq_off(64);
	h.ring_size = kcoll_ring_size(64, 128);
	return h;
}

static void hdr_case(const char *what, struct kcoll_ring_hdr h, uint64_t map, int want)
{
	const char *why = NULL;
	int r = kcoll_ring_hdr_check(&h, map, &why);

	tap_ok(r == want && (want == 0 || (why && *why)),
	       "ring_hdr_check: %s -> %s (got %s: %s)", what, en(want), en(r), why ? why : "-");
}

static void hdr_checks(void)
{
	struct kcoll_ring_hdr g = good_hdr(), h;
	uint64_t map = g.ring_size;

	hdr_case("valid header", g, map, 0);
	h = g, h.magic ^= 1;
	hdr_case("bad magic", h, map, -EPROTO);
	h = g, h.abi_version = KCOLL_ABI_VERSION + 1;
	hdr_case("abi_version + 1", h, map, -EPROTONOSUPPORT);
	h = g, h.hdr_size = 2048;
	hdr_case("hdr_size 2048", h, map, -EPROTONOSUPPORT);
	h = g, h.sqe_size = 128;
	hdr_case("sqe_size 128", h, map, -EPROTONOSUPPORT);
	h = g, h.cqe_size = 16;
	hdr_case("cqe_size 16", h, map, -EPROTONOSUPPORT);
	h = g, h.sq_entries = 0;
	hdr_case("sq_entries 0", h, map, -EPROTO);
	h = g, h.sq_entries = 48;
	hdr_case("sq_entries 48 (not a power of two)", h, map, -EPROTO);
	h = g, h.sq_entries = 2 * KCOLL_RING_MAX_ENTRIES, h.cq_entries = 2 * KCOLL_RING_MAX_ENTRIES;
	hdr_case("sq_entries 2 * max", h, map, -EPROTO);
	h = g, h.cq_entries = 96;
	hdr_case("cq_entries 96 (not a power of two)", h, map, -EPROTO);
	h = g, h.cq_entries = 32;
	hdr_case("cq_entries < sq_entries", h, map, -EPROTO);
	h = g, h.cq_entries = 4 * KCOLL_RING_MAX_ENTRIES;
	hdr_case("cq_entries 4 * max", h, map, -EPROTO);
	h = g, h.sq_off += 64;
	hdr_case("sq_off + 64", h, map, -EPROTO);
	h = g, h.cq_off -= 64;
	hdr_case("cq_off - 64", h, map, -EPROTO);
	h = g, h.ring_size += 4096;
	hdr_case("ring_size + 4096", h, map + 4096, -EPROTO);
	hdr_case("mapping shorter than ring_size", g, map - 4096, -EPROTO);
}

/* ------------------------------------------------------------------ 7-8: dying and stalled ranks */

/* Slots 0-2: ranks of comm id[0] (3 ranks); slot 2 never submits. Slots 3-4:
 * ranks of comm id[1]. */
static void sc_victim(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c;
	struct kcoll_req *rq;
	int32_t s[256] = { 0 }, d[256];
	int r = 0;

	if (me < 3) {
		c = ch_join(k, me, 0, 3, me);
		ch_phase(me, 1);
		if (me == 2)
			for (;;)
				pause();
		ch_wait_go(me, 1);
		r = kcoll_allreduce(c, s, d, 256, KCOLL_I32, KCOLL_SUM, &rq);
		ch_phase(me, 2);
		rec_wait(me, r, &rq, 15000);
	} else {
		c = ch_join(k, me, 1, 2, me - 3);
		ch_phase(me, 1);
		ch_wait_go(me, 1);
		for (int i = 0; i < 20; i++) {
			r = allreduce_checked(c, 10000, i, 10000);
			if (r) {
				ch_bad(me, "op %d: %s", i, en(r));
				break;
			}
		}
		ch_rec(me, r, -1);
	}
	ch_phase(me, 3);
	kcoll_disconnect(k);
}

/* Ranks 0-2 of a 64 MiB all-reduce on malloc'ed buffers (the copy path). */
static void sc_large(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 3, me);
	size_t n = (64u << 20) / 4;
	float *s = malloc(n * 4), *d = malloc(n * 4);
	struct kcoll_req *rq;
	int r;

	if (!s || !d)
		_exit(5);
	for (size_t i = 0; i < n; i++)
		s[i] = 1.0f;
	memset(d, 0, n * 4);
	ch_phase(me, 1);
	ch_wait_go(me, 1);
	r = kcoll_allreduce(c, s, d, n, KCOLL_F32, KCOLL_SUM, &rq);
	ch_phase(me, 2);
	rec_wait(me, r, &rq, 20000);
	ch_phase(me, 3);
	kcoll_disconnect(k);
}

static void dying_rank(void)
{
	pid_t pid[5];
	int64_t t_kill;
	bool ok = true;

	board_reset();
	new_id(&B->id[0]);
	new_id(&B->id[1]);
	for (int i = 0; i < 5; i++)
		pid[i] = spawn(sc_victim, i);
	for (int i = 0; i < 5; i++)
		ok &= wait_phase(i, 1, 10000);
	tap_ok(ok, "dead rank: a 3-rank and a 2-rank communicator formed");
	go(0, 1);
	go(1, 1);
	ok = wait_phase(0, 2, 5000) && wait_phase(1, 2, 5000);
	usleep(50000);
	t_kill = now_ns();
	kill(pid[2], SIGKILL);
	wait_kid(pid[2], 5000);
	ok &= wait_phase(0, 3, 10000) && wait_phase(1, 3, 10000);
	for (int i = 0; i < 2; i++) {
		struct slot *s = &B->s[i];
		double dt = s->nval ? (s->t_ns[0] - t_kill) / 1e9 : -1;

		tap_ok(ok && s->nval == 1 && s->res[0] == -ECONNRESET && s->err_rank[0] == 2 && dt < 2.0,
		       "dead rank: rank %d gets ECONNRESET, err_rank 2, %.3f s after rank 2 was killed (got %s, %d)",
		       i, dt, en(s->res[0]), s->err_rank[0]);
	}
	go(3, 1);
	go(4, 1);
	for (int i = 3; i < 5; i++) {
		int st = wait_kid(pid[i], 15000);

		tap_ok(st >= 0 && WIFEXITED(st) && !WEXITSTATUS(st) && B->s[i].nval == 1 &&
		       B->s[i].res[0] == 0,
		       "dead rank: the other communicator's rank %d: 20 correct all-reduces after the kill (%s)",
		       i - 3, B->s[i].bad ? B->s[i].why : en(B->s[i].res[0]));
	}
	wait_kid(pid[0], 5000);
	wait_kid(pid[1], 5000);

	/* killed in the middle of a 64 MiB single-copy all-reduce */
	board_reset();
	new_id(&B->id[0]);
	for (int i = 0; i < 3; i++)
		pid[i] = spawn(sc_large, i);
	ok = wait_phase(0, 1, 10000) && wait_phase(1, 1, 10000) && wait_phase(2, 1, 10000);
	for (int i = 0; i < 3; i++)
		go(i, 1);
	ok &= wait_phase(0, 2, 5000) && wait_phase(1, 2, 5000) && wait_phase(2, 2, 5000);
	usleep(5000);
	t_kill = now_ns();
	kill(pid[2], SIGKILL);
	wait_kid(pid[2], 5000);
	for (int i = 0; i < 2; i++) {
		struct slot *s = &B->s[i];
		bool done = wait_phase(i, 3, 20000);
		double dt = s->nval ? (s->t_ns[0] - t_kill) / 1e9 : -1;

		tap_ok(ok && done && s->nval == 1 && (s->res[0] == 0 || s->res[0] == -ECONNRESET) &&
		       (s->res[0] == 0 || s->err_rank[0] == 2),
		       "dead rank mid-copy: survivor %d completes with success or ECONNRESET/err_rank 2 (got %s, %d, %.3f s after the kill)",
		       i, en(s->res[0]), s->err_rank[0], dt);
		wait_kid(pid[i], 5000);
	}
	tap_ok(shared_daemon_ok(), "dead rank mid-copy: kcolld alive and serving");
}

/* Ranks 0,1 on kcoll_mem_alloc buffers, 4 ops queued back to back (so the
 * daemon chains them), then everything freed and the connection closed. */
static void sc_chain(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 2, me);
	size_t n = 1u << 20;
	float *s, *d;
	int r;

	if (kcoll_mem_alloc(k, n * 4, (void **)&s) || kcoll_mem_alloc(k, n * 4, (void **)&d)) {
		ch_bad(me, "kcoll_mem_alloc failed");
		_exit(5);
	}
	for (size_t i = 0; i < n; i++)
		s[i] = (float)(me + 1);
	for (int it = 0; it < 5; it++) {
		struct kcoll_req *rq[4];

		for (int j = 0; j < 4; j++) {
			r = kcoll_allreduce(c, s, d, n, KCOLL_F32, KCOLL_SUM, &rq[j]);
			if (r) {
				ch_bad(me, "submit: %s", en(r));
				_exit(5);
			}
		}
		for (int j = 0; j < 4; j++) {
			r = kcoll_wait(rq[j], 10000);
			if (r || d[n - 1] != 3.0f)
				ch_bad(me, "op %d: %s", it * 4 + j, r ? en(r) : "wrong data");
		}
	}
	kcoll_mem_free(k, s);
	kcoll_mem_free(k, d);
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	ch_phase(me, 1);
}

/* Lines of the shared kcolld's /proc/<pid>/maps that contain what. */
static int daemon_maps(const char *what)
{
	char path[64], line[512];
	int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%u/maps", dpid);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

/* A client that leaves takes its ring and shared buffers with it. */
static void departed_client(void)
{
	int64_t deadline = now_ns() + 2000000000LL;
	int buf0, ring0, buf, ring;
	bool ok;

	/* Baseline once the clients of earlier checks are reaped: only our
	 * own two rings (K, RC) are left. */
	while (daemon_maps("kcoll-ring") > 2 && now_ns() < deadline)
		usleep(10000);
	buf0 = daemon_maps("kcoll-buf");
	ring0 = daemon_maps("kcoll-ring");
	board_reset();
	new_id(&B->id[0]);
	ok = run_ranks(sc_chain, 2, 20000);
	tap_ok(ok && !B->s[0].bad && !B->s[1].bad,
	       "departed: 2 ranks ran 20 chained all-reduces on kcoll_mem_alloc buffers and left (%s)",
	       B->s[0].bad ? B->s[0].why : B->s[1].bad ? B->s[1].why : "ok");
	deadline = now_ns() + 2000000000LL;
	do {
		usleep(10000);
		buf = daemon_maps("kcoll-buf");
		ring = daemon_maps("kcoll-ring");
	} while ((buf > buf0 || ring > ring0) && now_ns() < deadline);
	tap_ok(buf0 >= 0 && buf == buf0,
	       "departed: kcolld unmapped the 4 shared buffers of the 2 clients that left (kcoll-buf mappings: %d before, %d after)",
	       buf0, buf);
	tap_ok(ring0 >= 0 && ring == ring0,
	       "departed: kcolld unmapped their rings (kcoll-ring mappings: %d before, %d after)", ring0,
	       ring);
}

static bool staller_timed;	/* sc_staller's rank 0 waits with kcoll_timedwait */

static void sc_staller(int me)
{
	struct kcoll *k;
	struct kcoll_comm *c;
	struct kcoll_req *rq = NULL;
	int32_t s[64] = { 0 }, d[64];
	int r, t, res = 1;

	setenv("KCOLL_TIMEOUT_MS", "1500", 1);
	k = ch_connect(me);
	c = ch_join(k, me, 0, 2, me);
	ch_phase(me, 1);
	if (me == 1) {
		ch_wait_go(me, 1);	/* alive, never submits */
		kcoll_disconnect(k);
		return;
	}
	r = kcoll_allreduce(c, s, d, 64, KCOLL_I32, KCOLL_SUM, &rq);
	if (!staller_timed) {
		ch_rec(me, 0, -1);	/* t_ns[0]: submitted */
		/* The old way: the blamed rank read from the freed request,
		 * right here where no other thread submits. */
		t = r ? r : kcoll_wait(rq, 5000);
		ch_rec(me, t, r ? -1 : kcoll_req_err_rank(rq));
	} else {
		ch_rec(me, r, -1);		/* [0] submitted */
		t = r ? r : kcoll_timedwait(rq, 100, &res);
		ch_rec(me, t, res);		/* [1] pending: 0, res untouched */
		usleep(3000 * 1000);		/* the operation fails after 1.5 s, unseen */
		t = r ? r : kcoll_timedwait(rq, 0, &res);
		ch_rec(me, t, res);		/* [2] 1, -ETIMEDOUT */
		t = r ? r : kcoll_timedwait(rq, 0, &res);
		ch_rec(me, t, -1);		/* [3] freed: -EINVAL */
	}
	ch_phase(me, 2);
	kcoll_disconnect(k);
}

/* Rank 1 joins and never submits. timed: rank 0 waits with
 * kcoll_timedwait, which tells "still pending" from "failed with
 * ETIMEDOUT" (kcoll_wait answers both -ETIMEDOUT). */
static void stalled_rank(bool timed)
{
	pid_t pid[2];
	struct slot *s = &B->s[0];
	double dt;

	staller_timed = timed;
	board_reset();
	new_id(&B->id[0]);
	pid[0] = spawn(sc_staller, 0);
	pid[1] = spawn(sc_staller, 1);
	wait_phase(0, 2, 15000);
	if (!timed) {
		dt = s->nval == 2 ? (s->t_ns[1] - s->t_ns[0]) / 1e9 : -1;
		tap_ok(s->nval == 2 && s->res[1] == -ETIMEDOUT && s->err_rank[1] == 1 && dt >= 1.4 && dt < 2.5,
		       "stalled rank: KCOLL_TIMEOUT_MS=1500, rank 1 never submits -> rank 0 ETIMEDOUT, err_rank 1, after %.3f s (got %s, %d)",
		       dt, en(s->res[1]), s->err_rank[1]);
	} else {
		tap_ok(s->nval == 4 && s->res[0] == 0 && s->res[1] == 0 && s->err_rank[1] == 1,
		       "timedwait: rank 1 never submits: after 100 ms still pending, 0 and the result untouched (got %d, %d)",
		       s->nval > 1 ? s->res[1] : -1, s->nval > 1 ? s->err_rank[1] : -1);
		tap_ok(s->nval == 4 && s->res[2] == 1 && s->err_rank[2] == -ETIMEDOUT && s->res[3] == -EINVAL,
		       "timedwait: once the operation failed (1.5 s timeout): 1 and -ETIMEDOUT, then -EINVAL for the freed request (got %d %s, %s)",
		       s->nval > 2 ? s->res[2] : -1, s->nval > 2 ? en(s->err_rank[2]) : "-",
		       s->nval > 3 ? en(s->res[3]) : "-");
	}
	go(1, 1);
	wait_kid(pid[0], 5000);
	wait_kid(pid[1], 5000);
}

/* ------------------------------------------------------------------ 9, 11: a private kcolld */

static pid_t start_kcolld(const char *sock)
{
	char bin[512], log[512];
	pid_t pid;

	snprintf(bin, sizeof(bin), "%s/bin/kcolld", getenv("KCOLL_BUILD"));
	snprintf(log, sizeof(log), "%s.log", sock);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		child_setup();
		alarm(0);
		execl(bin, bin, "-f", "-s", sock, "-l", log, "-w", "2", (char *)NULL);
		_exit(127);
	}
	if (pid < 0)
		return -errno;
	kid_add(pid);
	for (int i = 0; i < 200; i++) {
		struct kcoll_raw rc;

		if (kcoll_raw_connect(&rc, sock) == 0) {
			kcoll_raw_close(&rc);
			return pid;
		}
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			kid_forget(pid);
			return -ECHILD;
		}
		usleep(25000);
	}
	return -ETIMEDOUT;
}

static int private_id(const char *sock, kcoll_unique_id_t *out)
{
	struct kcoll_raw rc;
	struct kcoll_id id;
	int r = kcoll_raw_open(&rc, sock, 8);

	if (r)
		return r;
	r = kcoll_raw_unique_id(&rc, &id);
	kcoll_raw_close(&rc);
	memset(out, 0, sizeof(*out));
	memcpy(out->bytes, &id, sizeof(id));
	return r;
}

/* Rank 0 submits and waits; rank 1 joins and then only waits for go 1. */
static void sc_orphan(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 2, me);
	int32_t s[64] = { 0 }, d[64];
	struct kcoll_req *rq;
	int r;

	ch_phase(me, 1);
	if (me == 1) {
		ch_wait_go(me, 1);
		return;
	}
	r = kcoll_allreduce(c, s, d, 64, KCOLL_I32, KCOLL_SUM, &rq);
	ch_phase(me, 2);
	rec_wait(me, r, &rq, 5000);
	ch_phase(me, 3);
}

static void daemon_killed(void)
{
	struct kcoll_connect_opts o = { .size = sizeof(o) };
	struct slot *s = &B->s[0];
	struct kcoll *k;
	pid_t d, pid[2];
	int64_t t_kill;
	double dt;
	int r;

	board_reset();
	snprintf(B->sock, sizeof(B->sock), "%s/other.sock", getenv("KCOLL_TEST_TMP"));
	d = start_kcolld(B->sock);
	if (!tap_ok(d > 0, "killed daemon: a second kcolld started on %s (%s)", B->sock, d > 0 ? "ok" : en(d)))
		return;
	r = private_id(B->sock, &B->id[0]);
	pid[0] = spawn(sc_orphan, 0);
	pid[1] = spawn(sc_orphan, 1);
	tap_ok(!r && wait_phase(0, 2, 10000) && wait_phase(1, 1, 10000),
	       "killed daemon: 2 ranks joined, rank 0 submitted an all-reduce rank 1 never joins");
	usleep(100000);
	t_kill = now_ns();
	kill(d, SIGKILL);
	wait_kid(d, 5000);
	wait_phase(0, 3, 5000);
	dt = s->nval ? (s->t_ns[0] - t_kill) / 1e9 : -1;
	tap_ok(s->nval == 1 && s->res[0] == -ENOTCONN && dt < 1.0,
	       "killed daemon: rank 0's kcoll_wait -> ENOTCONN %.3f s after SIGKILL (< 1.0 s) (got %s)",
	       dt, en(s->res[0]));
	o.socket_path = B->sock;
	r = kcoll_connect(&o, &k);
	tap_ok(r == -ECONNREFUSED, "killed daemon: kcoll_connect to its socket -> ECONNREFUSED (got %s)",
	       en(r));
	if (!r)
		kcoll_disconnect(k);
	go(1, 1);
	wait_kid(pid[0], 5000);
	wait_kid(pid[1], 5000);
}

/* Both ranks: an op that completes while kcolld drains, then one after. */
static void sc_drain(int me)
{
	struct kcoll *k = ch_connect(me);
	struct kcoll_comm *c = ch_join(k, me, 0, 2, me);
	struct kcoll_req *rq;
	int32_t s[64] = { 0 }, d[64];
	int r;

	ch_phase(me, 1);
	ch_wait_go(me, 1);
	ch_rec(me, allreduce_checked(c, 100000, 11, 10000), -1);
	ch_phase(me, 2);
	ch_wait_go(me, 2);
	r = kcoll_allreduce(c, s, d, 64, KCOLL_I32, KCOLL_SUM, &rq);
	rec_wait(me, r, &rq, 5000);
	ch_phase(me, 3);
	kcoll_disconnect(k);
}

/* The daemon on sock reports an op in flight (status counters.inflight)
 * within timeout_ms. */
static bool wait_inflight(const char *sock, int timeout_ms)
{
	static char buf[KCOLL_MSG_BYTES];
	static const char key[] = "\"inflight\":";
	int64_t end = kcoll_raw_now_ms() + timeout_ms;

	do {
		struct kcoll_raw rc;
		const char *p = NULL;

		if (!kcoll_raw_connect(&rc, sock)) {
			if (!kcoll_raw_status(&rc, 1, buf, sizeof(buf)))
				p = strstr(buf, key);
			kcoll_raw_close(&rc);
		}
		if (p && strtoull(p + strlen(key), NULL, 10) > 0)
			return true;
		usleep(10000);
	} while (kcoll_raw_now_ms() < end);
	return false;
}

static void daemon_drained(void)
{
	struct kcoll_connect_opts o = { .size = sizeof(o) };
	struct stat st;
	struct kcoll *k;
	pid_t d, pid[2];
	int r, ds;
	bool waited, inflight;

	board_reset();
	snprintf(B->sock, sizeof(B->sock), "%s/drain.sock", getenv("KCOLL_TEST_TMP"));
	d = start_kcolld(B->sock);
	if (!tap_ok(d > 0, "drain: a second kcolld started on %s (%s)", B->sock, d > 0 ? "ok" : en(d)))
		return;
	r = private_id(B->sock, &B->id[0]);
	pid[0] = spawn(sc_drain, 0);
	pid[1] = spawn(sc_drain, 1);
	tap_ok(!r && wait_phase(0, 1, 10000) && wait_phase(1, 1, 10000), "drain: 2 ranks joined");
	go(0, 1);
	/* rank 0's op is in flight, waiting for rank 1 (the daemon says so: a
	 * fixed pause could end before a busy machine ran rank 0's submit) */
	inflight = wait_inflight(B->sock, 20000);
	kill(d, SIGTERM);
	usleep(300000);
	waited = waitpid(d, &ds, WNOHANG) == 0;
	go(1, 1);
	tap_ok(inflight && wait_phase(0, 2, 8000) && wait_phase(1, 2, 8000) && B->s[0].res[0] == 0 &&
	       B->s[1].res[0] == 0,
	       "drain: the op in flight at SIGTERM (%s) completes on both ranks (got %s, %s)",
	       inflight ? "the daemon counted it" : "never seen in flight",
	       en(B->s[0].res[0]), en(B->s[1].res[0]));
	ds = wait_kid(d, 8000);
	tap_ok(waited && ds >= 0 && WIFEXITED(ds) && WEXITSTATUS(ds) == 0,
	       "drain: kcolld waited for the op, then exited 0 (status %#x)", ds);
	r = stat(B->sock, &st) ? -errno : 0;
	tap_ok(r == -ENOENT, "drain: kcolld removed its socket (stat: %s)", en(r));
	go(0, 2);
	go(1, 2);
	wait_phase(0, 3, 5000);
	wait_phase(1, 3, 5000);
	tap_ok(B->s[0].res[1] == -ENOTCONN && B->s[1].res[1] == -ENOTCONN,
	       "drain: later ops -> ENOTCONN on both ranks (got %s, %s)", en(B->s[0].res[1]),
	       en(B->s[1].res[1]));
	o.socket_path = B->sock;
	r = kcoll_connect(&o, &k);
	tap_ok(r == -ECONNREFUSED, "drain: kcoll_connect afterwards -> ECONNREFUSED (got %s)", en(r));
	if (!r)
		kcoll_disconnect(k);
	wait_kid(pid[0], 5000);
	wait_kid(pid[1], 5000);
}

/* ------------------------------------------------------------------ 10: another uid */

/* Why uid 65534 cannot reach the socket, or NULL if it can. */
static const char *unreachable_by_others(const char *sock, char *why, size_t cap)
{
	char path[256], *p;
	struct stat st;

	snprintf(path, sizeof(path), "%s", sock);
	if (stat(path, &st) || (st.st_mode & 0006) != 0006) {
		snprintf(why, cap, "%.200s is not read/writable by others", sock);
		return why;
	}
	while ((p = strrchr(path, '/')) && p != path) {
		*p = 0;
		if (stat(path, &st) || !(st.st_mode & S_IXOTH)) {
			snprintf(why, cap, "%.200s is not traversable by other users (chmod o+x it)", path);
			return why;
		}
	}
	return NULL;
}

static void sc_nobody(int me)
{
	struct kcoll_raw rc;
	struct kcoll *k;
	struct kcoll_comm *c;
	char p[64];
	int r, worst = 0;
	DIR *dir;

	if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) {
		ch_bad(me, "cannot become uid %d: %s", NOBODY, strerror(errno));
		_exit(6);
	}
	k = ch_connect(me);
	/* (a) join root's forming communicator */
	r = kcoll_comm_init_rank(k, &B->id[0], 2, 1, &c);
	ch_rec(me, r, -1);
	if (!r)
		kcoll_comm_destroy(c);
	/* (b) the daemon's descriptors and mappings: every open must be refused */
	snprintf(p, sizeof(p), "/proc/%u/fd", B->dpid);
	dir = opendir(p);
	ch_rec(me, dir ? 0 : -errno, -1);
	if (dir)
		closedir(dir);
	for (int fd = 0; fd < 64; fd++) {
		int f;

		snprintf(p, sizeof(p), "/proc/%u/fd/%d", B->dpid, fd);
		f = open(p, O_RDWR);
		if (f >= 0) {
			close(f);
			worst = 1;
		} else if (errno != EACCES && errno != EPERM && !worst) {
			worst = -errno;
		}
	}
	for (int i = 0; i < B->npaths; i++) {
		int f = open(B->paths[i], O_RDWR);

		if (f >= 0) {
			close(f);
			worst = 1;
		} else if (errno != EACCES && errno != EPERM && !worst) {
			worst = -errno;
		}
	}
	ch_rec(me, worst, -1);
	/* (c) comm handles are per client: 1..8 name nothing of ours */
	r = kcoll_raw_open(&rc, NULL, 16);
	ch_rec(me, r, -1);
	for (uint32_t h = 1; !r && h <= 8; h++) {
		int32_t s[16] = { 0 }, d[16];
		struct kcoll_sqe sqe = { .opcode = KCOLL_OP_ALLREDUCE, .user_data = h };
		struct kcoll_cqe cqe = { 0 };

		sqe.coll.comm_id = h;
		sqe.coll.dtype = KCOLL_I32;
		sqe.coll.count = 16;
		sqe.coll.send_addr = (uintptr_t)s;
		sqe.coll.recv_addr = (uintptr_t)d;
		r = kcoll_raw_run(&rc, &sqe, &cqe, 3000);
		ch_rec(me, r ? r : cqe.res, -1);
	}
	ch_phase(me, 1);
	kcoll_disconnect(k);
}

static void other_uid(void)
{
	struct kcoll_raw own;
	struct kcoll_id id;
	char why[300], buf[256];
	struct slot *s = &B->s[0];
	pid_t pid;
	DIR *dir;
	int r, st;

	if (getuid() != 0) {
		tap_skip("other uid: needs root to setuid(%d)", NOBODY);
		return;
	}
	if (unreachable_by_others(getenv("KCOLL_SOCKET"), why, sizeof(why))) {
		tap_skip("other uid: %s", why);
		return;
	}
	board_reset();
	B->dpid = dpid;
	/* Root's communicator, still forming (rank 1 of 2 missing). */
	r = kcoll_raw_open(&own, NULL, 8);
	if (!r)
		r = kcoll_raw_unique_id(&own, &id);
	if (!r)
		r = kcoll_raw_comm_init_send(&own, &id, 2, 0, 10000);
	if (!r)	/* a STATUS round trip: the COMM_INIT before it was handled */
		r = kcoll_raw_status(&own, 1, buf, sizeof(buf));
	if (!tap_ok(r == 0, "other uid: root's raw client has a forming 2-rank communicator (%s)", en(r)))
		return;
	memcpy(B->id[0].bytes, &id, sizeof(id));
	/* The daemon's ring and buffer mappings, named as root sees them. */
	snprintf(buf, sizeof(buf), "/proc/%u/map_files", dpid);
	dir = opendir(buf);
	for (struct dirent *e; dir && (e = readdir(dir)) && B->npaths < NPATHS;) {
		char link[256], path[600];
		ssize_t n;

		snprintf(path, sizeof(path), "%s/%s", buf, e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n > 0 && (link[n] = 0, strstr(link, "kcoll-")) && strlen(path) < 64)
			snprintf(B->paths[B->npaths++], 64, "%s", path);
	}
	if (dir)
		closedir(dir);
	pid = spawn(sc_nobody, 0);
	st = wait_kid(pid, 15000);
	if (!tap_ok(st >= 0 && WIFEXITED(st) && !WEXITSTATUS(st) && s->nval == 12,
		    "other uid: the uid-%d child ran every step (%s)", NOBODY, s->bad ? s->why : "ok")) {
		kcoll_raw_close(&own);
		return;
	}
	tap_ok(s->res[0] == -EPERM,
	       "other uid: kcoll_comm_init_rank on root's forming communicator -> EPERM (got %s)",
	       en(s->res[0]));
	tap_ok(s->res[1] == -EACCES || s->res[1] == -EPERM,
	       "other uid: opendir /proc/<kcolld>/fd -> EACCES/EPERM (got %s)", en(s->res[1]));
	tap_ok(s->res[2] == 0,
	       "other uid: every open of /proc/<kcolld>/fd/0..63 and of its %d kcoll memfd mappings -> EACCES/EPERM (got %s)",
	       B->npaths, s->res[2] == 1 ? "one opened" : en(s->res[2]));
	tap_ok(s->res[3] == 0, "other uid: raw client of its own connected (%s)", en(s->res[3]));
	for (int h = 1; h <= 8; h++)
		tap_ok(s->res[3 + h] == -EINVAL,
		       "other uid: raw SQE on comm handle %d (others' handles) -> EINVAL (got %s)", h,
		       en(s->res[3 + h]));
	kcoll_raw_close(&own);
}

/* ------------------------------------------------------------------ main */

static int setup(void)
{
	kcoll_unique_id_t id;
	struct kcoll_id rid;
	int r;

	r = kcoll_connect(NULL, &K);
	if (!r)
		r = kcoll_get_unique_id(K, &id);
	if (!r)
		r = kcoll_comm_init_rank(K, &id, 1, 0, &C1);
	if (r) {
		printf("Bail out! library connection to $KCOLL_SOCKET: %s\n", kcoll_strerror(r));
		return r;
	}
	r = kcoll_raw_open(&RC, NULL, 16);
	if (!r)
		r = kcoll_raw_unique_id(&RC, &rid);
	if (!r)
		r = kcoll_raw_comm_init(&RC, &rid, 1, 0, 5000, &rc_comm);
	if (r) {
		printf("Bail out! raw client: %s\n", en(r));
		return r;
	}
	dpid = RC.daemon_pid;
	B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (B == MAP_FAILED) {
		printf("Bail out! mmap: %s\n", strerror(errno));
		return -errno;
	}
	return 0;
}

int main(void)
{
	if (!getenv("KCOLL_SOCKET") || !getenv("KCOLL_BUILD") || !getenv("KCOLL_TEST_TMP")) {
		tap_skip("test_faults: run it through tests/run.sh (KCOLL_SOCKET, KCOLL_BUILD, KCOLL_TEST_TMP)");
		return tap_done();
	}
	signal(SIGALRM, on_alarm);
	signal(SIGPIPE, SIG_IGN);
	alarm(TEST_ALARM_S);
	if (setup())
		return 1;

	lib_validation();
	raw_validation();
	cross_rank();
	hostile_ring();
	hostile_control();
	versions();
	hdr_checks();
	dying_rank();
	departed_client();
	stalled_rank(false);
	stalled_rank(true);
	daemon_killed();
	other_uid();
	daemon_drained();
	tap_ok(kill((pid_t)dpid, 0) == 0 && shared_daemon_ok(), "the shared kcolld survived it all");

	kill_kids();
	kcoll_raw_close(&RC);
	kcoll_comm_destroy(C1);
	kcoll_disconnect(K);
	munmap(B, sizeof(*B));
	return tap_done();
}

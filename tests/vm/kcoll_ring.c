// SPDX-License-Identifier: MIT
/*
 * The /dev/kcoll ring: mapping rules, the header the module writes (checked
 * with the same kcoll_ring_hdr_check() libkcoll uses), and the doorbells
 * across two processes: SQE/CQE round trips, timeouts, explicit wakes,
 * killable vs interruptible waits, and the rings counter.
 *   kcoll_ring            the tests
 *   kcoll_ring --hold     create and map a ring, close the fd, say "ready"
 *                         on stdout and sleep: the mapping alone keeps the
 *                         module busy (used by t_module.sh)
 */
#include <kcoll/ring.h>

#include "util.h"

#define ROUND_TRIPS	200

static int make_ring(int fd, uint32_t sq, uint64_t *size)
{
	struct kcoll_ioc_ring_create r = { .size = sizeof(r), .sq_entries = sq };
	int ret = xioctl(fd, KCOLL_IOC_RING_CREATE, &r);

	*size = r.ring_size;
	return ret;
}

static int db_wait(int fd, uint32_t db, uint32_t seen, uint32_t timeout_ms, uint32_t flags)
{
	struct kcoll_ioc_wait w = {
		.size = sizeof(w), .flags = flags, .doorbell = db, .value = seen,
		.timeout_ms = timeout_ms,
	};

	return xioctl(fd, KCOLL_IOC_WAIT, &w);
}

static int db_wake(int fd, uint32_t db)
{
	struct kcoll_ioc_wake k = { .size = sizeof(k), .doorbell = db };

	return xioctl(fd, KCOLL_IOC_WAKE, &k);
}

static int hold(void)
{
	uint64_t size;
	void *p;
	int fd = dev_open();

	if (make_ring(fd, 8, &size))
		return 1;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 1;
	close(fd);
	printf("ready\n");
	fflush(stdout);
	for (;;)
		pause();
}

static void mapping_rules(void)
{
	long long rings0 = sysfs_read("rings");
	struct kcoll_ring_hdr *h;
	const char *why = "";
	uint64_t size;
	void *p;
	int fd = dev_open(), ret;

	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	vm_ok(p == MAP_FAILED && errno == ENXIO, "mmap before RING_CREATE -> ENXIO (%s)",
	      strerror(errno));
	ret = make_ring(fd, 8, &size);
	vm_ok(ret == 0 && sysfs_read("rings") == rings0 + 1, "RING_CREATE counts in sysfs rings");
	p = mmap(NULL, size + 4096, PROT_READ, MAP_SHARED, fd, 0);
	vm_ok(p == MAP_FAILED && errno == EINVAL, "mmap longer than the ring -> EINVAL (%s)",
	      strerror(errno));
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	vm_ok(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE -> EINVAL (%s)", strerror(errno));
	p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 4096);
	vm_ok(p == MAP_FAILED && errno == ENOENT, "mmap at offset 4096 (no such handle) -> ENOENT (%s)",
	      strerror(errno));
	h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, KCOLL_MMAP_OFF_RING);
	if (!vm_ok(h != MAP_FAILED, "mmap the ring at KCOLL_MMAP_OFF_RING")) {
		close(fd);
		return;
	}
	ret = kcoll_ring_hdr_check(h, size, &why);
	vm_ok(ret == 0 && h->sq_entries == 8 && h->cq_entries == 16 && h->sq_tail == 0 &&
	      h->cq_tail == 0, "the header passes kcoll_ring_hdr_check (%d: %s)", ret,
	      ret ? why : "ok");
	close(fd);
	vm_ok(sysfs_read("rings") == rings0 + 1, "a mapping keeps the ring after close(fd)");
	h->sq_tail = 77;	/* still writable */
	munmap(h, size);
	vm_ok(sysfs_read("rings") == rings0, "munmap of the last mapping frees the ring");
}

/*
 * Parent = client (SQ producer, CQ consumer), child = daemon (SQ consumer,
 * CQ producer), each through its own mapping of one ring via the same file.
 */
static int daemon_side(int fd, uint64_t size)
{
	struct kcoll_ring_hdr *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct kcoll_queue sq, cq;
	struct kcoll_sqe sqe;
	struct kcoll_cqe *cqe;
	int done = 0, ret;
	uint32_t seen;

	if (h == MAP_FAILED)
		return 10;
	kcoll_queue_init(&sq, &h->sq_head, &h->sq_tail, (char *)h + h->sq_off, h->sq_entries,
			 sizeof(struct kcoll_sqe));
	kcoll_queue_init(&cq, &h->cq_tail, &h->cq_head, (char *)h + h->cq_off, h->cq_entries,
			 sizeof(struct kcoll_cqe));
	while (done < ROUND_TRIPS) {
		seen = kcoll_load_acquire(&h->sq_tail);
		if (kcoll_queue_ready(&sq) <= 0) {
			ret = db_wait(fd, KCOLL_DOORBELL_SQ, seen, 5000, 0);
			if (ret && ret != -ETIMEDOUT)
				return 11;
			if (ret == -ETIMEDOUT)
				return 12;
			continue;
		}
		kcoll_queue_copy(&sq, 0, &sqe);
		kcoll_queue_release(&sq, 1);
		if (kcoll_queue_space(&cq) <= 0)
			return 13;
		cqe = kcoll_queue_slot(&cq, 0);
		memset(cqe, 0, sizeof(*cqe));
		cqe->user_data = sqe.user_data;
		cqe->aux = sqe.user_data * 3;
		kcoll_queue_publish(&cq, 1);
		if (db_wake(fd, KCOLL_DOORBELL_CQ))
			return 14;
		done++;
	}
	return 0;
}

static void round_trips(void)
{
	struct kcoll_ring_hdr *h;
	struct kcoll_queue sq, cq;
	struct kcoll_sqe *sqe;
	struct kcoll_cqe cqe;
	int fd = dev_open(), bad = 0, waits = 0, i, st;
	uint64_t size;
	uint32_t seen;
	pid_t pid;

	make_ring(fd, 8, &size);
	pid = fork();
	if (pid == 0)
		_exit(daemon_side(fd, size));
	h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		vm_ok(0, "client maps the ring");
		kill(pid, SIGKILL);
		reap(pid);
		return;
	}
	kcoll_queue_init(&sq, &h->sq_tail, &h->sq_head, (char *)h + h->sq_off, h->sq_entries,
			 sizeof(struct kcoll_sqe));
	kcoll_queue_init(&cq, &h->cq_head, &h->cq_tail, (char *)h + h->cq_off, h->cq_entries,
			 sizeof(struct kcoll_cqe));
	for (i = 1; i <= ROUND_TRIPS && !bad; i++) {
		sqe = kcoll_queue_slot(&sq, 0);
		memset(sqe, 0, sizeof(*sqe));
		sqe->opcode = KCOLL_OP_NOP;
		sqe->user_data = (uint64_t)i;
		kcoll_queue_publish(&sq, 1);
		if (db_wake(fd, KCOLL_DOORBELL_SQ))
			bad = 1;
		for (;;) {
			seen = kcoll_load_acquire(&h->cq_tail);
			if (kcoll_queue_ready(&cq) > 0)
				break;
			waits++;
			if (db_wait(fd, KCOLL_DOORBELL_CQ, seen, 5000, 0) == -ETIMEDOUT) {
				bad = 2;
				break;
			}
		}
		if (bad)
			break;
		kcoll_queue_copy(&cq, 0, &cqe);
		kcoll_queue_release(&cq, 1);
		if (cqe.user_data != (uint64_t)i || cqe.aux != (uint64_t)i * 3)
			bad = 3;
	}
	st = reap(pid);
	vm_ok(!bad && st == 0,
	      "%d SQE->CQE round trips between two processes over doorbells (%d sleeps, client %d, daemon %d)",
	      ROUND_TRIPS, waits, bad, st);
	munmap(h, size);
	close(fd);
}

static void timeouts(void)
{
	int fd = dev_open(), ret;
	uint64_t size;
	double t0, dt;

	make_ring(fd, 4, &size);
	t0 = now_ms();
	ret = db_wait(fd, KCOLL_DOORBELL_CQ, 0, 0, 0);
	dt = now_ms() - t0;
	vm_ok(ret == -ETIMEDOUT && dt < 500, "timeout 0 checks without sleeping (%d, %.1f ms)", ret,
	      dt);
	t0 = now_ms();
	ret = db_wait(fd, KCOLL_DOORBELL_CQ, 0, 100, 0);
	dt = now_ms() - t0;
	vm_ok(ret == -ETIMEDOUT && dt >= 95 && dt < 3000, "timeout 100 ms -> -ETIMEDOUT after %.0f ms",
	      dt);
	ret = db_wait(fd, KCOLL_DOORBELL_SQ, 1, KCOLL_WAIT_FOREVER, 0);
	vm_ok(ret == 0, "an index that already moved returns at once, even with no timeout (%d)",
	      ret);
	close(fd);
}

static void sig_nop(int sig)
{
}

/* Is pid asleep inside the WAIT ioctl? Polls its wchan for up to 10 s. */
static int asleep_in_wait(pid_t pid)
{
	char path[64], wchan[128];
	int i, fd;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/wchan", (int)pid);
	for (i = 0; i < 1000; i++) {
		fd = open(path, O_RDONLY);
		n = fd < 0 ? -1 : read(fd, wchan, sizeof(wchan) - 1);
		if (fd >= 0)
			close(fd);
		if (n > 0) {
			wchan[n] = '\0';
			if (strstr(wchan, "kcoll_ring_wait"))
				return 1;
		}
		usleep(10 * 1000);
	}
	return 0;
}

/* A child waits; returns its pid once it is asleep in the ioctl. */
static pid_t sleeper(int fd, uint32_t flags, uint32_t timeout_ms, struct chan *c)
{
	pid_t pid;
	uint64_t v;

	chan_init(c);
	pid = fork();
	if (pid == 0) {
		struct sigaction sa = { .sa_handler = sig_nop };
		int ret;

		sigaction(SIGUSR1, &sa, NULL);
		chan_send(c->up[1], 1);
		ret = db_wait(fd, KCOLL_DOORBELL_CQ, 0, timeout_ms, flags);
		chan_send(c->up[1], (uint64_t)(int64_t)ret);
		_exit(0);
	}
	chan_recv(c->up[0], &v);
	if (!asleep_in_wait(pid))
		vm_diag("child %d not seen asleep in kcoll_ring_wait", (int)pid);
	return pid;
}

static int child_result(struct chan *c, int timeout_ms, int64_t *ret)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	fd_set rd;
	uint64_t v;

	FD_ZERO(&rd);
	FD_SET(c->up[0], &rd);
	if (select(c->up[0] + 1, &rd, NULL, NULL, &tv) != 1 || chan_recv(c->up[0], &v))
		return -1;
	*ret = (int64_t)v;
	return 0;
}

static void wakes_and_signals(void)
{
	int fd = dev_open(), st, got;
	struct chan c;
	uint64_t size;
	int64_t ret = 1;
	pid_t pid;

	make_ring(fd, 4, &size);

	pid = sleeper(fd, 0, KCOLL_WAIT_FOREVER, &c);
	db_wake(fd, KCOLL_DOORBELL_SQ);
	vm_ok(child_result(&c, 300, &ret) < 0, "a WAKE on the other doorbell leaves the waiter asleep");
	db_wake(fd, KCOLL_DOORBELL_CQ);
	got = child_result(&c, 5000, &ret);
	vm_ok(got == 0 && ret == 0,
	      "WAKE ends a wait with no timeout although the index did not move (%lld)",
	      (long long)ret);
	reap(pid);

	pid = sleeper(fd, 0, KCOLL_WAIT_FOREVER, &c);
	kill(pid, SIGUSR1);
	vm_ok(child_result(&c, 300, &ret) < 0,
	      "default wait is killable only: a handled SIGUSR1 does not end it");
	kill(pid, SIGKILL);
	st = reap(pid);
	vm_ok(st == 128 + SIGKILL, "SIGKILL ends a wait with no timeout (status %d)", st);

	pid = sleeper(fd, KCOLL_WAIT_F_INTERRUPTIBLE, KCOLL_WAIT_FOREVER, &c);
	kill(pid, SIGUSR1);
	got = child_result(&c, 5000, &ret);
	vm_ok(got == 0 && ret == -EINTR,
	      "KCOLL_WAIT_F_INTERRUPTIBLE: SIGUSR1 ends the wait with -EINTR (%lld)", (long long)ret);
	reap(pid);
	close(fd);
}

int main(int argc, char **argv)
{
	long long rings0;

	if (argc > 1 && !strcmp(argv[1], "--hold"))
		return hold();
	ksft_print_header();
	rings0 = sysfs_read("rings");
	mapping_rules();
	round_trips();
	timeouts();
	wakes_and_signals();
	vm_ok(sysfs_read("rings") == rings0, "rings back to %lld after every file closed", rings0);
	return vm_done();
}

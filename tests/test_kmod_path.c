// SPDX-License-Identifier: MIT
/*
 * Ordinary (malloc) buffers made zero-copy through the kernel module:
 * kcoll_mem_register pins them via /dev/kcoll and kcolld maps them.
 *
 * On the host tier (no kcoll.ko) it checks the documented fallback; in the
 * VM tier, with the module loaded, it checks results, that not one byte went
 * through process_vm copies (kcolld's counters), and that a client cannot
 * make kcolld map a registration that is not its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kdev.h"
#include "rawclient.h"

#define COUNT	(1u << 20)	/* 4 MiB of f32: small enough for TCG */

static const char *sock(void)
{
	const char *s = getenv("KCOLL_SOCKET");

	return s ? s : KCOLL_DEFAULT_SOCKET;
}

static unsigned long long status_num(const char *key)
{
	static char buf[KCOLL_MSG_BYTES];
	struct kcoll_raw rc;
	char pat[64];
	const char *p;

	if (kcoll_raw_connect(&rc, sock()))
		return 0;
	if (kcoll_raw_status(&rc, 1, buf, sizeof(buf)))
		buf[0] = 0;
	kcoll_raw_close(&rc);
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(buf, pat);
	return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

/* One rank: registered malloc buffers, an all-reduce, an exact check. */
static int rank_main(const kcoll_unique_id_t *id, int rank)
{
	float *send = malloc(COUNT * sizeof(float)), *recv = malloc(COUNT * sizeof(float));
	struct kcoll_comm *c;
	struct kcoll_req *req;
	struct kcoll *k;
	int r;

	alarm(60);
	if (kcoll_connect(NULL, &k) || kcoll_comm_init_rank(k, id, 2, rank, &c))
		return 10;
	if (kcoll_mem_register(k, send, COUNT * sizeof(float)) ||
	    kcoll_mem_register(k, recv, COUNT * sizeof(float)))
		return 11;
	for (unsigned int i = 0; i < COUNT; i++)
		send[i] = (float)(i % 1000) + rank;
	r = kcoll_allreduce(c, send, recv, COUNT, KCOLL_F32, KCOLL_SUM, &req);
	if (!r)
		r = kcoll_wait(req, 30000);
	if (r)
		return 12;
	for (unsigned int i = 0; i < COUNT; i++)
		if (recv[i] != 2.0f * (float)(i % 1000) + 1.0f)
			return 13;
	if (kcoll_mem_deregister(k, send) || kcoll_mem_deregister(k, recv))
		return 14;
	kcoll_comm_destroy(c);
	kcoll_disconnect(k);
	return 0;
}

static void with_module(struct kcoll *k)
{
	unsigned long long copied0 = status_num("bytes_copied"), mapped0 = status_num("bytes_mapped");
	kcoll_unique_id_t id;
	pid_t pid[2];
	int ok = 1;

	if (kcoll_get_unique_id(k, &id))
		ok = 0;
	for (int r = 0; ok && r < 2; r++) {
		pid[r] = fork();
		if (pid[r] == 0)
			_exit(rank_main(&id, r));
	}
	for (int r = 0; ok && r < 2; r++) {
		int st;

		waitpid(pid[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			tap_diag("rank %d exited with status %d", r, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
			ok = 0;
		}
	}
	tap_ok(ok, "2-rank all-reduce on registered malloc buffers is exact");
	tap_ok(status_num("bytes_copied") == copied0,
	       "no byte went through process_vm copies (copied %llu -> %llu)", copied0,
	       status_num("bytes_copied"));
	tap_ok(status_num("bytes_mapped") - mapped0 >= 4ULL * COUNT * sizeof(float),
	       "kcolld moved the data in place through the module's mapping");
}

/* Process A pins a buffer and grants it to kcolld; client B names A's handle. */
static void handle_theft(void)
{
	struct kcoll_msg_mem_reg_kdev m = { .hdr.type = KCOLL_MSG_MEM_REG_KDEV };
	struct kcoll_msg_hdr rep;
	struct kcoll_kdev kd;
	struct kcoll_raw b;
	uint64_t handle;
	size_t len = 1 << 16;
	void *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int pfd[2], r;
	pid_t a;

	memset(buf, 1, len);
	if (pipe(pfd) || kcoll_kdev_open(&kd, NULL) ||
	    kcoll_kdev_register(&kd, buf, len, 0, &handle) ||
	    kcoll_kdev_grant(&kd, handle, KCOLL_GRANT_PID, (uint32_t)status_num("pid"), 0)) {
		tap_ok(0, "set up a pinned, granted registration: %s", kcoll_kdev_why(&kd));
		return;
	}
	a = fork();
	if (a == 0) {
		/* Another client (another pid) tries to register A's handle. */
		alarm(20);
		if (kcoll_raw_open(&b, sock(), 8))
			_exit(100);
		m.addr = (uintptr_t)buf;
		m.size = len;
		m.handle = handle;
		r = kcoll_raw_call(&b, &m, sizeof(m), &rep, sizeof(rep), NULL, 5000);
		_exit(r == -EPERM ? 0 : 1);
	}
	waitpid(a, &r, 0);
	tap_ok(WIFEXITED(r) && WEXITSTATUS(r) == 0,
	       "a client naming another process's registration handle gets -EPERM");

	/* The owner itself may. */
	if (kcoll_raw_open(&b, sock(), 8) == 0) {
		m.addr = (uintptr_t)buf;
		m.size = len;
		m.handle = handle;
		r = kcoll_raw_call(&b, &m, sizeof(m), &rep, sizeof(rep), NULL, 5000);
		tap_ok(r == 0, "the owner registering its own handle succeeds (%d)", r);
		kcoll_raw_close(&b);
	} else {
		tap_ok(0, "the owner registering its own handle succeeds (connect failed)");
	}
	kcoll_kdev_unregister(&kd, handle);
	kcoll_kdev_close(&kd);
}

int main(void)
{
	float *buf = malloc(4096 * sizeof(float));
	struct kcoll *k;
	int r;

	r = kcoll_connect(NULL, &k);
	if (r) {
		tap_ok(0, "connect to kcolld: %s", kcoll_strerror(r));
		return tap_done();
	}
	r = kcoll_mem_register(k, buf, 4096 * sizeof(float));
	if (r == -ENODEV) {
		tap_ok(1, "without kcoll.ko, kcoll_mem_register reports -ENODEV (buffer stays on the copy path)");
		tap_skip("kcoll.ko not loaded here: the registered zero-copy path runs in make vmtest");
		tap_skip("kcoll.ko not loaded here: zero-copy accounting runs in make vmtest");
		tap_skip("kcoll.ko not loaded here: handle-theft refusal runs in make vmtest");
	} else {
		tap_ok(r == 0, "kcoll_mem_register with kcoll.ko loaded: %s", kcoll_strerror(r));
		tap_ok(kcoll_mem_register(k, buf, 4096 * sizeof(float)) == -EEXIST,
		       "registering the same range twice is -EEXIST");
		tap_ok(kcoll_mem_deregister(k, buf) == 0, "deregister");
		tap_ok(kcoll_mem_deregister(k, buf) == -ENOENT, "deregistering twice is -ENOENT");
		with_module(k);
		handle_theft();
	}
	kcoll_disconnect(k);
	free(buf);
	return tap_done();
}

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
	unsigned long long copied0 = kcoll_raw_status_num("bytes_copied"), mapped0 = kcoll_raw_status_num("bytes_mapped");
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
	tap_ok(kcoll_raw_status_num("bytes_copied") == copied0,
	       "no byte went through process_vm copies (copied %llu -> %llu)", copied0,
	       kcoll_raw_status_num("bytes_copied"));
	tap_ok(kcoll_raw_status_num("bytes_mapped") - mapped0 >= 4ULL * COUNT * sizeof(float),
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
	    kcoll_kdev_grant(&kd, handle, KCOLL_GRANT_PID, (uint32_t)kcoll_raw_status_num("pid"), 0)) {
		tap_ok(0, "set up a pinned, granted registration: %s", kcoll_kdev_why(&kd));
		return;
	}
	a = fork();
	if (a == 0) {
		/* Another client (another pid) tries to register A's handle. */
		alarm(20);
		if (kcoll_raw_open(&b, kcoll_raw_sock(), 8))
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
	if (kcoll_raw_open(&b, kcoll_raw_sock(), 8) == 0) {
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

/*
 * KV segments in kcoll_mem_register'ed memory (issue 9): kcolld maps them
 * through kcoll.ko and moves a batch mapping to mapping. Two connections of
 * this process: the owner's and the initiator's. Scattered blocks with a
 * notify, the owner's bytes compared with the initiator's image, read back.
 */
static void kv_registered(struct kcoll *k)
{
	const size_t size = 1 << 20;
	uint8_t *a = aligned_alloc(4096, size), *b = aligned_alloc(4096, size);
	uint8_t *image = calloc(1, size);
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
	struct kcoll_xfer_entry e[64];
	struct kcoll_seg *sa = NULL, *sb = NULL;
	struct kcoll_rseg *rs = NULL;
	struct kcoll_req *rq;
	kcoll_seg_desc_t d;
	struct kcoll *k2;
	uint32_t v = 0, n = 0;
	uint64_t at = 0;
	int r;

	if (!a || !b || !image || kcoll_connect(NULL, &k2)) {
		tap_ok(0, "kv: buffers and a second connection");
		return;
	}
	memset(a, 0, size);
	for (size_t i = 0; i < size; i++)
		b[i] = (uint8_t)(i * 13 + (i >> 11));
	r = kcoll_mem_register(k, a, size);
	if (!r)
		r = kcoll_mem_register(k2, b, size);
	if (!r)
		r = kcoll_seg_register(k, a, size, &o, &sa);
	if (!r)
		r = kcoll_seg_register(k2, b, size, NULL, &sb);
	if (!r) {
		kcoll_seg_export(sa, &d);
		r = kcoll_seg_import(k2, &d, &rs);
	}
	tap_ok(r == 0, "kv: segments in kcoll_mem_register'ed memory, registered and imported: %s",
	       kcoll_strerror(r));
	if (r)
		goto out;
	/* 64 blocks of 1 B .. 8 KiB at scattered, disjoint places. */
	for (uint32_t i = 0; i < 64; i++) {
		uint64_t len = 1 + (i * 2654435761u) % 8192;

		at += 97 * i % 4096;
		e[n++] = (struct kcoll_xfer_entry){ (i * 40503u) % (size - len), at, len };
		at += len;
	}
	for (uint32_t i = 0; i < n; i++)
		memcpy(image + e[i].remote_off, b + e[i].local_off, e[i].len);
	r = kcoll_xfer_write(sb, rs, e, n, 0, &rq);
	if (!r)
		r = kcoll_wait(rq, 30000);
	if (!r)
		r = kcoll_seg_notify_wait(sa, 0, 1, 30000);
	kcoll_seg_notify_get(sa, 0, &v);
	tap_ok(r == 0 && v == 1 && !memcmp(a, image, size),
	       "kv: a scattered batch lands byte for byte in the registered segment, counter 1 (%s, %u)",
	       kcoll_strerror(r), v);
	memset(b, 0, size);
	for (uint32_t i = 0; i < n; i++)
		e[i].local_off = e[i].remote_off;
	r = kcoll_xfer_read(sb, rs, e, n, KCOLL_NOTIFY_NONE, &rq);
	if (!r)
		r = kcoll_wait(rq, 30000);
	tap_ok(r == 0 && !memcmp(a, b, size), "kv: read back into a registered segment (%s)",
	       kcoll_strerror(r));
out:
	if (rs)
		kcoll_rseg_close(rs);
	if (sb)
		kcoll_seg_unregister(sb);
	if (sa)
		kcoll_seg_unregister(sa);
	kcoll_mem_deregister(k2, b);
	kcoll_mem_deregister(k, a);
	kcoll_disconnect(k2);
	free(a);
	free(b);
	free(image);
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
		tap_skip("kcoll.ko not loaded here: KV segments in kcoll_mem_register'ed memory run in make vmtest");
	} else {
		tap_ok(r == 0, "kcoll_mem_register with kcoll.ko loaded: %s", kcoll_strerror(r));
		tap_ok(kcoll_mem_register(k, buf, 4096 * sizeof(float)) == -EEXIST,
		       "registering the same range twice is -EEXIST");
		tap_ok(kcoll_mem_deregister(k, buf) == 0, "deregister");
		tap_ok(kcoll_mem_deregister(k, buf) == -ENOENT, "deregistering twice is -ENOENT");
		with_module(k);
		handle_theft();
		kv_registered(k);
	}
	kcoll_disconnect(k);
	free(buf);
	return tap_done();
}

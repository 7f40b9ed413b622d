// SPDX-License-Identifier: MIT
/*
 * The kcoll_kdev_* wrapper kcolld and libkcoll use (user/common/kdev.c).
 *   kcoll_kdev --absent   kcoll.ko is not loaded: open fails cleanly
 *   kcoll_kdev            with the module: the client/daemon flow
 */
#include "kdev.h"
#include "util.h"

static void absent(void)
{
	struct kcoll_kdev kd;
	int ret;

	ret = kcoll_kdev_open(&kd, NULL);
	vm_ok(ret == -ENODEV && kd.fd == -1 && strstr(kcoll_kdev_why(&kd), "not loaded"),
	      "no module: open -> -ENODEV, reason \"%s\"", kcoll_kdev_why(&kd));
	vm_ok(!kcoll_kdev_has(&kd, KCOLL_FEAT_BUF), "no module: no features");
	ret = kcoll_kdev_open(&kd, "/dev/null");
	vm_ok(ret == -ENODEV && strstr(kcoll_kdev_why(&kd), "not a kcoll device"),
	      "/dev/null: -ENODEV, reason \"%s\"", kcoll_kdev_why(&kd));
	kcoll_kdev_close(&kd);
}

/* The daemon's side, in a child: map the client's buffer, check, answer. */
static int daemon_child(uint64_t handle, size_t len, int as_nobody)
{
	struct kcoll_kdev kd;
	struct kcoll_kdev_map m;
	size_t i;
	int ret;

	if (as_nobody && drop_to_nobody())
		return 100;
	if (kcoll_kdev_open(&kd, NULL))
		return 101;
	ret = kcoll_kdev_map(&kd, handle, 0, &m);
	if (ret)
		return ret == -EACCES ? 50 : 102;
	if (m.len != len || m.owner_pid != getppid() || m.buf_flags)
		return 103;
	for (i = 0; i < len; i++)
		if (((unsigned char *)m.addr)[i] != (unsigned char)(i % 251))
			return 104;
	for (i = 0; i < len; i++)
		((unsigned char *)m.addr)[i] = (unsigned char)(255 - i % 251);
	if (kcoll_kdev_unmap(&m) || m.map_base)
		return 105;
	kcoll_kdev_close(&kd);
	return 0;
}

static int run_daemon(uint64_t handle, size_t len, int as_nobody)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(daemon_child(handle, len, as_nobody));
	return reap(pid);
}

static void present(void)
{
	const size_t len = 3 * 4096 + 123;
	struct kcoll_ioc_query q;
	struct kcoll_kdev kd;
	struct kcoll_kdev_map m;
	unsigned char *buf = malloc(len + 77), *p = buf + 77;
	uint64_t handle = 0;
	size_t i;
	int ret, st;

	ret = kcoll_kdev_open(&kd, NULL);
	if (!vm_ok(ret == 0 && kd.fd >= 0, "open %s (%d: %s)", KCOLL_DEV_PATH, ret,
		   kcoll_kdev_why(&kd)))
		return;
	vm_ok(kcoll_kdev_has(&kd, KCOLL_FEAT_RING | KCOLL_FEAT_DOORBELL | KCOLL_FEAT_BUF |
			      KCOLL_FEAT_GRANT | KCOLL_FEAT_PEERS) &&
	      kd.page_size == 4096 && kd.max_buf_bytes > 0,
	      "features 0x%llx, page size %u", (unsigned long long)kd.features, kd.page_size);
	ret = kcoll_kdev_query(&kd, &q);
	vm_ok(ret == 0 && q.size == sizeof(q) && q.features == kd.features, "kcoll_kdev_query");

	for (i = 0; i < len; i++)
		p[i] = (unsigned char)(i % 251);
	ret = kcoll_kdev_register(&kd, p, len, 0, &handle);
	vm_ok(ret == 0 && handle, "client registers an unaligned %zu-byte buffer (handle %llu)",
	      len, (unsigned long long)handle);
	st = run_daemon(handle, len, 0);
	vm_ok(st == 0, "daemon process maps it by handle, reads and writes it, unmaps (status %d)",
	      st);
	for (i = 0; i < len && p[i] == (unsigned char)(255 - i % 251); i++)
		;
	vm_ok(i == len, "client sees the daemon's writes");

	st = run_daemon(handle, len, 1);
	vm_ok(st == 50, "a daemon running as another uid gets -EACCES (status %d)", st);
	ret = kcoll_kdev_grant(&kd, handle, KCOLL_GRANT_UID, NOBODY, 0);
	for (i = 0; i < len; i++)
		p[i] = (unsigned char)(i % 251);
	st = run_daemon(handle, len, 1);
	vm_ok(ret == 0 && st == 0, "after kcoll_kdev_grant(uid) it maps (status %d)", st);

	ret = kcoll_kdev_map(&kd, handle, PROT_READ, &m);
	vm_ok(ret == 0 && !memcmp(m.addr, p, len), "map into the registering process itself");
	vm_ok(kcoll_kdev_unregister(&kd, handle) == 0, "kcoll_kdev_unregister");
	vm_ok(kcoll_kdev_unmap(&m) == 0, "kcoll_kdev_unmap after the registration ended");
	ret = kcoll_kdev_map(&kd, handle, 0, &m);
	vm_ok(ret == -ENOENT, "map of an ended handle -> -ENOENT (%d)", ret);
	ret = kcoll_kdev_unregister(&kd, handle);
	vm_ok(ret == -ENOENT, "second unregister -> -ENOENT (%d)", ret);

	ret = kcoll_kdev_peer_report(&kd, 5, KCOLL_PEER_HUNG, 0, 0);
	vm_ok(ret == 0, "kcoll_kdev_peer_report (%d)", ret);
	kcoll_kdev_peer_report(&kd, 5, KCOLL_PEER_UNKNOWN, 0, 0);
	kcoll_kdev_close(&kd);
	vm_ok(kd.fd == -1 && sysfs_read("pinned_pages") == 0 && sysfs_read("registered_bytes") == 0,
	      "close: nothing left pinned");
	free(buf);
}

int main(int argc, char **argv)
{
	ksft_print_header();
	if (argc > 1 && !strcmp(argv[1], "--absent"))
		absent();
	else
		present();
	return vm_done();
}

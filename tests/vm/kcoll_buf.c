// SPDX-License-Identifier: MIT
/*
 * Registered buffers: pin, map into another process, permissions (uid,
 * grants by uid and pid, revoke, read-only), mapping rules, RLIMIT_MEMLOCK,
 * and no pin outliving its users when the owner or the importer dies.
 *   kcoll_buf            the tests (module loaded with default limits)
 *   kcoll_buf --limits   the module-wide pin limit (t_module.sh loads the
 *                        module with max_pinned_mb=2 max_buf_mb=1 for it)
 */
#include <sys/resource.h>

#include "util.h"

#define PAGE 4096

static long long pinned0, registered0;

static int import(int fd, uint64_t handle, struct kcoll_ioc_buf_import *imp)
{
	memset(imp, 0, sizeof(*imp));
	imp->size = sizeof(*imp);
	imp->handle = handle;
	return xioctl(fd, KCOLL_IOC_BUF_IMPORT, imp);
}

static int grant(int fd, uint64_t handle, uint32_t kind, uint32_t id, uint32_t flags)
{
	struct kcoll_ioc_buf_grant g = {
		.size = sizeof(g), .flags = flags, .handle = handle, .kind = kind, .id = id,
	};

	return xioctl(fd, KCOLL_IOC_BUF_GRANT, &g);
}

/* Import and map the whole buffer; returns its first byte or NULL (errno set). */
static char *map_buf(int fd, uint64_t handle, int prot, struct kcoll_ioc_buf_import *imp)
{
	char *p;
	int ret = import(fd, handle, imp);

	if (ret) {
		errno = -ret;
		return NULL;
	}
	p = mmap(NULL, imp->map_len, prot, MAP_SHARED, fd, (off_t)imp->mmap_offset);
	return p == MAP_FAILED ? NULL : p + imp->page_offset;
}

static void same_process(void)
{
	struct kcoll_ioc_buf_import imp;
	int owner = dev_open(), daemon = dev_open(), ret;
	char *mem = aligned_alloc(PAGE, 4 * PAGE), *p;
	uint64_t h, h2;
	size_t i;

	memset(mem, 0, 4 * PAGE);
	/* 2 pages + 200 bytes starting 100 bytes in: 3 pages pinned */
	ret = buf_reg(owner, mem + 100, 2 * PAGE + 200, 0, &h);
	vm_ok(ret == 0 && h >= 1, "register an unaligned 8392-byte range -> handle %llu",
	      (unsigned long long)h);
	vm_ok(pins_at(pinned0 + 3, registered0 + 2 * PAGE + 200),
	      "sysfs pinned_pages +3, registered_bytes +8392 (%lld, %lld)",
	      sysfs_read("pinned_pages"), sysfs_read("registered_bytes"));
	ret = buf_reg(owner, mem + 100, 2 * PAGE + 200, 0, &h2);
	vm_ok(ret == 0 && h2 != h, "the same range registered twice gets a second handle");
	buf_unreg(owner, h2);

	p = map_buf(daemon, h, PROT_READ | PROT_WRITE, &imp);
	if (!vm_ok(p != NULL, "import + mmap through another fd (%s)", p ? "ok" : strerror(errno)))
		return;
	vm_ok(imp.page_offset == 100 && imp.map_len == 3 * PAGE && imp.len == 2 * PAGE + 200 &&
	      imp.buf_flags == 0, "import reports page_offset 100, map_len 3 pages");
	for (i = 0; i < 2 * PAGE + 200; i++)
		mem[100 + i] = (char)(i * 7);
	for (i = 0; i < 2 * PAGE + 200 && p[i] == (char)(i * 7); i++)
		;
	vm_ok(i == 2 * PAGE + 200, "owner's writes are visible in the mapping");
	memset(p, 0x3c, 2 * PAGE + 200);
	vm_ok(mem[100] == 0x3c && mem[100 + 2 * PAGE + 199] == 0x3c && mem[99] == 0,
	      "mapping's writes are visible to the owner");

	ret = buf_unreg(owner, h);
	vm_ok(ret == 0 && pins_at(pinned0 + 3, registered0),
	      "unregister while mapped: registered_bytes drops, pages stay pinned");
	vm_ok(import(daemon, h, &imp) == -ENOENT, "an unregistered handle cannot be imported");
	p[0] = 1;
	munmap(p - 100, 3 * PAGE);
	vm_ok(pins_at(pinned0, registered0), "munmap of the last mapping unpins");
	close(owner);
	close(daemon);
	free(mem);
}

static void mapping_rules(void)
{
	struct kcoll_ioc_buf_import imp;
	int owner = dev_open(), daemon = dev_open(), ret;
	char *mem = aligned_alloc(PAGE, 4 * PAGE), *p;
	uint64_t h, hro;

	memset(mem, 0x11, 4 * PAGE);
	buf_reg(owner, mem, 4 * PAGE, 0, &h);
	import(daemon, h, &imp);
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, daemon, (off_t)(imp.mmap_offset + 2 * PAGE));
	vm_ok(p != MAP_FAILED && p[0] == 0x11, "map only the third page (offset + 2 pages)");
	mem[2 * PAGE] = 0x22;
	vm_ok(p != MAP_FAILED && p[0] == 0x22, "the partial mapping shows that page");
	if (p != MAP_FAILED)
		munmap(p, PAGE);
	p = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, daemon, (off_t)(imp.mmap_offset + 3 * PAGE));
	vm_ok(p == MAP_FAILED && errno == EINVAL, "a mapping past the buffer's end -> EINVAL (%s)",
	      strerror(errno));
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, daemon, (off_t)(imp.mmap_offset + 4 * PAGE));
	vm_ok(p == MAP_FAILED && errno == EINVAL, "a mapping starting past the end -> EINVAL (%s)",
	      strerror(errno));
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, daemon, (off_t)imp.mmap_offset);
	vm_ok(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE -> EINVAL (%s)", strerror(errno));
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, daemon, (off_t)KCOLL_MMAP_OFF_BUF(999999));
	vm_ok(p == MAP_FAILED && errno == ENOENT, "mmap of an unknown handle's slot -> ENOENT (%s)",
	      strerror(errno));

	/* split a mapping: each half keeps the buffer alive on its own */
	p = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, daemon, (off_t)imp.mmap_offset);
	buf_unreg(owner, h);
	munmap(p + PAGE, PAGE);
	vm_ok(sysfs_read("pinned_pages") == pinned0 + 4, "a split mapping still holds the pins");
	munmap(p, PAGE);
	munmap(p + 2 * PAGE, 2 * PAGE);
	vm_ok(pins_at(pinned0, registered0), "unmapping both pieces unpins");

	/* read-only registrations */
	ret = buf_reg(owner, mem, PAGE, KCOLL_BUF_F_READONLY, &hro);
	import(daemon, hro, &imp);
	vm_ok(ret == 0 && imp.buf_flags == KCOLL_BUF_F_READONLY, "import reports KCOLL_BUF_F_READONLY");
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, daemon, (off_t)imp.mmap_offset);
	vm_ok(p == MAP_FAILED && errno == EACCES, "read-only buffer: PROT_WRITE mapping -> EACCES (%s)",
	      strerror(errno));
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, daemon, (off_t)imp.mmap_offset);
	vm_ok(p != MAP_FAILED, "read-only buffer: PROT_READ mapping works");
	vm_ok(p != MAP_FAILED && mprotect(p, PAGE, PROT_READ | PROT_WRITE) && errno == EACCES,
	      "read-only buffer: mprotect to writable -> EACCES");
	if (p != MAP_FAILED)
		munmap(p, PAGE);

	/* the mapping is not inherited: a forked child holds no reference */
	p = map_buf(daemon, hro, PROT_READ, &imp);
	if (p) {
		pid_t pid = fork();

		if (pid == 0) {
			unsigned char v;

			_exit(mincore(p, PAGE, &v) == -1 && errno == ENOMEM ? 0 : 1);
		}
		vm_ok(reap(pid) == 0, "a fork of the importer does not inherit the mapping");
		munmap(p, PAGE);
	}
	buf_unreg(owner, hro);
	vm_ok(pins_at(pinned0, registered0), "counters back after the read-only tests");
	close(owner);
	close(daemon);
	free(mem);
}

/* A child as nobody tries to import/map; returns a bitmask of what worked. */
enum { IMPORT_OK = 1, MMAP_OK = 2, DATA_OK = 4, OFFSET_MMAP_OK = 8 };

static int nobody_try(uint64_t handle)
{
	struct kcoll_ioc_buf_import imp;
	int fd, r = 0;
	char *p;

	fd = open(KCOLL_DEV_PATH, O_RDWR);
	if (fd < 0)
		return 101;
	/* straight to the documented offset, then the import way */
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, (off_t)KCOLL_MMAP_OFF_BUF(handle));
	if (p != MAP_FAILED)
		r |= OFFSET_MMAP_OK;
	if (!import(fd, handle, &imp)) {
		r |= IMPORT_OK;
		p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, (off_t)imp.mmap_offset);
		if (p != MAP_FAILED) {
			r |= MMAP_OK;
			if (p[0] == 0x5e)
				r |= DATA_OK;
		}
	}
	return r;
}

static int nobody_probe(uint64_t handle)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(drop_to_nobody() ? 100 : nobody_try(handle));
	return reap(pid);
}

/* A nobody child announces itself; the owner grants its pid; it tries. */
static int pid_grant_probe(int owner, uint64_t handle, int *grant_ret)
{
	struct chan c;
	uint64_t v;
	pid_t pid;

	chan_init(&c);
	pid = fork();
	if (pid == 0) {
		if (drop_to_nobody())
			_exit(100);
		chan_send(c.up[1], 1);
		chan_recv(c.down[0], &v);
		_exit(nobody_try(handle));
	}
	chan_recv(c.up[0], &v);
	*grant_ret = grant(owner, handle, KCOLL_GRANT_PID, (uint32_t)pid, 0);
	chan_send(c.down[1], 1);
	return reap(pid);
}

static int nobody_peer_report(void)
{
	struct kcoll_ioc_peer_report p = { .size = sizeof(p), .peer = 1, .state = KCOLL_PEER_OK };
	pid_t pid = fork();

	if (pid == 0) {
		if (drop_to_nobody())
			_exit(100);
		_exit(xioctl(open(KCOLL_DEV_PATH, O_RDWR), KCOLL_IOC_PEER_REPORT, &p) == -EPERM ? 0 : 1);
	}
	return reap(pid);
}

/* Pins by an unprivileged user are charged to its RLIMIT_MEMLOCK. */
static int nobody_memlock(void)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct rlimit rl = { 64 * 1024, 64 * 1024 };
		char *big = aligned_alloc(PAGE, 1 << 20);
		uint64_t h;
		int fd, r1, r2;

		memset(big, 1, 1 << 20);
		if (drop_to_nobody() || setrlimit(RLIMIT_MEMLOCK, &rl))
			_exit(100);
		fd = open(KCOLL_DEV_PATH, O_RDWR);
		r1 = buf_reg(fd, big, 1 << 20, 0, &h);
		r2 = buf_reg(fd, big, 32 * 1024, 0, &h);
		_exit(r1 == -ENOMEM && r2 == 0 ? 0 : 1);
	}
	return reap(pid);
}

static void permissions(void)
{
	const int all = IMPORT_OK | MMAP_OK | DATA_OK | OFFSET_MMAP_OK;
	int owner = dev_open(), st, ret, n;
	char *mem = aligned_alloc(PAGE, PAGE);
	uint64_t h;

	memset(mem, 0x5e, PAGE);
	buf_reg(owner, mem, PAGE, 0, &h);

	st = nobody_probe(h);
	vm_ok(st == 0, "uid 65534 can neither import nor mmap root's buffer (status %d)", st);
	ret = grant(owner, h, KCOLL_GRANT_UID, NOBODY, 0);
	st = nobody_probe(h);
	vm_ok(ret == 0 && st == all,
	      "after a uid grant, uid 65534 imports, maps and reads it (status %d)", st);
	ret = grant(owner, h, KCOLL_GRANT_UID, NOBODY, 0);
	vm_ok(ret == 0, "granting the same uid twice is harmless (%d)", ret);
	ret = grant(owner, h, KCOLL_GRANT_UID, NOBODY, KCOLL_GRANT_F_REVOKE);
	st = nobody_probe(h);
	vm_ok(ret == 0 && st == 0, "after revoke, uid 65534 is refused again (status %d)", st);

	st = pid_grant_probe(owner, h, &ret);
	vm_ok(ret == 0 && st == all,
	      "a pid grant lets that process (uid 65534) map the buffer (status %d)", st);
	st = nobody_probe(h);
	vm_ok(st == 0, "the pid grant does not extend to another process of that uid (status %d)",
	      st);

	for (ret = 0, n = 0; n < 16 && !ret; n++)
		ret = grant(owner, h, KCOLL_GRANT_UID, 2000 + n, 0);
	vm_ok(ret == -ENOSPC, "grants are bounded: -ENOSPC after %d more", n - 1);

	vm_ok(nobody_peer_report() == 0, "PEER_REPORT without CAP_NET_ADMIN -> -EPERM");
	vm_ok(nobody_memlock() == 0,
	      "uid 65534 with RLIMIT_MEMLOCK 64 KiB: 1 MiB -> -ENOMEM, 32 KiB works");
	close(owner);
	vm_ok(pins_at(pinned0, registered0), "counters back after the permission tests");
	free(mem);
}

/* The owner dies (SIGKILL) while its buffer is registered and mapped. */
static void owner_death(void)
{
	struct kcoll_ioc_buf_import imp;
	int daemon = dev_open(), ok;
	struct chan c;
	uint64_t h = 0;
	pid_t pid;
	char *p;
	size_t i;

	chan_init(&c);
	pid = fork();
	if (pid == 0) {
		int fd = dev_open();
		char *mem = aligned_alloc(PAGE, 256 * PAGE);
		uint64_t hh;

		memset(mem, 0x6b, 256 * PAGE);
		if (buf_reg(fd, mem, 256 * PAGE, 0, &hh))
			_exit(1);
		chan_send(c.up[1], hh);
		for (;;)
			pause();
	}
	if (chan_recv(c.up[0], &h)) {
		vm_ok(0, "owner child registered a buffer");
		return;
	}
	vm_ok(pins_at(pinned0 + 256, registered0 + 256 * PAGE),
	      "owner child pinned 256 pages (1 MiB)");
	p = map_buf(daemon, h, PROT_READ | PROT_WRITE, &imp);
	vm_ok(p && imp.owner_pid == (uint32_t)pid, "daemon maps it; import names the owner's pid");
	kill(pid, SIGKILL);
	reap(pid);
	vm_ok(pins_at(pinned0 + 256, registered0),
	      "owner killed: registration gone, pages stay pinned while the daemon maps them");
	vm_ok(import(daemon, h, &imp) == -ENOENT, "the dead owner's handle cannot be imported");
	for (i = 0, ok = p != NULL; p && i < 256 * PAGE; i += 512)
		ok &= p[i] == 0x6b;
	if (p)
		memset(p, 0, 256 * PAGE);
	vm_ok(ok, "the daemon's mapping still reads the dead owner's data and can be written");
	if (p)
		munmap(p, 256 * PAGE);
	vm_ok(pins_at(pinned0, registered0), "daemon unmaps: no pin left (%lld pages)",
	      sysfs_read("pinned_pages"));

	/* owner dies with no importer: everything goes at once */
	pid = fork();
	if (pid == 0) {
		int fd = dev_open();
		char *mem = aligned_alloc(PAGE, 16 * PAGE);
		uint64_t hh;

		memset(mem, 1, 16 * PAGE);
		buf_reg(fd, mem, 16 * PAGE, 0, &hh);
		buf_reg(fd, mem, 8 * PAGE, 0, &hh);
		chan_send(c.up[1], hh);
		for (;;)
			pause();
	}
	chan_recv(c.up[0], &h);
	ok = pins_at(pinned0 + 24, registered0 + 24 * PAGE);
	kill(pid, SIGKILL);
	reap(pid);
	vm_ok(ok && pins_at(pinned0, registered0),
	      "owner with two registrations killed, nothing mapped: all unpinned");
	close(daemon);
}

/* The importer dies while it maps a live buffer. */
static void importer_death(void)
{
	int owner = dev_open(), ret;
	char *mem = aligned_alloc(PAGE, 8 * PAGE);
	struct chan c;
	uint64_t h, v;
	pid_t pid;

	memset(mem, 2, 8 * PAGE);
	buf_reg(owner, mem, 8 * PAGE, 0, &h);
	chan_init(&c);
	pid = fork();
	if (pid == 0) {
		struct kcoll_ioc_buf_import imp;
		int fd = dev_open();
		char *p = map_buf(fd, h, PROT_READ, &imp);

		close(fd);	/* the mapping alone holds it */
		chan_send(c.up[1], p ? 1 : 0);
		for (;;)
			pause();
	}
	chan_recv(c.up[0], &v);
	ret = buf_unreg(owner, h);
	vm_ok(v == 1 && ret == 0 && pins_at(pinned0 + 8, registered0),
	      "importer child maps, owner unregisters: pins held by the child's mapping");
	kill(pid, SIGKILL);
	reap(pid);
	vm_ok(pins_at(pinned0, registered0), "importer killed: its mapping's pins are released");
	close(owner);
	free(mem);
}

static void module_limits(void)
{
	struct kcoll_ioc_query q = { .size = sizeof(q) };
	int fd = dev_open(), ret;
	char *mem = aligned_alloc(PAGE, 3 << 20);
	uint64_t h1, h2, h3;

	memset(mem, 1, 3 << 20);
	xioctl(fd, KCOLL_IOC_QUERY, &q);
	vm_ok(q.max_buf_bytes == 1 << 20 && q.max_pinned_bytes == 2 << 20,
	      "QUERY reports max_buf 1 MiB, max_pinned 2 MiB");
	ret = buf_reg(fd, mem, (1 << 20) + 1, 0, &h1);
	vm_ok(ret == -EINVAL, "a registration above max_buf_mb -> -EINVAL (%d)", ret);
	ret = buf_reg(fd, mem, 1 << 20, 0, &h1);
	ret |= buf_reg(fd, mem + (1 << 20), 1 << 20, 0, &h2);
	vm_ok(ret == 0, "two 1 MiB registrations fit in max_pinned_mb=2");
	ret = buf_reg(fd, mem + (2 << 20), PAGE, 0, &h3);
	vm_ok(ret == -ENOSPC && sysfs_read("pinned_pages") == 512,
	      "one more page -> -ENOSPC, nothing more pinned (%d)", ret);
	buf_unreg(fd, h1);
	ret = buf_reg(fd, mem + (2 << 20), PAGE, 0, &h3);
	vm_ok(ret == 0, "after an unregister the page fits (%d)", ret);
	close(fd);
	vm_ok(pins_at(0, 0), "all unpinned on close");
	free(mem);
}

int main(int argc, char **argv)
{
	ksft_print_header();
	pinned0 = sysfs_read("pinned_pages");
	registered0 = sysfs_read("registered_bytes");
	if (pinned0 < 0 || registered0 < 0)
		ksft_exit_fail_msg("cannot read %s counters\n", SYSFS_DIR);
	if (argc > 1 && !strcmp(argv[1], "--limits")) {
		module_limits();
		return vm_done();
	}
	same_process();
	mapping_rules();
	permissions();
	owner_death();
	importer_death();
	return vm_done();
}

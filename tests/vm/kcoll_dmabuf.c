// SPDX-License-Identifier: MIT
/*
 * KCOLL_IOC_BUF_DMABUF: a registration exported as a dma-buf. Contents both
 * ways between the registrant and another process that maps the dma-buf
 * (kcolld's role), permissions, the size-first ioctl rules, read-only
 * registrations, and no pin outliving the dma-buf or staying after it.
 *   kcoll_dmabuf          the tests (module loaded, nothing else pinned)
 *   kcoll_dmabuf --hold   register, export, close /dev/kcoll, print "ready"
 *                         and wait with only the dma-buf open (t_module.sh:
 *                         rmmod must be refused)
 */
#include <dirent.h>

#include "util.h"

#define PAGE 4096

static long long pinned0, registered0;

/* Export handle through fd; 0 (d filled) or -errno. */
static int export(int fd, uint64_t handle, struct kcoll_ioc_buf_dmabuf *d)
{
	memset(d, 0, sizeof(*d));
	d->size = sizeof(*d);
	d->handle = handle;
	d->fd = -1;
	return xioctl(fd, KCOLL_IOC_BUF_DMABUF, d);
}

/* The release of a file may run a little after close() returns: poll for 10 s. */
static int counters_reach(long long pinned, long long registered)
{
	double end = now_ms() + 10000;

	while (!pins_at(pinned, registered)) {
		if (now_ms() > end)
			return 0;
		usleep(10000);
	}
	return 1;
}

static int nr_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* Whether /proc/self/fdinfo/fd names the kcoll exporter. */
static int fdinfo_is_kcoll(int fd)
{
	char path[64], line[256];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "exp_name:", 9) && strstr(line, "kcoll"))
			found = 1;
	fclose(f);
	return found;
}

static void basics(void)
{
	struct kcoll_ioc_query q = { .size = sizeof(q) };
	struct kcoll_ioc_buf_dmabuf d, again;
	int fd = dev_open(), ret;
	char *mem = aligned_alloc(PAGE, 4 * PAGE), *p;
	uint64_t h;

	ret = xioctl(fd, KCOLL_IOC_QUERY, &q);
	vm_ok(ret == 0 && (q.features & KCOLL_FEAT_DMABUF), "QUERY reports KCOLL_FEAT_DMABUF");
	memset(mem, 0x3c, 4 * PAGE);
	/* 2 pages + 200 bytes starting 100 bytes in: 3 pages */
	ret = buf_reg(fd, mem + 100, 2 * PAGE + 200, 0, &h);
	ret = ret ? ret : export(fd, h, &d);
	vm_ok(ret == 0 && d.fd >= 0 && d.dmabuf_size == 3 * PAGE && d.len == 2 * PAGE + 200 &&
	      d.page_offset == 100, "export: fd %d, dmabuf_size %llu, len %llu, page_offset %u",
	      d.fd, (unsigned long long)d.dmabuf_size, (unsigned long long)d.len, d.page_offset);
	if (ret) {
		close(fd);
		return;
	}
	vm_ok((fcntl(d.fd, F_GETFD) & FD_CLOEXEC) && (fcntl(d.fd, F_GETFL) & O_ACCMODE) == O_RDWR,
	      "the dma-buf fd is close-on-exec and read-write");
	vm_ok(fdinfo_is_kcoll(d.fd), "fdinfo names exporter kcoll");
	vm_ok(pins_at(pinned0 + 3, registered0 + 2 * PAGE + 200),
	      "export pins nothing more (pinned_pages %lld)", sysfs_read("pinned_pages"));
	p = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, d.fd, 0);
	vm_ok(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE of the dma-buf -> EINVAL");
	p = mmap(NULL, 4 * PAGE, PROT_READ, MAP_SHARED, d.fd, 0);
	vm_ok(p == MAP_FAILED, "a mapping past the dma-buf's size is refused");
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, d.fd, 2 * PAGE);
	mem[2 * PAGE + 7] = 0x5a;
	vm_ok(p != MAP_FAILED && p[7] == 0x5a, "a mapping of the third page alone shows it");
	if (p != MAP_FAILED)
		munmap(p, PAGE);
	vm_ok(buf_unreg(fd, h) == 0 && pins_at(pinned0 + 3, registered0),
	      "unregister: registered_bytes drops, the dma-buf keeps the pages pinned");
	vm_ok(export(fd, h, &again) == -ENOENT, "an ended registration cannot be exported");
	close(d.fd);
	vm_ok(counters_reach(pinned0, registered0), "closing the dma-buf unpins (%lld pages)",
	      sysfs_read("pinned_pages"));
	close(fd);
	free(mem);
}

/* The registrant (a child) and the daemon (this process) see each other's bytes. */
static void both_ways(void)
{
	struct kcoll_ioc_buf_dmabuf d;
	int daemon = dev_open(), ok, ret;
	struct chan c;
	uint64_t h = 0, v;
	char *p = NULL;
	pid_t pid;
	size_t i;

	chan_init(&c);
	pid = fork();
	if (pid == 0) {
		int fd = dev_open();
		unsigned char *mem = aligned_alloc(PAGE, 64 * PAGE);
		uint64_t hh, bad = 0;

		for (i = 0; i < 64 * PAGE; i++)
			mem[i] = (unsigned char)(i * 7 + 1);
		if (buf_reg(fd, mem, 64 * PAGE, 0, &hh))
			_exit(1);
		chan_send(c.up[1], hh);
		/* the daemon wrote through its mapping: check, report */
		chan_recv(c.down[0], &v);
		for (i = 0; i < 64 * PAGE; i++)
			bad += mem[i] != (unsigned char)(i * 13 + 5);
		chan_send(c.up[1], bad);
		for (;;)
			pause();
	}
	if (chan_recv(c.up[0], &h)) {
		vm_ok(0, "registrant child registered 64 pages");
		return;
	}
	ret = export(daemon, h, &d);
	vm_ok(ret == 0 && d.dmabuf_size == 64 * PAGE, "the daemon exports the child's buffer (%d)",
	      ret);
	if (!ret)
		p = mmap(NULL, 64 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, d.fd, 0);
	if (p == MAP_FAILED)
		p = NULL;
	for (i = 0, ok = p != NULL; p && i < 64 * PAGE; i++)
		ok &= (unsigned char)p[i] == (unsigned char)(i * 7 + 1);
	vm_ok(ok, "the daemon's mapping of the dma-buf reads the registrant's 256 KiB exactly");
	for (i = 0; p && i < 64 * PAGE; i++)
		p[i] = (char)(i * 13 + 5);
	chan_send(c.down[1], 1);
	v = ~0ULL;
	chan_recv(c.up[0], &v);
	vm_ok(p && v == 0, "the registrant reads the daemon's writes (%llu bytes differ)",
	      (unsigned long long)v);

	/* the registrant dies: the dma-buf still holds its pages */
	kill(pid, SIGKILL);
	reap(pid);
	vm_ok(pins_at(pinned0 + 64, registered0),
	      "registrant killed: registration gone, 64 pages stay pinned for the dma-buf");
	if (!ret)
		close(d.fd);
	vm_ok(pins_at(pinned0 + 64, registered0), "closing the fd keeps them: still mapped");
	for (i = 0, ok = p != NULL; p && i < 64 * PAGE; i++)
		ok &= (unsigned char)p[i] == (unsigned char)(i * 13 + 5);
	vm_ok(ok, "the mapping still reads the dead registrant's memory");
	if (p)
		munmap(p, 64 * PAGE);
	vm_ok(counters_reach(pinned0, registered0), "munmap of the last user unpins (%lld pages)",
	      sysfs_read("pinned_pages"));
	close(daemon);
}

/* A child as nobody exports handle; returns 0 on success or the errno. */
static int nobody_export(uint64_t handle)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct kcoll_ioc_buf_dmabuf d;
		int ret;

		if (drop_to_nobody())
			_exit(100);
		ret = export(dev_open(), handle, &d);
		_exit(ret ? (-ret & 0x7f) : 0);
	}
	return reap(pid);
}

static void permissions(void)
{
	struct kcoll_ioc_buf_dmabuf d;
	int owner = dev_open(), ret, fds;
	char *mem = aligned_alloc(PAGE, 2 * PAGE), *p;
	uint64_t h, hro;

	memset(mem, 0x44, 2 * PAGE);
	buf_reg(owner, mem, 2 * PAGE, 0, &h);
	ret = nobody_export(h);
	vm_ok(ret == EACCES, "another uid without a grant -> EACCES (%d)", ret);
	vm_ok(pins_at(pinned0 + 2, registered0 + 2 * PAGE), "the refusal pinned nothing");
	vm_ok(export(owner, 0, &d) == -ENOENT && export(owner, h + 1000, &d) == -ENOENT,
	      "handle 0 or an unknown handle -> ENOENT");
	ret = xioctl(owner, KCOLL_IOC_BUF_GRANT, &(struct kcoll_ioc_buf_grant){
		.size = sizeof(struct kcoll_ioc_buf_grant), .handle = h,
		.kind = KCOLL_GRANT_UID, .id = NOBODY });
	ret = ret ? ret : nobody_export(h);
	vm_ok(ret == 0, "after a uid grant nobody may export (%d)", ret);
	vm_ok(counters_reach(pinned0 + 2, registered0 + 2 * PAGE),
	      "the exiting child's dma-buf was released");

	/* the size-first contract; no fd may leak from a refusal */
	fds = nr_fds();
	{
		struct { struct kcoll_ioc_buf_dmabuf d; uint64_t tail; } big;

		memset(&big, 0, sizeof(big));
		big.d.size = 8;
		big.d.handle = h;
		vm_ok(xioctl(owner, KCOLL_IOC_BUF_DMABUF, &big) == -EINVAL, "size 8 -> EINVAL");
		big.d.size = sizeof(big.d) - 1;
		vm_ok(xioctl(owner, KCOLL_IOC_BUF_DMABUF, &big) == -EINVAL, "size 39 -> EINVAL");
		big.d.size = PAGE + 1;
		vm_ok(xioctl(owner, KCOLL_IOC_BUF_DMABUF, &big) == -E2BIG, "size 4097 -> E2BIG");
		big.d.size = sizeof(big);
		big.tail = 1;
		vm_ok(xioctl(owner, KCOLL_IOC_BUF_DMABUF, &big) == -E2BIG,
		      "a longer struct with a non-zero tail -> E2BIG");
		big.d.size = sizeof(big.d);
		big.d.flags = 1;
		vm_ok(xioctl(owner, KCOLL_IOC_BUF_DMABUF, &big) == -EOPNOTSUPP,
		      "unknown flags -> EOPNOTSUPP");
		vm_ok(nr_fds() == fds && pins_at(pinned0 + 2, registered0 + 2 * PAGE),
		      "no fd and no pin left by the refusals");
		big.d.size = sizeof(big);
		big.d.flags = 0;
		big.tail = 0;
		ret = xioctl(owner, KCOLL_IOC_BUF_DMABUF, &big);
		vm_ok(ret == 0 && big.d.fd >= 0 && big.tail == 0,
		      "a longer struct with a zero tail works (%d)", ret);
		if (!ret)
			close(big.d.fd);
	}
	/* the reply cannot be written back: no fd, no reference left behind */
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED) {
		struct kcoll_ioc_buf_dmabuf *a = (void *)p;

		a->size = sizeof(*a);
		a->handle = h;
		mprotect(p, PAGE, PROT_READ);
		ret = xioctl(owner, KCOLL_IOC_BUF_DMABUF, a);
		vm_ok(ret == -EFAULT && nr_fds() == fds &&
		      counters_reach(pinned0 + 2, registered0 + 2 * PAGE),
		      "an argument the kernel cannot write back -> EFAULT, no fd installed (%d)",
		      ret);
		munmap(p, PAGE);
	} else {
		vm_skip("mmap failed: %s", strerror(errno));
	}

	/* read-only registration: an O_RDONLY dma-buf */
	buf_reg(owner, mem, PAGE, KCOLL_BUF_F_READONLY, &hro);
	ret = export(owner, hro, &d);
	vm_ok(ret == 0 && (fcntl(d.fd, F_GETFL) & O_ACCMODE) == O_RDONLY,
	      "a read-only registration exports an O_RDONLY dma-buf");
	if (!ret) {
		p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, d.fd, 0);
		vm_ok(p == MAP_FAILED && errno == EACCES, "... that cannot be mapped writable");
		p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, d.fd, 0);
		vm_ok(p != MAP_FAILED && p[0] == 0x44 &&
		      mprotect(p, PAGE, PROT_READ | PROT_WRITE) != 0,
		      "... read-only mapping reads it, mprotect to writable refused");
		if (p != MAP_FAILED)
			munmap(p, PAGE);
		close(d.fd);
	}
	close(owner);
	vm_ok(counters_reach(pinned0, registered0), "counters back after the permission tests");
	free(mem);
}

static int hold(void)
{
	struct kcoll_ioc_buf_dmabuf d;
	char *mem = aligned_alloc(PAGE, PAGE);
	int fd = dev_open();
	uint64_t h;

	memset(mem, 1, PAGE);
	if (buf_reg(fd, mem, PAGE, 0, &h) || export(fd, h, &d)) {
		printf("failed: %s\n", strerror(errno));
		return 1;
	}
	close(fd);
	printf("ready\n");
	fflush(stdout);
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--hold"))
		return hold();
	ksft_print_header();
	pinned0 = sysfs_read("pinned_pages");
	registered0 = sysfs_read("registered_bytes");
	if (pinned0 < 0 || registered0 < 0)
		ksft_exit_fail_msg("cannot read %s counters\n", SYSFS_DIR);
	basics();
	both_ways();
	permissions();
	return vm_done();
}

// SPDX-License-Identifier: MIT
/*
 * The size-first contract of every /dev/kcoll ioctl, one rule broken at a
 * time: size below the first version's (-EINVAL), one byte more with a
 * non-zero tail (-E2BIG), a longer all-zero tail (accepted, tail untouched),
 * unknown flags (-EOPNOTSUPP), each reserved field (-EINVAL). Then the value
 * checks each ioctl makes on its own fields.
 */
#include "util.h"

#define PAGE 4096

struct ctx {
	int fd;			/* has a ring and a registered buffer */
	int fresh_fd;		/* no ring yet: for RING_CREATE */
	uint64_t handle;	/* registered on fd */
	char *mem;		/* 4 pages for registrations */
};

struct ioc_case {
	const char *name;
	unsigned long cmd;
	size_t size;		/* sizeof today */
	size_t min_size;	/* first version's size */
	size_t reserved[2];	/* offsets of __u32 reserved fields, 0 = none */
	uint32_t bad_flag;	/* a flag this module does not know */
	void (*fill)(struct ctx *c, void *arg);
	int (*fd)(struct ctx *c);
	void (*undo)(struct ctx *c, void *arg);
};

static int fd_main(struct ctx *c)
{
	return c->fd;
}

static int fd_fresh(struct ctx *c)
{
	return c->fresh_fd;
}

static void fill_query(struct ctx *c, void *arg)
{
}

static void fill_ring_create(struct ctx *c, void *arg)
{
	struct kcoll_ioc_ring_create *r = arg;

	r->sq_entries = 4;
}

static void undo_ring_create(struct ctx *c, void *arg)
{
	close(c->fresh_fd);
	c->fresh_fd = dev_open();
}

static void fill_wait(struct ctx *c, void *arg)
{
	struct kcoll_ioc_wait *w = arg;

	w->doorbell = KCOLL_DOORBELL_CQ;
	w->value = 12345;	/* differs from the index: returns at once */
	w->timeout_ms = 0;
}

static void fill_wake(struct ctx *c, void *arg)
{
	struct kcoll_ioc_wake *w = arg;

	w->doorbell = KCOLL_DOORBELL_SQ;
}

static void fill_register(struct ctx *c, void *arg)
{
	struct kcoll_ioc_buf_register *r = arg;

	r->addr = (uintptr_t)c->mem + 100;
	r->len = 2 * PAGE;
}

static void undo_register(struct ctx *c, void *arg)
{
	struct kcoll_ioc_buf_register *r = arg;
	struct kcoll_ioc_buf_unregister u = { .size = sizeof(u), .handle = r->handle };

	xioctl(c->fd, KCOLL_IOC_BUF_UNREGISTER, &u);
}

static void fill_unregister(struct ctx *c, void *arg)
{
	struct kcoll_ioc_buf_unregister *u = arg;
	struct kcoll_ioc_buf_register r = {
		.size = sizeof(r), .addr = (uintptr_t)c->mem, .len = PAGE,
	};

	/* a fresh registration for every call that should succeed */
	xioctl(c->fd, KCOLL_IOC_BUF_REGISTER, &r);
	u->handle = r.handle;
}

static void undo_unregister_fail(struct ctx *c, void *arg)
{
	struct kcoll_ioc_buf_unregister *u = arg;
	struct kcoll_ioc_buf_unregister v = { .size = sizeof(v), .handle = u->handle };

	/* the failing calls leave their registration behind */
	xioctl(c->fd, KCOLL_IOC_BUF_UNREGISTER, &v);
}

static void fill_grant(struct ctx *c, void *arg)
{
	struct kcoll_ioc_buf_grant *g = arg;

	g->handle = c->handle;
	g->kind = KCOLL_GRANT_UID;
	g->id = 4321;
}

static void fill_import(struct ctx *c, void *arg)
{
	struct kcoll_ioc_buf_import *i = arg;

	i->handle = c->handle;
}

static void fill_peer(struct ctx *c, void *arg)
{
	struct kcoll_ioc_peer_report *p = arg;

	p->peer = 7;
	p->state = KCOLL_PEER_OK;
}

#define OFF(type, field) offsetof(struct type, field)

static const struct ioc_case cases[] = {
	{ "QUERY", KCOLL_IOC_QUERY, sizeof(struct kcoll_ioc_query), 8, { 0 }, 1,
	  fill_query, fd_main, NULL },
	{ "RING_CREATE", KCOLL_IOC_RING_CREATE, sizeof(struct kcoll_ioc_ring_create),
	  sizeof(struct kcoll_ioc_ring_create), { 0 }, 1, fill_ring_create, fd_fresh,
	  undo_ring_create },
	{ "WAIT", KCOLL_IOC_WAIT, sizeof(struct kcoll_ioc_wait), sizeof(struct kcoll_ioc_wait),
	  { OFF(kcoll_ioc_wait, reserved) }, 2, fill_wait, fd_main, NULL },
	{ "WAKE", KCOLL_IOC_WAKE, sizeof(struct kcoll_ioc_wake), sizeof(struct kcoll_ioc_wake),
	  { OFF(kcoll_ioc_wake, reserved) }, 1, fill_wake, fd_main, NULL },
	{ "BUF_REGISTER", KCOLL_IOC_BUF_REGISTER, sizeof(struct kcoll_ioc_buf_register),
	  sizeof(struct kcoll_ioc_buf_register), { 0 }, 2, fill_register, fd_main, undo_register },
	{ "BUF_UNREGISTER", KCOLL_IOC_BUF_UNREGISTER, sizeof(struct kcoll_ioc_buf_unregister),
	  sizeof(struct kcoll_ioc_buf_unregister), { 0 }, 1, fill_unregister, fd_main, NULL },
	{ "BUF_GRANT", KCOLL_IOC_BUF_GRANT, sizeof(struct kcoll_ioc_buf_grant),
	  sizeof(struct kcoll_ioc_buf_grant), { 0 }, 2, fill_grant, fd_main, NULL },
	{ "BUF_IMPORT", KCOLL_IOC_BUF_IMPORT, sizeof(struct kcoll_ioc_buf_import),
	  sizeof(struct kcoll_ioc_buf_import), { OFF(kcoll_ioc_buf_import, reserved) }, 1,
	  fill_import, fd_main, NULL },
	{ "PEER_REPORT", KCOLL_IOC_PEER_REPORT, sizeof(struct kcoll_ioc_peer_report),
	  sizeof(struct kcoll_ioc_peer_report), { 0 }, 1, fill_peer, fd_main, NULL },
};

static unsigned char arg[PAGE + 64];

/* Build a valid argument of 'size' bytes (tail zeroed), then call. */
static int call(struct ctx *c, const struct ioc_case *t, uint32_t size,
		void (*mutate)(void *arg, const struct ioc_case *t, size_t extra), size_t extra)
{
	int ret;

	memset(arg, 0, sizeof(arg));
	t->fill(c, arg);
	memcpy(arg, &size, sizeof(size));
	if (mutate)
		mutate(arg, t, extra);
	ret = xioctl(t->fd(c), t->cmd, arg);
	if (!ret && t->undo)
		t->undo(c, arg);
	if (ret && t->fill == fill_unregister)
		undo_unregister_fail(c, arg);
	return ret;
}

static void set_tail_byte(void *a, const struct ioc_case *t, size_t extra)
{
	((unsigned char *)a)[t->size + extra] = 0x5a;
}

static void set_bad_flag(void *a, const struct ioc_case *t, size_t extra)
{
	uint32_t f;

	memcpy(&f, (char *)a + 4, 4);
	f |= t->bad_flag;
	memcpy((char *)a + 4, &f, 4);
}

static void set_high_flag(void *a, const struct ioc_case *t, size_t extra)
{
	uint32_t f = 1U << 31;

	memcpy((char *)a + 4, &f, 4);
}

static void set_reserved(void *a, const struct ioc_case *t, size_t which)
{
	uint32_t v = 1;

	memcpy((char *)a + t->reserved[which], &v, 4);
}

static int all_zero(const unsigned char *p, size_t n)
{
	while (n--)
		if (*p++)
			return 0;
	return 1;
}

static void contract(struct ctx *c, const struct ioc_case *t)
{
	uint32_t sz = (uint32_t)t->size;
	int ret;
	size_t i;

	ret = call(c, t, sz, NULL, 0);
	vm_ok(ret == 0, "%s: valid call at size %u -> 0 (got %d)", t->name, sz, ret);

	ret = call(c, t, (uint32_t)t->min_size - 1, NULL, 0);
	vm_ok(ret == -EINVAL, "%s: size %zu (below the first version) -> -EINVAL (got %d)",
	      t->name, t->min_size - 1, ret);

	ret = call(c, t, 0, NULL, 0);
	vm_ok(ret == -EINVAL, "%s: size 0 -> -EINVAL (got %d)", t->name, ret);

	ret = call(c, t, sz + 1, set_tail_byte, 0);
	vm_ok(ret == -E2BIG, "%s: size+1 with a non-zero tail byte -> -E2BIG (got %d)",
	      t->name, ret);

	ret = call(c, t, sz + 8, set_tail_byte, 7);
	vm_ok(ret == -E2BIG, "%s: size+8 with a non-zero last byte -> -E2BIG (got %d)",
	      t->name, ret);

	ret = call(c, t, sz + 8, NULL, 0);
	vm_ok(ret == 0 && all_zero(arg + sz, 8),
	      "%s: size+8 with a zero tail -> 0, tail left untouched (got %d)", t->name, ret);

	ret = call(c, t, PAGE + 8, NULL, 0);
	vm_ok(ret == -E2BIG, "%s: size beyond a page -> -E2BIG (got %d)", t->name, ret);

	ret = call(c, t, sz, set_bad_flag, 0);
	vm_ok(ret == -EOPNOTSUPP, "%s: unknown flag 0x%x -> -EOPNOTSUPP (got %d)", t->name,
	      t->bad_flag, ret);

	ret = call(c, t, sz, set_high_flag, 0);
	vm_ok(ret == -EOPNOTSUPP, "%s: flag bit 31 -> -EOPNOTSUPP (got %d)", t->name, ret);

	for (i = 0; i < 2 && t->reserved[i]; i++) {
		ret = call(c, t, sz, set_reserved, i);
		vm_ok(ret == -EINVAL, "%s: reserved field at offset %zu non-zero -> -EINVAL (got %d)",
		      t->name, t->reserved[i], ret);
	}
}

/* QUERY is all output: a short struct gets exactly the bytes it has room for. */
static void query_short(struct ctx *c)
{
	struct kcoll_ioc_query q;
	unsigned char raw[sizeof(q)];
	int ret;

	memset(raw, 0xee, sizeof(raw));
	raw[0] = 8;
	raw[1] = raw[2] = raw[3] = 0;
	memset(raw + 4, 0, 4);
	ret = xioctl(c->fd, KCOLL_IOC_QUERY, raw);
	vm_ok(ret == 0 && raw[8] == 0xee && raw[sizeof(raw) - 1] == 0xee,
	      "QUERY: size 8 -> 0 and nothing written past byte 8 (got %d)", ret);

	memset(raw, 0xee, sizeof(raw));
	memset(raw, 0, 8);
	raw[0] = sizeof(q) - 1;
	ret = xioctl(c->fd, KCOLL_IOC_QUERY, raw);
	memcpy(&q, raw, sizeof(q));
	vm_ok(ret == 0 && raw[sizeof(raw) - 1] == 0xee && q.abi_version == KCOLL_KDEV_ABI_VERSION,
	      "QUERY: size-1 -> 0, zero-extended, last byte untouched (got %d)", ret);

	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	ret = xioctl(c->fd, KCOLL_IOC_QUERY, &q);
	vm_ok(ret == 0 && q.features == 0x3f && q.page_size == (uint32_t)getpagesize() &&
	      q.max_ring_entries == KCOLL_RING_MAX_ENTRIES && q.max_grants > 0 &&
	      q.max_buf_bytes > 0 && q.max_pinned_bytes >= q.max_buf_bytes &&
	      (long long)q.features == sysfs_read("features"),
	      "QUERY: features 0x%llx, limits filled, features match sysfs",
	      (unsigned long long)q.features);
}

static void unknown_ioctls(struct ctx *c)
{
	struct kcoll_ioc_query q = { .size = sizeof(q) };
	int ret;

	ret = xioctl(c->fd, _IOWR('k', 0x4a, struct kcoll_ioc_query), &q);
	vm_ok(ret == -ENOTTY, "unknown ioctl number 0x4a -> -ENOTTY (got %d)", ret);
	ret = xioctl(c->fd, _IOWR('k', 0x3f, struct kcoll_ioc_query), &q);
	vm_ok(ret == -ENOTTY, "unknown ioctl number 0x3f -> -ENOTTY (got %d)", ret);
	ret = xioctl(c->fd, _IOR('k', 0x40, struct kcoll_ioc_query), &q);
	vm_ok(ret == -ENOTTY, "QUERY number with the wrong direction -> -ENOTTY (got %d)", ret);
	ret = xioctl(c->fd, _IOWR('k', 0x40, uint64_t), &q);
	vm_ok(ret == 0, "QUERY number with another size still works: size field governs (got %d)",
	      ret);
	ret = xioctl(c->fd, KCOLL_IOC_QUERY, (void *)16);
	vm_ok(ret == -EFAULT, "QUERY with a bad pointer -> -EFAULT (got %d)", ret);
}

static int ring_create(int fd, uint32_t sq, uint32_t cq)
{
	struct kcoll_ioc_ring_create r = { .size = sizeof(r), .sq_entries = sq, .cq_entries = cq };

	return xioctl(fd, KCOLL_IOC_RING_CREATE, &r);
}

static void ring_values(struct ctx *c)
{
	static const struct { uint32_t sq, cq; int want; } v[] = {
		{ 0, 0, -EINVAL }, { 3, 0, -EINVAL }, { 8192, 0, -EINVAL },
		{ 8, 4, -EINVAL }, { 8, 12, -EINVAL }, { 8, 16384, -EINVAL },
		{ KCOLL_RING_MAX_ENTRIES, 2 * KCOLL_RING_MAX_ENTRIES, 0 },
	};
	struct kcoll_ioc_ring_create r = { .size = sizeof(r), .sq_entries = 8 };
	size_t i;
	int fd, ret;

	for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		fd = dev_open();
		ret = ring_create(fd, v[i].sq, v[i].cq);
		vm_ok(ret == v[i].want, "RING_CREATE sq %u cq %u -> %d (got %d)", v[i].sq, v[i].cq,
		      v[i].want, ret);
		close(fd);
	}
	fd = dev_open();
	ret = xioctl(fd, KCOLL_IOC_RING_CREATE, &r);
	vm_ok(ret == 0 && r.ring_size == 4096 + 8 * 64 + 16 * 32 + 3072 && r.mmap_offset == 0,
	      "RING_CREATE sq 8, cq 0 -> cq 16, ring_size %llu, offset 0",
	      (unsigned long long)r.ring_size);
	ret = ring_create(fd, 8, 0);
	vm_ok(ret == -EBUSY, "second RING_CREATE on one file -> -EBUSY (got %d)", ret);
	close(fd);
}

static void doorbell_values(struct ctx *c)
{
	struct kcoll_ioc_wait w = { .size = sizeof(w), .doorbell = 2 };
	struct kcoll_ioc_wake k = { .size = sizeof(k), .doorbell = 2 };
	int fd = dev_open(), ret;

	ret = xioctl(c->fd, KCOLL_IOC_WAIT, &w);
	vm_ok(ret == -EINVAL, "WAIT doorbell 2 -> -EINVAL (got %d)", ret);
	ret = xioctl(c->fd, KCOLL_IOC_WAKE, &k);
	vm_ok(ret == -EINVAL, "WAKE doorbell 2 -> -EINVAL (got %d)", ret);
	w.doorbell = k.doorbell = KCOLL_DOORBELL_SQ;
	ret = xioctl(fd, KCOLL_IOC_WAIT, &w);
	vm_ok(ret == -ENXIO, "WAIT on a file without a ring -> -ENXIO (got %d)", ret);
	ret = xioctl(fd, KCOLL_IOC_WAKE, &k);
	vm_ok(ret == -ENXIO, "WAKE on a file without a ring -> -ENXIO (got %d)", ret);
	ret = xioctl(c->fd, KCOLL_IOC_WAIT, &w);
	vm_ok(ret == -ETIMEDOUT, "WAIT with timeout 0 on an unchanged index -> -ETIMEDOUT (got %d)",
	      ret);
	close(fd);
}

static int reg(int fd, uint64_t addr, uint64_t len, uint64_t *handle)
{
	struct kcoll_ioc_buf_register r = { .size = sizeof(r), .addr = addr, .len = len };
	int ret = xioctl(fd, KCOLL_IOC_BUF_REGISTER, &r);

	if (!ret && handle)
		*handle = r.handle;
	return ret;
}

static void buf_values(struct ctx *c)
{
	struct kcoll_ioc_query q = { .size = sizeof(q) };
	struct kcoll_ioc_buf_unregister u = { .size = sizeof(u) };
	struct kcoll_ioc_buf_import imp = { .size = sizeof(imp) };
	struct kcoll_ioc_buf_grant g = { .size = sizeof(g), .handle = c->handle };
	void *ro;
	int fd2 = dev_open(), ret;

	xioctl(c->fd, KCOLL_IOC_QUERY, &q);
	ret = reg(c->fd, (uintptr_t)c->mem, 0, NULL);
	vm_ok(ret == -EINVAL, "BUF_REGISTER len 0 -> -EINVAL (got %d)", ret);
	ret = reg(c->fd, (uintptr_t)c->mem, q.max_buf_bytes + 1, NULL);
	vm_ok(ret == -EINVAL, "BUF_REGISTER len max_buf_bytes+1 -> -EINVAL (got %d)", ret);
	ret = reg(c->fd, ~0ULL - 100, 4096, NULL);
	vm_ok(ret == -EFAULT, "BUF_REGISTER wrapping range -> -EFAULT (got %d)", ret);
	ret = reg(c->fd, 0xffff800000000000ULL, 4096, NULL);
	vm_ok(ret == -EFAULT, "BUF_REGISTER kernel address -> -EFAULT (got %d)", ret);
	ret = reg(c->fd, 4096, 4096, NULL);
	vm_ok(ret == -EFAULT, "BUF_REGISTER unmapped address -> -EFAULT (got %d)", ret);
	ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ret = reg(c->fd, (uintptr_t)ro, 4096, NULL);
	vm_ok(ret == -EFAULT, "BUF_REGISTER read-only memory -> -EFAULT (got %d)", ret);
	munmap(ro, 4096);

	u.handle = c->handle;
	ret = xioctl(fd2, KCOLL_IOC_BUF_UNREGISTER, &u);
	vm_ok(ret == -ENOENT, "BUF_UNREGISTER from another file -> -ENOENT (got %d)", ret);
	u.handle = 0;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_UNREGISTER, &u);
	vm_ok(ret == -ENOENT, "BUF_UNREGISTER handle 0 -> -ENOENT (got %d)", ret);
	u.handle = 1ULL << 40;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_UNREGISTER, &u);
	vm_ok(ret == -ENOENT, "BUF_UNREGISTER handle 2^40 -> -ENOENT (got %d)", ret);

	g.kind = 2;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_GRANT, &g);
	vm_ok(ret == -EINVAL, "BUF_GRANT kind 2 -> -EINVAL (got %d)", ret);
	g.kind = KCOLL_GRANT_UID;
	g.id = (uint32_t)-1;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_GRANT, &g);
	vm_ok(ret == -EINVAL, "BUF_GRANT uid -1 -> -EINVAL (got %d)", ret);
	g.kind = KCOLL_GRANT_PID;
	g.id = 0;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_GRANT, &g);
	vm_ok(ret == -EINVAL, "BUF_GRANT pid 0 -> -EINVAL (got %d)", ret);
	g.id = 4000000;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_GRANT, &g);
	vm_ok(ret == -ESRCH, "BUF_GRANT pid of no process -> -ESRCH (got %d)", ret);
	g.id = (uint32_t)getpid();
	ret = xioctl(fd2, KCOLL_IOC_BUF_GRANT, &g);
	vm_ok(ret == -ENOENT, "BUF_GRANT from a file that does not own the handle -> -ENOENT (got %d)",
	      ret);
	g.flags = KCOLL_GRANT_F_REVOKE;
	ret = xioctl(c->fd, KCOLL_IOC_BUF_GRANT, &g);
	vm_ok(ret == -ENOENT, "BUF_GRANT revoke of a grant never made -> -ENOENT (got %d)", ret);

	imp.handle = 0;
	ret = xioctl(fd2, KCOLL_IOC_BUF_IMPORT, &imp);
	vm_ok(ret == -ENOENT, "BUF_IMPORT handle 0 -> -ENOENT (got %d)", ret);
	imp.handle = 999999;
	ret = xioctl(fd2, KCOLL_IOC_BUF_IMPORT, &imp);
	vm_ok(ret == -ENOENT, "BUF_IMPORT unknown handle -> -ENOENT (got %d)", ret);
	imp.handle = c->handle;
	ret = xioctl(fd2, KCOLL_IOC_BUF_IMPORT, &imp);
	vm_ok(ret == 0 && imp.mmap_offset == KCOLL_MMAP_OFF_BUF(c->handle) && imp.len == 4 * PAGE &&
	      imp.map_len == 4 * PAGE && imp.page_offset == 0 && imp.owner_pid == (uint32_t)getpid(),
	      "BUF_IMPORT from another file of the same uid: offset, lengths, owner pid");
	close(fd2);
}

static void peer_values(struct ctx *c)
{
	struct kcoll_ioc_peer_report p = { .size = sizeof(p), .peer = KCOLL_MAX_PEERS };
	int ret;

	ret = xioctl(c->fd, KCOLL_IOC_PEER_REPORT, &p);
	vm_ok(ret == -EINVAL, "PEER_REPORT peer %d -> -EINVAL (got %d)", KCOLL_MAX_PEERS, ret);
	p.peer = 1;
	p.state = KCOLL_PEER_STATE_MAX;
	ret = xioctl(c->fd, KCOLL_IOC_PEER_REPORT, &p);
	vm_ok(ret == -EINVAL, "PEER_REPORT state %d -> -EINVAL (got %d)", KCOLL_PEER_STATE_MAX, ret);
	p.peer = 7;
	p.state = KCOLL_PEER_UNKNOWN;
	ret = xioctl(c->fd, KCOLL_IOC_PEER_REPORT, &p);
	vm_ok(ret == 0, "PEER_REPORT state unknown forgets the peer (got %d)", ret);
}

int main(void)
{
	struct ctx c;
	size_t i;

	ksft_print_header();
	c.fd = dev_open();
	c.fresh_fd = dev_open();
	c.mem = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c.mem == MAP_FAILED || ring_create(c.fd, 8, 0) || reg(c.fd, (uintptr_t)c.mem, 4 * PAGE,
								  &c.handle))
		ksft_exit_fail_msg("setup: %s\n", strerror(errno));
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		contract(&c, &cases[i]);
	query_short(&c);
	unknown_ioctls(&c);
	ring_values(&c);
	doorbell_values(&c);
	buf_values(&c);
	peer_values(&c);
	close(c.fd);
	close(c.fresh_fd);
	return vm_done();
}

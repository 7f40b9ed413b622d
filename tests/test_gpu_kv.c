// SPDX-License-Identifier: MIT
/*
 * KV segments in device memory (docs/kv.md "Device memory"): a cudaMalloc
 * range registered with kcoll_seg_register is reached by kcolld through the
 * allocation's CUDA IPC mapping. Blocks between two device segments on one
 * host move with the driver's device-to-device copy; blocks to or from host
 * memory, on this host or another kcolld's (TCP), through pinned staging.
 *
 * One owner with a 2 MiB device segment on kcolld A; two initiators, one on
 * A (same host) and one on kcolld B (another "host", TCP on loopback), each
 * with a host and a device segment of its own: each writes host -> device
 * and device -> device (with a notify) into its own half of the owner's
 * first MiB, then reads device -> host and device -> device from the
 * second MiB (written by nobody) and reads one of its blocks back. Then:
 * the owner's memory byte for byte, both kcollds' count of bytes copied
 * to or from GPU memory (exact: process_vm on the fake's memory, which is
 * host memory underneath, would move the same bytes uncounted), the raw
 * SEG_REG refusals, and a kcolld without a GPU refusing a device segment.
 *
 * Two runs, as test_gpu_ring.c: the real driver when this machine has a
 * usable GPU (else every check SKIPs), then the fake driver
 * (tests/fixtures/libcuda-fake.so as libcuda.so.1 and the kernels library)
 * in a re-execution of this program. CUDA is initialised only in forked
 * children.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcoll/kcoll.h>
#include <kcoll/tap.h>

#include "kcoll_gpu.h"
#include "rawclient.h"
#include "gpu_kcolld.h"
#include "test_util.h"

#define SEG		(2u << 20)	/* the owner's device segment */
#define ISEG		(1u << 20)	/* each initiator's host and device segments */
#define HALF		(512u << 10)	/* initiator i writes into [i * HALF, (i + 1) * HALF) */
#define RUN_CHECKS	14

/* Remote offsets are relative to initiator i's base i * HALF; the reads'
 * ranges from 1 MiB up lie where nobody writes. */
static const struct kcoll_xfer_entry w_host[] = {	/* host -> owner's device */
	{ 0, 4096, 1000 }, { 65536, 131072, 70000 }, { 300000, 400000, 4097 },
};
static const struct kcoll_xfer_entry w_dev[] = {	/* device -> owner's device */
	{ 20007, 9000, 5000 }, { 400000, 450000, 66000 },
};
static const struct kcoll_xfer_entry r_host[] = {	/* owner's device -> host */
	{ 100000, (1u << 20) + 20000, 30000 }, { 500000, 4096, 1000 },	/* the 2nd: read back */
};
static const struct kcoll_xfer_entry r_dev[] = {	/* owner's device -> device */
	{ 800000, (1u << 20) + 200000, 100000 },
};
#define N(a)	(sizeof(a) / sizeof((a)[0]))

enum { ST_WHOST, ST_WDEV, ST_RHOST, ST_RDEV, ST_N };
static const char *st_names[ST_N] = { "host -> device write", "device -> device write",
				      "device -> host read", "device -> device read" };

struct board {
	kcoll_seg_desc_t desc;
	int owner_rc, owner_ready, inits_done;
	int inits_registered, counted;	/* the parent reads the segment counts between */
	int owner_bad, owner_notify;	/* differing bytes; the counter's wait */
	int init_rc[2][ST_N];		/* 0, -errno, or 1: wrong bytes */
	int init_setup[2];
	int nogpu_rc, nogpu_text, nogpu_host_rc;
	int dereg_rc[3];		/* deregister, the write after it, the bytes (0 same) */
};

static struct board *bd;
static char exe_dir[PATH_MAX], dir[PATH_MAX];
static const char *run_name;

TEST_CUDA_SAN_DEFAULTS

/* Byte i of the pattern numbered seed (test_util.h's hash). */
static void pattern(uint8_t *p, size_t n, unsigned int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)mix(((uint64_t)seed << 32) + i);
}

static void *dalloc_fill(size_t n, unsigned int seed)
{
	uint8_t *h = malloc(n);
	void *d = h ? gpu_dalloc(n) : NULL;

	if (d)
		pattern(h, n, seed);
	if (d && K->copy(d, h, n)) {
		K->mem_free(d);
		d = NULL;
	}
	free(h);
	return d;
}

static int connect_to(const char *sock, struct kcoll **k)
{
	struct kcoll_connect_opts o = { .size = sizeof(o), .socket_path = sock };

	return kcoll_connect(&o, k);
}

static int wait_flag(const int *flag, int want, int seconds)
{
	for (int i = 0; i < seconds * 100; i++) {
		if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) >= want)
			return 0;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

/* One batch, shifted by base at the remote side; the request's result. */
static int batch(bool write, struct kcoll_seg *l, struct kcoll_rseg *r,
		 const struct kcoll_xfer_entry *e, size_t n, uint64_t base, uint32_t notify)
{
	struct kcoll_xfer_entry s[4];
	struct kcoll_req *req;
	int rc;

	for (size_t i = 0; i < n; i++)
		s[i] = (struct kcoll_xfer_entry){ e[i].local_off, base + e[i].remote_off, e[i].len };
	rc = write ? kcoll_xfer_write(l, r, s, n, notify, &req) :
		     kcoll_xfer_read(l, r, s, n, notify, &req);
	return rc ? rc : kcoll_wait(req, 60000);
}

/* What the owner's segment holds once both initiators are done. */
static void owner_expect(uint8_t *want)
{
	uint8_t *src = malloc(ISEG);

	pattern(want, SEG, 1);
	for (int i = 0; i < 2 && src; i++) {
		pattern(src, ISEG, 10 + i);
		for (size_t j = 0; j < N(w_host); j++)
			memcpy(want + i * HALF + w_host[j].remote_off, src + w_host[j].local_off,
			       w_host[j].len);
		pattern(src, ISEG, 20 + i);
		for (size_t j = 0; j < N(w_dev); j++)
			memcpy(want + i * HALF + w_dev[j].remote_off, src + w_dev[j].local_off,
			       w_dev[j].len);
	}
	free(src);
}

static int owner_main(const char *sock)
{
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
	uint8_t *want = malloc(SEG), *got = malloc(SEG);
	struct kcoll_seg *seg;
	struct kcoll *k;
	void *d;

	bd->owner_rc = -ENODEV;
	if (!want || !got || gpu_dev_init(NULL, 0) || !(d = dalloc_fill(SEG, 1)) || connect_to(sock, &k))
		goto out;
	bd->owner_rc = kcoll_seg_register(k, d, SEG, &o, &seg);
	if (bd->owner_rc)
		goto out;
	kcoll_seg_export(seg, &bd->desc);
	__atomic_store_n(&bd->owner_ready, 1, __ATOMIC_RELEASE);
	wait_flag(&bd->inits_done, 2, 180);
	bd->owner_notify = kcoll_seg_notify_wait(seg, 0, 2, 10000);
	owner_expect(want);
	bd->owner_bad = K->copy(got, d, SEG) ? -EIO : 0;
	for (size_t i = 0; !bd->owner_bad && i < SEG; i++)
		bd->owner_bad += got[i] != want[i];
	for (size_t i = 0; bd->owner_bad > 0 && i < SEG; i++)
		if (got[i] != want[i]) {
			tap_diag("%s: owner: first wrong byte at %zu", run_name, i);
			break;
		}
	kcoll_seg_unregister(seg);
	kcoll_disconnect(k);
out:
	__atomic_store_n(&bd->owner_ready, 1, __ATOMIC_RELEASE);
	free(want);
	free(got);
	return 0;
}

/* Do the n entries' local ranges of mine hold the owner's bytes at base? */
static int reads_right(const uint8_t *mine, const struct kcoll_xfer_entry *e, size_t n,
		       uint64_t base, const uint8_t *owner)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(mine + e[i].local_off, owner + base + e[i].remote_off, e[i].len))
			return 1;
	return 0;
}

static int initiator_main(int i, const char *sock)
{
	struct kcoll_seg *hs, *ds;
	struct kcoll_rseg *rs;
	uint8_t *h = malloc(ISEG), *back = malloc(ISEG), *owner = malloc(SEG);
	uint64_t base = (uint64_t)i * HALF;
	struct kcoll *k;
	int *rc = bd->init_rc[i];
	void *d;

	for (int s = 0; s < ST_N; s++)
		rc[s] = -ENODEV;
	if (!h || !back || !owner || gpu_dev_init(NULL, 0) || !(d = dalloc_fill(ISEG, 20 + i)) ||
	    connect_to(sock, &k)) {
		bd->init_setup[i] = -ENODEV;
		__atomic_fetch_add(&bd->inits_registered, 1, __ATOMIC_RELEASE);
		goto out;
	}
	pattern(h, ISEG, 10 + i);
	bd->init_setup[i] = kcoll_seg_register(k, h, ISEG, NULL, &hs);
	if (!bd->init_setup[i])
		bd->init_setup[i] = kcoll_seg_register(k, d, ISEG, NULL, &ds);
	if (!bd->init_setup[i] && (wait_flag(&bd->owner_ready, 1, 120) || bd->owner_rc))
		bd->init_setup[i] = -ESRCH;
	if (!bd->init_setup[i])
		bd->init_setup[i] = kcoll_seg_import(k, &bd->desc, &rs);
	__atomic_fetch_add(&bd->inits_registered, 1, __ATOMIC_RELEASE);
	wait_flag(&bd->counted, 1, 60);
	if (bd->init_setup[i])
		goto out;
	rc[ST_WHOST] = batch(true, hs, rs, w_host, N(w_host), base, KCOLL_NOTIFY_NONE);
	rc[ST_WDEV] = batch(true, ds, rs, w_dev, N(w_dev), base, 0);
	/* The owner's segment as this initiator now sees it: its pattern,
	 * this initiator's writes over it (the other writes elsewhere). */
	pattern(owner, SEG, 1);
	pattern(back, ISEG, 20 + i);
	for (size_t j = 0; j < N(w_host); j++)
		memcpy(owner + base + w_host[j].remote_off, h + w_host[j].local_off, w_host[j].len);
	for (size_t j = 0; j < N(w_dev); j++)
		memcpy(owner + base + w_dev[j].remote_off, back + w_dev[j].local_off, w_dev[j].len);
	rc[ST_RHOST] = batch(false, hs, rs, r_host, N(r_host), base, KCOLL_NOTIFY_NONE);
	if (!rc[ST_RHOST])
		rc[ST_RHOST] = reads_right(h, r_host, N(r_host), base, owner);
	rc[ST_RDEV] = batch(false, ds, rs, r_dev, N(r_dev), base, KCOLL_NOTIFY_NONE);
	if (!rc[ST_RDEV])
		rc[ST_RDEV] = K->copy(back, d, ISEG) ? -EIO :
			      reads_right(back, r_dev, N(r_dev), base, owner);
	kcoll_rseg_close(rs);
	kcoll_seg_unregister(ds);
	kcoll_seg_unregister(hs);
	kcoll_disconnect(k);
out:
	__atomic_fetch_add(&bd->inits_done, 1, __ATOMIC_RELEASE);
	free(h);
	free(back);
	free(owner);
	return 0;
}

/* A raw SEG_REG: the reply's status; its error text in why. */
static int raw_seg_reg(struct kcoll_raw *rc, const void *addr, size_t size, uint32_t flags,
		       char *why, size_t len)
{
	struct kcoll_msg_seg_reg m = { .hdr.type = KCOLL_MSG_SEG_REG };
	struct kcoll_msg_seg_reg_reply rep;
	int fd = -1, r;

	m.addr = (uintptr_t)addr;
	m.size = size;
	m.flags = flags;
	r = kcoll_raw_call(rc, &m, sizeof(m), &rep, sizeof(rep), &fd, 10000);
	if (fd >= 0)
		close(fd);
	snprintf(why, len, "%.*s", (int)sizeof(rep.error), rep.error);
	return r;
}

enum { RAW_HOST, RAW_UNREG, RAW_FLAGS, RAW_N };
static const char *raw_names[RAW_N] = {
	"raw SEG_REG of host memory flagged as device memory: -EFAULT, saying why",
	"raw SEG_REG of a device allocation never registered with kcolld: -EFAULT",
	"raw SEG_REG with an unknown flag: -EINVAL",
};

/* In a child: exit status = bitmask of failed raw checks. */
static int raw_main(const char *sock)
{
	struct kcoll_raw rc;
	char why[160];
	int fails = 0;
	void *h = malloc(65536), *d;

	if (!h || gpu_dev_init(NULL, 0) || !(d = dalloc_fill(65536, 5)) || kcoll_raw_open(&rc, sock, 64))
		return 0x7f;
	if (raw_seg_reg(&rc, h, 65536, KCOLL_MSG_SEG_F_DEVICE, why, sizeof(why)) != -EFAULT ||
	    !strstr(why, "registered with this kcolld"))
		fails |= 1 << RAW_HOST;
	if (raw_seg_reg(&rc, d, 65536, KCOLL_MSG_SEG_F_DEVICE, why, sizeof(why)) != -EFAULT)
		fails |= 1 << RAW_UNREG;
	if (raw_seg_reg(&rc, h, 65536, 1u << 2, why, sizeof(why)) != -EINVAL)
		fails |= 1 << RAW_FLAGS;
	kcoll_raw_close(&rc);
	return fails;
}

/*
 * In a child: a device segment whose allocation the process then
 * deregisters (kcoll_mem_deregister): kcolld closes its mapping, so a write
 * into the segment fails with -EFAULT and leaves the memory as it was.
 */
static int dereg_main(const char *sock)
{
	struct kcoll_xfer_entry e = { 0, 4096, 8192 };
	uint8_t *h = malloc(65536), *want = malloc(65536), *got = malloc(65536);
	struct kcoll_seg *ds, *hs;
	kcoll_seg_desc_t desc;
	struct kcoll_rseg *rs;
	struct kcoll_req *req;
	struct kcoll *k;
	void *d;

	bd->dereg_rc[0] = bd->dereg_rc[1] = bd->dereg_rc[2] = -ENODEV;
	if (!h || !want || !got || gpu_dev_init(NULL, 0) || !(d = dalloc_fill(65536, 7)) ||
	    connect_to(sock, &k) || kcoll_seg_register(k, d, 65536, NULL, &ds) ||
	    kcoll_seg_register(k, h, 65536, NULL, &hs) || kcoll_seg_export(ds, &desc) ||
	    kcoll_seg_import(k, &desc, &rs))
		return 0;
	memset(h, 0xee, 65536);
	pattern(want, 65536, 7);
	bd->dereg_rc[0] = kcoll_mem_deregister(k, d);
	bd->dereg_rc[1] = kcoll_xfer_write(hs, rs, &e, 1, KCOLL_NOTIFY_NONE, &req);
	if (!bd->dereg_rc[1])
		bd->dereg_rc[1] = kcoll_wait(req, 30000);
	bd->dereg_rc[2] = K->copy(got, d, 65536) ? -EIO : memcmp(got, want, 65536) != 0;
	kcoll_rseg_close(rs);
	kcoll_disconnect(k);
	return 0;
}

static int nogpu_main(const char *sock)
{
	struct kcoll_seg *s;
	struct kcoll *k;
	void *d, *h = malloc(4096);

	bd->nogpu_rc = bd->nogpu_host_rc = -ENODEV;
	if (!h || gpu_dev_init(NULL, 0) || !(d = dalloc_fill(65536, 6)) || connect_to(sock, &k))
		return 0;
	bd->nogpu_rc = kcoll_seg_register(k, d, 65536, NULL, &s);
	bd->nogpu_text = !!strstr(kcoll_strerror(bd->nogpu_rc), "device KV segments");
	bd->nogpu_host_rc = kcoll_seg_register(k, h, 4096, NULL, &s);
	if (!bd->nogpu_host_rc)
		kcoll_seg_unregister(s);
	kcoll_disconnect(k);
	return 0;
}

/* A number of kcolld's status JSON ("dev_bytes", "dev_segments"), or -1. */
static long long status_num(const char *sock, const char *key)
{
	struct kcoll_raw rc;
	char *buf = malloc(KCOLL_MSG_BYTES), *p, want[64];
	long long v = -1;

	snprintf(want, sizeof(want), "\"%s\":", key);
	if (buf && !kcoll_raw_open(&rc, sock, 8)) {
		if (!kcoll_raw_status(&rc, 1, buf, KCOLL_MSG_BYTES) && (p = strstr(buf, want)))
			v = strtoll(p + strlen(want), NULL, 10);
		kcoll_raw_close(&rc);
	}
	free(buf);
	return v;
}

static long long sum(const struct kcoll_xfer_entry *e, size_t n)
{
	long long s = 0;

	for (size_t i = 0; i < n; i++)
		s += (long long)e[i].len;
	return s;
}

static void run_all(void)
{
	char sk[3][PATH_MAX + 16], lg[3][PATH_MAX + 16];
	long long all = sum(w_host, N(w_host)) + sum(w_dev, N(w_dev)) + sum(r_host, N(r_host)) +
			sum(r_dev, N(r_dev));
	long long a, b;
	pid_t kd[3], owner, init[2], raw, nogpu;
	int st;

	for (int h = 0; h < 3; h++) {
		struct gpu_kcolld o = { exe_dir, dir, h < 2, 1, NULL, NULL };

		snprintf(sk[h], sizeof(sk[h]), "%s/%s-kv%d.sock", dir, run_name, h);
		snprintf(lg[h], sizeof(lg[h]), "%s/%s-kv%d.log", dir, run_name, h);
		kd[h] = gpu_kcolld_start(&o, sk[h], lg[h]);
	}
	memset(bd, 0, sizeof(*bd));
	tap_ok(kd[0] > 0 && kd[1] > 0 && kd[2] > 0, "%s: kcolld A and B with the GPU, C without, "
	       "on loopback", run_name);
	if (kd[0] <= 0 || kd[1] <= 0 || kd[2] <= 0) {
		for (int i = 1; i < RUN_CHECKS; i++)
			tap_skip("%s: a kcolld did not start", run_name);
		for (int h = 0; h < 3; h++)
			if (kd[h] > 0)
				kcolld_stop(kd[h]);
		return;
	}
	owner = fork();
	if (owner == 0)
		_exit(owner_main(sk[0]));
	for (int i = 0; i < 2; i++) {
		init[i] = fork();
		if (init[i] == 0)
			_exit(initiator_main(i, sk[i]));
	}
	/* With every segment registered: A holds the owner's and initiator
	 * 0's device segments, B initiator 1's (host segments not counted). */
	wait_flag(&bd->inits_registered, 2, 120);
	a = status_num(sk[0], "dev_segments");
	b = status_num(sk[1], "dev_segments");
	__atomic_store_n(&bd->counted, 1, __ATOMIC_RELEASE);
	tap_ok(a == 2 && b == 1, "%s: kcollctl status counts the device segments: A %lld (2 wanted), "
	       "B %lld (1 wanted)", run_name, a, b);
	for (int i = 0; i < 2; i++)
		wait_child(init[i]);
	wait_child(owner);
	tap_ok(!bd->owner_rc && !bd->init_setup[0] && !bd->init_setup[1],
	       "%s: device segments register (owner %d, initiators %d %d)", run_name, bd->owner_rc,
	       bd->init_setup[0], bd->init_setup[1]);
	for (int i = 0; i < 2; i++) {
		char what[160] = "";

		for (int s = 0; s < ST_N; s++)
			if (bd->init_rc[i][s])
				snprintf(what + strlen(what), sizeof(what) - strlen(what), " %s: %d",
					 st_names[s], bd->init_rc[i][s]);
		tap_ok(!bd->init_setup[i] && !what[0], "%s: %s: host -> device and device -> device "
		       "writes, device -> host and device -> device reads, the bytes right%s",
		       run_name, i ? "from another kcolld (TCP)" : "on the owner's kcolld", what);
	}
	tap_ok(!bd->owner_bad && !bd->owner_notify, "%s: the owner's device memory holds every "
	       "written block and nothing else changed (%d bytes differ); notify counter 2 (%d)",
	       run_name, bd->owner_bad, bd->owner_notify);
	a = status_num(sk[0], "dev_bytes");
	b = status_num(sk[1], "dev_bytes");
	tap_ok(a == 2 * all, "%s: kcolld A copied %lld bytes to or from GPU memory (%lld wanted: "
	       "both initiators' blocks, each once)", run_name, a, 2 * all);
	tap_ok(b == sum(w_dev, N(w_dev)) + sum(r_dev, N(r_dev)), "%s: kcolld B copied %lld bytes "
	       "to or from GPU memory (%lld wanted: its initiator's device blocks)", run_name, b,
	       sum(w_dev, N(w_dev)) + sum(r_dev, N(r_dev)));

	raw = fork();
	if (raw == 0)
		_exit(raw_main(sk[0]));
	st = wait_child(raw);
	for (int i = 0; i < RAW_N; i++)
		tap_ok(st >= 0 && st != 0x7f && !(st & (1 << i)), "%s: %s (child %d)", run_name,
		       raw_names[i], st);

	raw = fork();
	if (raw == 0)
		_exit(dereg_main(sk[0]));
	wait_child(raw);
	tap_ok(!bd->dereg_rc[0] && bd->dereg_rc[1] == -EFAULT && !bd->dereg_rc[2],
	       "%s: the allocation under a device segment deregistered: a write into it fails "
	       "-EFAULT, the memory unchanged (%d %d %d)", run_name, bd->dereg_rc[0],
	       bd->dereg_rc[1], bd->dereg_rc[2]);

	nogpu = fork();
	if (nogpu == 0)
		_exit(nogpu_main(sk[2]));
	wait_child(nogpu);
	tap_ok(bd->nogpu_rc == -EOPNOTSUPP && bd->nogpu_text && !bd->nogpu_host_rc,
	       "%s: kcolld without a GPU: a device segment gets -EOPNOTSUPP naming device KV "
	       "segments, a host segment registers (%d %d)", run_name, bd->nogpu_rc,
	       bd->nogpu_host_rc);
	st = kcolld_stop(kd[0]) | kcolld_stop(kd[1]) | kcolld_stop(kd[2]);
	tap_ok(st == 0, "%s: the three kcollds exited 0 on SIGTERM", run_name);
}

int main(int argc, char **argv)
{
	struct gpu_test t = { "TEST_GPU_KV", "gpu-kv", RUN_CHECKS, run_all, exe_dir, dir,
			      &run_name };

	bd = mmap(NULL, sizeof(*bd), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (bd == MAP_FAILED)
		return 1;
	return gpu_test_main(&t, argv);
}

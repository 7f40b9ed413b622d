// SPDX-License-Identifier: MIT
/*
 * /sys/kernel/kcoll: defaults, every tunable's validation one bad value at a
 * time (the value must not change), root-only writes, read-only state, and
 * the peers table fed by KCOLL_IOC_PEER_REPORT. Restores the defaults.
 */
#include "util.h"

struct knob {
	const char *name;
	const char *def;
	const char *good[3];
	const char *bad[6];
};

static const struct knob knobs[] = {
	{ "algo", "auto", { "ring", "direct\n", "auto" },
	  { "fast", "ring direct", "AUTO", "auto2", "-", NULL } },
	{ "chunk_bytes", "524288", { "4096", "0x4000000", "1048576\n" },
	  { "0", "2048", "134217728", "65537", "12288", "abc" } },
	{ "timeout_ms", "30000", { "1", "3600000", "250\n" },
	  { "0", "3600001", "-5", "1.5", "99999999999", "10 ms" } },
	{ "slow_ratio_pct", "200", { "101", "10000", "150" },
	  { "100", "0", "10001", "x", "+", NULL } },
	{ "hang_ms", "5000", { "1", "3600000", "2000" },
	  { "0", "3600001", "4294967296", "-1", " ", NULL } },
	{ "straggler_ms", "20", { "1", "3600000", "50" },
	  { "0", "3600001", "4294967296", "-3", "2 ms", NULL } },
};

static void read_str(const char *name, char *out, size_t n)
{
	char path[256];
	FILE *f;

	out[0] = '\0';
	snprintf(path, sizeof(path), SYSFS_DIR "%s", name);
	f = fopen(path, "r");
	if (!f)
		return;
	if (!fgets(out, (int)n, f))
		out[0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	fclose(f);
}

/* The value a good write should read back as. */
static void canonical(const char *in, char *out, size_t n)
{
	char *end;
	unsigned long v = strtoul(in, &end, 0);

	if (end != in && (*end == '\0' || *end == '\n'))
		snprintf(out, n, "%lu", v);
	else
		snprintf(out, n, "%.*s", (int)strcspn(in, "\n"), in);
}

static void knob_tests(const struct knob *k)
{
	char now[64], want[64], before[64];
	int i, ret;

	read_str(k->name, now, sizeof(now));
	vm_ok(!strcmp(now, k->def), "%s defaults to %s (reads %s)", k->name, k->def, now);
	for (i = 0; i < 3; i++) {
		ret = sysfs_write(k->name, k->good[i]);
		read_str(k->name, now, sizeof(now));
		canonical(k->good[i], want, sizeof(want));
		vm_ok(ret == 0 && !strcmp(now, want), "%s: write '%s' -> reads %s (%d)", k->name,
		      want, now, ret);
	}
	for (i = 0; i < 6 && k->bad[i]; i++) {
		read_str(k->name, before, sizeof(before));
		ret = sysfs_write(k->name, k->bad[i]);
		read_str(k->name, now, sizeof(now));
		vm_ok(ret < 0 && !strcmp(now, before), "%s: write '%s' refused (%d), stays %s",
		      k->name, k->bad[i], ret, now);
	}
	sysfs_write(k->name, k->def);
}

static int nobody_write(const char *name)
{
	pid_t pid = fork();

	if (pid == 0) {
		if (drop_to_nobody())
			_exit(100);
		_exit(sysfs_write(name, "1") == -EACCES ? 0 : 1);
	}
	return reap(pid);
}

static void access_tests(void)
{
	static const char * const ro[] = { "rings", "registered_bytes", "pinned_pages", "features",
					   "peers" };
	size_t i;
	int ret;

	for (i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
		vm_ok(nobody_write(knobs[i].name) == 0, "%s: uid 65534 cannot write it (EACCES)",
		      knobs[i].name);
	for (i = 0; i < sizeof(ro) / sizeof(ro[0]); i++) {
		ret = sysfs_write(ro[i], "0");
		vm_ok(ret == -EACCES, "%s is read-only, even for root (%d)", ro[i], ret);
	}
	vm_ok(sysfs_read("features") == 0x3f, "features reads 0x3f");
}

static int report(int fd, uint32_t peer, uint32_t state, uint32_t lat, uint32_t bw)
{
	struct kcoll_ioc_peer_report p = {
		.size = sizeof(p), .peer = peer, .state = state, .latency_us = lat, .bw_mbps = bw,
	};

	return xioctl(fd, KCOLL_IOC_PEER_REPORT, &p);
}

/* Does the peers file have a line starting "<peer> <state> <lat> <bw> "? */
static int peers_has(const char *prefix)
{
	char line[256];
	int found = 0;
	FILE *f = fopen(SYSFS_DIR "peers", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, prefix, strlen(prefix)))
			found = 1;
	fclose(f);
	return found;
}

static int peers_lines(void)
{
	char line[256];
	int n = 0;
	FILE *f = fopen(SYSFS_DIR "peers", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (line[0] != '#')
			n++;
	fclose(f);
	return n;
}

static void peer_tests(void)
{
	int fd = dev_open(), i, ret = 0;

	vm_ok(peers_lines() == 0, "peers starts empty (header only)");
	ret |= report(fd, 3, KCOLL_PEER_SLOW, 120, 500);
	ret |= report(fd, 0, KCOLL_PEER_OK, 15, 9000);
	ret |= report(fd, 63, KCOLL_PEER_DOWN, 0, 0);
	vm_ok(ret == 0 && peers_has("3 slow 120 500 ") && peers_has("0 ok 15 9000 ") &&
	      peers_has("63 down 0 0 ") && peers_lines() == 3,
	      "three reports show as three lines in peers");
	report(fd, 3, KCOLL_PEER_HUNG, 0, 0);
	vm_ok(peers_has("3 hung 0 0 ") && !peers_has("3 slow"), "a new report replaces the old one");
	for (i = 0; i < KCOLL_MAX_PEERS; i++)
		ret |= report(fd, (uint32_t)i, KCOLL_PEER_SLOW, 4294967295U, 4294967295U);
	vm_ok(ret == 0 && peers_lines() == KCOLL_MAX_PEERS,
	      "all %d peers at the widest values fit in the file", KCOLL_MAX_PEERS);
	for (i = 0; i < KCOLL_MAX_PEERS; i++)
		report(fd, (uint32_t)i, KCOLL_PEER_UNKNOWN, 0, 0);
	vm_ok(peers_lines() == 0, "state unknown forgets each peer");
	close(fd);
}

int main(void)
{
	size_t i;

	ksft_print_header();
	for (i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
		knob_tests(&knobs[i]);
	access_tests();
	peer_tests();
	return vm_done();
}

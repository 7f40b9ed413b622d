// SPDX-License-Identifier: MIT
/* kcollctl: look at and steer a running kcolld. */
#include <errno.h>
#include <unistd.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "config.h"
#include "kcoll_gpu.h"
#include "kcollctl.h"
#include "reduce.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kcollctl [-s SOCKET] COMMAND [--json]\n"
		"Look at and steer a running kcolld.\n\n"
		"Commands:\n"
		"  status     clients, communicators, operations in flight, counters\n"
		"  config     every KCOLL_* knob with its value, default and meaning\n"
		"  metrics    kcolld's Prometheus metrics (the text KCOLL_METRICS serves over HTTP;\n"
		"             docs/metrics.md lists them)\n"
		"  set KEY VALUE\n"
		"             change a running kcolld: algo (auto, ring, rd, rabenseifner, direct: multi-host\n"
		"             all-reduce), streams (TCP streams per peer, 1..8), lane_bytes (all-reduces\n"
		"             up to this size run in the ranks when every host has one; 0: off),\n"
		"             chunk_bytes, timeout_ms. Other keys go to kcoll.ko's /sys/kernel/kcoll/KEY\n"
		"             (slow_ratio_pct, hang_ms, ...; docs/sysfs.md)\n"
		"  anomalies [--local]\n"
		"             C4 detector: anomalies active now in each multi-host communicator\n"
		"             (hangs, slow links, stragglers) as every host of it judges them, each\n"
		"             with the hosts that saw it, and the evidence: link rates, ranks;\n"
		"             --local: only this host's own verdicts\n"
		"  events [--follow] [--since ID] [--local]\n"
		"             C4 events (raised and cleared) of every host of each communicator, as\n"
		"             this kcolld logged them; --follow keeps printing new ones until\n"
		"             interrupted; --local: only this host's own\n"
		"  plan       C4 planner: the local link each data stream to each peer uses, the\n"
		"             one the plan wants, and why\n"
		"  top [-d SECONDS] [-n COUNT]\n"
		"             live view: operations and MB/s by collective, mean latency, communicators,\n"
		"             per-link rates and the anomalies active now, refreshed every SECONDS\n"
		"             (default 1) COUNT times (default: until Ctrl-C); --json: one object a refresh\n"
		"  gpu        GPU doctor: driver, devices, dma-buf / peer memory, the path kcoll\n"
		"             takes and, if not the fastest, why and how to fix it\n"
		"  version    versions of kcollctl, libkcoll and the ring ABI\n\n"
		"Options:\n"
		"  -s, --socket PATH  kcolld's socket (default $KCOLL_SOCKET or %s)\n"
		"  --json             machine-readable output\n"
		"  -h, --help         this help\n",
		KCOLL_DEFAULT_SOCKET);
}

static int ctl_request(const char *path, void *req, size_t len, void *rep, size_t cap, bool quiet);

/* 0 done, 1 failed (said why), -1 the daemon does not own KEY or is not there. */
static int set_daemon(const char *path, const char *key, const char *value)
{
	struct kcoll_msg_set req = { .hdr = { .magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_SET,
					      .len = sizeof(req), .seq = 1 } };
	struct kcoll_msg_set_reply rep = { 0 };
	int r;

	if (strlen(key) >= sizeof(req.key) || strlen(value) >= sizeof(req.value)) {
		fprintf(stderr, "kcollctl: key or value too long\n");
		return 1;
	}
	strcpy(req.key, key);
	strcpy(req.value, value);
	r = ctl_request(path, &req, sizeof(req), &rep, sizeof(rep), true);
	if (r < 0)
		return -1;
	if (rep.hdr.status == -ENOENT)
		return -1;
	if (rep.hdr.status) {
		fprintf(stderr, "kcollctl: kcolld refused %s=%s: %.*s\n", key, value,
			(int)sizeof(rep.error), rep.error);
		return 1;
	}
	return 0;
}

static int set_sysfs(const char *key, const char *value)
{
	char path[128];
	FILE *f;
	int r = 0;

	if (strchr(key, '/') || strchr(key, '.')) {
		fprintf(stderr, "kcollctl: '%s' is not a tunable name\n", key);
		return 2;
	}
	if (access("/sys/kernel/kcoll", F_OK)) {
		fprintf(stderr, "kcollctl: kcoll.ko is not loaded, so there is no /sys/kernel/kcoll to set.\n"
			"kcollctl: load it (insmod kcoll.ko), or set KCOLL_CHUNK_BYTES / KCOLL_TIMEOUT_MS\n"
			"kcollctl: in kcolld's environment and restart it\n");
		return 1;
	}
	snprintf(path, sizeof(path), "/sys/kernel/kcoll/%s", key);
	if (access(path, F_OK)) {
		fprintf(stderr, "kcollctl: no such tunable '%s' (see docs/sysfs.md)\n", key);
		return 2;
	}
	f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "kcollctl: cannot open %s: %s%s\n", path, strerror(errno),
			errno == ENOENT ? " (no such tunable: see docs/sysfs.md)" :
			errno == EACCES ? " (tunables are root's)" : "");
		return 1;
	}
	if (fprintf(f, "%s\n", value) < 0)
		r = errno;
	if (fclose(f) && !r)
		r = errno;
	if (r) {
		fprintf(stderr, "kcollctl: %s refused '%s': %s%s\n", path, value, strerror(r),
			r == EINVAL || r == ERANGE ? " (out of range: see docs/sysfs.md)" : "");
		return 1;
	}
	return 0;
}

static int set(const char *path, const char *key, const char *value)
{
	int r = set_daemon(path, key, value);

	if (r >= 0)
		return r;
	if (!strcmp(key, "algo") || !strcmp(key, "streams") || !strcmp(key, "lane_bytes")) {
		fprintf(stderr, "kcollctl: cannot reach kcolld at %s to set %s (is it running? pass -s)\n",
			path, key);
		return 1;
	}
	return set_sysfs(key, value);
}

/* One request, one reply (at most cap bytes). Returns the reply length or -1. */
static int ctl_request(const char *path, void *req, size_t len, void *rep, size_t cap, bool quiet)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct pollfd p;
	ssize_t n;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "kcollctl: socket path too long\n");
		return -1;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		if (!quiet)
			fprintf(stderr, "kcollctl: cannot reach kcolld at %s: %s\n"
				"kcollctl: is it running? start it with 'kcolld' (or pass -s / set KCOLL_SOCKET)\n",
				path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	r = kcoll_msg_send(fd, req, len, -1);
	p.fd = fd;
	p.events = POLLIN;
	if (r || poll(&p, 1, 5000) != 1) {
		fprintf(stderr, "kcollctl: kcolld did not answer within 5 s\n");
		close(fd);
		return -1;
	}
	n = kcoll_msg_recv(fd, rep, cap, NULL);
	close(fd);
	if (n < (ssize_t)sizeof(struct kcoll_msg_hdr)) {
		fprintf(stderr, "kcollctl: bad reply from kcolld: %s\n", n < 0 ? strerror(-n) : "short");
		return -1;
	}
	return (int)n;
}

static int status(const char *path, int json)
{
	struct kcoll_msg_hdr req = {
		.magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_STATUS, .flags = json ? 1 : 0,
		.len = sizeof(req), .seq = 1,
	};
	static char buf[KCOLL_MSG_BYTES];
	int n = ctl_request(path, &req, sizeof(req), buf, sizeof(buf) - 1, false);

	if (n < 0)
		return 1;
	buf[n] = 0;
	fputs(buf + sizeof(req), stdout);
	return 0;
}

static int metrics(const char *path)
{
	static char text[KCOLL_MSG_BYTES];

	if (kcollctl_fetch(path, KCOLL_MSG_METRICS, false, 0, text, sizeof(text)))
		return 1;
	fputs(text, stdout);
	return 0;
}

int kcollctl_fetch(const char *path, uint32_t type, bool json, uint32_t what, char *out, size_t cap)
{
	struct kcoll_msg_c4 req = {
		.hdr = { .magic = KCOLL_PROTO_MAGIC, .type = type, .flags = json ? 1 : 0, .seq = 1 },
		.what = what,
	};
	static char buf[KCOLL_MSG_BYTES];
	const struct kcoll_msg_hdr *h = (const void *)buf;
	size_t len = type == KCOLL_MSG_C4 ? sizeof(req) : sizeof(req.hdr);
	int n;

	req.hdr.len = len;
	n = ctl_request(path, &req, len, buf, sizeof(buf) - 1, false);
	if (n < 0)
		return 1;
	buf[n] = 0;
	if (h->status) {
		fprintf(stderr, "kcollctl: kcolld refused a %s request: %s%s\n",
			type == KCOLL_MSG_METRICS ? "metrics" : type == KCOLL_MSG_C4 ? "C4" : "status",
			strerror(-h->status),
			h->status == -EPROTO || h->status == -EOPNOTSUPP ? " (run the same kcoll build)" : "");
		return 1;
	}
	snprintf(out, cap, "%s", buf + sizeof(*h));
	return 0;
}

/* anomalies / plan, or events from id 'since' (--follow: poll until killed). */
static int c4(const char *path, uint32_t what, int json, bool follow, uint64_t since, bool local)
{
	static char buf[KCOLL_MSG_BYTES];

	for (;;) {
		struct kcoll_msg_c4 req = {
			.hdr = { .magic = KCOLL_PROTO_MAGIC, .type = KCOLL_MSG_C4, .len = sizeof(req), .seq = 1,
				 .flags = (json ? KCOLL_C4_F_JSON : 0) | (local ? KCOLL_C4_F_LOCAL : 0) },
			.what = what, .since = since,
		};
		int n = ctl_request(path, &req, sizeof(req), buf, sizeof(buf) - 1, false);
		const struct kcoll_msg_hdr *h = (const void *)buf;
		const char *text = buf + sizeof(*h), *p;

		if (n < 0)
			return 1;
		buf[n] = 0;
		if (h->status == -EOPNOTSUPP) {
			fprintf(stderr, "kcollctl: this kcolld has no C4 detector or does not know an option "
				"asked for (--local): run the same kcoll build\n");
			return 1;
		}
		if (h->status) {
			fprintf(stderr, "kcollctl: kcolld refused: %s\n", strerror(-h->status));
			return 1;
		}
		if (!follow || !json || *text != '{' || strstr(text, "\"events\":[]") == NULL)
			fputs(text, stdout);
		if (!follow)
			return 0;
		fflush(stdout);
		/* resume after the last id printed */
		if (json) {
			p = strstr(text, "\"last\":");
			if (p)
				since = strtoull(p + 7, NULL, 10);
		} else {
			for (p = text; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
				if (*p >= '0' && *p <= '9')
					since = strtoull(p, NULL, 10);
		}
		usleep(200000);
	}
}

int main(int argc, char **argv)
{
	const char *path = kcoll_knob_str("KCOLL_SOCKET");
	const char *cmd = NULL, *args[2] = { NULL, NULL };
	int json = 0, nargs = 0;
	bool follow = false, local = false;
	uint64_t since = 0;
	double delay = 1.0;
	long count = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "-s") || !strcmp(argv[i], "--socket")) {
			if (++i == argc) {
				fprintf(stderr, "kcollctl: %s needs a path\n", argv[i - 1]);
				return 2;
			}
			path = argv[i];
		} else if (!strcmp(argv[i], "--local")) {
			local = true;
		} else if (!strcmp(argv[i], "--follow") || !strcmp(argv[i], "-f")) {
			follow = true;
		} else if (!strcmp(argv[i], "--since")) {
			char *end;

			if (++i == argc || (since = strtoull(argv[i], &end, 10), *end)) {
				fprintf(stderr, "kcollctl: --since needs an event id (a number)\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "-d") || !strcmp(argv[i], "--delay") ||
			   !strcmp(argv[i], "-n") || !strcmp(argv[i], "--count")) {
			bool d = argv[i][1] == 'd' || argv[i][2] == 'd';
			char *end;

			if (++i == argc || (d ? (delay = strtod(argv[i], &end)) : (count = strtol(argv[i], &end, 10)),
					    *end || end == argv[i])) {
				fprintf(stderr, "kcollctl: %s needs a number\n", argv[i - 1]);
				return 2;
			}
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help") || !strcmp(argv[i], "help")) {
			usage(stdout);
			return 0;
		} else if (cmd && !strcmp(cmd, "set") && nargs < 2 && argv[i][0] != '-') {
			args[nargs++] = argv[i];
		} else if (argv[i][0] == '-' || cmd) {
			fprintf(stderr, "kcollctl: unexpected argument '%s' (try kcollctl --help)\n", argv[i]);
			return 2;
		} else {
			cmd = argv[i];
		}
	}
	if (!cmd) {
		usage(stderr);
		return 2;
	}
	if (local && strcmp(cmd, "anomalies") && strcmp(cmd, "events")) {
		fprintf(stderr, "kcollctl: --local goes with 'anomalies' and 'events'\n");
		return 2;
	}
	if (!strcmp(cmd, "status"))
		return status(path, json);
	if (!strcmp(cmd, "metrics")) {
		if (json) {
			fprintf(stderr, "kcollctl: metrics are Prometheus text; there is no --json\n");
			return 2;
		}
		return metrics(path);
	}
	if ((follow || since) && strcmp(cmd, "events")) {
		fprintf(stderr, "kcollctl: --follow and --since go with 'events'\n");
		return 2;
	}
	if (!strcmp(cmd, "top"))
		return kcollctl_top(path, delay, count, json);
	if (!strcmp(cmd, "anomalies"))
		return c4(path, KCOLL_C4_ANOMALIES, json, false, 0, local);
	if (!strcmp(cmd, "events"))
		return c4(path, KCOLL_C4_EVENTS, json, follow, since, local);
	if (!strcmp(cmd, "plan"))
		return c4(path, KCOLL_C4_PLAN, json, false, 0, false);
	if (!strcmp(cmd, "config")) {
		kcoll_knobs_print(stdout, json);
		return 0;
	}
	if (!strcmp(cmd, "set")) {
		if (nargs != 2) {
			fprintf(stderr, "kcollctl: usage: kcollctl set KEY VALUE\n");
			return 2;
		}
		return set(path, args[0], args[1]);
	}
	if (!strcmp(cmd, "gpu")) {
		int r = kcoll_gpu_doctor(stdout, json);

		if (fflush(stdout))
			return 2;
		return r ? 1 : 0;	/* 1: no usable GPU (the report says why) */
	}
	if (!strcmp(cmd, "version")) {
		if (json)
			printf("{\"kcollctl\":\"%s\",\"libkcoll\":\"%s\",\"ring_abi\":%d,\"reduce_impl\":\"%s\"}\n",
			       KCOLL_VERSION, kcoll_version(), KCOLL_ABI_VERSION, kcoll_reduce_impl());
		else
			printf("kcollctl %s, libkcoll %s, ring ABI %d, reduce %s\n", KCOLL_VERSION,
			       kcoll_version(), KCOLL_ABI_VERSION, kcoll_reduce_impl());
		return 0;
	}
	fprintf(stderr, "kcollctl: unknown command '%s': status, config, metrics, set, anomalies, events, "
		"plan, top, gpu or version (try kcollctl --help)\n", cmd);
	return 2;
}

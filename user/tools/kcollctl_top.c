// SPDX-License-Identifier: MIT
/*
 * kcollctl top: a live view of one kcolld for a person at a terminal (or,
 * with --json, one JSON object a refresh for a program). Each refresh asks
 * kcolld for its metrics (the text KCOLL_METRICS serves) and its status,
 * and shows what changed since the last one as rates: operations and bytes
 * by collective, mean latency, communicators, per-link rates with the C4
 * detector's estimate, and the anomalies active now.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kcollctl.h"

#define MAX_SERIES	1024
#define MAX_COMMS	64
#define KEY_LEN		160

static const char *const ops[] = { "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier" };
#define NOPS (sizeof(ops) / sizeof(ops[0]))

struct series {
	char key[KEY_LEN];	/* name{labels}, as kcolld writes it */
	double v;
};

struct comm {
	char id[24], state[16];
	unsigned nranks, joined;
	double ops_done;
};

struct snap {
	double t;		/* CLOCK_MONOTONIC seconds */
	struct series s[MAX_SERIES];
	unsigned ns;
	struct comm c[MAX_COMMS];
	unsigned nc;
	char anomalies[2048];	/* kcollctl anomalies' text, first lines */
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = 1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Prometheus text: "name{labels} value" lines; comments skipped. */
static void parse_metrics(struct snap *sn, char *text)
{
	for (char *line = strtok(text, "\n"); line && sn->ns < MAX_SERIES; line = strtok(NULL, "\n")) {
		char *sp = strrchr(line, ' ');

		if (line[0] == '#' || !sp || (size_t)(sp - line) >= KEY_LEN)
			continue;
		memcpy(sn->s[sn->ns].key, line, sp - line);
		sn->s[sn->ns].key[sp - line] = 0;
		sn->s[sn->ns].v = strtod(sp + 1, NULL);
		sn->ns++;
	}
}

static double get(const struct snap *sn, const char *key)
{
	for (unsigned i = 0; i < sn->ns; i++)
		if (!strcmp(sn->s[i].key, key))
			return sn->s[i].v;
	return 0;
}

static double getf(const struct snap *sn, const char *fmt, const char *a, const char *b)
{
	char key[KEY_LEN];

	snprintf(key, sizeof(key), fmt, a, b);
	return get(sn, key);
}

/* The value of "name": in a flat JSON object starting at p (status --json). */
static const char *jfield(const char *p, const char *end, const char *name)
{
	char pat[40];
	const char *f;

	snprintf(pat, sizeof(pat), "\"%s\":", name);
	f = strstr(p, pat);
	return f && f < end ? f + strlen(pat) : NULL;
}

static void parse_comms(struct snap *sn, const char *json)
{
	const char *p = strstr(json, "\"communicators\":[");

	for (p = p ? p + 17 : NULL; p && *p == '{' && sn->nc < MAX_COMMS;) {
		const char *end = strchr(p, '}'), *f;
		struct comm *c = &sn->c[sn->nc];

		if (!end)
			break;
		memset(c, 0, sizeof(*c));
		if ((f = jfield(p, end, "id")))
			sscanf(f, "\"%23[^\"]\"", c->id);
		if ((f = jfield(p, end, "state")))
			sscanf(f, "\"%15[^\"]\"", c->state);
		if ((f = jfield(p, end, "nranks")))
			c->nranks = strtoul(f, NULL, 10);
		if ((f = jfield(p, end, "joined")))
			c->joined = strtoul(f, NULL, 10);
		if ((f = jfield(p, end, "ops_done")))
			c->ops_done = strtod(f, NULL);
		sn->nc++;
		p = end + 1;
		if (*p == ',')
			p++;
	}
}

static int take(const char *path, struct snap *sn)
{
	static char buf[KCOLL_MSG_BYTES];
	int r;

	sn->ns = sn->nc = 0;
	sn->t = now_s();
	r = kcollctl_fetch(path, KCOLL_MSG_METRICS, 0, 0, buf, sizeof(buf));
	if (r)
		return r;
	parse_metrics(sn, buf);
	r = kcollctl_fetch(path, KCOLL_MSG_STATUS, 1, 0, buf, sizeof(buf));
	if (r)
		return r;
	parse_comms(sn, buf);
	/* Only the head of a long report fits: the rest is kcollctl anomalies'. */
	if (kcollctl_fetch(path, KCOLL_MSG_C4, 0, KCOLL_C4_ANOMALIES, sn->anomalies, sizeof(sn->anomalies)))
		sn->anomalies[0] = 0;
	return 0;
}

static const struct comm *comm_find(const struct snap *sn, const char *id)
{
	for (unsigned i = 0; i < sn->nc; i++)
		if (!strcmp(sn->c[i].id, id))
			return &sn->c[i];
	return NULL;
}

/* One label's value out of a series key: key {peer="h1",link="eth0",...}. */
static void label(const char *key, const char *name, char *out, size_t len)
{
	char pat[32];
	const char *p;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "%s=\"", name);
	p = strstr(key, pat);
	for (p = p ? p + strlen(pat) : ""; *p && *p != '"' && n + 1 < len; p++)
		out[n++] = *p;
	out[n] = 0;
}

static void show(const struct snap *a, const struct snap *b, bool json, bool tty, double interval)
{
	double dt = b->t - a->t > 1e-3 ? b->t - a->t : 1e-3;
	const char *lk = "kcoll_link_bytes_total{";
	bool first;

	if (json) {
		printf("{\"t\":%.3f,\"interval_s\":%.3f,\"clients\":%.0f,\"ops_in_flight\":%.0f,"
		       "\"rings_killed\":%.0f,\"ops\":{", b->t, dt, get(b, "kcoll_clients"),
		       get(b, "kcoll_ops_in_flight"), get(b, "kcoll_rings_killed_total"));
	} else {
		if (tty)
			fputs("\033[H\033[2J", stdout);
		printf("kcolld: clients %.0f, ops in flight %.0f, rings killed %.0f, up %.0f s"
		       "   (every %.1f s; Ctrl-C quits)\n\n",
		       get(b, "kcoll_clients"), get(b, "kcoll_ops_in_flight"),
		       get(b, "kcoll_rings_killed_total"), get(b, "kcoll_uptime_seconds"), interval);
		printf("%-16s %10s %12s %12s %10s\n", "OPERATION", "OPS/S", "MB/S", "MEAN LAT", "FAILED/S");
	}
	first = true;
	for (unsigned i = 0; i < NOPS; i++) {
		const char *f = "kcoll_ops_total{op=\"%s\",status=\"%s\"}";
		double ok = getf(b, f, ops[i], "ok") - getf(a, f, ops[i], "ok");
		double all = 0;
		double bytes = getf(b, "kcoll_op_bytes_total{op=\"%s\"}%s", ops[i], "") -
			       getf(a, "kcoll_op_bytes_total{op=\"%s\"}%s", ops[i], "");
		double sum = getf(b, "kcoll_op_duration_seconds_sum{op=\"%s\"}%s", ops[i], "") -
			     getf(a, "kcoll_op_duration_seconds_sum{op=\"%s\"}%s", ops[i], "");
		double cnt = getf(b, "kcoll_op_duration_seconds_count{op=\"%s\"}%s", ops[i], "") -
			     getf(a, "kcoll_op_duration_seconds_count{op=\"%s\"}%s", ops[i], "");
		static const char *const st[] = { "ok", "timeout", "aborted", "invalid", "error" };

		for (unsigned s = 0; s < 5; s++)
			all += getf(b, f, ops[i], st[s]) - getf(a, f, ops[i], st[s]);
		if (json) {
			printf("%s\"%s\":{\"ops_per_s\":%.2f,\"bytes_per_s\":%.0f,\"mean_latency_s\":%.6g,"
			       "\"failed_per_s\":%.2f}", first ? "" : ",", ops[i], ok / dt, bytes / dt,
			       cnt > 0 ? sum / cnt : 0, (all - ok) / dt);
			first = false;
		} else if (all > 0) {
			printf("%-16s %10.1f %12.1f %9.3f ms %10.1f\n", ops[i], ok / dt, bytes / dt / 1e6,
			       cnt > 0 ? sum / cnt * 1e3 : 0, (all - ok) / dt);
		}
	}
	if (json)
		printf("},\"communicators\":[");
	else
		printf("\n%-18s %7s %-9s %10s\n", "COMMUNICATOR", "RANKS", "STATE", "OPS/S");
	for (unsigned i = 0; i < b->nc; i++) {
		const struct comm *c = &b->c[i], *old = comm_find(a, c->id);
		double rate = old ? (c->ops_done - old->ops_done) / dt : 0;

		if (json)
			printf("%s{\"id\":\"%s\",\"nranks\":%u,\"joined\":%u,\"state\":\"%s\",\"ops_per_s\":%.2f}",
			       i ? "," : "", c->id, c->nranks, c->joined, c->state, rate);
		else
			printf("%-18s %3u/%-3u %-9s %10.1f\n", c->id, c->joined, c->nranks, c->state, rate);
	}
	if (json)
		printf("],\"links\":[");
	else
		printf("\n%-24s %-10s %-3s %10s %14s\n", "LINK TO PEER", "OUR LINK", "DIR", "MB/S", "C4 RATE MB/S");
	first = true;
	for (unsigned i = 0; i < b->ns; i++) {
		char peer[64], link[32], dir[8], rkey[KEY_LEN];
		double d;

		if (strncmp(b->s[i].key, lk, strlen(lk)))
			continue;
		d = b->s[i].v - get(a, b->s[i].key);
		label(b->s[i].key, "peer", peer, sizeof(peer));
		label(b->s[i].key, "link", link, sizeof(link));
		label(b->s[i].key, "dir", dir, sizeof(dir));
		snprintf(rkey, sizeof(rkey), "kcoll_link_rate_bytes_per_second%s",
			 b->s[i].key + strlen(lk) - 1);
		if (json)
			printf("%s{\"peer\":\"%s\",\"link\":\"%s\",\"dir\":\"%s\",\"bytes_per_s\":%.0f,"
			       "\"c4_rate_bytes_per_s\":%.0f}", first ? "" : ",", peer, link, dir, d / dt,
			       get(b, rkey));
		else
			printf("%-24s %-10s %-3s %10.1f %14.1f\n", peer, link, dir, d / dt / 1e6,
			       get(b, rkey) / 1e6);
		first = false;
	}
	if (json) {
		printf("],\"anomalies_active\":{");
		first = true;
	} else {
		printf("\nANOMALIES ACTIVE:");
	}
	{
		const char *ak = "kcoll_c4_anomalies_active{kind=\"";
		unsigned nact = 0;

		for (unsigned i = 0; i < b->ns; i++) {
			char kind[32];

			if (strncmp(b->s[i].key, ak, strlen(ak)) || b->s[i].v <= 0)
				continue;
			label(b->s[i].key, "kind", kind, sizeof(kind));
			printf(json ? "%s\"%s\":%.0f" : "%s %s %.0f", first ? "" : ",", kind, b->s[i].v);
			first = false;
			nact++;
		}
		if (json) {
			printf("}}\n");
		} else {
			printf("%s\n", nact ? "" : " none");
			if (nact)
				fputs(b->anomalies, stdout);
		}
	}
	fflush(stdout);
}

int kcollctl_top(const char *path, double interval, long iterations, bool json)
{
	static struct snap s[2];
	bool tty = isatty(STDOUT_FILENO);
	struct sigaction sa = { .sa_handler = on_signal };
	int cur = 0, r;

	if (!(interval >= 0.1 && interval <= 3600)) {
		fprintf(stderr, "kcollctl: top: --delay must be 0.1 to 3600 seconds\n");
		return 2;
	}
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	r = take(path, &s[cur]);
	for (long n = 0; !r && !stop && (iterations <= 0 || n < iterations); n++) {
		struct timespec ts = { (time_t)interval, (long)(fmod(interval, 1.0) * 1e9) };

		while (nanosleep(&ts, &ts) && errno == EINTR && !stop)
			;
		if (stop)
			break;
		r = take(path, &s[!cur]);
		if (r)
			break;
		show(&s[cur], &s[!cur], json, tty, interval);
		cur = !cur;
	}
	return r ? 1 : 0;
}

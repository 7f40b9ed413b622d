// SPDX-License-Identifier: MIT
/* `kcollctl status`: the daemon's state as a table or as JSON. Control thread. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "kcolld.h"
#include "metrics.h"
#include "net.h"
#include "xport.h"
#include "reduce.h"

struct out {
	char *buf;
	size_t cap, len;
};

static void __attribute__((format(printf, 2, 3))) put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->len >= o->cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len = o->len + n < o->cap ? o->len + n : o->cap - 1;
}

/* A JSON string: the socket path is whatever the administrator chose. */
static void put_json_str(struct out *o, const char *str)
{
	put(o, "\"");
	for (; *str; str++) {
		if (*str == '"' || *str == '\\')
			put(o, "\\%c", *str);
		else if ((unsigned char)*str < 0x20)
			put(o, "\\u%04x", *str);
		else
			put(o, "%c", *str);
	}
	put(o, "\"");
}

static uint32_t comm_pending(const struct kd_comm *comm)
{
	uint32_t n = 0;

	for (const struct kd_op *op = comm->pending; op; op = op->next)
		n++;
	return n;
}

size_t kd_status_render(char *buf, size_t cap, int json)
{
	struct out o = { .buf = buf, .cap = cap };
	double up = (kd_now_ns() - kd.start_ns) / 1e9;
	uint32_t nclients = 0, inflight = 0;
	const char *path = kd.kdev.fd >= 0 ?
		"zero-copy for kcoll_mem_alloc and kcoll_mem_register buffers, process_vm single copy otherwise" :
		"zero-copy for kcoll_mem_alloc buffers, process_vm single copy otherwise";
	char kmod[224], tune[1024], netst[4096], kvst[512];

	if (kd.kdev.fd >= 0)
		snprintf(kmod, sizeof(kmod), "in use (%s): maps buffers pinned with kcoll_mem_register",
			 KCOLL_DEV_PATH);
	else
		snprintf(kmod, sizeof(kmod), "not used: %s", kcoll_kdev_why(&kd.kdev));

	for (struct kd_client *c = kd.clients; c; c = c->next) {
		if (!c->ring)
			continue;
		nclients++;
		inflight += atomic_load(&c->inflight);
	}
	kd_tunables_render(tune, sizeof(tune), json);
	kd_net_render(netst, sizeof(netst), json);
	kd_kv_render(kvst, sizeof(kvst), json);

	if (json) {
		put(&o, "{\"version\":\"%s\",\"pid\":%d,\"uptime_s\":%.1f,\"socket\":", KCOLL_VERSION,
		    getpid(), up);
		put_json_str(&o, kd.socket_path);
		put(&o, ",\"metrics\":\"%s\"", kd_metrics_addr());
		put(&o, ",\"net_xport\":");
		put_json_str(&o, kd_xport_choice());
		put(&o, ",\"workers\":%d,\"reduce_impl\":\"%s\",\"data_path\":\"%s\",\"kernel_module\":\"%s\","
			"\"tunables\":{%s},%s,%s,"
			"\"counters\":{\"ops_ok\":%lu,\"ops_failed\":%lu,\"bytes\":%lu,\"clients_total\":%lu,"
			"\"rings_killed\":%lu,\"inflight\":%u,\"bytes_mapped\":%lu,\"bytes_copied\":%lu},"
			"\"clients\":[",
			kd.nworkers, kcoll_reduce_impl(), path,
			kmod, tune, netst, kvst, atomic_load(&kd.stats.ops_ok), atomic_load(&kd.stats.ops_failed),
			atomic_load(&kd.stats.bytes), atomic_load(&kd.stats.clients_total),
			atomic_load(&kd.stats.rings_killed), inflight, atomic_load(&kd.stats.bytes_mapped),
			atomic_load(&kd.stats.bytes_copied));
		bool first = true;

		for (struct kd_client *c = kd.clients; c; c = c->next) {
			if (!c->ring)
				continue;	/* control-only connections (kcollctl) */
			put(&o, "%s{\"id\":%u,\"pid\":%d,\"uid\":%d,\"ring\":%s,\"sq_entries\":%u,"
				"\"inflight\":%u,\"ops\":%lu,\"errors\":%lu}",
				first ? "" : ",", c->id, c->pid, c->uid, "true", c->sq.mask + 1,
				atomic_load(&c->inflight), atomic_load(&c->ops), atomic_load(&c->errors));
			first = false;
		}
		put(&o, "],\"communicators\":[");
		for (struct kd_comm *m = kd.comms; m; m = m->next) {
			pthread_mutex_lock(&m->lock);
			put(&o, "%s{\"id\":\"%s\",\"uid\":%d,\"nranks\":%u,\"joined\":%u,\"state\":\"%s\","
				"\"ops_done\":%lu,\"ops_pending\":%u}",
				m == kd.comms ? "" : ",", m->name, m->uid, m->nranks, m->joined,
				kd_comm_shown_name(kd_comm_shown(m)), atomic_load(&m->ops_done), comm_pending(m));
			pthread_mutex_unlock(&m->lock);
		}
		put(&o, "]}\n");
		return o.len;
	}

	put(&o, "kcolld %s  pid %d  up %.0fs  socket %s\n", KCOLL_VERSION, getpid(), up, kd.socket_path);
	if (*kd_metrics_addr())
		put(&o, "metrics: http://%s/metrics\n", kd_metrics_addr());
	put(&o, "workers %d  reduce %s\ntunables: %s\n%s%s", kd.nworkers, kcoll_reduce_impl(), tune, netst,
	    kvst);
	put(&o, "data path: %s\n  moved in place %lu bytes, copied %lu bytes\nkernel module: %s\n", path,
	    atomic_load(&kd.stats.bytes_mapped), atomic_load(&kd.stats.bytes_copied), kmod);
	if (*kd_xport_choice())
		put(&o, "transport between daemons: %s\n", kd_xport_choice());
	put(&o, "ops ok %lu  failed %lu  bytes %lu  in flight %u  clients %u (total %lu)  rings killed %lu\n\n",
	    atomic_load(&kd.stats.ops_ok), atomic_load(&kd.stats.ops_failed),
	    atomic_load(&kd.stats.bytes), inflight, nclients, atomic_load(&kd.stats.clients_total),
	    atomic_load(&kd.stats.rings_killed));
	put(&o, "%-6s %-8s %-6s %-6s %-9s %-10s %s\n", "CLIENT", "PID", "UID", "SQ", "INFLIGHT", "OPS", "ERRORS");
	for (struct kd_client *c = kd.clients; c; c = c->next)
		if (c->ring)
			put(&o, "%-6u %-8d %-6d %-6u %-9u %-10lu %lu\n", c->id, c->pid, c->uid,
			    c->sq.mask + 1, atomic_load(&c->inflight), atomic_load(&c->ops),
			    atomic_load(&c->errors));
	put(&o, "\n%-17s %-6s %-7s %-8s %-10s %s\n", "COMMUNICATOR", "UID", "RANKS", "STATE", "OPS", "PENDING");
	for (struct kd_comm *m = kd.comms; m; m = m->next) {
		pthread_mutex_lock(&m->lock);
		put(&o, "%-17s %-6d %u/%-5u %-8s %-10lu %u\n", m->name, m->uid, m->joined, m->nranks,
		    kd_comm_shown_name(kd_comm_shown(m)), atomic_load(&m->ops_done), comm_pending(m));
		pthread_mutex_unlock(&m->lock);
	}
	return o.len;
}

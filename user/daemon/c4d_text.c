// SPDX-License-Identifier: MIT
/*
 * C4 in kcolld, the bottom of its files (c4d_int.h): what a verdict says,
 * as text and as JSON, with the names of hosts and links (net_conn.c's
 * addresses), and the event log: every raise and clear, ours and those the
 * peers' views report, logged and kept for `kcollctl events`. Calls
 * net_conn.c and metrics.c only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <kcoll/c4.h>

#include "c4d.h"
#include "c4d_int.h"
#include "kcolld.h"
#include "log.h"
#include "metrics.h"
#include "mh.h"
#include "net.h"

#define KD_C4_LOG	256

struct kd_c4_logent {
	uint64_t id;
	char comm[17];
	char link_addr[20];
	uint32_t self;		/* the host that observed it */
	bool remote;		/* a peer's verdict (KD_P_C4_VIEW), not ours */
	int64_t wall_ms;
	struct kcoll_c4_event e;
	char text[512];
};

/* The event log; control thread only. */
static struct {
	struct kd_c4_logent log[KD_C4_LOG];
	uint64_t next_id;
} c4log = { .next_id = 1 };

const char *c4d_hname(const struct kd_mh *mh, uint32_t h)
{
	return h < mh->nhosts ? mh->hosts[h].info.name : "?";
}

const char *c4d_kind_key(uint32_t k)
{
	switch (k) {
	case KCOLL_C4_COMM_HANG: return "comm_hang";
	case KCOLL_C4_NONCOMM_HANG: return "noncomm_hang";
	case KCOLL_C4_COMM_SLOW: return "comm_slow";
	case KCOLL_C4_NONCOMM_SLOW: return "straggler";
	}
	return "?";
}

/* "link 1 (eth1 10.20.0.3)" for ours, "link 1 (10.20.0.3)" for a peer's. */
void c4d_link_str(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len)
{
	char addr[20], ifn[20];

	if (l == KCOLL_C4_NONE) {
		snprintf(buf, len, "no link");
		return;
	}
	kd_net_link_addr(mh, h, l, addr, sizeof(addr));
	if (h == mh->self) {
		kd_net_link_ifname(l, ifn, sizeof(ifn));
		snprintf(buf, len, "link %u (%s %s)", l, ifn, addr);
	} else {
		snprintf(buf, len, "link %u (%s)", l, addr);
	}
}

size_t c4d_event_text(const struct kd_mh *mh, const struct kcoll_c4_event *e, char *b, size_t cap)
{
	char ls[64];

	c4d_link_str(mh, e->host, e->link, ls, sizeof(ls));
	switch (e->kind) {
	case KCOLL_C4_COMM_SLOW:
		if (!e->raised)
			return snprintf(b, cap, "communication slow cleared: host %u (%s) %s", e->host,
					c4d_hname(mh, e->host), ls);
	{
		size_t n = (size_t)snprintf(b, cap, "communication slow: host %u (%s) %s: %.1f MB/s against a "
					    "median of %.1f MB/s over the links (seen on traffic with host %u; %u "
					    "of %u peers on that link slow; %u samples)", e->host,
					    c4d_hname(mh, e->host), ls, e->value / 1e6, e->ref / 1e6, e->via_host,
					    (uint32_t)(e->spread >> 32), (uint32_t)e->spread, e->nsamples);

		if (e->bpf_flags && n < cap)
			n += (size_t)snprintf(b + n, cap - n, "; BPF %s: %.1f MB/s (usually %.1f), %u "
					      "retransmissions in %u ms, srtt %.2f ms (usually %.2f)%s",
					      e->bpf_dir ? "tx" : "rx", e->bpf_rate / 1e6, e->bpf_usual / 1e6,
					      e->bpf_retrans, mh->c4 ? mh->c4->core.p.bpf_window_ms : 0,
					      e->bpf_srtt_us / 1e3, e->bpf_usual_srtt_us / 1e3,
					      e->bpf_flags & KCOLL_C4_BPF_CORROB ? ", corroborates" : "");
		return n;
	}
	case KCOLL_C4_COMM_HANG:
		if (!e->raised)
			return snprintf(b, cap, "communication hang cleared: host %u (%s)", e->host,
					c4d_hname(mh, e->host));
		return snprintf(b, cap, "communication hang: op %u: every rank submitted it, but no data from "
				"host %u (%s, rank %u) on %s for %" PRIu64 " ms", e->seq_lo, e->host,
				c4d_hname(mh, e->host), e->rank, ls, e->value);
	case KCOLL_C4_NONCOMM_HANG:
		if (!e->raised)
			return snprintf(b, cap, "non-communication hang cleared: rank %u (host %u, %s)", e->rank,
					e->host, c4d_hname(mh, e->host));
		return snprintf(b, cap, "non-communication hang: rank %u (host %u, %s) never submitted op %u; "
				"other ranks have waited %" PRIu64 " ms, it submitted nothing for %" PRIu64
				" ms", e->rank, e->host, c4d_hname(mh, e->host), e->seq_lo, e->value, e->ref);
	case KCOLL_C4_NONCOMM_SLOW:
		if (!e->raised)
			return snprintf(b, cap, "straggler cleared: rank %u (host %u, %s)", e->rank, e->host,
					c4d_hname(mh, e->host));
		return snprintf(b, cap, "straggler: rank %u (host %u, %s) submits %.1f ms after its previous "
				"op completes; the ranks' median is %.1f ms (MAD %.1f ms, %u samples)", e->rank,
				e->host, c4d_hname(mh, e->host), e->value / 1e3, e->ref / 1e3, e->spread / 1e3,
				e->nsamples);
	}
	return snprintf(b, cap, "?");
}

/* JSON string body: the texts are ours, but host names come from peers. */
size_t c4d_jstr(char *b, size_t cap, const char *s)
{
	size_t n = 0;

	for (; *s && n + 7 < cap; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			n += snprintf(b + n, cap - n, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			n += snprintf(b + n, cap - n, "\\u%04x", ch);
		else
			b[n++] = ch;
	}
	if (n < cap)
		b[n] = 0;
	return n;
}

size_t c4d_event_json(const struct kd_mh *mh, const struct kcoll_c4_event *e, char *buf, size_t cap)
{
	char addr[20], t[512], js[640];
	size_t n = 0;

	addr[0] = 0;
	if (e->link != KCOLL_C4_NONE)
		kd_net_link_addr(mh, e->host, e->link, addr, sizeof(addr));
	c4d_event_text(mh, e, t, sizeof(t));
	c4d_jstr(js, sizeof(js), t);
	PUT("{\"kind\":\"%s\",\"raised\":%s,\"rank\":%d,\"host\":%u,\"host_name\":\"", c4d_kind_key(e->kind),
	    e->raised ? "true" : "false", e->rank == KCOLL_C4_NONE ? -1 : (int)e->rank, e->host);
	n += c4d_jstr(buf + n, n < cap ? cap - n : 0, c4d_hname(mh, e->host));
	PUT("\",\"link\":%d,\"link_addr\":\"%s\",\"via_host\":%d,\"value\":%" PRIu64 ",\"ref\":%" PRIu64
	    ",\"spread\":%" PRIu64 ",\"samples\":%u,\"op\":%u,\"text\":\"%s\"}",
	    e->link == KCOLL_C4_NONE ? -1 : (int)e->link, addr,
	    e->via_host == KCOLL_C4_NONE ? -1 : (int)e->via_host, e->value, e->ref, e->spread, e->nsamples,
	    e->seq_lo, js);
	if (e->kind == KCOLL_C4_COMM_SLOW && e->via_host != KCOLL_C4_NONE) {
		n--;	/* reopen the object: the direction of the evidence key */
		PUT(",\"dir\":\"%s\"}", e->bpf_dir ? "tx" : "rx");
	}
	if (e->bpf_flags) {
		n--;	/* reopen the object */
		PUT(",\"bpf\":{\"dir\":\"%s\",\"rate\":%" PRIu64 ",\"usual\":%" PRIu64 ",\"retrans\":%u,"
		    "\"srtt_us\":%u,\"usual_srtt_us\":%u,\"collapsed\":%s,\"rtt_up\":%s,"
		    "\"corroborates\":%s}}", e->bpf_dir ? "tx" : "rx", e->bpf_rate, e->bpf_usual,
		    e->bpf_retrans, e->bpf_srtt_us, e->bpf_usual_srtt_us,
		    e->bpf_flags & KCOLL_C4_BPF_COLLAPSED ? "true" : "false",
		    e->bpf_flags & KCOLL_C4_BPF_RTT_UP ? "true" : "false",
		    e->bpf_flags & KCOLL_C4_BPF_CORROB ? "true" : "false");
	}
	return n;
}

int64_t c4d_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* observer: mh->self, or the peer host whose view reported it (at its wall_ms). */
void c4d_log_event(struct kd_comm *comm, const struct kcoll_c4_event *e, uint32_t observer, int64_t when)
{
	struct kd_c4_logent *le = &c4log.log[c4log.next_id % KD_C4_LOG];
	struct kd_mh *mh = comm->mh;

	le->id = c4log.next_id++;
	memcpy(le->comm, comm->name, sizeof(le->comm));
	le->self = observer;
	le->remote = observer != mh->self;
	le->wall_ms = when;
	le->e = *e;
	le->link_addr[0] = 0;
	if (e->link != KCOLL_C4_NONE)
		kd_net_link_addr(mh, e->host, e->link, le->link_addr, sizeof(le->link_addr));
	c4d_event_text(mh, e, le->text, sizeof(le->text));
	if (le->remote) {
		/* the observer logs and counts it; here it is news of the communicator */
		kc_info("comm %s: C4 (seen by host %u): %s", comm->name, observer, le->text);
	} else if (e->raised) {
		kd_metrics_c4_raised(e->kind);
		kc_warn("comm %s: C4: %s", comm->name, le->text);
	} else {
		kc_info("comm %s: C4: %s", comm->name, le->text);
	}
}

size_t c4d_render_events(uint64_t since, char *buf, size_t cap, int json, bool local)
{
	uint64_t first = c4log.next_id > KD_C4_LOG ? c4log.next_id - KD_C4_LOG : 1;
	size_t n = 0;
	bool any = false;

	if (since + 1 > first)
		first = since + 1;
	if (json)
		PUT("{\"last\":%" PRIu64 ",\"events\":[", c4log.next_id - 1);
	for (uint64_t id = first; id < c4log.next_id && n + 1024 < cap; id++) {
		const struct kd_c4_logent *le = &c4log.log[id % KD_C4_LOG];
		char js[640];

		if (local && le->remote)
			continue;
		if (json) {
			c4d_jstr(js, sizeof(js), le->text);
			PUT("%s{\"id\":%" PRIu64 ",\"comm\":\"%s\",\"observer\":%u,\"time_ms\":%" PRId64
			    ",\"kind\":\"%s\",\"raised\":%s,\"rank\":%d,\"host\":%u,\"link\":%d,"
			    "\"link_addr\":\"%s\",\"text\":\"%s\"}",
			    any ? "," : "", le->id, le->comm, le->self, le->wall_ms, c4d_kind_key(le->e.kind),
			    le->e.raised ? "true" : "false",
			    le->e.rank == KCOLL_C4_NONE ? -1 : (int)le->e.rank, le->e.host,
			    le->e.link == KCOLL_C4_NONE ? -1 : (int)le->e.link, le->link_addr, js);
		} else {
			time_t t = le->wall_ms / 1000;
			struct tm tm;
			char ts[32];

			gmtime_r(&t, &tm);
			strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
			PUT("%" PRIu64 " %s.%03d comm %s: %s [seen by host %u]\n", le->id, ts,
			    (int)(le->wall_ms % 1000), le->comm, le->text, le->self);
		}
		any = true;
	}
	if (json)
		PUT("]}\n");
	return n;
}

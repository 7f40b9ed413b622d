// SPDX-License-Identifier: MIT
/*
 * A peer that is not kcolld sending KV_OP_MSG frames (docs/kv.md
 * "Notifications") to the kcolld at $KCOLL_SOCKET over its TCP listener
 * (tests/t_kv_cluster.sh runs it in a netns host). The process registers a
 * segment with one counter through libkcoll and exports it; then, with the
 * segment's token, raw frames (user/daemon/kv_wire.h):
 *
 *   - a message of 0 bytes, of KCOLL_NOTIF_MAX_BYTES + 1, a header length
 *     that disagrees with the message's, entries (nr) on a MSG: the owner
 *     drops the connection, queues nothing
 *   - a counter the segment lacks: answered -EINVAL, the connection goes on
 *   - a good message: answered 0, queued once with the sender as sent, the
 *     counter bumped
 *   - KCOLL_SEG_NOTIF_QUEUE more, then one: -ENOBUFS on the same connection,
 *     which still carries the next good frame after one was taken
 *
 * and the owner's queue holds exactly what was accepted, in order, and its
 * kcolld still serves. "check NAME: PASS|FAIL detail" lines; exit 0 when all
 * passed. Not a test_* program: run.sh does not run it alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "kv_wire.h"
#include "peer_check.h"

static int io_all(int fd, const void *p, size_t n, int out)
{
	uint8_t *b = (uint8_t *)p;

	while (n) {
		ssize_t got = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);

		if (got <= 0)
			return got < 0 ? -errno : -ECONNRESET;
		b += got;
		n -= got;
	}
	return 0;
}

/* A KD_CONN_KV connection to w's segment with its token: fd, or -errno. */
static int kv_dial(const struct kcoll_seg_wire *w)
{
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(w->port),
				  .sin_addr.s_addr = w->addrs[0] };
	struct kd_p_hello h = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_HELLO, .len = sizeof(h) },
				.version = KD_PEER_VERSION, .kind = KD_CONN_KV, .from_host = w->seg_id,
				.nonce = 0x6261646d7367ULL };
	struct timeval tv = { .tv_sec = 10 };
	struct kv_ack ack;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r;

	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	memcpy(h.token, w->token, sizeof(h.token));
	r = connect(fd, (struct sockaddr *)&to, sizeof(to)) ? -errno : 0;
	if (!r)
		r = io_all(fd, &h, sizeof(h), 1);
	if (!r)
		r = io_all(fd, &ack, sizeof(ack), 0);
	if (!r && (ack.hdr.magic != KD_PEER_MAGIC || ack.hdr.type != KD_P_KV_ACK))
		r = -EPROTO;
	if (!r && !(ack.features & KV_ACK_F_MSG))
		r = -EOPNOTSUPP;
	if (!r)
		r = ack.status;
	if (r) {
		close(fd);
		return r;
	}
	return fd;
}

/*
 * Send a MSG frame: len bytes of data, km_len in its kv_msg, hdr_len in its
 * header (0: the right one), nr entries claimed. The answer's status, or
 * 1 when the owner closed the connection instead (-ETIMEDOUT: neither).
 */
static int send_msg(int fd, const char *data, uint32_t len, uint32_t km_len, uint32_t hdr_len,
		    uint32_t nr, uint32_t notify_id, uint64_t tag)
{
	struct kv_req rq = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ },
			     .op = KV_OP_MSG, .nr = nr, .notify_id = notify_id, .tag = tag };
	struct kv_msg km = { .sender = 0x5e4d, .len = km_len };
	struct kv_resp rs;
	ssize_t got;

	rq.hdr.len = hdr_len ? hdr_len : sizeof(rq) + sizeof(km) + len;
	if (io_all(fd, &rq, sizeof(rq), 1) || io_all(fd, &km, sizeof(km), 1) ||
	    (len && io_all(fd, data, len, 1)))
		return 1;	/* already closed */
	got = recv(fd, &rs, sizeof(rs), MSG_WAITALL);
	if (got == 0 || (got < 0 && errno == ECONNRESET))
		return 1;
	if (got != sizeof(rs))
		return -ETIMEDOUT;
	if (rs.hdr.magic != KD_PEER_MAGIC || rs.hdr.type != KD_P_KV_RESP || rs.tag != tag)
		return -EPROTO;
	return rs.status;
}

int main(void)
{
	struct kcoll_seg_opts o = { .size = sizeof(o), .nr_notify = 1 };
	struct kcoll_notif *nt = calloc(KCOLL_SEG_NOTIF_QUEUE + 2, sizeof(*nt));
	char big[KCOLL_NOTIF_MAX_BYTES + 1];
	struct kcoll_seg_wire w;
	kcoll_seg_desc_t d;
	struct kcoll_seg *seg;
	struct kcoll *k;
	uint8_t *buf = malloc(4096);
	uint32_t nr = 0, cnt = 0;
	int fd, r, ok;

	memset(big, 'b', sizeof(big));
	if (!nt || !buf || kcoll_connect(NULL, &k) || kcoll_seg_register(k, buf, 4096, &o, &seg))
		return 2;
	kcoll_seg_export(seg, &d);
	memcpy(&w, d.bytes, sizeof(w));

	struct {
		const char *name;
		uint32_t len, km_len, hdr_len, nr;
	} bad[] = {
		{ "empty_message", 0, 0, 0, 0 },
		{ "message_too_long", sizeof(big), sizeof(big), 0, 0 },
		{ "header_length_disagrees", 8, 8, sizeof(struct kv_req) + sizeof(struct kv_msg) + 9, 0 },
		{ "entries_on_a_message", 8, 8, 0, 1 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fd = kv_dial(&w);
		r = fd < 0 ? fd : send_msg(fd, big, bad[i].len, bad[i].km_len, bad[i].hdr_len, bad[i].nr,
					   KCOLL_NOTIFY_NONE, 1);
		check(r == 1, bad[i].name, "(the owner drops the connection: %d)", r);
		if (fd >= 0)
			close(fd);
	}
	fd = kv_dial(&w);
	r = fd < 0 ? fd : send_msg(fd, "x", 2, 2, 0, 0, 5, 2);
	check(r == -EINVAL, "counter_beyond", "(answered %d, want -EINVAL; the connection stays)", r);
	r = fd < 0 ? fd : send_msg(fd, "hello", 6, 6, 0, 0, 0, 3);
	nt[0].size = sizeof(nt[0]);
	kcoll_seg_get_notifs(seg, nt, 4, &nr);
	kcoll_seg_notify_get(seg, 0, &cnt);
	check(r == 0 && nr == 1 && nt[0].sender == 0x5e4d && !strcmp((char *)nt[0].data, "hello") &&
	      cnt == 1, "good_message", "(answered %d; %u queued, counter %u; the refused ones left "
	      "nothing)", r, nr, cnt);
	ok = fd >= 0;
	for (uint32_t i = 0; i < KCOLL_SEG_NOTIF_QUEUE && ok; i++) {
		char m[16];

		snprintf(m, sizeof(m), "f%u", i);
		ok = send_msg(fd, m, strlen(m) + 1, strlen(m) + 1, 0, 0, KCOLL_NOTIFY_NONE, 10 + i) == 0;
	}
	r = fd < 0 ? fd : send_msg(fd, "over", 5, 5, 0, 0, 0, 9999);
	kcoll_seg_notify_get(seg, 0, &cnt);
	check(ok && r == -ENOBUFS && cnt == 1, "queue_full", "(answered %d after %u, counter %u)", r,
	      KCOLL_SEG_NOTIF_QUEUE, cnt);
	nt[0].size = sizeof(nt[0]);
	kcoll_seg_get_notifs(seg, nt, 1, &nr);
	r = fd < 0 ? fd : send_msg(fd, "next", 5, 5, 0, 0, KCOLL_NOTIFY_NONE, 10000);
	check(r == 0, "same_connection_after_full", "(one taken, the next frame: %d)", r);
	nt[1].size = sizeof(nt[1]);
	kcoll_seg_get_notifs(seg, nt + 1, KCOLL_SEG_NOTIF_QUEUE + 1, &nr);
	ok = nr == KCOLL_SEG_NOTIF_QUEUE && !strcmp((char *)nt[0].data, "f0") &&
	     !strcmp((char *)nt[nr].data, "next");
	for (uint32_t i = 1; ok && i < KCOLL_SEG_NOTIF_QUEUE; i++) {
		char m[16];

		snprintf(m, sizeof(m), "f%u", i);
		ok = !strcmp((char *)nt[i].data, m);
	}
	check(ok, "queue_exact", "(%u more taken: f0..f%u in order, then next; never over)", nr,
	      KCOLL_SEG_NOTIF_QUEUE - 1);
	if (fd >= 0)
		close(fd);
	kcoll_seg_unregister(seg);
	r = kcoll_seg_register(k, buf, 4096, &o, &seg);
	check(r == 0, "owner_kcolld_serves", "(a new segment afterwards: %s)", kcoll_strerror(r));
	if (!r)
		kcoll_seg_unregister(seg);
	kcoll_disconnect(k);
	free(nt);
	free(buf);
	return failed;
}

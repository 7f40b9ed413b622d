// SPDX-License-Identifier: MIT
/*
 * A hostile peer of kcolld's KV RDMA path (docs/kv.md "Across hosts over
 * RDMA"; tests/vm/t_kv_rdma.sh runs it on Soft-RoCE):
 *
 *   kv_hostile ADDR      ADDR: the attacker's IPv4 address (a RoCE v2 GID)
 *
 * The parent is an ordinary client of the kcolld at $KCOLL_SOCKET: it
 * allocates four 1 MiB regions with kcoll_mem_alloc (what kcolld registers
 * for RDMA) and fills them with patterns; registers three as segments A, B
 * and N, and 8000 bytes at offset 100 of the fourth as segment C (neither
 * end on a page boundary); exports A, B and C (N is given to nobody). The child is not kcolld and does not use libkcoll:
 * it speaks the peer protocol over TCP (kv_wire.h) and raw libibverbs, and:
 *
 *   - says HELLO with no token, a wrong token, B's token for A, and sends a
 *     request without a HELLO: refused, no rkey
 *   - opens an RDMA session on A with A's token (what a grantee may do) and
 *     writes its first 4 KiB: that works (so the refusals below are real)
 *   - writes past A's end, before its start, across its end, reads past its
 *     end, and writes just past either end of C (inside C's pages): each a
 *     failed completion (each in a fresh session: a remote access error
 *     ends one)
 *   - with sessions on A and on B open, uses A's live rkey through B's QP:
 *     refused (one PD per connection), while A's own QP still writes
 *   - has the parent unregister A while its session is open, then writes
 *     again: refused; a new HELLO for A: -EIDRM
 *
 * Then the parent checks A holds its pattern except the granted 4 KiB, and
 * B, N and C's whole region their patterns byte for byte, and that its kcolld still answers.
 * Each check prints "check NAME: PASS|FAIL detail"; exit 0 when all passed.
 * Not a test_* program: run.sh does not run it alone.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <kcoll/kcoll.h>
#include <kcoll/proto.h>

#include "kv_rdma.h"
#include "kv_wire.h"
#include "peer_check.h"

#define SEG	(1u << 20)
#define BLK	4096
#define CSKIP	100	/* segment C: [CSKIP, CSKIP + CSIZE) of the fourth region */
#define CSIZE	8000


static uint8_t pat(int seg, size_t i)
{
	return (uint8_t)(i * 13 + seg * 71 + (i >> 10));
}

/* ---- the attacker ---------------------------------------------------------- */

static uint32_t my_addr;	/* network order */
static struct ibv_context *ctx;
static int gid_index = -1;
static union ibv_gid my_gid;

static int io_all(int fd, void *p, size_t n, int out)
{
	uint8_t *b = p;

	while (n) {
		ssize_t got = out ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);

		if (got <= 0)
			return got < 0 ? -errno : -ECONNRESET;
		b += got;
		n -= got;
	}
	return 0;
}

/* A TCP connection from my_addr to the owner's kcolld (desc's first address). */
static int dial(const struct kcoll_seg_wire *w)
{
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_addr.s_addr = my_addr };
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(w->port),
				  .sin_addr.s_addr = w->addrs[0] };
	struct timeval tv = { .tv_sec = 30 };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (bind(fd, (struct sockaddr *)&me, sizeof(me)) ||
	    connect(fd, (struct sockaddr *)&to, sizeof(to))) {
		int r = -errno;

		close(fd);
		return r;
	}
	return fd;
}

/* HELLO for segment id with token: the owner's verdict (*fd kept on 0). */
static int hello(const struct kcoll_seg_wire *w, const uint8_t *token, uint32_t id, int *fd)
{
	struct kd_p_hello h = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_HELLO, .len = sizeof(h) },
				.version = KD_PEER_VERSION, .kind = KD_CONN_KV, .from_host = id,
				.nonce = 0x6861636b6572ULL };
	struct kv_ack ack;
	int r;

	*fd = dial(w);
	if (*fd < 0)
		return *fd;
	if (token)
		memcpy(h.token, token, sizeof(h.token));
	r = io_all(*fd, &h, sizeof(h), 1);
	if (!r)
		r = io_all(*fd, &ack, sizeof(ack), 0);
	if (!r && (ack.hdr.magic != KD_PEER_MAGIC || ack.hdr.type != KD_P_KV_ACK))
		r = -EPROTO;
	if (!r)
		r = ack.status;
	if (r) {
		close(*fd);
		*fd = -1;
	}
	return r;
}

static int pick_gid(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);

	for (int d = 0; l && l[d] && gid_index < 0; d++) {
		struct ibv_context *c = ibv_open_device(l[d]);

		for (int i = 0; c && i < 64 && gid_index < 0; i++) {
			struct ibv_gid_entry e;

			if (ibv_query_gid_ex(c, 1, i, &e, 0) || e.gid_type != IBV_GID_TYPE_ROCE_V2)
				continue;
			/* ::ffff:a.b.c.d */
			if (!memcmp(e.gid.raw + 12, &my_addr, 4) && e.gid.raw[10] == 0xff &&
			    e.gid.raw[11] == 0xff) {
				gid_index = i;
				my_gid = e.gid;
				ctx = c;
			}
		}
		if (c && c != ctx)
			ibv_close_device(c);
	}
	if (l)
		ibv_free_device_list(l);
	return gid_index < 0 ? -ENODEV : 0;
}

struct sess {
	int fd;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t buf[2 * BLK];
	uint64_t base;
	uint32_t rkey;
};

static void sess_close(struct sess *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	if (s->mr)
		ibv_dereg_mr(s->mr);
	if (s->cq)
		ibv_destroy_cq(s->cq);
	if (s->pd)
		ibv_dealloc_pd(s->pd);
	if (s->fd >= 0)
		close(s->fd);
	free(s);
}

/* A granted connection to segment (id, token), then the RDMA setup kcolld's
 * initiator does: our QP out, the owner's QP, base and rkey back. */
static struct sess *sess_open(const struct kcoll_seg_wire *w, const char *what)
{
	struct sess *s = calloc(1, sizeof(*s));
	struct kv_req rq = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = sizeof(rq) +
				     sizeof(struct kv_rdma_hello) }, .op = KV_OP_RDMA, .tag = 7 };
	struct kv_rdma_hello me = { 0 }, peer;
	struct kv_resp rs;
	struct ibv_port_attr pa;
	int r;

	if (!s)
		return NULL;
	s->fd = -1;
	r = hello(w, w->token, w->seg_id, &s->fd);
	if (r)
		goto err;
	r = -EIO;
	if (ibv_query_port(ctx, 1, &pa) || !(s->pd = ibv_alloc_pd(ctx)) ||
	    !(s->cq = ibv_create_cq(ctx, 16, NULL, NULL, 0)) ||
	    !(s->mr = ibv_reg_mr(s->pd, s->buf, sizeof(s->buf), IBV_ACCESS_LOCAL_WRITE)))
		goto err;
	{
		struct ibv_qp_init_attr qa = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 8, .max_recv_wr = 1,
							.max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };

		s->qp = ibv_create_qp(s->pd, &qa);
		if (!s->qp || ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS))
			goto err;
	}
	me.addr.version = KCOLL_RDMA_ADDR_VERSION;
	me.addr.nqp = 1;
	me.addr.gid = my_gid;
	me.addr.qgid[0] = my_gid;
	me.addr.mtu = pa.active_mtu;
	me.addr.qpn[0] = s->qp->qp_num;
	me.addr.psn[0] = 4242;
	r = io_all(s->fd, &rq, sizeof(rq), 1);
	r = r ? r : io_all(s->fd, &me, sizeof(me), 1);
	r = r ? r : io_all(s->fd, &rs, sizeof(rs), 0);
	if (!r && (rs.hdr.type != KD_P_KV_RESP || rs.hdr.len != sizeof(rs) + sizeof(peer)))
		r = rs.status ? rs.status : -EPROTO;
	r = r ? r : io_all(s->fd, &peer, sizeof(peer), 0);
	r = r ? r : rs.status;
	if (r)
		goto err;
	{
		struct ibv_qp_attr a = {
			.qp_state = IBV_QPS_RTR, .dest_qp_num = peer.addr.qpn[0], .rq_psn = peer.addr.psn[0],
			.path_mtu = peer.addr.mtu < pa.active_mtu ? peer.addr.mtu : pa.active_mtu,
			.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
			.ah_attr = { .is_global = 1, .port_num = 1,
				     .grh = { .dgid = peer.addr.qgid[0], .sgid_index = gid_index,
					      .hop_limit = 64 } },
		};

		r = -EIO;
		if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			goto err;
		/* A short retry: a dead peer QP fails the request in about 0.5 s. */
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
					  .rnr_retry = 7, .sq_psn = 4242, .max_rd_atomic = 1 };
		if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			goto err;
	}
	s->base = peer.base;
	s->rkey = peer.rkey;
	return s;
err:
	check(0, "session", "(%s: cannot open an RDMA session: %s)", what, strerror(r < 0 ? -r : r));
	sess_close(s);
	return NULL;
}

/* One WRITE (fill: the bytes) or READ of len at raddr/rkey through s's QP:
 * the completion status, or -1 if none came within wait_s seconds. */
static int rd_op_wait(struct sess *s, int write, uint8_t fill, uint64_t raddr, uint32_t rkey, uint32_t len,
		      int wait_s)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = raddr, .rkey = rkey } }, *bad;
	struct ibv_wc wc;

	memset(s->buf, write ? fill : 0, sizeof(s->buf));
	if (ibv_post_send(s->qp, &wr, &bad))
		return -2;
	for (int i = 0; i < wait_s * 1000; i++) {
		int n = ibv_poll_cq(s->cq, 1, &wc);

		if (n < 0)
			return -2;
		if (n)
			return wc.status;
		usleep(1000);
	}
	return -1;
}

static int rd_op(struct sess *s, int write, uint8_t fill, uint64_t raddr, uint32_t rkey, uint32_t len)
{
	return rd_op_wait(s, write, fill, raddr, rkey, len, 60);
}

static const char *wc_str(int st)
{
	return st == -1 ? "no completion" : st == -2 ? "cannot post" :
	       ibv_wc_status_str((enum ibv_wc_status)st);
}

/* A bad access in a fresh session on w: it must fail, with the rkey live. */
static void bad_access(const struct kcoll_seg_wire *w, const char *name, int write, int64_t off, uint32_t len)
{
	struct sess *s = sess_open(w, name);
	int st;

	if (!s)
		return;
	st = rd_op(s, write, 0xbb, s->base + off, s->rkey, len);
	check(st > 0, name, "(%s %u bytes at segment %u%+lld: %s)", write ? "write" : "read", len,
	      w->seg_id, (long long)off, wc_str(st));
	sess_close(s);
}

static int cmd(int to, int from, char c)
{
	char got = 0;

	return write(to, &c, 1) == 1 && read(from, &got, 1) == 1 && got == 'y' ? 0 : -1;
}

static void attacker(const struct kcoll_seg_wire *a, const struct kcoll_seg_wire *b,
		     const struct kcoll_seg_wire *c, int to, int from)
{
	struct kv_req rq = { .hdr = { .magic = KD_PEER_MAGIC, .type = KD_P_KV_REQ, .len = sizeof(rq) +
				     sizeof(struct kv_rdma_hello) }, .op = KV_OP_RDMA };
	struct kv_rdma_hello me = { 0 };
	uint8_t tok[KCOLL_SEG_TOKEN_BYTES];
	struct sess *sa, *sb;
	int fd, r, st;

	if (pick_gid()) {
		check(0, "attacker_gid", "(no RoCE v2 GID for the attacker's address)");
		_exit(1);
	}
	/* No token, a wrong one, another segment's. */
	r = hello(a, NULL, a->seg_id, &fd);
	check(r == -EACCES, "no_token", "-> %s", strerror(-r));
	memcpy(tok, a->token, sizeof(tok));
	tok[5] ^= 0x10;
	r = hello(a, tok, a->seg_id, &fd);
	check(r == -EACCES, "wrong_token", "-> %s", strerror(-r));
	r = hello(a, b->token, a->seg_id, &fd);
	check(r == -EACCES, "other_segments_token", "-> %s", strerror(-r));
	/* No HELLO at all: straight to the RDMA setup. */
	fd = dial(a);
	r = fd < 0 ? fd : io_all(fd, &rq, sizeof(rq), 1);
	r = r ? r : io_all(fd, &me, sizeof(me), 1);
	{
		struct kv_resp rs = { 0 };

		r = r ? r : io_all(fd, &rs, sizeof(rs), 0);
		check(r || rs.hdr.type != KD_P_KV_RESP || rs.status,
		      "no_hello", "(a request without a HELLO: %s)",
		      r ? strerror(-r) : rs.hdr.type == KD_P_KV_RESP ? "answered!" : "rejected");
	}
	if (fd >= 0)
		close(fd);

	/* Granted: A's first 4 KiB. */
	sa = sess_open(a, "granted_session");
	if (!sa)
		_exit(1);
	st = rd_op(sa, 1, 0x77, sa->base, sa->rkey, BLK);
	check(st == IBV_WC_SUCCESS && !cmd(to, from, 'V'), "granted_write",
	      "(4 KiB at A+0: %s; the owner sees it)", wc_str(st));
	sess_close(sa);

	bad_access(a, "write_past_end", 1, SEG, BLK);
	bad_access(a, "write_before_start", 1, -BLK, BLK);
	bad_access(a, "write_across_end", 1, SEG - BLK / 2, BLK);
	bad_access(a, "read_past_end", 0, SEG, BLK);

	/* C: CSIZE bytes at CSKIP into a mapped region, neither end on a page
	 * boundary: the region must cover exactly the segment, not its pages. */
	bad_access(c, "write_past_unaligned_end", 1, CSIZE, 16);
	bad_access(c, "write_before_unaligned_start", 1, -16, 16);
	bad_access(c, "write_across_unaligned_end", 1, CSIZE - 8, 16);

	/* Another connection's rkey through this QP. */
	sa = sess_open(a, "session_a");
	sb = sess_open(b, "session_b");
	if (!sa || !sb)
		_exit(1);
	st = rd_op(sb, 1, 0xcc, sa->base, sa->rkey, BLK);
	check(st > 0, "foreign_rkey", "(A's rkey through B's QP: %s)", wc_str(st));
	st = rd_op(sa, 1, 0x77, sa->base, sa->rkey, BLK);
	check(st == IBV_WC_SUCCESS, "foreign_rkey_was_live", "(the same rkey through A's QP: %s)",
	      wc_str(st));

	/* A unregistered under an open session. */
	r = cmd(to, from, 'U');
	{
		struct kv_resp rs = { 0 };
		int e = io_all(sa->fd, &rs, sizeof(rs), 0);

		/* The owner's last word on the stream: -EIDRM, then its end. */
		check(!r && ((!e && rs.hdr.type == KD_P_KV_RESP && rs.status == -EIDRM) || e == -ECONNRESET),
		      "stream_says_unregistered", "(%s)", e ? strerror(-e) : strerror(-rs.status));
	}
	/* The region is deregistered and the owner's QP gone: a failed
	 * completion, or (rxe drops what reaches a destroyed QP; its retry
	 * timer need not fire under TCG) none within 20 s. Either way
	 * nothing lands: the parent checks A's bytes. */
	st = rd_op_wait(sa, 1, 0xdd, sa->base, sa->rkey, BLK, 20);
	check(st != IBV_WC_SUCCESS, "write_after_unregister", "(%s)", wc_str(st));
	r = hello(a, a->token, a->seg_id, &fd);
	check(r == -EIDRM, "hello_after_unregister", "-> %s", strerror(-r));
	sess_close(sa);
	sess_close(sb);
	_exit(failed);
}

/* ---- the owner -------------------------------------------------------------- */

int main(int argc, char **argv)
{
	struct kcoll *k;
	uint8_t *seg[4];
	struct kcoll_seg *s[4];
	kcoll_seg_desc_t d[3];
	struct kcoll_seg_wire w[3];
	int to[2], from[2], st, r;
	size_t bad[4] = { 0 };
	pid_t pid;
	char c;

	if (argc != 2 || inet_pton(AF_INET, argv[1], &my_addr) != 1) {
		fprintf(stderr, "usage: kv_hostile ADDR (the attacker's IPv4 address)\n");
		return 2;
	}
	r = kcoll_connect(NULL, &k);
	if (r) {
		fprintf(stderr, "kv_hostile: kcoll_connect: %s\n", kcoll_strerror(r));
		return 2;
	}
	for (int i = 0; i < 4; i++) {
		if (kcoll_mem_alloc(k, SEG, (void **)&seg[i]))
			return 2;
		for (size_t j = 0; j < SEG; j++)
			seg[i][j] = pat(i, j);
		r = i == 3 ? kcoll_seg_register(k, seg[i] + CSKIP, CSIZE, NULL, &s[i]) :
		    kcoll_seg_register(k, seg[i], SEG, NULL, &s[i]);
		if (r) {
			fprintf(stderr, "kv_hostile: register: %s\n", kcoll_strerror(r));
			return 2;
		}
	}
	for (int i = 0; i < 3; i++) {
		kcoll_seg_export(s[i == 2 ? 3 : i], &d[i]);
		memcpy(&w[i], d[i].bytes, sizeof(w[i]));
	}
	if (pipe(to) || pipe(from))
		return 2;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(to[0]);
		close(from[1]);
		alarm(300);
		attacker(&w[0], &w[1], &w[2], to[1], from[0]);
	}
	close(to[1]);
	close(from[0]);
	while (read(to[0], &c, 1) == 1) {
		int ok = 0;

		if (c == 'V') {
			ok = 1;
			for (size_t j = 0; j < SEG; j++)
				ok &= seg[0][j] == (j < BLK ? 0x77 : pat(0, j));
		} else if (c == 'U') {
			ok = kcoll_seg_unregister(s[0]) == 0;
			s[0] = NULL;
		}
		if (write(from[1], ok ? "y" : "n", 1) != 1)
			break;
	}
	waitpid(pid, &st, 0);
	check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "attacker_exit", "(status %#x)", st);
	for (int i = 0; i < 4; i++)
		for (size_t j = 0; j < SEG; j++)
			bad[i] += seg[i][j] != (i == 0 && j < BLK ? 0x77 : pat(i, j));
	check(bad[0] == 0, "granted_segment_exact", "(A: %zu bytes differ from the pattern plus the "
	      "granted 4 KiB)", bad[0]);
	check(bad[1] == 0, "other_segment_intact", "(B: %zu bytes differ)", bad[1]);
	check(bad[2] == 0, "neighbour_intact", "(N, given to nobody: %zu bytes differ)", bad[2]);
	check(bad[3] == 0, "unaligned_segment_region_intact",
	      "(C's whole region, C and the bytes around it: %zu bytes differ)", bad[3]);
	{
		struct kcoll_seg *t;

		r = kcoll_seg_register(k, seg[0], SEG, NULL, &t);
		check(r == 0, "owner_kcolld_serves", "(a new segment after the attack: %s)", kcoll_strerror(r));
		if (!r)
			kcoll_seg_unregister(t);
	}
	for (int i = 1; i < 4; i++)
		kcoll_seg_unregister(s[i]);
	for (int i = 0; i < 4; i++)
		kcoll_mem_free(k, seg[i]);
	kcoll_disconnect(k);
	return failed;
}

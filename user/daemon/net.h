/* SPDX-License-Identifier: MIT */
/*
 * Daemon-to-daemon: the peer protocol, a communicator's multi-host state,
 * and the transport ops table (docs/multihost.md has the long form).
 *
 *   net.c        TCP listener, connections between daemons, bootstrap
 *                (root and member side), control messages (abort, query);
 *                runs on the control thread
 *   mh.c         a multi-host communicator's net thread: the hierarchical
 *                algorithms (local reduce -> inter-host steps -> local write)
 *   xport_tcp.c  the TCP transport: one step's sends and receives over
 *                several non-blocking streams per peer, reductions as pieces
 *                arrive
 *
 * Every connection starts with a HELLO carrying the communicator's token; a
 * daemon accepts it only for a token it issued (bootstrap) or a communicator
 * it is forming with that peer (control, data): the token is the key.
 */
#ifndef KCOLLD_NET_H
#define KCOLLD_NET_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#include <kcoll/proto.h>

#define KD_MAX_HOSTS		64
#define KD_MAX_STREAMS		8
#define KD_PEER_MAGIC		0x6b63706eU	/* "kcpn" */
/* Bumped whenever a peer message changes shape or meaning. 2: the C4 report
 * grew (c4d.c), RDMA addresses carry a GID per QP, TABLE.algo may be
 * KD_ALGO_DIRECT. */
#define KD_PEER_VERSION		3
#define KD_PMSG_MAX		16384

enum kd_pmsg_type {
	KD_P_HELLO = 1,		/* first message of every connection */
	KD_P_REJECT = 2,	/* why, then the sender closes */
	KD_P_REGISTER = 3,	/* member -> root: a rank of the communicator lives on me */
	KD_P_TABLE = 4,		/* root -> members: hosts, placement of ranks */
	KD_P_READY = 5,		/* member -> root: table installed, accepting peers */
	KD_P_GO = 6,		/* root -> members: connect to the hosts after you */
	KD_P_ABORT = 7,		/* control: the communicator fails from op from_seq on */
	KD_P_QUERY = 8,		/* control: which of your ranks submitted op seq? */
	KD_P_ANSWER = 9,
	KD_P_DATA = 10,		/* data stream: one piece of one step */
	KD_P_C4 = 11,		/* control: our ranks' submission summaries (c4d.c) */
	KD_P_PLAN = 12,		/* control: which streams the pair leaves unused (c4d.c) */
	KD_P_KV_ACK = 13,	/* KV connection: the owner's verdict on the HELLO (kv_serve.c) */
	KD_P_KV_REQ = 14,	/* KV connection: a frame of a batch, or its notify */
	KD_P_KV_RESP = 15,
	KD_P_C4_VIEW = 16,	/* control: the sender's active anomalies, when they change (c4d.c) */
};

/* KD_CONN_KV: HELLO.token is a segment token, from_host its segment id,
 * stream the stream index; kv_serve.c owns the connection after the HELLO. */
/* KD_CONN_LANE: one per host pair of a communicator with lanes, handed to the
 * local rank (docs/multihost.md "Lanes"). */
#define KD_LANE_MAX_HOSTS	8
#define KD_LANE_MAX_BYTES	(1u << 20)
enum kd_conn_kind { KD_CONN_BOOT = 1, KD_CONN_CTRL = 2, KD_CONN_DATA = 3, KD_CONN_KV = 4,
		    KD_CONN_LANE = 5 };

struct kd_phdr {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint32_t len;		/* whole message, header included */
	uint32_t reserved;
};

struct kd_p_hello {
	struct kd_phdr hdr;
	uint32_t version;
	uint32_t kind;		/* enum kd_conn_kind */
	uint8_t token[KCOLL_ID_TOKEN_BYTES];
	uint32_t from_host;	/* ctrl/data: the sender's host index */
	uint32_t stream;	/* data: stream index */
	uint64_t nonce;		/* the sender daemon's instance */
};

struct kd_p_reject {
	struct kd_phdr hdr;
	char why[128];
};

/* Where a daemon can be reached. */
struct kd_p_hostinfo {
	uint64_t nonce;
	uint16_t port;
	uint16_t naddrs;
	uint32_t addrs[KCOLL_ID_MAX_ADDRS];	/* network order */
	uint8_t prefix[KCOLL_ID_MAX_ADDRS];	/* netmask length of each */
	char name[48];
};

struct kd_p_register {
	struct kd_phdr hdr;
	uint8_t token[KCOLL_ID_TOKEN_BYTES];
	uint32_t nranks;
	uint32_t rank;
	struct kd_p_hostinfo me;
	uint32_t flags;		/* KCOLL_COMM_F_* of the rank */
	uint32_t reserved;
};

/* Followed by uint16_t rank_host[nranks]. */
struct kd_p_table {
	struct kd_phdr hdr;
	uint8_t token[KCOLL_ID_TOKEN_BYTES];
	uint32_t nranks;
	uint32_t nhosts;
	uint32_t you;		/* the receiver's host index */
	uint32_t nstreams;
	uint32_t algo;		/* enum kd_algo: one choice for every host */
	uint32_t piece;		/* bytes per piece: the same everywhere */
	uint32_t lane_bytes;	/* > 0: the ranks all-reduce up to this over lanes */
	uint32_t reserved;
	struct kd_p_hostinfo hosts[];
};

struct kd_p_token {		/* READY, GO */
	struct kd_phdr hdr;
	uint8_t token[KCOLL_ID_TOKEN_BYTES];
};

#define KD_ABORT_F_LEFT	(1u << 31)	/* flags: the rank left (destroy), not died */

struct kd_p_abort {
	struct kd_phdr hdr;
	int32_t err;
	uint32_t rank;		/* the culprit, KCOLL_RANK_NONE if unknown */
	uint32_t flags;		/* KCOLL_CQE_F_* */
	uint32_t reserved;
	uint64_t from_seq;	/* ops before this one are not affected */
};

struct kd_p_query {
	struct kd_phdr hdr;
	uint64_t seq;
};

struct kd_p_answer {
	struct kd_phdr hdr;
	uint64_t seq;
	uint64_t submitted[4];	/* bitmap over ranks: submitted op seq (only the sender's) */
};

struct kd_p_c4_rank {
	uint32_t rank;
	uint32_t age_ms;	/* since its last submission */
	uint64_t nsub;		/* ops it submitted */
	uint32_t think_us;	/* median time from a completion to its next submission */
	uint32_t nthink;
};

/* Followed by n struct kd_p_c4_rank. */
struct kd_p_c4 {
	struct kd_phdr hdr;
	uint32_t n;
	uint32_t want_avoid;	/* streams to us the sender's planner wants left unused */
	uint32_t steer_recv;	/* links on which the sender restores every foreign flow to us
				 * steered onto another link (the receiving half of kcoll_steer) */
	uint32_t pad;
};

/* One active anomaly as its observer judged it at its raise (struct
 * kcoll_c4_event's verdict and evidence, spelt out for the wire). */
struct kd_p_c4_anom {
	uint32_t kind, rank, host, link, via_host, nsamples, seq_lo, bpf_flags;
	uint32_t bpf_dir, bpf_retrans, bpf_srtt_us, bpf_usual_srtt_us;
	uint64_t value, ref, spread, bpf_rate, bpf_usual;
	int64_t wall_ms;	/* when the observer raised it, its wall clock */
};

/*
 * Followed by n struct kd_p_c4_anom: every anomaly the sender has active, a
 * snapshot replacing its previous one, sent when the set or, with one
 * active, the data path's wait changes. Peer version 3 without it logs an
 * unexpected control message and goes on, so the version stays.
 */
struct kd_p_c4_view {
	struct kd_phdr hdr;
	uint32_t n;
	uint32_t wait_host;	/* the sender's data path waits for this host; KCOLL_C4_NONE: not */
	uint32_t wait_link;	/* on this link */
	uint32_t wait_ms;	/* for this long when sent */
	uint64_t wait_seq;	/* in this op */
};

/*
 * The streams a host pair leaves unused, agreed between the two: the lower
 * host proposes (the union of both sides' wishes) from op 'from' on, the
 * higher one accepts if it has not started that op yet, else refuses and
 * says how far it is. Both then switch at the same op.
 */
enum kd_plan_verb { KD_PLAN_PROPOSE = 0, KD_PLAN_ACCEPT = 1, KD_PLAN_REFUSE = 2 };

struct kd_p_plan {
	struct kd_phdr hdr;
	uint32_t verb;		/* enum kd_plan_verb */
	uint32_t avoid;		/* bitmap of stream indices */
	uint64_t from;		/* first op it applies to */
	uint64_t started;	/* refuse: ops the refusing host has started */
};

struct kd_p_data {
	struct kd_phdr hdr;	/* len = header + payload */
	uint64_t seq;
	uint32_t step;
	uint32_t piece;
};

/* ---- a multi-host communicator ---------------------------------------- */

struct kd_comm;
struct kd_op;
struct kd_pconn;

struct kd_range {
	uint64_t off, len;	/* bytes of the op's accumulator */
};

/* Move ranges to or from one host. */
struct kd_xfer {
	uint32_t host;
	uint32_t nr;
	const struct kd_range *r;
	const uint8_t *base;	/* sends: where the ranges are (NULL: the accumulator) */
	uint8_t *dst;		/* receives, unreduced: where they go (NULL: the accumulator) */
	const uint8_t *src;	/* receives, reduced: our operand (NULL: the accumulator);
				 * the result always goes to the accumulator */
};

/* One step of an inter-host algorithm: every send and receive at once;
 * received pieces are reduced into the accumulator or stored in it. */
struct kd_step {
	uint32_t nsend, nrecv;
	bool reduce;
	struct kd_xfer send[KD_MAX_HOSTS];
	struct kd_xfer recv[KD_MAX_HOSTS];
};

/* A piece: the unit a transport moves and the receiver reduces. */
struct kd_piece {
	uint64_t off, len;
};

/* Cut a transfer's ranges into pieces of at most piece bytes; at least one
 * (empty) piece. malloc'ed; NULL when out of memory. */
struct kd_piece *kd_xfer_cut(const struct kd_xfer *x, size_t piece, uint32_t *n);

struct kd_mh;

/*
 * The transport ops table: how steps move bytes between daemons. TCP
 * (xport_tcp.c) today; RDMA verbs plug in here. run_steps runs n steps
 * numbered first.. in order; chained (one send and one receive per step, the
 * send of step t being what step t - 1 received) lets piece j of step t go
 * once piece j of step t - 1 is in. Returns 0 or a negative errno with
 * *bad_host the host it failed on (or waited for).
 */
struct kd_xport_ops {
	const char *name;
	/* Once, when xport.c considers it: 0 if usable (it logs what it runs
	 * on), else -errno with why filled in. NULL: always usable. */
	int (*init)(char *why, size_t cap);
	int (*run_steps)(struct kd_mh *mh, struct kd_op *op, const struct kd_step *st, uint32_t n,
			 uint32_t first, bool chain, uint32_t *bad_host);
	/* Release mh->xpriv (the net thread has stopped); NULL: nothing to. */
	void (*close)(struct kd_mh *mh);
	/* kcollctl status: the transport's own state for mh (json: one
	 * "key":value member); NULL: nothing to show. Returns bytes written. */
	size_t (*render)(struct kd_mh *mh, char *buf, size_t cap, int json);
};

extern const struct kd_xport_ops kd_xport_tcp;	/* xport_tcp.c */
extern const struct kd_xport_ops kd_xport_rdma;	/* xport_rdma.c */

/* xport.c: the transport new communicators use (KCOLL_NET_XPORT; auto: the
 * best whose init succeeds, RDMA before TCP, logging why once). */
const struct kd_xport_ops *kd_xport_default(void);

enum kd_algo { KD_ALGO_AUTO, KD_ALGO_RING, KD_ALGO_RD, KD_ALGO_RABENSEIFNER, KD_ALGO_DIRECT };

struct kd_mh_host {
	struct kd_p_hostinfo info;
	uint32_t first_rank;
	uint32_t nranks;
	struct kd_pconn *ctrl;		/* control connection (control thread) */
	int data[KD_MAX_STREAMS];	/* data streams, -1 until connected */
	int lane;			/* lane to this host until the rank takes it, else -1 */
	bool answered;			/* query round */
	uint64_t submitted[4];
	bool dead;
	/* C4 (c4d.c): the local link (network index) each data stream uses, and
	 * what the net thread moved on it in pieces of KD_C4_OBS_MIN bytes or
	 * more: bytes and the time from a piece's first to its last byte. */
	uint8_t link[KD_MAX_STREAMS];
	_Atomic uint64_t obs_bytes[KD_MAX_STREAMS][2];	/* [stream][0 rx, 1 tx] */
	_Atomic uint64_t obs_busy[KD_MAX_STREAMS][2];
	/* C4 plan, under mh->plan_lock: streams left unused toward this host */
	uint32_t avoid;			/* in force for the op the net thread runs */
	uint32_t next_avoid;		/* agreed: in force from op next_from on */
	uint64_t next_from;
	bool next_valid;
	uint32_t prop_avoid;		/* we proposed it (lower host), no answer yet */
	uint64_t prop_from;
	bool prop_out;
	int64_t prop_sent;
	uint64_t peer_started;		/* its data path's progress, from a refusal */
	uint32_t agreed;		/* control thread: the last mask agreed */
	uint32_t peer_want;		/* control thread: what the peer's planner wants */
	uint32_t peer_steer_recv;	/* control thread: kd_p_c4.steer_recv of the peer */
};

#define KD_C4_OBS_MIN	(64u << 10)

struct kd_c4;

struct kd_mh {
	struct kd_comm *comm;
	uint32_t nhosts, self, nstreams;
	uint32_t algo;			/* enum kd_algo, fixed when the comm formed */
	size_t net_piece;		/* bytes per piece, fixed when the comm formed */
	uint32_t lane_bytes;		/* the ranks' lanes (0: none), fixed when formed */
	_Atomic int64_t last_progress;	/* the net loop moved bytes (hang detection) */
	struct kd_mh_host *hosts;
	uint16_t *rank_host;		/* [nranks] */
	uint32_t conns_needed, conns_up;
	const struct kd_xport_ops *xport;
	void *xpriv;			/* the transport's state (net thread) */

	/* net thread */
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t qlock;
	pthread_cond_t qcond;
	struct kd_op *queue;
	bool busy;			/* an op of this comm runs (net thread or inline) */
	bool stop;
	int abort_fd;			/* eventfd: wakes the net thread on abort */
	uint8_t *acc;			/* the op's accumulator: own, or a local rank's buffer */
	uint8_t *own;			/* ours, kept between ops */
	size_t acc_size;
	uint8_t *snap;			/* recursive doubling: what we send this step */
	size_t snap_size;
	uint8_t *stage;			/* local phase: one chunk per local rank */
	size_t stage_size;
	uint8_t *rx[KD_MAX_HOSTS * KD_MAX_STREAMS];	/* reduce staging per receive stream */
	size_t rx_size;
	size_t piece;			/* bytes per piece (this op) */
	uint32_t sig;			/* this op's parameters, checked on every piece */
	uint8_t redop;			/* this op's reduction between hosts (avg: sum) */
	uint8_t dtype;			/* ... and its element type (integer avg: 64-bit) */
	size_t esz;

	/* what the net thread runs now, for the watchdog */
	_Atomic uint64_t running_seq;	/* UINT64_MAX: none */
	_Atomic int64_t running_since;
	int64_t query_deadline;		/* control thread: a query round is open */
	uint64_t query_seq;
	uint32_t wait_host;		/* the host the net thread waits for */
	uint32_t wait_stream;		/* ... on this stream */
	struct kd_c4 *c4;		/* detector and planner (c4d.c), comm->lock */
	pthread_mutex_t plan_lock;	/* the hosts' plan fields and 'started' */
	uint64_t started;		/* ops the data path has started */

	_Atomic uint64_t bytes_sent, bytes_recv;
};

/* net.c (control thread). pick: the transport for new communicators
 * (main.c passes xport.c's kd_xport_default; called once here, at start). */
int kd_net_start(const char *listen_spec, const char *addrs_spec,
		 const struct kd_xport_ops *(*pick)(void));
/* Who this daemon is to its peers (after kd_net_start): listen port (0 when
 * not listening) and up to max advertised addresses; returns how many. */
int kd_net_self_addrs(uint16_t *port, uint32_t *addrs, int max);
/* Called on the control thread when a communicator's host table is installed
 * (flow tracking learns peers' addresses and ports from it); NULL: none. */
extern void (*kd_net_table_hook)(const struct kd_p_hostinfo *hosts, uint32_t nhosts, uint32_t you);
/* BPF flow statistics summed per (peer host, link) over the tracked flows
 * (cumulative counters); c4d.c feeds them to the detector. Set by
 * kcolld_bpf.c while tracking is on (KCOLL_BPF=1), NULL otherwise. Fills
 * at most max, *n: how many; 0 or a negative errno. */
struct kd_bpf_sum {
	uint32_t host, link;
	uint64_t tx_payload, rx_payload, retrans;
	uint32_t srtt_us;	/* the largest of its flows active in the last second; 0 unknown */
	uint32_t nflows;
};
extern int (*kd_bpf_sums_hook)(struct kd_bpf_sum *out, uint32_t max, uint32_t *n);
/* Foreign tracked flows (not kcolld's own streams) follow the C4 plan: per
 * peer host, the links our planner and the peer's want left, the link to use
 * instead, the addresses of both hosts on every link. kcolld_bpf.c moves each
 * such flow with kcoll_steer (two phases, kcoll_steer.h: the sending half
 * only once the peer says it restores on that link) and fills recv_ready.
 * Control thread; NULL while tracking is off. */
#define KD_STEER_LINKS 4
struct kd_steer_want {
	uint32_t host;
	uint32_t avoid_mine, avoid_peer;	/* link bitmaps */
	uint32_t peer_recv;			/* links the peer restores on (its steer_recv) */
	uint32_t via[KD_STEER_LINKS];		/* instead of link l; UINT32_MAX: none */
	uint32_t laddr[KD_STEER_LINKS], raddr[KD_STEER_LINKS];	/* network order; 0 unknown */
	uint32_t recv_ready;			/* out: links we restore on (for our steer_recv) */
};
extern void (*kd_bpf_steer_hook)(struct kd_steer_want *w, uint32_t n, int64_t now);
/* `kcollctl plan`: the foreign flows and why (text or a JSON array). */
extern size_t (*kd_bpf_steer_render)(char *buf, size_t cap, int json);
void kd_net_stop(void);
void kd_net_event(struct kd_pconn *pc, uint32_t events);
void kd_net_fill_id(struct kcoll_id *id);
/* kv_serve.c: a KD_CONN_KV HELLO; takes the connection's fd (answers and serves it). */
void kd_kv_accept(int fd, const struct kd_p_hello *m);
/* This daemon's address and instance nonce, for KV segment descriptors. */
void kd_net_self(struct kd_p_hostinfo *me);
/* TCP connection to addr:port (network-order address), blocking mode; fd or -errno. */
int kd_net_connect(uint32_t addr, uint16_t port);
/* A local rank joined comm (FORMING): register it with the id's root. */
int kd_net_join(struct kd_comm *comm, const struct kcoll_id *id, uint32_t rank, uint32_t flags,
		const char **why);
/* Abort comm from op from_seq on and tell every peer (control thread or any). */
void kd_net_abort_peers(struct kd_comm *comm, int err, uint32_t rank, uint32_t flags, uint64_t from_seq);
/* Control thread, periodically: bootstrap deadlines, query rounds. */
void kd_net_watchdog(int64_t now);
/* Tear a comm's multi-host state down (control thread; the comm is aborted). */
void kd_net_comm_close(struct kd_comm *comm);
size_t kd_net_render(char *buf, size_t cap, int json);
const char *kd_algo_name(enum kd_algo a);
int kd_algo_parse(const char *s, enum kd_algo *a);
enum kd_algo kd_net_algo(void);
/* kcollctl set KEY VALUE for the keys net.c owns (algo, streams). */
int kd_net_set(const char *key, const char *value, char *err, size_t errlen);

/* Host h's address on the network of our link l ("?" if none); our
 * interface name of link l. */
void kd_net_link_addr(const struct kd_mh *mh, uint32_t h, uint32_t l, char *buf, size_t len);
void kd_net_link_ifname(uint32_t l, char *buf, size_t len);
uint32_t kd_net_nlinks(void);
/* Links (bitmap of our network indices) host h is on too. */
uint32_t kd_net_shared_links(const struct kd_mh *mh, uint32_t h);
int kd_net_ctrl_send(struct kd_mh *mh, uint32_t h, void *msg, uint16_t type, size_t len);

/* c4d.c: the C4 detector and planner of multi-host communicators */
int kd_c4_attach(struct kd_comm *comm);
void kd_c4_detach(struct kd_mh *mh);
/* comm->lock held */
void kd_c4_submitted(struct kd_comm *comm, uint32_t rank, uint64_t seq);
void kd_c4_completed(struct kd_comm *comm, const struct kd_op *op);
/* Control thread */
void kd_c4_on_report(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
void kd_c4_on_plan(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
void kd_c4_on_view(struct kd_comm *comm, uint32_t from_host, const struct kd_phdr *h);
/* Net thread (or an inline op), at the start of op seq: the agreed plans
 * that apply from it on take effect; waits while a proposal for it is open. */
void kd_c4_op_start(struct kd_mh *mh, struct kd_op *op);
void kd_c4_tick(int64_t now);
/* Control thread: active anomalies of every communicator, counted by kind
 * into n[0..nkinds) (metrics.c). */
void kd_c4_active_kinds(uint64_t *n, uint32_t nkinds);
/* kcollctl status: active anomalies over every host of comm (0: none or no
 * detector); *seen: the hosts that hold one, a bitmap. */
uint32_t kd_c4_summary(struct kd_comm *comm, uint64_t *seen);
/* kcollctl anomalies / events / plan */
size_t kd_c4_render(uint32_t what, uint64_t since, char *buf, size_t cap, uint32_t flags);

/* mh.c */
int kd_mh_start(struct kd_mh *mh);
void kd_mh_stop(struct kd_mh *mh);
void kd_mh_queue(struct kd_op *op);
void kd_mh_wake(struct kd_mh *mh);

#endif /* KCOLLD_NET_H */

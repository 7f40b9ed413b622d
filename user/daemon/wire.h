/* SPDX-License-Identifier: MIT */
/*
 * The peer protocol between daemons: message types, connection kinds and
 * the structs each message carries (docs/multihost.md has the long form).
 * Plain data, no behaviour: net.c speaks it on control and bootstrap
 * connections, xport_tcp.c on data streams, kv_send.c and kv_serve.c on KV connections, c4d.c
 * in its reports and plans.
 *
 * Every connection starts with a HELLO carrying the communicator's token; a
 * daemon accepts it only for a token it issued (bootstrap) or a communicator
 * it is forming with that peer (control, data): the token is the key.
 */
#ifndef KCOLLD_WIRE_H
#define KCOLLD_WIRE_H

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

/* The inter-host all-reduce algorithm: one choice for every host (TABLE.algo). */
enum kd_algo { KD_ALGO_AUTO, KD_ALGO_RING, KD_ALGO_RD, KD_ALGO_RABENSEIFNER, KD_ALGO_DIRECT };

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

#endif /* KCOLLD_WIRE_H */

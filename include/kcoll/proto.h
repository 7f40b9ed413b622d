/* SPDX-License-Identifier: MIT */
/*
 * Control protocol between libkcoll (and kcollctl) and kcolld over the unix
 * socket (SOCK_SEQPACKET: one message per datagram, file descriptors passed
 * with SCM_RIGHTS). The data path never uses it: operations go through the
 * ring. Internal to kcoll: both ends are built from this tree, and HELLO
 * refuses a peer of another protocol version with a message saying so.
 */
#ifndef KCOLL_PROTO_H
#define KCOLL_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <linux/kcoll.h>

#define KCOLL_PROTO_MAGIC	0x6b63746cU	/* "kctl" */
#define KCOLL_PROTO_VERSION	2
#define KCOLL_MSG_BYTES		65536
#define KCOLL_ID_TOKEN_BYTES	32

enum kcoll_msg_type {
	KCOLL_MSG_HELLO = 1,		/* -> ring memfd back */
	KCOLL_MSG_MEM_REG = 2,		/* memfd in, region handle back */
	KCOLL_MSG_MEM_UNREG = 3,
	KCOLL_MSG_UNIQUE_ID = 4,
	KCOLL_MSG_COMM_INIT = 5,	/* reply deferred until all ranks joined */
	KCOLL_MSG_COMM_DESTROY = 6,
	KCOLL_MSG_STATUS = 7,		/* reply: JSON text */
	KCOLL_MSG_MEM_REG_KDEV = 8,	/* buffer pinned through /dev/kcoll, by handle */
	KCOLL_MSG_SET = 9,		/* set a run-time tunable (kcollctl set) */
	KCOLL_MSG_COMM_LANE = 11,	/* -> a lane's socket (docs/multihost.md "Lanes") */
	KCOLL_MSG_METRICS = 12,		/* kcollctl metrics: reply Prometheus text (docs/metrics.md) */
	/* KV-cache segments (user/daemon/kv_seg.c, docs/kv.md) */
	KCOLL_MSG_SEG_REG = 32,		/* -> descriptor + notify counters memfd */
	KCOLL_MSG_SEG_UNREG = 33,
	KCOLL_MSG_SEG_IMPORT = 34,	/* descriptor -> import handle */
	KCOLL_MSG_SEG_CLOSE = 35,	/* drop an import handle */
	KCOLL_MSG_SEG_NOTIFS = 36,	/* take a segment's queued notifications */
	KCOLL_MSG_C4 = 10,		/* kcollctl anomalies/events/plan: reply text */
	KCOLL_MSG_MEM_REG_DEV = 48,	/* GPU allocation shared by CUDA IPC (docs/gpu.md) */
};

/* Every message and every reply starts with this. */
struct kcoll_msg_hdr {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint32_t len;		/* whole message, header included */
	uint32_t seq;		/* echoed in the reply */
	int32_t status;		/* replies: 0 or negative errno */
	uint32_t reserved;
};

struct kcoll_msg_hello {
	struct kcoll_msg_hdr hdr;
	uint32_t proto_version;
	uint32_t abi_version;
	uint32_t sq_entries;
	uint32_t flags;
};

struct kcoll_msg_hello_reply {
	struct kcoll_msg_hdr hdr;
	uint64_t ring_size;
	uint32_t daemon_pid;
	uint32_t features;
	char daemon_version[32];
	char error[128];	/* on failure: what to do about it */
};

struct kcoll_msg_mem_reg {
	struct kcoll_msg_hdr hdr;
	uint64_t addr;		/* where the client mapped the memfd */
	uint64_t size;
};

/* An ordinary buffer the client pinned with /dev/kcoll and granted to kcolld. */
struct kcoll_msg_mem_reg_kdev {
	struct kcoll_msg_hdr hdr;
	uint64_t addr;
	uint64_t size;
	uint64_t handle;	/* from KCOLL_IOC_BUF_REGISTER */
};

/*
 * A GPU allocation of the client (MEM_REG_DEV), registered once; MEM_UNREG by
 * addr drops it. SQEs then name device addresses inside it (KCOLL_MEM_DEVICE).
 */
#define KCOLL_GPU_IPC_BYTES	88	/* struct kcoll_gpu_ipc (gpu/kcoll_gpu.h) */

struct kcoll_msg_mem_reg_dev {
	struct kcoll_msg_hdr hdr;
	uint64_t addr;		/* the allocation's base, a device address of the client */
	uint64_t size;		/* the allocation's bytes */
	uint64_t buffer_id;	/* CU_POINTER_ATTRIBUTE_BUFFER_ID (for logs and status) */
	char pci_bus_id[32];	/* its device, as every process names it */
	uint8_t ipc[KCOLL_GPU_IPC_BYTES];	/* the handle of the whole allocation */
};

struct kcoll_msg_mem_unreg {
	struct kcoll_msg_hdr hdr;
	uint64_t addr;
};

#define KCOLL_ID_MAX_ADDRS	4

/*
 * Unique id layout (kcoll_unique_id_t is 128 opaque bytes to applications).
 * It names the root daemon, the one that issued it: every rank's daemon
 * registers its ranks there, wherever the rank runs (docs/multihost.md).
 */
struct kcoll_id {
	uint32_t magic;
	uint32_t version;
	uint8_t token[KCOLL_ID_TOKEN_BYTES];	/* random: the communicator's name and key */
	uint64_t root_nonce;			/* the root daemon's instance (random at start) */
	uint32_t daemon_pid;
	uint16_t port;				/* root's TCP port, host byte order */
	uint16_t naddrs;
	uint32_t addrs[KCOLL_ID_MAX_ADDRS];	/* root's IPv4 addresses, network order */
	char host[48];				/* root's host name, for messages */
};

/* Set a run-time tunable of kcolld (root or the daemon's own user only). */
struct kcoll_msg_set {
	struct kcoll_msg_hdr hdr;
	char key[32];
	char value[64];
};

struct kcoll_msg_set_reply {
	struct kcoll_msg_hdr hdr;
	char error[128];
};

/* kcollctl anomalies / events / plan; hdr.flags: KCOLL_C4_F_*. */
enum kcoll_c4_what { KCOLL_C4_ANOMALIES = 0, KCOLL_C4_EVENTS = 1, KCOLL_C4_PLAN = 2 };
#define KCOLL_C4_F_JSON		(1u << 0)
#define KCOLL_C4_F_LOCAL	(1u << 1)	/* only this host's verdicts, not its peers' */

struct kcoll_msg_c4 {
	struct kcoll_msg_hdr hdr;
	uint32_t what;		/* enum kcoll_c4_what */
	uint32_t reserved;
	uint64_t since;		/* events: only those with a larger id */
};

#define KCOLL_COMM_F_GPU	(1u << 0)	/* the rank's process has the CUDA driver loaded */

struct kcoll_msg_comm_init {
	struct kcoll_msg_hdr hdr;
	struct kcoll_id id;
	uint32_t nranks;
	uint32_t rank;
	uint32_t timeout_ms;
	uint32_t flags;		/* KCOLL_COMM_F_* */
};

struct kcoll_msg_comm_init_reply {
	struct kcoll_msg_hdr hdr;
	uint32_t comm_id;	/* the client's handle, used in sqe->coll.comm_id */
	uint32_t nhosts;	/* hosts the communicator spans */
	uint32_t self_host;	/* this rank's host index */
	uint32_t lane_bytes;	/* > 0: all-reduces up to this size go over lanes */
	uint32_t timeout_ms;	/* the communicator's hang timeout */
	uint32_t reserved;
	char error[128];
};

/* One lane of a communicator: a connected TCP socket to host 'host' (not
 * ours), passed with SCM_RIGHTS once; kcolld keeps no copy. */
struct kcoll_msg_comm_lane {
	struct kcoll_msg_hdr hdr;
	uint32_t comm_id;
	uint32_t host;
};

struct kcoll_msg_comm_destroy {
	struct kcoll_msg_hdr hdr;
	uint32_t comm_id;
	uint32_t reserved;
};

/*
 * KV-cache segment descriptor (kcoll_seg_desc_t is KCOLL_SEG_DESC_BYTES
 * opaque bytes to applications): names the owning daemon (instance nonce,
 * TCP address) and the segment, and carries the segment's access token.
 */
#define KCOLL_SEG_MAGIC		0x6b677365U	/* "esgk" */
#define KCOLL_SEG_TOKEN_BYTES	32

struct kcoll_seg_wire {
	uint32_t magic;
	uint16_t version;			/* KCOLL_PROTO_VERSION */
	uint16_t naddrs;
	uint64_t nonce;				/* owning daemon's instance */
	uint64_t size;				/* segment bytes */
	uint32_t seg_id;			/* daemon-wide, never reused by an instance */
	uint32_t nr_notify;
	uint16_t port;				/* owning daemon's TCP port, host order */
	uint16_t reserved;
	uint32_t daemon_pid;
	uint32_t addrs[KCOLL_ID_MAX_ADDRS];	/* owning daemon's IPv4 addresses */
	uint8_t token[KCOLL_SEG_TOKEN_BYTES];
	char host[32];				/* for messages */
};

/* seg_reg flags */
#define KCOLL_MSG_SEG_F_GRANT_UID	(1U << 0)	/* grant_uid may import it too */
#define KCOLL_MSG_SEG_F_DEVICE		(1U << 1)	/* GPU memory inside a device allocation
							 * the client registered (MEM_REG_DEV) */

struct kcoll_msg_seg_reg {
	struct kcoll_msg_hdr hdr;
	uint64_t addr;
	uint64_t size;
	uint32_t nr_notify;
	uint32_t flags;
	uint32_t grant_uid;
	uint32_t reserved;
};

/* The notify counters (nr_notify __u32, a sealed memfd) come with it. */
struct kcoll_msg_seg_reg_reply {
	struct kcoll_msg_hdr hdr;
	struct kcoll_seg_wire desc;
	char error[128];
};

/*
 * The memfd that comes with SEG_REG: nr_notify __u32 counters, then, on the
 * next page, the number of notifications queued for the segment (a futex
 * word kcoll_seg_notif_wait sleeps on). Always sent, even without counters.
 */
static inline size_t kcoll_seg_notif_word_off(uint32_t nr_notify)
{
	return ((size_t)nr_notify * sizeof(uint32_t) + 4095) & ~(size_t)4095;
}

static inline size_t kcoll_seg_counters_len(uint32_t nr_notify)
{
	return kcoll_seg_notif_word_off(nr_notify) + 4096;
}

/* SEG_NOTIFS: take up to max (<= KCOLL_SEG_NOTIFS_PER_MSG) of segment id's
 * notifications, oldest first. */
#define KCOLL_SEG_NOTIFS_PER_MSG	64

struct kcoll_msg_seg_notifs {
	struct kcoll_msg_hdr hdr;
	uint32_t id;
	uint32_t max;
};

struct kcoll_notif_wire {
	uint64_t sender;
	uint32_t notify_id;
	uint32_t len;
	uint8_t data[KCOLL_NOTIF_MAX_BYTES];
};

struct kcoll_msg_seg_notifs_reply {
	struct kcoll_msg_hdr hdr;
	uint32_t nr;		/* records that follow */
	uint32_t left;		/* still queued after these */
	struct kcoll_notif_wire rec[KCOLL_SEG_NOTIFS_PER_MSG];
};

/* SEG_UNREG (id = seg_id) and SEG_CLOSE (id = import handle). */
struct kcoll_msg_seg_id {
	struct kcoll_msg_hdr hdr;
	uint32_t id;
	uint32_t reserved;
};

struct kcoll_msg_seg_import {
	struct kcoll_msg_hdr hdr;
	struct kcoll_seg_wire desc;
};

struct kcoll_msg_seg_import_reply {
	struct kcoll_msg_hdr hdr;
	uint32_t handle;	/* sqe->xfer.remote_seg */
	uint32_t nr_notify;
	uint64_t size;
	char error[128];
};

/* Send msg (len bytes, hdr.len set by the caller) with an optional fd (-1). */
int kcoll_msg_send(int sock, const void *msg, size_t len, int fd);
/*
 * Receive one message into buf (at most cap bytes). *fd gets a passed
 * descriptor or -1 (fd may be NULL: any passed descriptor is closed).
 * Returns the length, 0 on orderly EOF, or a negative errno; a message that
 * is truncated, has a bad magic or a len that disagrees is -EBADMSG.
 */
ssize_t kcoll_msg_recv(int sock, void *buf, size_t cap, int *fd);

#endif /* KCOLL_PROTO_H */

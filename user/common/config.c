// SPDX-License-Identifier: MIT
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <kcoll/kcoll.h>

#include "config.h"
#include "log.h"

static const struct kcoll_knob knobs[] = {
	{ "KCOLL_SOCKET", KCOLL_DEFAULT_SOCKET, "unix socket kcolld listens on and libkcoll connects to" },
	{ "KCOLL_TIMEOUT_MS", "30000", "communicator init and hang timeout: a rank missing this long fails the op" },
	{ "KCOLL_SPIN_US", "50", "busy-poll this long before sleeping on a futex doorbell (both sides)" },
	{ "KCOLL_WORKERS", "0", "kcolld data-path worker threads (0: one per online CPU)" },
	{ "KCOLL_CHUNK_BYTES", "262144", "bytes per data-path task; large ops are split across workers" },
	{ "KCOLL_SQ_ENTRIES", "256", "submission queue entries per client ring (power of two, max 4096)" },
	{ "KCOLL_LOG_LEVEL", "info", "kcolld log level: error, warn, info, debug" },
	{ "KCOLL_GPU_LIB", "", "path of libkcoll_gpu.so (empty: <exe dir>/../lib, then the loader's search path)" },
	{ "KCOLL_LISTEN", "0.0.0.0:0", "kcolld: TCP address:port other daemons connect to (port 0: any free port)" },
	{ "KCOLL_ADDRS", "", "kcolld: IPv4 addresses to advertise to other daemons, comma separated (empty: every up interface)" },
	{ "KCOLL_ALGO", "auto", "multi-host all-reduce: auto, ring, rd (recursive doubling), rabenseifner, direct (one exchange with every host)" },
	{ "KCOLL_LANE_BYTES", "65536", "kcolld (the id's root decides for the communicator): with one rank per host on 2..8 hosts, all-reduces up to this many bytes run in the ranks over a direct connection per host pair that the daemons set up (\"lanes\"; 0: off, every op through the daemons; at most 1048576 = 1 MiB: more is logged and 1 MiB used)" },
	{ "KCOLL_NET_STREAMS", "0", "TCP streams per peer daemon, spread over the interfaces (1..8; 0: one per network both hosts are on)" },
	{ "KCOLL_KV_STREAMS", "4", "KV transfers to another host: TCP streams per imported segment (1..8)" },
	{ "KCOLL_NET_CHUNK_BYTES", "1048576", "bytes per piece of a transfer between daemons (pieces alternate between streams)" },
	{ "KCOLL_BENCH_LAUNCH", "", "kcoll-bench --hosts: command template starting a rank on host %h (empty: scripts/netns-cluster.sh exec %h)" },
	{ "KCOLL_MPI_MIN_BYTES", "16M", "libkcoll_mpi.so: smallest MPI collective (bytes, K/M suffixes) sent to kcolld, and smallest MPI_Alloc_mem block taken from kcoll memory" },
	{ "KCOLL_MPI_DEBUG", "0", "libkcoll_mpi.so: 1 = per-rank summary at MPI_Finalize, 2 = also one line per call" },
	{ "KCOLL_LIB", "", "Python package kcoll: the libkcoll.so.1 to load, and no other (empty: the build tree's build/lib/libkcoll.so.1 next to the package, else the loader's libkcoll.so.1)" },
	{ "KCOLL_TORCH_AUTOLOAD", "1", "pip-installed kcoll under torch 2.5+: torch registers the \"kcoll\" backend as it starts (no import kcoll.torch needed; libkcoll loads when the first kcoll group is made); 0 = off" },
	{ "KCOLL_TORCH_SHARE_MIN_BYTES", "1048576", "kcoll.torch: an all_reduce or broadcast of a CPU tensor of at least this many bytes (K/M/G suffixes) runs as its first and last 4 KiB plus a zero-copy middle, the whole pages inside the tensor's storage shared with kcolld in place on first use (kcoll_mem_share); the same value on every rank; 0 = off" },
	{ "KCOLL_TORCH_SHARE_MAX_BYTES", "1073741824", "kcoll.torch: storages each process group keeps shared with kcolld (and alive) at most, least recently used dropped first (K/M/G suffixes)" },
	{ "KCOLL_MPI_DISABLE", "0", "libkcoll_mpi.so: 1 on any rank keeps the whole job on plain MPI" },
	{ "KCOLL_NET_XPORT", "auto", "transport between daemons: auto (rdma when a device is present, else tcp), rdma, tcp" },
	{ "KCOLL_IB_LIB", "", "libibverbs that kcolld dlopens for RDMA (empty: libibverbs.so.1 from the loader's search path; a library that cannot be loaded means TCP, and the log says why)" },
	{ "KCOLL_IB_HCA", "", "RDMA devices kcolld may use, comma separated (empty: all; see ibv_devices)" },
	{ "KCOLL_IB_GID_INDEX", "-1", "GID index to use (-1: the RoCE v2 GID whose netdev carries the address used for the peer)" },
	{ "KCOLL_IB_QPS", "2", "RC queue pairs per peer daemon (1..8); pieces alternate between them" },
	{ "KCOLL_IB_PIECE_BYTES", "1048576", "RDMA: largest piece written in one work request (rounded down to 4 KiB; at most KCOLL_NET_CHUNK_BYTES); the receive slots are this size" },
	{ "KCOLL_IB_ZC_BYTES", "65536", "RDMA: pieces of at least this many bytes are written straight from the buffer (zero-copy, registered through the cache, local access only); smaller ones are copied into a send slot (0: always copy)" },
	{ "KCOLL_IB_QP_ADDRS", "", "RDMA path per QP: comma-separated local IPv4 addresses; QP i leaves from the port and RoCE v2 GID of address i (round robin; empty: every QP uses the GID of the address the peer is reached from)" },
	{ "KCOLL_IB_UDP_SPORT", "0", "RDMA: first RoCE v2 UDP source port of a peer's QPs (0xc000..0xffff; QP i gets port+i through its flow label; 0: KCOLL_IB_FLOW_LABEL decides)" },
	{ "KCOLL_IB_TIMEOUT", "14", "RDMA: the QPs' local ACK timeout, 4.096 us * 2^N (1..31; 14 = 67 ms); raise it on slow or emulated links, where early retransmissions hurt" },
	{ "KCOLL_IB_FLOW_LABEL", "0", "first RoCE v2 flow label of a peer's QPs (QP i gets label+i; 0: none, the device picks the UDP source port)" },
	{ "KCOLL_C4_SLOW_RATIO_PCT", "200", "C4 detector: a link is slow when the median of its peers' rates is above this % of its own (sysfs slow_ratio_pct)" },
	{ "KCOLL_C4_HANG_MS", "5000", "C4 detector: a rank or link without progress this long is reported hung (sysfs hang_ms)" },
	{ "KCOLL_C4_STRAGGLER_MS", "20", "C4 detector: a rank whose median think time exceeds the ranks' median by this much is a straggler" },
	{ "KCOLL_C4_PLAN", "1", "C4 planner: 1 = move kcolld's data streams off links the detector marks slow, 0 = only show the plan" },
	{ "KCOLL_C4_TRACE", "", "C4: kcolld appends the detector inputs of its first multi-host communicator to this file, %p = its pid (tests/data traces)" },
	{ "KCOLL_REDUCE_IMPL", "", "force a reduction implementation (generic, avx2, avx512); empty: best" },
	{ "KCOLL_BPF", "0", "kcolld: 1 = attach the eBPF flow tracker (bpf/) on the interfaces of its addresses; runs without it if it cannot" },
	{ "KCOLL_BPF_PIN", "/sys/fs/bpf/kcoll", "bpffs directory where the flow tracker's maps and programs are pinned (kcolld, kcoll-bpf)" },
	{ "KCOLL_BPF_CGROUP", "", "kcolld flow tracking: cgroup v2 directory for the sockops program (TCP retransmissions, RTT); empty: where cgroup v2 is mounted" },
	{ "KCOLL_METRICS", "", "kcolld: serve Prometheus metrics over HTTP at PORT (on 127.0.0.1) or IPV4:PORT, GET /metrics (empty: off; docs/metrics.md)" },
	{ "KCOLL_METRICS_FILE", "", "kcolld: also write the metrics to this file every KCOLL_METRICS_INTERVAL seconds, atomically (node_exporter textfile collector: a .prom file in its directory; empty: off)" },
	{ "KCOLL_METRICS_INTERVAL", "15", "kcolld: seconds between KCOLL_METRICS_FILE rewrites (at least 1)" },
	{ "KCOLL_THP_MIN_BYTES", "4194304", "libkcoll: a host buffer of at least this many bytes outside kcoll memory gets its whole 2 MiB pages collapsed into huge pages (MADV_COLLAPSE, once per buffer) so kcolld's process_vm copies pin 512x fewer pages; 0 = never" },
};

static const struct kcoll_knob *knob_find(const char *name)
{
	for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++)
		if (!strcmp(knobs[i].name, name))
			return &knobs[i];
	fprintf(stderr, "kcoll: internal error: unknown knob %s\n", name);
	abort();
}

int kcoll_knob_is_set(const char *name)
{
	const char *v = getenv(knob_find(name)->name);

	return v && *v;
}

const char *kcoll_knob_str(const char *name)
{
	const struct kcoll_knob *k = knob_find(name);
	const char *v = getenv(name);

	return v && *v ? v : k->def;
}

long long kcoll_knob_ll(const char *name)
{
	const struct kcoll_knob *k = knob_find(name);
	const char *v = getenv(name);
	char *end;
	long long n;

	if (!v || !*v)
		return strtoll(k->def, NULL, 0);
	errno = 0;
	n = strtoll(v, &end, 0);
	if (errno || *end || n < 0) {
		kc_warn("%s=%s is not a non-negative number; using the default %s", name, v, k->def);
		return strtoll(k->def, NULL, 0);
	}
	return n;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

void kcoll_knobs_print(FILE *f, int json)
{
	size_t n = sizeof(knobs) / sizeof(knobs[0]);

	if (json)
		fputs("[", f);
	for (size_t i = 0; i < n; i++) {
		const char *v = getenv(knobs[i].name);
		int set = v && *v;

		if (json) {
			fprintf(f, "%s{\"name\":", i ? "," : "");
			json_str(f, knobs[i].name);
			fputs(",\"value\":", f);
			json_str(f, kcoll_knob_str(knobs[i].name));
			fputs(",\"default\":", f);
			json_str(f, knobs[i].def);
			fprintf(f, ",\"set\":%s,\"doc\":", set ? "true" : "false");
			json_str(f, knobs[i].doc);
			fputs("}", f);
		} else {
			fprintf(f, "%-18s %-24s %s%s\n", knobs[i].name, kcoll_knob_str(knobs[i].name),
				knobs[i].doc, set ? " [set]" : "");
		}
	}
	if (json)
		fputs("]\n", f);
}

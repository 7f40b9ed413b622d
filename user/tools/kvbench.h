/* SPDX-License-Identifier: MIT */
/*
 * What kcoll-kvbench's files share (kcoll-kvbench.c: main, the options, the
 * target and the initiator; kvbench_tcp.c: the raw TCP anchor;
 * kvbench_batch.c: the options' values and the batches every mode moves).
 * They call each other in that direction only.
 */
#ifndef KCOLL_KVBENCH_H
#define KCOLL_KVBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcoll/kcoll.h>

#define MAX_BLOCKS	16
#define MAX_THREADS	64

enum mode { MODE_LOCAL, MODE_TARGET, MODE_INITIATOR, MODE_TCP_SINK, MODE_TCP_SOURCE };
/* tcp modes' buffers: anonymous (the default), a memfd MAP_SHARED like
 * kcoll_mem_alloc's; either one 2 MiB aligned with its whole 2 MiB pages
 * collapsed into huge pages (MADV_COLLAPSE) */
enum { TCP_MEM_ANON, TCP_MEM_MEMFD, TCP_MEM_ANON_HUGE, TCP_MEM_MEMFD_HUGE };
static const char *const kvb_tcp_mem_names[] = { "anon", "memfd", "anon-huge", "memfd-huge" };
#define TCP_MAX_STREAMS	16

/* The options, as parsed (kcoll-kvbench.c); kvbench_batch.c holds the defaults. */
struct kvb_opts {
	enum mode mode;
	const char *desc_path;
	const char *addr;	/* tcp modes: HOST:PORT */
	size_t blocks[MAX_BLOCKS];
	int nblocks;
	uint32_t batch;
	int threads;
	double duration;
	bool read;
	bool many_to_one;
	int depth;
	size_t seg_bytes;
	bool shm;
	int tcp_mem;		/* tcp modes: TCP_MEM_* */
	bool anchor;
	bool json;
};

extern struct kvb_opts kvb_opt;

/* kvbench_batch.c */
double kvb_now_s(void);
/* Distinct batches cycled through, so that the blocks sweep the segments
 * (DRAM, not cache) for the transfer and the memcpy anchor alike. */
uint32_t kvb_nbatches(size_t block, uint32_t batch);
/* batch random distinct slots of block bytes in a segment of seg bytes */
void kvb_make_entries(struct kcoll_xfer_entry *e, uint32_t n, size_t block, size_t seg,
		      uint64_t seed);

/* kvbench_tcp.c: the tcp-sink and tcp-source modes; the exit status. */
int kvb_tcp_sink(void);
int kvb_tcp_source(void);

#endif /* KCOLL_KVBENCH_H */

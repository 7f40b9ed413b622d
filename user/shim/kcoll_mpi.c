/* SPDX-License-Identifier: MIT */
/*
 * libkcoll_mpi.so: an LD_PRELOAD (PMPI) shim that hands an unmodified MPI
 * program's large collectives to kcolld.
 *
 *	LD_PRELOAD=build/lib/libkcoll_mpi.so mpirun -np 4 ./app
 *
 * Rules (docs/shim.md has the reasoning):
 *  - A call goes to kcoll only when its arguments say so on every rank alike:
 *    a predefined datatype (and op) kcoll has, a message of at least
 *    KCOLL_MPI_MIN_BYTES, an intracommunicator of two or more ranks. Nothing
 *    local (daemon reachable, buffer kind) enters that decision, so every
 *    rank of a communicator takes the same path for the same call.
 *  - MPI_Init connects to kcolld and the ranks agree over MPI_COMM_WORLD
 *    (one PMPI_Allreduce) on the threshold and on whether every rank could
 *    connect; unless all could, the whole job stays on PMPI.
 *  - The kcoll communicator of an MPI communicator is made on its first such
 *    call, collectively: rank 0 makes the id (PMPI_Bcast shares it), and
 *    PMPI_Allreduces settle that every rank got and joined it, else the
 *    communicator stays on PMPI for good. It hangs off the MPI communicator
 *    as an attribute, so MPI_Comm_free (or MPI_Finalize) destroys it,
 *    whichever call created the MPI communicator.
 *  - After each kcoll operation the ranks agree on its outcome (PMPI_Allreduce
 *    of one int). If any rank failed, the communicator goes back to PMPI for
 *    good and the call is redone there when its input is intact (every case
 *    but in-place all-reduce / reduce-scatter, which return MPI_ERR_OTHER
 *    through the communicator's error handler).
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <kcoll/kcoll.h>

#define KCOLL_MPI_EXPORT __attribute__((visibility("default")))
/* Measured break-even with Open MPI's shared-memory all-reduce on the 2-core
 * test VM (docs/perf/shim.md section 5): 16 MiB. Set it lower on larger
 * hosts. */
#define KCOLL_MPI_DEFAULT_MIN_BYTES (16 * 1024 * 1024)
/* Largest element kcoll moves: 8 bytes in reductions, 32 (MPI's largest
 * predefined type without holes, long double complex) in all-gather and
 * broadcast. Bounds the cheap "count x this < threshold" test that sends a
 * small call to PMPI before any type is looked at (docs/shim.md). */
#define KCOLL_MPI_REDUCE_ELEM_MAX 8
#define KCOLL_MPI_PLAIN_ELEM_MAX 32

enum kcoll_mpi_call {
	KCOLL_MPI_ALLREDUCE,
	KCOLL_MPI_REDUCE_SCATTER_BLOCK,
	KCOLL_MPI_ALLGATHER,
	KCOLL_MPI_BCAST,
	KCOLL_MPI_BARRIER,
	/* counted and always passed to PMPI (docs/shim.md says why) */
	KCOLL_MPI_IALLREDUCE,
	KCOLL_MPI_IREDUCE_SCATTER_BLOCK,
	KCOLL_MPI_IALLGATHER,
	KCOLL_MPI_IBCAST,
	KCOLL_MPI_IBARRIER,
	KCOLL_MPI_COMM_DUP,
	KCOLL_MPI_COMM_SPLIT,
	KCOLL_MPI_COMM_CREATE,
	KCOLL_MPI_COMM_FREE,
	/* "kcoll": memory from kcoll_mem_alloc (zero copy for kcolld) */
	KCOLL_MPI_ALLOC_MEM,
	KCOLL_MPI_FREE_MEM,
	KCOLL_MPI_NCALLS
};

static const char *const kcoll_mpi_call_names[KCOLL_MPI_NCALLS] = {
	"MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Bcast", "MPI_Barrier",
	"MPI_Iallreduce", "MPI_Ireduce_scatter_block", "MPI_Iallgather", "MPI_Ibcast",
	"MPI_Ibarrier", "MPI_Comm_dup", "MPI_Comm_split", "MPI_Comm_create", "MPI_Comm_free",
	"MPI_Alloc_mem", "MPI_Free_mem",
};

/* Per MPI communicator, as the value of attribute kcoll_mpi.keyval. */
struct kcoll_mpi_comm {
	struct kcoll_comm *kc;	/* NULL: this communicator stays on PMPI */
	int rank;
	int size;
};

static struct {
	int keyval;		/* MPI_KEYVAL_INVALID until MPI_Init */
	size_t min_bytes;
	int debug;		/* 0 off, 1 summary at MPI_Finalize, 2 also every call */
	bool disabled;		/* KCOLL_MPI_DISABLE=1: pass everything through */
	struct kcoll *k;	/* NULL: disabled */
	atomic_bool logged;
	atomic_ulong count[KCOLL_MPI_NCALLS][2];	/* [call][0 PMPI, 1 kcoll] */
	atomic_ulong fallbacks;
	atomic_long mem_live;	/* MPI_Alloc_mem blocks from kcoll not yet freed */
} kcoll_mpi = {
	.keyval = MPI_KEYVAL_INVALID,
};

/* The one line the shim prints when something makes it step aside. */
static void kcoll_mpi_log_once(const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (atomic_exchange(&kcoll_mpi.logged, true) && kcoll_mpi.debug == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* one write: lines of several ranks sharing a terminal stay whole */
	fprintf(stderr, "kcoll_mpi: %s\n", line);
}

static long long kcoll_mpi_env_ll(const char *name, long long def, long long min)
{
	const char *s = getenv(name);
	char *end;
	long long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoll(s, &end, 0);
	if (*end == 'K' || *end == 'k')
		v *= 1024, end++;
	else if (*end == 'M' || *end == 'm')
		v *= 1024 * 1024, end++;
	if (errno || *end || v < min) {
		fprintf(stderr, "kcoll_mpi: ignoring %s=%s (want an integer >= %lld)\n", name, s,
			min);
		return def;
	}
	return v;
}

/*
 * Counts feed only the KCOLL_MPI_DEBUG summary, so without it nothing is
 * counted: a locked add per call is measurable on a small message
 * (docs/perf/shim.md section 5).
 */
static inline void kcoll_mpi_count(enum kcoll_mpi_call call, bool kcoll, MPI_Comm comm,
				   size_t bytes)
{
	if (__builtin_expect(kcoll_mpi.debug == 0, 1))
		return;
	atomic_fetch_add_explicit(&kcoll_mpi.count[call][kcoll], 1, memory_order_relaxed);
	if (kcoll_mpi.debug >= 2) {
		int rank = -1;

		if (comm != MPI_COMM_NULL)
			PMPI_Comm_rank(comm, &rank);
		fprintf(stderr, "kcoll_mpi: comm rank %d: %s %zu bytes -> %s\n", rank,
			kcoll_mpi_call_names[call], bytes, kcoll ? "kcoll" : "PMPI");
	}
}

static int kcoll_mpi_comm_delete(MPI_Comm comm, int keyval, void *attr, void *extra)
{
	struct kcoll_mpi_comm *c = attr;

	if (c->kc)
		kcoll_comm_destroy(c->kc);
	free(c);
	return MPI_SUCCESS;
}

/*
 * At MPI_Init: read the knobs, connect, and agree over MPI_COMM_WORLD, so
 * that a knob set differently on some ranks or a daemon missing on some host
 * cannot make ranks decide differently later: every rank takes the largest
 * threshold, and unless every rank could connect (and none has
 * KCOLL_MPI_DISABLE=1) the whole job stays on PMPI.
 */
static void kcoll_mpi_setup(void)
{
	/* MAX over ranks: -(lowest failing rank), threshold, disable */
	long long agree[3];
	int rank = 0, err = 0;

	kcoll_mpi.disabled = kcoll_mpi_env_ll("KCOLL_MPI_DISABLE", 0, 0) != 0;
	kcoll_mpi.min_bytes = kcoll_mpi_env_ll("KCOLL_MPI_MIN_BYTES", KCOLL_MPI_DEFAULT_MIN_BYTES, 1);
	kcoll_mpi.debug = (int)kcoll_mpi_env_ll("KCOLL_MPI_DEBUG", 0, 0);
	if (PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, kcoll_mpi_comm_delete,
				    &kcoll_mpi.keyval, NULL) != MPI_SUCCESS)
		kcoll_mpi.keyval = MPI_KEYVAL_INVALID;
	if (!kcoll_mpi.disabled && kcoll_mpi.keyval != MPI_KEYVAL_INVALID)
		err = kcoll_connect(NULL, &kcoll_mpi.k);
	PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
	agree[0] = err ? -(long long)rank : -(long long)INT_MAX;
	agree[1] = (long long)kcoll_mpi.min_bytes;
	agree[2] = kcoll_mpi.disabled || kcoll_mpi.keyval == MPI_KEYVAL_INVALID;
	PMPI_Allreduce(MPI_IN_PLACE, agree, 3, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
	kcoll_mpi.min_bytes = (size_t)agree[1];
	if (agree[0] != -(long long)INT_MAX && -agree[0] == rank)
		kcoll_mpi_log_once("cannot connect to kcolld (%s) on rank %d; every collective goes "
				   "to MPI", kcoll_strerror(err), rank);
	if (agree[0] != -(long long)INT_MAX || agree[2]) {
		kcoll_mpi.disabled = true;
		if (kcoll_mpi.k)
			kcoll_disconnect(kcoll_mpi.k);
		kcoll_mpi.k = NULL;
	}
}

KCOLL_MPI_EXPORT int MPI_Init(int *argc, char ***argv)
{
	int r = PMPI_Init(argc, argv);

	if (r == MPI_SUCCESS)
		kcoll_mpi_setup();
	return r;
}

KCOLL_MPI_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	int r = PMPI_Init_thread(argc, argv, required, provided);

	if (r == MPI_SUCCESS)
		kcoll_mpi_setup();
	return r;
}

static void kcoll_mpi_print_summary(void)
{
	int rank = -1;
	char line[1024];
	size_t len = 0;

	PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
	len += snprintf(line + len, sizeof(line) - len, "kcoll_mpi: rank %d:", rank);
	for (int i = 0; i < KCOLL_MPI_NCALLS && len < sizeof(line); i++)
		len += snprintf(line + len, sizeof(line) - len, " %s kcoll %lu pmpi %lu;",
				kcoll_mpi_call_names[i] + 4, atomic_load(&kcoll_mpi.count[i][1]),
				atomic_load(&kcoll_mpi.count[i][0]));
	if (len < sizeof(line))
		snprintf(line + len, sizeof(line) - len, " fallbacks %lu (min bytes %zu)",
			 atomic_load(&kcoll_mpi.fallbacks), kcoll_mpi.min_bytes);
	fprintf(stderr, "%s\n", line);
}

KCOLL_MPI_EXPORT int MPI_Finalize(void)
{
	if (kcoll_mpi.keyval != MPI_KEYVAL_INVALID) {
		/* Destroy our communicators while MPI still works; the rest were
		 * freed by the program or die with the connection. */
		void *attr;
		int found = 0;

		if (PMPI_Comm_get_attr(MPI_COMM_WORLD, kcoll_mpi.keyval, &attr, &found) ==
			    MPI_SUCCESS && found)
			PMPI_Comm_delete_attr(MPI_COMM_WORLD, kcoll_mpi.keyval);
		PMPI_Comm_free_keyval(&kcoll_mpi.keyval);
	}
	if (kcoll_mpi.debug)
		kcoll_mpi_print_summary();
	/* Disconnecting unmaps every kcoll_mem_alloc block: while the program
	 * still holds one from MPI_Alloc_mem, keep the connection (it ends
	 * with the process). */
	kcoll_mpi.disabled = true;
	if (kcoll_mpi.k && atomic_load(&kcoll_mpi.mem_live) == 0) {
		kcoll_disconnect(kcoll_mpi.k);
		kcoll_mpi.k = NULL;
	}
	return PMPI_Finalize();
}

/*
 * Make comm's kcoll communicator, collectively. Every step whose outcome may
 * differ between ranks ends in an agreement, so all ranks leave with a
 * communicator or all without one.
 */
static struct kcoll_mpi_comm *kcoll_mpi_comm_make(MPI_Comm comm)
{
	struct kcoll_mpi_comm *c = calloc(1, sizeof(*c));
	kcoll_unique_id_t id = { 0 };
	int ok, all_ok = 0, first_bad, err = 0;
	const char *what = "";

	/* A rank out of memory would be the one rank to step aside here:
	 * the agreement below needs everyone, so it aborts instead. */
	if (!c) {
		fprintf(stderr, "kcoll_mpi: out of memory\n");
		PMPI_Abort(comm, 1);
		return NULL;
	}
	PMPI_Comm_rank(comm, &c->rank);
	PMPI_Comm_size(comm, &c->size);
	ok = 1;
	if (c->rank == 0) {
		err = kcoll_get_unique_id(kcoll_mpi.k, &id);
		ok = err == 0;
		what = "cannot get a communicator id from kcolld";
	}
	first_bad = ok ? INT_MAX : c->rank;
	PMPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, comm);
	if (first_bad != INT_MAX)
		goto out;
	PMPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
	err = kcoll_comm_init_rank(kcoll_mpi.k, &id, c->size, c->rank, &c->kc);
	what = "cannot join the kcoll communicator";
	ok = err == 0;
	first_bad = ok ? INT_MAX : c->rank;
	PMPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, comm);
	if (first_bad == INT_MAX) {
		all_ok = 1;
		goto out;
	}
	if (c->kc) {
		kcoll_comm_destroy(c->kc);
		c->kc = NULL;
	}
out:
	/* One line for the whole job: from the lowest rank that failed. */
	if (!all_ok && c->rank == first_bad)
		kcoll_mpi_log_once("%s (%s) at comm rank %d of %d; using MPI for this communicator",
				   what, kcoll_strerror(err), c->rank, c->size);
	if (!all_ok)
		atomic_fetch_add(&kcoll_mpi.fallbacks, 1);
	if (PMPI_Comm_set_attr(comm, kcoll_mpi.keyval, c) != MPI_SUCCESS) {
		/* Cannot happen with a valid keyval; stay on PMPI. Collectively
		 * so: this communicator then asks again next time, everywhere. */
		kcoll_mpi_comm_delete(comm, kcoll_mpi.keyval, c, NULL);
		return NULL;
	}
	return c;
}

/* comm's kcoll communicator, made on first use; NULL: use PMPI. Called only
 * where every rank of comm calls it (the decision so far is collective). */
static struct kcoll_mpi_comm *kcoll_mpi_comm_get(MPI_Comm comm)
{
	struct kcoll_mpi_comm *c;
	int found = 0, inter = 0;

	if (kcoll_mpi.disabled || comm == MPI_COMM_NULL)
		return NULL;
	if (PMPI_Comm_get_attr(comm, kcoll_mpi.keyval, &c, &found) != MPI_SUCCESS)
		return NULL;
	if (!found) {
		int size = 0;

		if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
			return NULL;
		if (PMPI_Comm_size(comm, &size) != MPI_SUCCESS || size < 2)
			return NULL;
		c = kcoll_mpi_comm_make(comm);
	}
	return c && c->kc ? c : NULL;
}

/*
 * After an operation: do all ranks agree it worked? If not, the communicator
 * leaves kcoll for good (on every rank: they all see the same verdict).
 * Returns 0, or the (first) error to report.
 */
static int kcoll_mpi_agree(struct kcoll_mpi_comm *c, MPI_Comm comm, int err,
			   enum kcoll_mpi_call call)
{
	int bad = err ? 1 : 0;

	PMPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
	if (!bad)
		return 0;
	if (err)
		kcoll_mpi_log_once("%s failed on comm rank %d (%s); this communicator goes back to MPI",
				   kcoll_mpi_call_names[call], c->rank, kcoll_strerror(err));
	kcoll_comm_destroy(c->kc);
	c->kc = NULL;
	atomic_fetch_add(&kcoll_mpi.fallbacks, 1);
	return err ? err : -ECANCELED;
}

static int kcoll_mpi_wait(int err, struct kcoll_req *req)
{
	return err ? err : kcoll_wait(req, -1);
}

/* The kcoll type of a predefined MPI type used in a reduction, or -1. */
static int kcoll_mpi_reduce_dtype(MPI_Datatype t)
{
	if (t == MPI_FLOAT)
		return KCOLL_F32;
	if (t == MPI_DOUBLE)
		return KCOLL_F64;
	if (t == MPI_INT || t == MPI_INT32_T)
		return KCOLL_I32;
	if (t == MPI_UNSIGNED || t == MPI_UINT32_T)
		return KCOLL_U32;
	if (t == MPI_INT8_T || t == MPI_SIGNED_CHAR)
		return KCOLL_I8;
	if (t == MPI_UINT8_T || t == MPI_UNSIGNED_CHAR)
		return KCOLL_U8;
	if (t == MPI_INT64_T || t == MPI_LONG_LONG || t == MPI_LONG_LONG_INT)
		return KCOLL_I64;
	if (t == MPI_UINT64_T || t == MPI_UNSIGNED_LONG_LONG)
		return KCOLL_U64;
	if (t == MPI_LONG)
		return sizeof(long) == 8 ? KCOLL_I64 : KCOLL_I32;
	if (t == MPI_UNSIGNED_LONG)
		return sizeof(long) == 8 ? KCOLL_U64 : KCOLL_U32;
	return -1;
}

static int kcoll_mpi_redop(MPI_Op op)
{
	if (op == MPI_SUM)
		return KCOLL_SUM;
	if (op == MPI_PROD)
		return KCOLL_PROD;
	if (op == MPI_MIN)
		return KCOLL_MIN;
	if (op == MPI_MAX)
		return KCOLL_MAX;
	return -1;
}

/*
 * Bytes per element of a predefined type without holes (moved as bytes by
 * all-gather and broadcast), or 0. Predefined only: ranks may pass different
 * types with one signature (MPI_INT here, MPI_INT32_T there); those still
 * decide alike, a derived type on one rank and a predefined one on another
 * would not.
 */
static size_t kcoll_mpi_plain_size(MPI_Datatype t)
{
	int ni, na, nd, combiner, size;
	MPI_Aint lb, extent, tlb, textent;

	if (t == MPI_DATATYPE_NULL ||
	    PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner) != MPI_SUCCESS ||
	    combiner != MPI_COMBINER_NAMED || PMPI_Type_size(t, &size) != MPI_SUCCESS ||
	    PMPI_Type_get_extent(t, &lb, &extent) != MPI_SUCCESS ||
	    PMPI_Type_get_true_extent(t, &tlb, &textent) != MPI_SUCCESS)
		return 0;
	if (size <= 0 || size > KCOLL_MPI_PLAIN_ELEM_MAX || lb != 0 || tlb != 0 || extent != size ||
	    textent != size)
		return 0;
	return (size_t)size;
}

/* The kcoll dtype/op for a reduction of count x t, or false (then PMPI). */
static bool kcoll_mpi_reduce_ok(int count, MPI_Datatype t, MPI_Op op, size_t nblocks, int *dtype,
				int *redop)
{
	*dtype = kcoll_mpi_reduce_dtype(t);
	*redop = kcoll_mpi_redop(op);
	if (*dtype < 0 || *redop < 0 || count <= 0)
		return false;
	return (size_t)count * nblocks * kcoll_dtype_size(*dtype) >= kcoll_mpi.min_bytes;
}

static __attribute__((noinline)) int kcoll_mpi_allreduce(const void *sendbuf, void *recvbuf,
							 int count, MPI_Datatype datatype,
							 MPI_Op op, MPI_Comm comm)
{
	enum kcoll_mpi_call call = KCOLL_MPI_ALLREDUCE;
	struct kcoll_mpi_comm *c = NULL;
	struct kcoll_req *req = NULL;
	bool inplace = sendbuf == MPI_IN_PLACE;
	int dtype, redop, err;

	/* below the threshold for any type: straight to PMPI */
	if ((size_t)count * KCOLL_MPI_REDUCE_ELEM_MAX >= kcoll_mpi.min_bytes &&
	    kcoll_mpi_reduce_ok(count, datatype, op, 1, &dtype, &redop))
		c = kcoll_mpi_comm_get(comm);
	if (c) {
		err = kcoll_allreduce(c->kc, inplace ? recvbuf : sendbuf, recvbuf, count, dtype,
				      redop, &req);
		err = kcoll_mpi_agree(c, comm, kcoll_mpi_wait(err, req), call);
		if (!err) {
			kcoll_mpi_count(call, true, comm, count * kcoll_dtype_size(dtype));
			return MPI_SUCCESS;
		}
		if (inplace)
			return PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER), MPI_ERR_OTHER;
	}
	kcoll_mpi_count(call, false, comm, 0);
	return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

/*
 * The exported wrappers of all-reduce and broadcast are this small on
 * purpose: a call below the threshold for any type (and no KCOLL_MPI_DEBUG)
 * costs one compare and a tail jump to PMPI (shim_check overhead measures
 * it; docs/perf/shim.md section 5).
 */
KCOLL_MPI_EXPORT int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count,
				   MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
{
	if (__builtin_expect((size_t)count * KCOLL_MPI_REDUCE_ELEM_MAX < kcoll_mpi.min_bytes &&
			     kcoll_mpi.debug == 0, 1))
		return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
	return kcoll_mpi_allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

/*
 * MPI's in place reduce-scatter reads the whole vector from recvbuf and puts
 * this rank's block at its start; kcoll's puts it at block 'rank' of the
 * vector, so it is moved down afterwards.
 */
KCOLL_MPI_EXPORT int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
					      MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
{
	enum kcoll_mpi_call call = KCOLL_MPI_REDUCE_SCATTER_BLOCK;
	struct kcoll_mpi_comm *c = NULL;
	struct kcoll_req *req = NULL;
	bool inplace = sendbuf == MPI_IN_PLACE;
	int dtype, redop, size = 0, err;

	if (recvcount > 0 && !kcoll_mpi.disabled)
		PMPI_Comm_size(comm, &size);
	if (size > 0 && (size_t)recvcount * size * KCOLL_MPI_REDUCE_ELEM_MAX >= kcoll_mpi.min_bytes &&
	    kcoll_mpi_reduce_ok(recvcount, datatype, op, size, &dtype, &redop))
		c = kcoll_mpi_comm_get(comm);
	if (c) {
		size_t block = (size_t)recvcount * kcoll_dtype_size(dtype);
		char *dst = inplace ? (char *)recvbuf + c->rank * block : recvbuf;

		err = kcoll_reduce_scatter(c->kc, inplace ? recvbuf : sendbuf, dst, recvcount,
					   dtype, redop, &req);
		err = kcoll_mpi_agree(c, comm, kcoll_mpi_wait(err, req), call);
		if (!err) {
			if (dst != recvbuf)
				memmove(recvbuf, dst, block);
			kcoll_mpi_count(call, true, comm, block * size);
			return MPI_SUCCESS;
		}
		if (inplace)
			return PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER), MPI_ERR_OTHER;
	}
	kcoll_mpi_count(call, false, comm, 0);
	return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
}

/*
 * All-gather moves bytes. The decision uses the receive side, which every rank
 * passes (the send side is ignored in place). A failed kcoll all-gather is
 * always redone: the input is sendbuf, or in place this rank's own block,
 * which kcoll only ever rewrites with the same bytes.
 */
KCOLL_MPI_EXPORT int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
				   void *recvbuf, int recvcount, MPI_Datatype recvtype,
				   MPI_Comm comm)
{
	enum kcoll_mpi_call call = KCOLL_MPI_ALLGATHER;
	struct kcoll_mpi_comm *c = NULL;
	struct kcoll_req *req = NULL;
	bool inplace = sendbuf == MPI_IN_PLACE;
	size_t block = 0;
	int size = 0, err;

	if (recvcount > 0 && !kcoll_mpi.disabled)
		PMPI_Comm_size(comm, &size);
	/* the type is looked at only when the call may be large enough */
	if (size > 0 && (size_t)recvcount * size * KCOLL_MPI_PLAIN_ELEM_MAX >= kcoll_mpi.min_bytes)
		block = kcoll_mpi_plain_size(recvtype) * (size_t)recvcount;
	if (block && block * size >= kcoll_mpi.min_bytes &&
	    (inplace || kcoll_mpi_plain_size(sendtype) * (size_t)(sendcount > 0 ? sendcount : 0) == block))
		c = kcoll_mpi_comm_get(comm);
	if (c) {
		const void *src = inplace ? (char *)recvbuf + c->rank * block : sendbuf;

		err = kcoll_allgather(c->kc, src, recvbuf, block, KCOLL_U8, &req);
		err = kcoll_mpi_agree(c, comm, kcoll_mpi_wait(err, req), call);
		if (!err) {
			kcoll_mpi_count(call, true, comm, block * size);
			return MPI_SUCCESS;
		}
	}
	kcoll_mpi_count(call, false, comm, 0);
	return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

/* The root's buffer is only read, so a failed kcoll broadcast is redone. */
static __attribute__((noinline)) int kcoll_mpi_bcast(void *buffer, int count,
						     MPI_Datatype datatype, int root,
						     MPI_Comm comm)
{
	enum kcoll_mpi_call call = KCOLL_MPI_BCAST;
	struct kcoll_mpi_comm *c = NULL;
	struct kcoll_req *req = NULL;
	size_t bytes = 0;
	int err;

	/* the type is looked at only when the call may be large enough */
	if (count > 0 && (size_t)count * KCOLL_MPI_PLAIN_ELEM_MAX >= kcoll_mpi.min_bytes)
		bytes = kcoll_mpi_plain_size(datatype) * (size_t)count;
	if (bytes && bytes >= kcoll_mpi.min_bytes)
		c = kcoll_mpi_comm_get(comm);
	if (c && root >= 0 && root < c->size) {
		err = kcoll_broadcast(c->kc, buffer, bytes, KCOLL_U8, root, &req);
		err = kcoll_mpi_agree(c, comm, kcoll_mpi_wait(err, req), call);
		if (!err) {
			kcoll_mpi_count(call, true, comm, bytes);
			return MPI_SUCCESS;
		}
	}
	kcoll_mpi_count(call, false, comm, 0);
	return PMPI_Bcast(buffer, count, datatype, root, comm);
}

KCOLL_MPI_EXPORT int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root,
			       MPI_Comm comm)
{
	if (__builtin_expect((size_t)count * KCOLL_MPI_PLAIN_ELEM_MAX < kcoll_mpi.min_bytes &&
			     kcoll_mpi.debug == 0, 1))
		return PMPI_Bcast(buffer, count, datatype, root, comm);
	return kcoll_mpi_bcast(buffer, count, datatype, root, comm);
}

/*
 * Counted, then always PMPI: a barrier has no size to weigh, MPI's
 * shared-memory barrier beats a round trip through the daemon, and a kcoll
 * barrier would need the outcome agreement (a PMPI_Allreduce, itself a
 * barrier) after it.
 */
KCOLL_MPI_EXPORT int MPI_Barrier(MPI_Comm comm)
{
	kcoll_mpi_count(KCOLL_MPI_BARRIER, false, comm, 0);
	return PMPI_Barrier(comm);
}

/*
 * The non-blocking forms stay on PMPI (counted for KCOLL_MPI_DEBUG). A kcoll
 * operation needs the ranks to agree on its outcome before any of them may
 * fall back, and that agreement is a collective: run inside MPI_Wait/Test it
 * would be started in completion order, which MPI lets differ between ranks
 * (rank 0 waits on A then B, rank 1 on B then A), and deadlock. Without it, a
 * kcolld failure could not fall back safely. docs/shim.md has the details.
 */
KCOLL_MPI_EXPORT int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count,
				    MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
				    MPI_Request *request)
{
	kcoll_mpi_count(KCOLL_MPI_IALLREDUCE, false, comm, 0);
	return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
}

KCOLL_MPI_EXPORT int MPI_Ireduce_scatter_block(const void *sendbuf, void *recvbuf,
					       int recvcount, MPI_Datatype datatype, MPI_Op op,
					       MPI_Comm comm, MPI_Request *request)
{
	kcoll_mpi_count(KCOLL_MPI_IREDUCE_SCATTER_BLOCK, false, comm, 0);
	return PMPI_Ireduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm,
					  request);
}

KCOLL_MPI_EXPORT int MPI_Iallgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
				    void *recvbuf, int recvcount, MPI_Datatype recvtype,
				    MPI_Comm comm, MPI_Request *request)
{
	kcoll_mpi_count(KCOLL_MPI_IALLGATHER, false, comm, 0);
	return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
			       request);
}

KCOLL_MPI_EXPORT int MPI_Ibcast(void *buffer, int count, MPI_Datatype datatype, int root,
				MPI_Comm comm, MPI_Request *request)
{
	kcoll_mpi_count(KCOLL_MPI_IBCAST, false, comm, 0);
	return PMPI_Ibcast(buffer, count, datatype, root, comm, request);
}

KCOLL_MPI_EXPORT int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request)
{
	kcoll_mpi_count(KCOLL_MPI_IBARRIER, false, comm, 0);
	return PMPI_Ibarrier(comm, request);
}

/*
 * Communicators: counted for KCOLL_MPI_DEBUG, then PMPI. The kcoll
 * communicator is made on first use and destroyed by the attribute's delete
 * callback, which also covers the calls not wrapped here (split_type, cart,
 * create_group, disconnect...).
 */
KCOLL_MPI_EXPORT int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm)
{
	kcoll_mpi_count(KCOLL_MPI_COMM_DUP, false, comm, 0);
	return PMPI_Comm_dup(comm, newcomm);
}

KCOLL_MPI_EXPORT int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm)
{
	kcoll_mpi_count(KCOLL_MPI_COMM_SPLIT, false, comm, 0);
	return PMPI_Comm_split(comm, color, key, newcomm);
}

KCOLL_MPI_EXPORT int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm *newcomm)
{
	kcoll_mpi_count(KCOLL_MPI_COMM_CREATE, false, comm, 0);
	return PMPI_Comm_create(comm, group, newcomm);
}

KCOLL_MPI_EXPORT int MPI_Comm_free(MPI_Comm *comm)
{
	kcoll_mpi_count(KCOLL_MPI_COMM_FREE, false, comm ? *comm : MPI_COMM_NULL, 0);
	return PMPI_Comm_free(comm);
}

/*
 * MPI_Alloc_mem hands out kcolld-shared memory (kcoll_mem_alloc: a memfd the
 * daemon maps too), so collectives on it skip the one process_vm copy that
 * malloc'ed buffers take. Only blocks of at least KCOLL_MPI_MIN_BYTES (a
 * smaller one never carries a collective that goes to kcoll); otherwise, or
 * when kcoll cannot, MPI's own. The choice is local: a buffer's kind never
 * enters the routing decision, so ranks may differ here.
 */
KCOLL_MPI_EXPORT int MPI_Alloc_mem(MPI_Aint size, MPI_Info info, void *baseptr)
{
	void *p = NULL;

	if (!kcoll_mpi.disabled && kcoll_mpi.k && baseptr && size > 0 &&
	    (size_t)size >= kcoll_mpi.min_bytes &&
	    kcoll_mem_alloc(kcoll_mpi.k, (size_t)size, &p) == 0) {
		atomic_fetch_add(&kcoll_mpi.mem_live, 1);
		memcpy(baseptr, &p, sizeof(p));
		kcoll_mpi_count(KCOLL_MPI_ALLOC_MEM, true, MPI_COMM_NULL, (size_t)size);
		return MPI_SUCCESS;
	}
	kcoll_mpi_count(KCOLL_MPI_ALLOC_MEM, false, MPI_COMM_NULL, size > 0 ? (size_t)size : 0);
	return PMPI_Alloc_mem(size, info, baseptr);
}

/* A block kcoll does not know (-ENOENT) is MPI's. */
KCOLL_MPI_EXPORT int MPI_Free_mem(void *base)
{
	if (kcoll_mpi.k && base && kcoll_mem_free(kcoll_mpi.k, base) != -ENOENT) {
		atomic_fetch_sub(&kcoll_mpi.mem_live, 1);
		kcoll_mpi_count(KCOLL_MPI_FREE_MEM, true, MPI_COMM_NULL, 0);
		return MPI_SUCCESS;
	}
	kcoll_mpi_count(KCOLL_MPI_FREE_MEM, false, MPI_COMM_NULL, 0);
	return PMPI_Free_mem(base);
}

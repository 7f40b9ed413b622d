// SPDX-License-Identifier: MIT
/*
 * gloo-allreduce-bench: the Gloo anchor for kcoll-bench and mpi-coll-bench.
 * Gloo's ring all-reduce (gloo::allreduce, algorithm RING: reduce-scatter then
 * all-gather round the ring, 1 MiB segments, as PyTorch's Gloo backend runs
 * it) over Gloo's TCP device. Same sweep options, nccl-tests style table and
 * --json schema as the other benchmarks (bench_common).
 *
 * One process per host, each told its rank; they meet through a FileStore, a
 * directory every process can see (one filesystem across network namespaces):
 *
 *	gloo-allreduce-bench allreduce -N 4 --rank R --store DIR --host ADDR \
 *		-b 1K -e 256M -f 4 --json
 *
 * Each iteration is one blocking all-reduce; time = slowest rank's mean after
 * a barrier. Gloo has no f16/bf16 reductions here and no average.
 */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <memory>
#include <string>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "bench_common.h"

namespace {

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

enum { OPT_RANK = BENCH_OPT_PROG, OPT_STORE, OPT_PREFIX, OPT_HOST, OPT_IFACE, OPT_TIMEOUT,
       OPT_ALGO };

struct GlooOpts {
	struct bench_opts b;
	int rank = -1;
	std::string store, prefix = "gloo-allreduce-bench", host, iface;
	int timeout_s = 120;
	gloo::AllreduceOptions::Algorithm algo = gloo::AllreduceOptions::Algorithm::RING;
};

struct bench_prog prog;

void usage(FILE *f)
{
	fprintf(f,
"usage: %s allreduce -N N --rank R --store DIR [--host ADDR | --iface IF] [options]\n"
"  -N, --nranks N        processes in the job (one per host)\n"
"      --rank R          this process's rank, 0..N-1\n"
"      --store DIR       FileStore rendezvous directory, shared by all ranks\n"
"      --prefix P        key prefix in the store: unique per run  [gloo-allreduce-bench]\n"
"      --host ADDR       bind Gloo's TCP device to this address\n"
"      --iface IF        ... or to this interface's address       [the hostname's]\n"
"      --algo ring|bcube gloo::allreduce algorithm                 [ring]\n"
"      --timeout S       rendezvous and per-operation timeout     [120]\n"
BENCH_USAGE_SWEEP
"  -d, --datatype T      f32 f64 i8 u8 i32 u32 i64 u64            [f32]\n"
"  -o, --op OP           sum prod min max                         [sum]\n"
"      --inplace         also measure in place (extra columns)\n"
"      --json            print one JSON document instead of the table\n"
"  -h, --help            this text\n",
		prog.name);
}

const struct option longopts[] = {
	BENCH_LONGOPTS,
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "store", required_argument, NULL, OPT_STORE },
	{ "prefix", required_argument, NULL, OPT_PREFIX },
	{ "host", required_argument, NULL, OPT_HOST },
	{ "iface", required_argument, NULL, OPT_IFACE },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "algo", required_argument, NULL, OPT_ALGO },
	{ 0, 0, 0, 0 }
};

bool dtype_ok(enum bench_dtype t)
{
	return t != BENCH_F16 && t != BENCH_BF16;
}

void parse_opt(const struct bench_prog *p, void *ctx, struct bench_opts *o, int c,
	       const char *arg)
{
	GlooOpts *g = static_cast<GlooOpts *>(ctx);

	switch (c) {
	case 'N': o->nranks = bench_parse_long(p, arg, "-N", 1, 4096); break;
	case 'd':
		if (bench_dtype_parse(arg, &o->dtype) || !dtype_ok(o->dtype))
			bench_usage_error(p, "datatype '%s' is not one this benchmark has", arg);
		break;
	case 'o':
		if (bench_op_parse(arg, &o->op) || o->op == BENCH_AVG)
			bench_usage_error(p, "reduction op '%s' is not one Gloo has", arg);
		break;
	case 'r': bench_usage_error(p, "-r: all-reduce has no root");
	case OPT_RANK: g->rank = bench_parse_long(p, arg, "--rank", 0, INT_MAX); break;
	case OPT_STORE: g->store = arg; break;
	case OPT_PREFIX: g->prefix = arg; break;
	case OPT_HOST: g->host = arg; break;
	case OPT_IFACE: g->iface = arg; break;
	case OPT_TIMEOUT: g->timeout_s = bench_parse_long(p, arg, "--timeout", 1, 86400); break;
	case OPT_ALGO:
		if (!strcmp(arg, "ring"))
			g->algo = gloo::AllreduceOptions::Algorithm::RING;
		else if (!strcmp(arg, "bcube"))
			g->algo = gloo::AllreduceOptions::Algorithm::BCUBE;
		else
			bench_usage_error(p, "--algo '%s': ring or bcube", arg);
		break;
	}
}

void parse_args(int argc, char **argv, GlooOpts *g)
{
	struct bench_opts *o = &g->b;

	bench_opts_init(o, 0);
	bench_parse_args(&prog, argc, argv, o, g);
	if (o->coll != BENCH_ALLREDUCE)
		bench_usage_error(&prog, "only allreduce: Gloo's ring all-reduce is what this measures");
	if (o->nranks < 1)
		bench_usage_error(&prog, "-N: how many processes are in the job?");
	if (g->rank < 0 || g->rank >= o->nranks)
		bench_usage_error(&prog, "--rank must be in [0, %d)", o->nranks);
	if (g->store.empty())
		bench_usage_error(&prog, "--store DIR: a directory every rank can see");
	if (!g->host.empty() && !g->iface.empty())
		bench_usage_error(&prog, "--host or --iface, not both");
	if (o->check && o->nranks > BENCH_MAX_CHECK_RANKS)
		bench_usage_error(&prog, "-c 1 supports at most %d ranks; use -c 0",
				  BENCH_MAX_CHECK_RANKS);
}

template <typename T>
ReduceFn reduce_fn(enum bench_op op)
{
	switch (op) {
	case BENCH_PROD: return &gloo::product<T>;
	case BENCH_MIN: return &gloo::min<T>;
	case BENCH_MAX: return &gloo::max<T>;
	default: return &gloo::sum<T>;
	}
}

// One all-reduce of n elements of T; in place when send is NULL.
template <typename T>
void allreduce_typed(const std::shared_ptr<gloo::Context> &ctx, const GlooOpts &g, uint32_t tag,
		     void *send, void *recv, size_t n)
{
	gloo::AllreduceOptions opts(ctx);

	if (send)
		opts.setInput(static_cast<T *>(send), n);
	opts.setOutput(static_cast<T *>(recv), n);
	opts.setReduceFunction(reduce_fn<T>(g.b.op));
	opts.setAlgorithm(g.algo);
	opts.setTag(tag);
	gloo::allreduce(opts);
}

class Runner {
public:
	Runner(std::shared_ptr<gloo::Context> ctx, const GlooOpts &g) : ctx_(std::move(ctx)), g_(g) {}

	void allreduce(void *send, void *recv, size_t n)
	{
		switch (g_.b.dtype) {
		case BENCH_F64: allreduce_typed<double>(ctx_, g_, tag_++, send, recv, n); break;
		case BENCH_I8: allreduce_typed<int8_t>(ctx_, g_, tag_++, send, recv, n); break;
		case BENCH_U8: allreduce_typed<uint8_t>(ctx_, g_, tag_++, send, recv, n); break;
		case BENCH_I32: allreduce_typed<int32_t>(ctx_, g_, tag_++, send, recv, n); break;
		case BENCH_U32: allreduce_typed<uint32_t>(ctx_, g_, tag_++, send, recv, n); break;
		case BENCH_I64: allreduce_typed<int64_t>(ctx_, g_, tag_++, send, recv, n); break;
		case BENCH_U64: allreduce_typed<uint64_t>(ctx_, g_, tag_++, send, recv, n); break;
		default: allreduce_typed<float>(ctx_, g_, tag_++, send, recv, n); break;
		}
	}

	// Every rank's value combined with fn; the job's answer on every rank.
	template <typename T>
	T combine(T v, ReduceFn fn)
	{
		gloo::AllreduceOptions opts(ctx_);

		opts.setOutput(&v, 1);
		opts.setReduceFunction(fn);
		opts.setTag(tag_++);
		gloo::allreduce(opts);
		return v;
	}

	void barrier()
	{
		gloo::BarrierOptions opts(ctx_);

		opts.setTag(tag_++);
		gloo::barrier(opts);
	}

	// One column at one size on every rank; the row's figures on every rank.
	void measure(void *send, void *recv, bool inplace, const struct bench_counts *n,
		     struct bench_row *row)
	{
		const struct bench_opts *o = &g_.b;
		long long wrong = -1;
		double mean;

		if (o->check) {
			bench_check_prepare(o, g_.rank, send, recv, inplace, n);
			allreduce(inplace ? NULL : send, recv, n->param);
			wrong = combine<int64_t>(bench_check_result(o, g_.rank, recv, n),
						 &gloo::sum<int64_t>);
		}
		for (int i = 0; i < o->warmup; i++)
			allreduce(inplace ? NULL : send, recv, n->param);
		barrier();
		auto t0 = std::chrono::steady_clock::now();
		for (int i = 0; i < o->iters; i++)
			allreduce(inplace ? NULL : send, recv, n->param);
		std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
		mean = combine<double>(dt.count() / o->iters, &gloo::max<double>);
		bench_row_set(o, row, inplace, mean, wrong);
	}

private:
	std::shared_ptr<gloo::Context> ctx_;
	const GlooOpts &g_;
	uint32_t tag_ = 1;
};

std::shared_ptr<gloo::Context> connect(const GlooOpts &g)
{
	gloo::transport::tcp::attr attr;
	struct stat st;

	// Every rank may get here first: whoever does makes the directory.
	if (mkdir(g.store.c_str(), 0700) && errno != EEXIST)
		throw std::runtime_error("--store " + g.store + ": " + strerror(errno));
	if (stat(g.store.c_str(), &st) || !S_ISDIR(st.st_mode))
		throw std::runtime_error("--store " + g.store + " is not a directory");

	if (!g.host.empty())
		attr.hostname = g.host;
	else if (!g.iface.empty())
		attr.iface = g.iface;
	else
		attr.hostname = "";	// Gloo then resolves this host's name
	auto dev = gloo::transport::tcp::CreateDevice(attr);
	auto file = gloo::rendezvous::FileStore(g.store);
	auto store = gloo::rendezvous::PrefixStore(g.prefix, file);
	auto ctx = std::make_shared<gloo::rendezvous::Context>(g.rank, g.b.nranks);
	ctx->setTimeout(std::chrono::seconds(g.timeout_s));
	ctx->connectFullMesh(store, dev);
	return ctx;
}

int run(int argc, char **argv)
{
	GlooOpts g;
	const struct bench_opts *o = &g.b;
	struct bench_env env = {};
	struct bench_counts n;
	char host[256] = "unknown", about[600], version[64];
	std::string where;
	long long wrong;
	void *send, *recv;
	size_t elt, alloc;
	int nrows;

	prog.name = "gloo-allreduce-bench";
	prog.usage = usage;
	prog.shortopts = BENCH_SHORTOPTS;
	prog.longopts = longopts;
	prog.parse_opt = parse_opt;
	parse_args(argc, argv, &g);
	gethostname(host, sizeof(host) - 1);
	snprintf(version, sizeof(version), "Gloo %d.%d.%d tcp %s", GLOO_VERSION_MAJOR,
		 GLOO_VERSION_MINOR, GLOO_VERSION_PATCH,
		 g.algo == gloo::AllreduceOptions::Algorithm::RING ? "ring" : "bcube");
	env.tool = prog.name;
	env.system = "gloo";
	env.version = version;
	env.mem = "host";
	env.host = host;

	auto ctx = connect(g);
	Runner run(ctx, g);
	// From here on every rank has the same options: only rank 0 prints.
	prog.quiet = g.rank != 0;

	nrows = bench_count_rows(o);
	std::unique_ptr<struct bench_row[]> rows(new struct bench_row[nrows]());
	elt = bench_dtype_size(o->dtype);
	bench_counts(o, o->max_bytes, &n);
	alloc = (n.bytes + 4095) & ~(size_t)4095;
	send = aligned_alloc(4096, alloc);
	recv = aligned_alloc(4096, alloc);
	if (!send || !recv) {
		fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", prog.name, g.rank,
			n.bytes);
		free(send);
		free(recv);
		return 1;
	}
	bench_fill_input(o, send, g.rank, n.bytes / elt);
	bench_fill_input(o, recv, g.rank, n.bytes / elt);
	where = ctx->getDevice()->str();
	if (g.rank == 0 && !o->json) {
		snprintf(about, sizeof(about), "%s on %s, device %s", version, host, where.c_str());
		bench_print_header(o, &env, about);
	}

	size_t bytes = o->min_bytes;
	for (int k = 0; k < nrows; k++, bytes *= o->factor) {
		bench_counts(o, bytes, &n);
		rows[k].bytes = n.bytes;
		rows[k].count = n.param;
		for (int ip = 0; ip <= (int)o->inplace; ip++)
			run.measure(send, recv, ip, &n, &rows[k]);
		if (g.rank == 0 && !o->json)
			bench_print_row(o, &rows[k]);
	}
	wrong = bench_wrong_total(o, rows.get(), nrows);
	if (g.rank == 0) {
		if (o->json)
			bench_print_json(o, &env, rows.get(), nrows, true);
		else
			bench_print_footer(o, rows.get(), nrows);
		if (wrong)
			fprintf(stderr, "%s: %lld wrong elements\n", prog.name, wrong);
	}
	// No rank leaves (closing its pairs) while another is still in the last call.
	run.barrier();
	free(send);
	free(recv);
	return wrong ? 1 : 0;
}

} // namespace

int main(int argc, char **argv)
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		fprintf(stderr, "gloo-allreduce-bench: %s\n", e.what());
		return 1;
	}
}

// SPDX-License-Identifier: MIT
/*
 * The GPU room. Without a GPU (here, CI):
 *  - CUDA error -> errno conversion, the arch and path choices;
 *  - the GPU's element semantics (gpu/reduce_core.h, the code the kernels
 *    run) on the host, bit for bit against kcoll_reduce_ref, and its f16/bf16
 *    conversions against user/common's;
 *  - the loader against missing and wrong libraries and a fake CUDA driver
 *    ($(TBIN)/fixtures/libcuda-fake.so) over a fake sysfs;
 *  - the doctor's text and JSON, and kcoll-gpu-doctor's exit status.
 * With a GPU, additionally the kernels against kcoll_reduce_ref for every
 * dtype x op; without one each of those prints "ok N # SKIP no GPU: <why>".
 *
 * One program of about 1400 lines, on purpose: the themes share three
 * fixtures, each used across them: the element fill and comparison (the
 * host semantics and the GPU kernels), the fake driver over a fake sysfs
 * (the loader, context and IPC cases) and the JSON checker (the loader and
 * the doctor). Split by theme, each program would need all three.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kcoll/tap.h"
#include "reduce.h"

#include "cuda_abi.h"
#include "fake_cuda.h"
#include "kcoll_gpu.h"
#include "reduce_core.h"
#include "test_util.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

TEST_CUDA_SAN_DEFAULTS

static const char *const dtype_names[] = {
	"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64",
};
static const char *const op_names[] = { "sum", "prod", "min", "max", "avg" };

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static char exe_dir[PATH_MAX - 64];	/* room for the names appended to it */

static void find_exe_dir(void)
{
	ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof(exe_dir) - 1);
	char *slash;

	exe_dir[n > 0 ? n : 0] = '\0';
	slash = strrchr(exe_dir, '/');
	if (slash)
		*slash = '\0';
}

/* ---- a small JSON checker -------------------------------------------------- */

static const char *j_ws(const char *s)
{
	while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
		s++;
	return s;
}

static const char *j_string(const char *s)
{
	if (*s++ != '"')
		return NULL;
	for (; *s != '"'; s++) {
		if (!*s || (unsigned char)*s < 0x20)
			return NULL;
		if (*s != '\\')
			continue;
		s++;
		if (*s == 'u') {
			for (int i = 1; i <= 4; i++)
				if (!strchr("0123456789abcdefABCDEF", s[i]) || !s[i])
					return NULL;
			s += 4;
		} else if (!*s || !strchr("\"\\/bfnrt", *s)) {
			return NULL;
		}
	}
	return s + 1;
}

static const char *j_digits(const char *s)
{
	const char *start = s;

	while (*s >= '0' && *s <= '9')
		s++;
	return s > start ? s : NULL;
}

static const char *j_number(const char *s)
{
	if (*s == '-')
		s++;
	if (*s == '0')
		s++;
	else if (!(s = j_digits(s)))
		return NULL;
	if (*s == '.' && !(s = j_digits(s + 1)))
		return NULL;
	if (*s == 'e' || *s == 'E') {
		s++;
		if (*s == '+' || *s == '-')
			s++;
		s = j_digits(s);
	}
	return s;
}

/* The end of the JSON value at s, or NULL if it is not valid JSON. */
static const char *j_value(const char *s, int depth)
{
	char close;

	s = j_ws(s);
	if (depth > 32)
		return NULL;
	switch (*s) {
	case '{':
	case '[':
		close = *s == '{' ? '}' : ']';
		s = j_ws(s + 1);
		if (*s == close)
			return s + 1;
		for (;;) {
			if (close == '}') {
				s = j_string(j_ws(s));
				if (!s)
					return NULL;
				s = j_ws(s);
				if (*s++ != ':')
					return NULL;
			}
			s = j_value(s, depth + 1);
			if (!s)
				return NULL;
			s = j_ws(s);
			if (*s == close)
				return s + 1;
			if (*s++ != ',')
				return NULL;
		}
	case '"':
		return j_string(s);
	case 't':
		return strncmp(s, "true", 4) ? NULL : s + 4;
	case 'f':
		return strncmp(s, "false", 5) ? NULL : s + 5;
	case 'n':
		return strncmp(s, "null", 4) ? NULL : s + 4;
	default:
		return j_number(s);
	}
}

static int json_valid(const char *doc)
{
	const char *end = j_value(doc, 0);

	return end && !*j_ws(end);
}

/* Member key of the (valid) object at obj: its raw text in val, 0 or -1. */
static int json_get(const char *obj, const char *key, char *val, size_t len)
{
	const char *s = j_ws(obj);

	if (!s || *s != '{')
		return -1;
	s = j_ws(s + 1);
	while (*s == '"') {
		const char *k = s + 1, *kend = j_string(s), *v, *vend;

		v = j_ws(j_ws(kend) + 1);
		vend = j_value(v, 0);
		if ((size_t)(kend - 1 - k) == strlen(key) && !strncmp(k, key, strlen(key))) {
			snprintf(val, len, "%.*s", (int)(vend - v), v);
			return 0;
		}
		s = j_ws(vend);
		if (*s == ',')
			s = j_ws(s + 1);
	}
	return -1;
}

static int json_is(const char *obj, const char *key, const char *want)
{
	char v[4096];

	if (json_get(obj, key, v, sizeof(v))) {
		tap_diag("JSON has no \"%s\"", key);
		return 0;
	}
	if (strcmp(v, want)) {
		tap_diag("\"%s\" is %s, expected %s", key, v, want);
		return 0;
	}
	return 1;
}

/* The value of key, which must be an object, copied into sub. */
static int json_sub(const char *obj, const char *key, char *sub, size_t len)
{
	return json_get(obj, key, sub, len) == 0 && sub[0] == '{';
}

static void test_json_checker(void)
{
	static const char *const good[] = {
		"{}", "[]", "{\"a\":[1,-2.5e3,true,false,null,\"x\\\"\\u00e9\"]}", " 0 ",
	};
	static const char *const bad[] = {
		"{", "{\"a\"}", "[1,]", "{\"a\":1,}", "\"\x01\"", "01", "tru", "{} x", "\"\\q\"",
	};
	int ok = 1;

	for (size_t i = 0; i < ARRAY_SIZE(good); i++)
		ok &= json_valid(good[i]);
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		ok &= !json_valid(bad[i]);
	tap_ok(ok, "the test's JSON checker accepts valid and refuses broken documents");
}

/* ---- CUDA errors, archs, paths --------------------------------------------- */

static void test_errno(void)
{
	static const struct {
		int cuda, want;
		const char *what;
	} cases[] = {
		{ KCOLL_CUDA_SUCCESS, 0, "success" },
		{ KCOLL_CUDA_INVALID_VALUE, -EINVAL, "invalid value" },
		{ KCOLL_CUDA_OUT_OF_MEMORY, -ENOMEM, "out of memory" },
		{ KCOLL_CUDA_NO_DEVICE, -ENODEV, "no device" },
		{ KCOLL_CUDA_STUB_LIBRARY, -ENODEV, "stub library" },
		{ KCOLL_CUDA_INSUFFICIENT_DRIVER, -EOPNOTSUPP, "insufficient driver (runtime)" },
		{ KCOLL_CUDA_NOT_SUPPORTED, -EOPNOTSUPP, "not supported" },
		{ KCOLL_CUDA_NO_BINARY_FOR_GPU, -ENOEXEC, "no kernel image" },
		{ KCOLL_CUDA_INVALID_DEVICE_FUNCTION, -ENOEXEC, "invalid device function (runtime)" },
		{ KCOLL_CUDA_ILLEGAL_ADDRESS, -EFAULT, "illegal address" },
		{ KCOLL_CUDA_LAUNCH_TIMEOUT, -ETIMEDOUT, "launch timeout" },
		{ KCOLL_CUDA_NOT_READY, -EAGAIN, "not ready" },
		{ KCOLL_CUDA_DEINITIALIZED, -ESHUTDOWN, "deinitialized" },
		{ KCOLL_CUDA_LAUNCH_FAILED, -EIO, "launch failed" },
		{ 12345, -EIO, "an unknown code" },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int got = kcoll_cuda_errno(cases[i].cuda);

		tap_ok(got == cases[i].want, "CUDA error %d (%s) -> %d (got %d)", cases[i].cuda,
		       cases[i].what, cases[i].want, got);
	}
}

static void test_archs(void)
{
	static const struct {
		const char *archs;
		int major, minor, want;
	} cases[] = {
		{ "sm_80 sm_90 compute_90", 8, 0, 1 },	/* A100: sm_80 */
		{ "sm_80 sm_90 compute_90", 8, 6, 1 },	/* sm_80 runs on 8.6 */
		{ "sm_80 sm_90 compute_90", 8, 9, 1 },
		{ "sm_80 sm_90 compute_90", 9, 0, 1 },
		{ "sm_80 sm_90 compute_90", 10, 0, 1 },	/* JIT from compute_90 */
		{ "sm_80 sm_90 compute_90", 12, 0, 1 },
		{ "sm_80 sm_90 compute_90", 7, 5, 0 },	/* T4: nothing */
		{ "sm_80 sm_90", 10, 0, 0 },		/* no PTX, no future */
		{ "sm_90a", 9, 0, 1 },
		{ "sm_90a", 10, 0, 0 },			/* arch-specific: that device only */
		{ "sm_86", 8, 0, 0 },			/* SASS never runs on a lower minor */
		{ "", 9, 0, 0 },
	};
	int ok = 1;

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		int got = kcoll_gpu_arch_runs(cases[i].archs, cases[i].major, cases[i].minor);

		if (got != cases[i].want) {
			tap_diag("\"%s\" on %d.%d: %d, expected %d", cases[i].archs,
				 cases[i].major, cases[i].minor, got, cases[i].want);
			ok = 0;
		}
	}
	tap_ok(ok, "which compute capabilities a set of -gencode images runs on (%zu cases)",
	       ARRAY_SIZE(cases));
}

static void test_paths(void)
{
	static const struct {
		struct kcoll_gpu_path_facts f;
		enum kcoll_gpu_path want;
		const char *reason, *fix;	/* substrings; "" = must be empty */
	} cases[] = {
		{ { 1, 1, 1, 1, 0 }, KCOLL_GPU_PATH_STAGING, "no RDMA device", "RDMA NIC" },
		{ { 1, 1, 0, 1, 2 }, KCOLL_GPU_PATH_DMABUF, "", "" },
		{ { 0, 1, 1, 1, 1 }, KCOLL_GPU_PATH_PEERMEM, "DMA_BUF_SUPPORTED = 0", "nvidia-open" },
		{ { 1, 1, 1, 0, 1 }, KCOLL_GPU_PATH_PEERMEM, "older than 5.12", "Linux 5.12" },
		{ { 0, 1, 0, 1, 1 }, KCOLL_GPU_PATH_STAGING, "nvidia_peermem is not loaded",
		  "modprobe nvidia-peermem" },
		{ { 0, 0, 1, 1, 1 }, KCOLL_GPU_PATH_STAGING, "GPU_DIRECT_RDMA_SUPPORTED = 0",
		  "data-center GPU" },
		{ { -1, -1, 0, 1, 1 }, KCOLL_GPU_PATH_STAGING, "predates", "current NVIDIA driver" },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		char reason[KCOLL_GPU_TEXT], fix[KCOLL_GPU_TEXT];
		enum kcoll_gpu_path p = kcoll_gpu_pick_path(&cases[i].f, reason, sizeof(reason), fix,
							   sizeof(fix));
		int ok = p == cases[i].want;

		ok &= cases[i].reason[0] ? !!strstr(reason, cases[i].reason) : !reason[0];
		ok &= cases[i].fix[0] ? !!strstr(fix, cases[i].fix) : !fix[0];
		if (!ok)
			tap_diag("got %s, reason \"%s\", fix \"%s\"", kcoll_gpu_path_name(p), reason,
				 fix);
		tap_ok(ok, "path: dmabuf %d gdr %d peermem %d kernel %d rdma %d -> %s",
		       cases[i].f.dmabuf, cases[i].f.gdr, cases[i].f.peermem,
		       cases[i].f.kernel_dmabuf, cases[i].f.rdma_devices,
		       kcoll_gpu_path_name(cases[i].want));
	}
}

/* ---- the element semantics, on the host ------------------------------------ */

#define HOST_COUNT 1029	/* not a multiple of any vector width */
#define MAX_NIN 70	/* more than KCOLL_GPU_INLINE_INPUTS */

/* Random bits, with the special values of the type sprinkled in. */
static void fill(enum kcoll_dtype dt, void *buf, size_t count)
{
	static const uint32_t f32_special[] = {
		0x7fc00000, 0x7f800001, 0xffc12345, 0x7f800000, 0xff800000, 0x80000000, 0x00000001,
		0x80000003, 0x7f7fffff, 0x00800000, 0x3f800000, 0x477fe000, 0x477ff000,
	};
	static const uint16_t h_special[] = {
		0x7e00, 0x7c01, 0xfd55, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x03ff, 0x7bff, 0x3c00,
	};
	static const uint64_t f64_special[] = {
		0x7ff8000000000000ull, 0x7ff0000000000001ull, 0x7ff0000000000000ull,
		0x8000000000000000ull, 0x0000000000000001ull, 0x7fefffffffffffffull,
	};
	static const uint64_t int_special[] = {
		0, 1, ~0ull, 0x7f, 0x80, 0x7fffffff, 0x80000000, 0x7fffffffffffffffull,
		0x8000000000000000ull,
	};
	size_t size = kcoll_core_size(dt);

	for (size_t i = 0; i < count; i++) {
		uint64_t r = rnd(), v = r;
		int special = (r >> 60) == 0;	/* one in 16 */

		if (dt == KCOLL_F32 && special)
			v = f32_special[r % ARRAY_SIZE(f32_special)];
		else if (dt == KCOLL_F32 && (r >> 59) & 1)	/* a moderate value */
			v = kcoll_core_f32_bits((float)((int64_t)(r % 20001) - 10000) / 64.0f);
		else if ((dt == KCOLL_F16 || dt == KCOLL_BF16) && special)
			v = h_special[r % ARRAY_SIZE(h_special)];
		else if (dt == KCOLL_F64 && special)
			v = f64_special[r % ARRAY_SIZE(f64_special)];
		else if (dt == KCOLL_F64 && (r >> 59) & 1) {
			double d = (double)((int64_t)(r % 2000001) - 1000000) / 1024.0;

			memcpy(&v, &d, sizeof(v));
		} else if (special)
			v = int_special[r % ARRAY_SIZE(int_special)];
		memcpy((char *)buf + i * size, &v, size);	/* little-endian low bytes */
	}
}

static uint64_t elem_bits(const void *p, size_t i, size_t size)
{
	uint64_t v = 0;

	memcpy(&v, (const char *)p + i * size, size);
	return v;
}

/*
 * Bit for bit, except NaN payloads where sum/prod/avg computed a NaN on both
 * sides (tests/test_reduce.c's rule): which NaN wins is not specified. A
 * compiler may commute a + b and x86 returns the first operand's NaN; the
 * GPU returns its canonical NaN. min/max only select: exact always.
 */
static int same_elem(int dt, int op, const void *a, const void *b, size_t i)
{
	size_t size = kcoll_core_size(dt);
	uint64_t x = elem_bits(a, i, size), y = elem_bits(b, i, size);
	int arith = op == KCOLL_SUM || op == KCOLL_PROD || op == KCOLL_AVG;

	if (x == y)
		return 1;
	if (!arith)
		return 0;
	switch (dt) {
	case KCOLL_F32:
		return (x & 0x7fffffff) > 0x7f800000 && (y & 0x7fffffff) > 0x7f800000;
	case KCOLL_F64:
		return (x & ~(1ull << 63)) > 0x7ff0000000000000ull &&
		       (y & ~(1ull << 63)) > 0x7ff0000000000000ull;
	case KCOLL_F16:
		return (x & 0x7fff) > 0x7c00 && (y & 0x7fff) > 0x7c00;
	case KCOLL_BF16:
		return (x & 0x7fff) > 0x7f80 && (y & 0x7fff) > 0x7f80;
	default:
		return 0;
	}
}

static int first_diff(int dt, int op, const void *a, const void *b, size_t count, size_t *at)
{
	for (size_t i = 0; i < count; i++) {
		if (!same_elem(dt, op, a, b, i)) {
			*at = i;
			return 1;
		}
	}
	return 0;
}

static void test_conversions(void)
{
	int ok = 1;

	for (uint32_t h = 0; h < 0x10000 && ok; h++) {
		float a = kcoll_core_f16_to_f32((uint16_t)h), b = kcoll_f16_to_f32((unsigned short)h);
		float c = kcoll_core_bf16_to_f32((uint16_t)h), d = kcoll_bf16_to_f32((unsigned short)h);

		ok = kcoll_core_f32_bits(a) == kcoll_core_f32_bits(b) &&
		     kcoll_core_f32_bits(c) == kcoll_core_f32_bits(d);
		if (!ok)
			tap_diag("16-bit pattern 0x%04x widens differently", h);
	}
	tap_ok(ok, "GPU f16/bf16 -> f32 equals kcoll_f16/bf16_to_f32 for all 65536 patterns");

	ok = 1;
	/* a stride that is odd and prime walks every exponent and low bits */
	for (uint64_t x = 0; x < (1ull << 32) && ok; x += 4093) {
		float f = kcoll_core_bits_f32((uint32_t)x);

		ok = kcoll_core_f32_to_f16(f) == kcoll_f32_to_f16(f) &&
		     kcoll_core_f32_to_bf16(f) == kcoll_f32_to_bf16(f);
		if (!ok)
			tap_diag("f32 0x%08x narrows differently", (uint32_t)x);
	}
	tap_ok(ok, "GPU f32 -> f16/bf16 equals kcoll_f32_to_f16/bf16 on 1M patterns");
}

static void core_reduce(int dt, int op, void *out, const void *const *in, unsigned int nin,
			size_t count)
{
	for (size_t i = 0; i < count; i++)
		kcoll_core_reduce_elem(dt, op, out, in, nin, i);
}

static void test_core_vs_ref(void)
{
	static const unsigned int nins[] = { 1, 2, 3, 5, MAX_NIN };
	size_t bytes = HOST_COUNT * 8;
	char *inbuf = malloc(MAX_NIN * bytes), *ref = malloc(bytes), *got = malloc(bytes);
	const void *in[MAX_NIN];

	for (int dt = 0; dt < KCOLL_DTYPE_MAX; dt++) {
		size_t size = kcoll_core_size(dt);

		for (int op = 0; op < KCOLL_REDOP_MAX; op++) {
			int ok = 1;

			for (size_t n = 0; n < ARRAY_SIZE(nins) && ok; n++) {
				unsigned int nin = nins[n];
				size_t at;

				for (unsigned int k = 0; k < nin; k++) {
					in[k] = inbuf + k * bytes;
					fill(dt, inbuf + k * bytes, HOST_COUNT);
				}
				kcoll_reduce_ref(dt, op, ref, in, nin, HOST_COUNT);
				core_reduce(dt, op, got, in, nin, HOST_COUNT);
				if (first_diff(dt, op, ref, got, HOST_COUNT, &at)) {
					tap_diag("nin %u, element %zu: ref 0x%llx, core 0x%llx", nin, at,
						 (unsigned long long)elem_bits(ref, at, size),
						 (unsigned long long)elem_bits(got, at, size));
					ok = 0;
				}
			}
			if (ok) {	/* in place: out is in[0] */
				size_t at;

				fill(dt, inbuf, HOST_COUNT);
				fill(dt, inbuf + bytes, HOST_COUNT);
				in[0] = inbuf;
				in[1] = inbuf + bytes;
				kcoll_reduce_ref(dt, op, ref, in, 2, HOST_COUNT);
				core_reduce(dt, op, inbuf, in, 2, HOST_COUNT);
				ok = !first_diff(dt, op, ref, inbuf, HOST_COUNT, &at);
				if (!ok)
					tap_diag("in place, element %zu differs", at);
			}
			tap_ok(ok, "GPU semantics on the host: %s %s equals kcoll_reduce_ref (nin "
				   "1..%d, in place)",
			       dtype_names[dt], op_names[op], MAX_NIN);
		}
	}
	free(inbuf);
	free(ref);
	free(got);
}

/* ---- the loader ---------------------------------------------------------- */

static int has(const char *s, const char *sub)
{
	if (strstr(s, sub))
		return 1;
	tap_diag("\"%s\" lacks \"%s\"", s, sub);
	return 0;
}

static void test_loader_missing(void)
{
	struct kcoll_gpu_config cfg = {
		.driver_lib = "/nonexistent/libcuda.so.1",
		.kernels_lib = "/nonexistent/libkcoll_gpu.so",
	};
	const struct kcoll_gpu_kernels *k;
	const struct kcoll_gpu_info *in;
	struct kcoll_gpu *g;
	int rc;

	rc = kcoll_gpu_open(&g, &cfg);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -ENODEV && in->rc == rc && !in->driver_loaded &&
		       has(in->why, "no CUDA driver: /nonexistent/libcuda.so.1") &&
		       has(in->fix, "install the NVIDIA driver") &&
		       kcoll_gpu_kernels(g, &k) == -ENODEV && !k,
	       "no driver library: -ENODEV, the dlopen error and a fix");
	tap_ok(!in->kernels_loaded && has(in->kernels_error, "/nonexistent/libkcoll_gpu.so"),
	       "no kernels library: its dlopen error is kept");
	kcoll_gpu_close(g);

	cfg.driver_lib = "libm.so.6";	/* a real library without the CUDA entry points */
	cfg.kernels_lib = "libm.so.6";
	rc = kcoll_gpu_open(&g, &cfg);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -EOPNOTSUPP && has(in->why, "CUDA driver too old") &&
		       has(in->why, "has no cuInit"),
	       "a driver library without cuInit: -EOPNOTSUPP, driver too old");
	tap_ok(!in->kernels_loaded && has(in->kernels_error, "not a kcoll GPU library"),
	       "a kernels library without the kcoll table is refused");
	kcoll_gpu_close(g);
}

struct fake_env {
	char fake[PATH_MAX];
	char sysfs[PATH_MAX];
	void (*set)(const struct kcoll_fake_cuda *);
	void *dl;
};

static struct kcoll_fake_cuda fake_defaults(void)
{
	struct kcoll_fake_cuda f = {
		.init_result = KCOLL_CUDA_SUCCESS,
		.driver_version = 13000,
		.ndev = 2,
		.cc_major = 9,
		.cc_minor = 0,
		.dmabuf = 1,
		.gdr = 1,
		.mem_bytes = 80ULL << 30,
		.kernels_version = KCOLL_GPU_KERNELS_VERSION,
		.min_driver_version = 13000,
		.archs = "sm_80 sm_90 compute_90",
	};

	return f;
}

static int mkdirs(const char *root, const char *rel)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		if (mkdir(path, 0755) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

static void rmdirs(const char *root, const char *rel)
{
	char path[PATH_MAX];
	char *slash;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	do {
		rmdir(path);
		slash = strrchr(path, '/');
		if (slash)
			*slash = '\0';
	} while (slash && strlen(path) > strlen(root));
}

static const char *const sysfs_dirs[] = { "module/nvidia_peermem", "class/infiniband/mlx5_0" };

static int fake_setup(struct fake_env *e)
{
	const char *tmp = getenv("KCOLL_TEST_TMP");
	void *sym;

	snprintf(e->fake, sizeof(e->fake), "%s/fixtures/libcuda-fake.so", exe_dir);
	e->dl = dlopen(e->fake, RTLD_NOW | RTLD_LOCAL);
	if (!e->dl)
		return -1;
	sym = dlsym(e->dl, "kcoll_fake_cuda_set");
	memcpy(&e->set, &sym, sizeof(sym));
	snprintf(e->sysfs, sizeof(e->sysfs), "%s/kcoll-gpu-sysfs.XXXXXX", tmp ? tmp : "/tmp");
	if (!e->set || !mkdtemp(e->sysfs))
		return -1;
	return 0;
}

/* The fake driver's device memory (shared memory) allocator and free. */
static void fake_mem_fns(const struct fake_env *e, void *(**dalloc)(size_t), void (**dfree)(void *))
{
	void *sym = dlsym(e->dl, "kcoll_fake_cuda_alloc");

	memcpy(dalloc, &sym, sizeof(sym));
	sym = dlsym(e->dl, "kcoll_fake_cuda_free");
	memcpy(dfree, &sym, sizeof(sym));
}

static void fake_teardown(struct fake_env *e)
{
	for (size_t i = 0; i < ARRAY_SIZE(sysfs_dirs); i++)
		rmdirs(e->sysfs, sysfs_dirs[i]);
	rmdir(e->sysfs);
	dlclose(e->dl);
}

/* Open the loader on the fake (driver and kernels) with fake sysfs state. */
static int fake_open(struct fake_env *e, const struct kcoll_fake_cuda *f, int peermem, int rdma,
		     const char *release, struct kcoll_gpu **g)
{
	struct kcoll_gpu_config cfg = {
		.driver_lib = e->fake,
		.kernels_lib = e->fake,
		.sysfs_root = e->sysfs,
		.kernel_release = release,
	};

	for (size_t i = 0; i < ARRAY_SIZE(sysfs_dirs); i++)
		rmdirs(e->sysfs, sysfs_dirs[i]);
	if (peermem)
		mkdirs(e->sysfs, sysfs_dirs[0]);
	if (rdma)
		mkdirs(e->sysfs, sysfs_dirs[1]);
	e->set(f);
	return kcoll_gpu_open(g, &cfg);
}

static char *doctor_to_string(int json, const struct kcoll_gpu_config *cfg, int *rc)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
	*rc = cfg ? kcoll_gpu_doctor_with(f, json, cfg) : kcoll_gpu_doctor(f, json);
	fclose(f);
	return buf;
}

static const char *const top_keys[] = {
	"kcoll_version", "usable", "status", "errno", "error", "reason", "fix", "driver",
	"runtime", "device_count", "usable_count", "devices", "peer_memory", "rdma_devices",
	"kernel", "device_buffers", "path", "path_reason", "path_fix",
};

static int json_has_keys(const char *doc)
{
	char v[8192];
	int ok = 1;

	for (size_t i = 0; i < ARRAY_SIZE(top_keys); i++) {
		if (json_get(doc, top_keys[i], v, sizeof(v))) {
			tap_diag("no \"%s\"", top_keys[i]);
			ok = 0;
		}
	}
	return ok;
}

#define N_FAKE_TESTS 13

static void test_loader_fake(void)
{
	struct kcoll_fake_cuda f = fake_defaults();
	const struct kcoll_gpu_kernels *k;
	const struct kcoll_gpu_info *in;
	struct kcoll_gpu *g;
	struct fake_env e;
	int rc;

	if (fake_setup(&e)) {
		for (int i = 0; i < N_FAKE_TESTS; i++)
			tap_skip("fake CUDA driver %s not loadable (make builds it with test_gpu)",
				 e.fake);
		return;
	}

	f.init_result = KCOLL_CUDA_NO_DEVICE;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -ENODEV && in->driver_loaded && has(in->why, "cuInit: CUDA_ERROR_NO_DEVICE"),
	       "cuInit without devices: -ENODEV naming CUDA_ERROR_NO_DEVICE");
	kcoll_gpu_close(g);

	f.init_result = KCOLL_CUDA_STUB_LIBRARY;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -ENODEV && has(in->why, "stub") && has(in->fix, "LD_LIBRARY_PATH"),
	       "the toolkit's stub libcuda: -ENODEV and how to get rid of it");
	kcoll_gpu_close(g);

	f.init_result = KCOLL_CUDA_SYSTEM_DRIVER_MISMATCH;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -ENODEV && has(in->fix, "reload the module"),
	       "libcuda and kernel module versions differ: -ENODEV, reload or reboot");
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.ndev = 0;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -ENODEV && has(in->why, "reports no device"), "zero devices: -ENODEV");
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.driver_version = 12080;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -EOPNOTSUPP && has(in->why, "supports CUDA 12.8") &&
		       has(in->why, "needs 13.0") && has(in->fix, "CUDA 13.0 or newer"),
	       "driver older than the kernels' runtime: -EOPNOTSUPP with both versions");
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.cc_major = 7;
	f.cc_minor = 5;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -EOPNOTSUPP && in->ndev == 2 && in->nusable == 0 &&
		       has(in->why, "compute capability 7.5") && has(in->fix, "GPU_ARCHS"),
	       "devices the kernels were not built for: -EOPNOTSUPP, rebuild with GPU_ARCHS");
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.kernels_version = KCOLL_GPU_KERNELS_VERSION + 1;
	rc = fake_open(&e, &f, 0, 0, NULL, &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == -EOPNOTSUPP && !in->kernels_loaded &&
		       has(in->kernels_error, "built by another kcoll") &&
		       has(in->why, "GPU present but libkcoll_gpu.so is not usable"),
	       "a kernels table of another version is refused: -EOPNOTSUPP");
	kcoll_gpu_close(g);

	f = fake_defaults();
	rc = fake_open(&e, &f, 0, 1, "6.8.0-generic", &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == 0 && in->nusable == 2 && in->path == KCOLL_GPU_PATH_DMABUF &&
		       in->driver_version == 13000 && in->dev[1].cc_major == 9 &&
		       !strcmp(in->dev[1].pci_bus_id, "0000:1a:00.0") &&
		       in->dev[0].mem_bytes == 80ULL << 30 && !strcmp(in->rdma, "mlx5_0") &&
		       kcoll_gpu_kernels(g, &k) == 0 && k && !in->path_reason[0],
	       "usable fake GPUs, RDMA NIC, dma-buf: rc 0, devices described, path dma-buf");
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.dmabuf = 0;
	rc = fake_open(&e, &f, 1, 1, "6.8.0", &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == 0 && in->nvidia_peermem && in->path == KCOLL_GPU_PATH_PEERMEM &&
		       has(in->path_reason, "DMA_BUF_SUPPORTED = 0"),
	       "no dma-buf, nvidia_peermem loaded: path peermem, with the reason");
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.dmabuf = -1;
	f.gdr = -1;
	rc = fake_open(&e, &f, 0, 1, "5.4.0", &g);
	in = kcoll_gpu_info(g);
	tap_ok(rc == 0 && !in->kernel_dmabuf && in->dev[0].dmabuf == -1 &&
		       in->path == KCOLL_GPU_PATH_STAGING && has(in->path_reason, "predates"),
	       "an old driver that knows neither attribute: host staging, unknowns kept as -1");
	kcoll_gpu_close(g);

	/* the doctor over the fake: JSON and text */
	{
		struct kcoll_gpu_config cfg = {
			.driver_lib = e.fake, .kernels_lib = e.fake, .sysfs_root = e.sysfs,
			.kernel_release = "6.8.0",
		};
		char sub[8192];
		char *doc, *text;
		int drc, trc;

		f = fake_defaults();
		f.dmabuf = 0;
		for (size_t i = 0; i < ARRAY_SIZE(sysfs_dirs); i++)
			rmdirs(e.sysfs, sysfs_dirs[i]);
		mkdirs(e.sysfs, sysfs_dirs[1]);
		e.set(&f);
		doc = doctor_to_string(1, &cfg, &drc);
		tap_ok(doc && drc == 0 && json_valid(doc) && json_has_keys(doc) &&
			       json_is(doc, "usable", "true") && json_is(doc, "errno", "0") &&
			       json_is(doc, "device_count", "2") &&
			       json_is(doc, "path", "\"host-staging\"") &&
			       json_is(doc, "rdma_devices", "[\"mlx5_0\"]") &&
			       json_sub(doc, "driver", sub, sizeof(sub)) &&
			       json_is(sub, "cuda", "\"13.0\"") &&
			       json_get(doc, "devices", sub, sizeof(sub)) == 0 &&
			       strstr(sub, "\"name\":\"Fake \\\"GPU\\\" 0\"") &&
			       strstr(sub, "\"dma_buf\":false") &&
			       json_is(doc, "device_buffers", "{\"ipc\":true,\"dmabuf_export\":true}"),
		       "doctor --json over fake GPUs: valid, every key, names escaped, values right");
		if (doc && !json_valid(doc))
			tap_diag("%s", doc);
		free(doc);

		text = doctor_to_string(0, &cfg, &trc);
		tap_ok(text && trc == 0 &&
			       !strncmp(text, "GPU: 2 of 2 devices usable, path host-staging\n", 46) &&
			       has(text, "device 1:") && has(text, "nvidia_peermem is not loaded") &&
			       has(text, "fix: modprobe nvidia-peermem") &&
			       has(text, "device bufs:  CUDA IPC yes, dma-buf export yes"),
		       "doctor text over fake GPUs: verdict first, devices, device buffers, why "
		       "and fix");
		free(text);

		f.init_result = KCOLL_CUDA_NO_DEVICE;
		e.set(&f);
		doc = doctor_to_string(1, &cfg, &drc);
		tap_ok(doc && drc == -ENODEV && json_valid(doc) && json_has_keys(doc) &&
			       json_is(doc, "usable", "false") && json_is(doc, "error", "\"ENODEV\"") &&
			       json_is(doc, "devices", "[]") && json_is(doc, "path", "\"none\""),
		       "doctor --json when cuInit finds no device: usable false, ENODEV");
		free(doc);
	}
	fake_teardown(&e);
}

/* Pointer queries and contexts (what libkcoll and kcolld ask), on the fake. */
#define N_PTR_TESTS 6

/*
 * The kernels table's streams, pinned memory, asynchronous copies and events
 * (what kcolld's staging uses): pinned -> d0 -> d1 -> pinned on one new
 * stream, an event after the last copy; the bytes must come back, the event
 * must be complete after its sync. 0, a negative errno, or 1 for wrong bytes.
 */
static int stream_roundtrip(const struct kcoll_gpu_kernels *k, void *d0, void *d1, size_t n)
{
	unsigned char *pin = NULL, *pin2 = NULL;
	void *st = NULL, *ev = NULL;
	int r = k->stream_create(&st);

	if (!r)
		r = k->event_create(&ev);
	if (!r)
		r = k->host_alloc((void **)&pin, n);
	if (!r)
		r = k->host_alloc((void **)&pin2, n);
	if (!r) {
		for (size_t i = 0; i < n; i++)
			pin[i] = (unsigned char)(i * 13 + 5);
		memset(pin2, 0, n);
		r = k->copy_async(d0, pin, n, st);
	}
	if (!r)
		r = k->copy_async(d1, d0, n, st);
	if (!r)
		r = k->copy_async(pin2, d1, n, st);
	if (!r)
		r = k->event_record(ev, st);
	if (!r)
		r = k->event_sync(ev);
	if (!r)
		r = k->event_query(ev);
	if (!r)
		r = k->stream_sync(st);
	if (!r && memcmp(pin, pin2, n))
		r = 1;
	if (r < 0)
		tap_diag("stream round trip: %d: %s", r, k->last_error());
	if (pin)
		k->host_free(pin);
	if (pin2)
		k->host_free(pin2);
	if (ev)
		k->event_destroy(ev);
	if (st)
		k->stream_destroy(st);
	return r;
}

static void test_ptr_ctx(void)
{
	struct kcoll_fake_cuda f = fake_defaults();
	struct kcoll_gpu_config none = { .driver_lib = "/nonexistent/libcuda.so.1" };
	char why[KCOLL_GPU_TEXT];
	void *(*dalloc)(size_t);
	void (*dfree)(void *);
	struct kcoll_gpu_ptr q, q2;
	struct kcoll_gpu *g = NULL;
	unsigned char *mem, *again;
	struct fake_env e;
	int rc, rc2, host = 0;
	long page = sysconf(_SC_PAGESIZE);

	if (fake_setup(&e)) {
		for (int i = 0; i < N_PTR_TESTS; i++)
			tap_skip("the fake CUDA fixture did not load: %s", dlerror());
		return;
	}
	fake_mem_fns(&e, &dalloc, &dfree);
	fake_open(&e, &f, 0, 1, "6.1.0", &g);
	mem = dalloc(4 * (size_t)page);
	rc = mem ? kcoll_gpu_ptr_query(g, mem + page + 8, &q, why, sizeof(why)) : -ENOMEM;
	tap_ok(rc == 0 && q.is_device && q.base == (uintptr_t)mem && q.size == 4ULL * page &&
		       q.dev == 0 && !strcmp(q.pci_bus_id, "0000:19:00.0"),
	       "pointer query: device memory, its allocation, device and PCI bus id (%d)", rc);
	rc2 = kcoll_gpu_ptr_query(g, &host, &q2, why, sizeof(why));
	tap_ok(rc2 == 0 && !q2.is_device, "pointer query: host memory is not device memory (%d)",
	       rc2);
	dfree(mem);
	again = dalloc(4 * (size_t)page);
	rc2 = again ? kcoll_gpu_ptr_query(g, again, &q2, why, sizeof(why)) : -ENOMEM;
	tap_ok(again == mem && rc2 == 0 && q2.is_device && q2.buffer_id != q.buffer_id,
	       "pointer query: an allocation at a freed one's address has a new buffer id "
	       "(%llu -> %llu)", q.buffer_id, q2.buffer_id);
	rc = kcoll_gpu_device_by_pci(g, "0000:19:00.0");
	rc2 = kcoll_gpu_device_by_pci(g, "0000:99:00.0");
	tap_ok(rc == 0 && rc2 == -ENODEV && kcoll_gpu_ctx_enter(g, 0, why, sizeof(why)) == 0 &&
		       kcoll_gpu_ctx_enter(g, 5, why, sizeof(why)) == -ENODEV,
	       "device by PCI bus id; primary context of device 0, -ENODEV for device 5 (%s)", why);
	{
		const struct kcoll_gpu_kernels *fk = dlsym(e.dl, KCOLL_GPU_KERNELS_SYMBOL);
		unsigned char *d1 = dalloc(4 * (size_t)page);

		rc = !fk || !d1 || !again ? -ENOMEM : fk->set_device(0);
		if (!rc)
			rc = stream_roundtrip(fk, again, d1, 4 * (size_t)page - 3);
		tap_ok(rc == 0, "fake kernels table: a stream, pinned memory, async copies host -> "
		       "device -> device -> host and an event, bytes back in order (%d)", rc);
		if (d1)
			dfree(d1);
	}
	dfree(again);
	kcoll_gpu_close(g);
	kcoll_gpu_open(&g, &none);
	rc = kcoll_gpu_ptr_query(g, &host, &q, why, sizeof(why));
	rc2 = kcoll_gpu_ctx_enter(g, 0, why, sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && rc2 == -EOPNOTSUPP && has(why, "no CUDA driver"),
	       "no driver: pointer query and context -EOPNOTSUPP with the reason (%s)", why);
	kcoll_gpu_close(g);
	fake_teardown(&e);
}

/* ---- this machine ---------------------------------------------------------- */

static int gpu_rc;
static char gpu_why[KCOLL_GPU_TEXT];

static void test_this_machine(void)
{
	char *doc, *text, sub[4096];
	float x = 0;
	const void *xin[1] = { &x };
	int drc, trc;

	gpu_rc = kcoll_gpu_available(gpu_why, sizeof(gpu_why));
	tap_ok(gpu_rc == 0 || ((gpu_rc == -ENODEV || gpu_rc == -EOPNOTSUPP) && gpu_why[0]),
	       "kcoll_gpu_available: %d%s%s", gpu_rc, gpu_rc ? ", " : "", gpu_why);

	doc = doctor_to_string(1, NULL, &drc);
	tap_ok(doc && drc == gpu_rc && json_valid(doc) && json_has_keys(doc) &&
		       json_is(doc, "usable", gpu_rc ? "false" : "true") &&
		       json_sub(doc, "driver", sub, sizeof(sub)) &&
		       json_sub(doc, "runtime", sub, sizeof(sub)) &&
		       json_sub(doc, "kernel", sub, sizeof(sub)),
	       "doctor --json here: valid JSON with every key, agreeing with kcoll_gpu_available");
	if (gpu_rc) {
		tap_ok(doc && json_is(doc, "path", "\"none\"") && json_is(doc, "usable_count", "0") &&
			       json_get(doc, "reason", sub, sizeof(sub)) == 0 && sub[0] == '"',
		       "doctor --json without a usable GPU: path none, a reason");
	} else {
		tap_ok(doc && json_is(doc, "reason", "null") &&
			       json_get(doc, "path", sub, sizeof(sub)) == 0 && strcmp(sub, "\"none\""),
		       "doctor --json with a usable GPU: no reason, a path");
	}
	free(doc);

	text = doctor_to_string(0, NULL, &trc);
	if (gpu_rc) {
		char want[KCOLL_GPU_TEXT + 32];

		snprintf(want, sizeof(want), "%s: %s\n", gpu_rc == -ENODEV ? "no GPU" : "GPU not usable",
			 gpu_why);
		tap_ok(text && trc == gpu_rc && !strncmp(text, want, strlen(want)),
		       "doctor text starts with \"%s: <reason>\"",
		       gpu_rc == -ENODEV ? "no GPU" : "GPU not usable");
	} else {
		tap_ok(text && trc == 0 && !strncmp(text, "GPU: ", 5),
		       "doctor text starts with \"GPU: \"");
	}
	free(text);

	if (gpu_rc)
		tap_ok(kcoll_gpu_reduce(KCOLL_F32, KCOLL_SUM, &x, xin, 1, 1, NULL) == gpu_rc,
		       "kcoll_gpu_reduce without a usable GPU returns kcoll_gpu_available's error");
	else
		tap_ok(kcoll_gpu_reduce(KCOLL_F32, KCOLL_SUM, &x, xin, 0, 1, NULL) == -EINVAL,
		       "kcoll_gpu_reduce reaches the kernels library (nin 0: -EINVAL)");
}

/* Run the standalone doctor; its exit status, or -1. */
static int run_doctor(const char *args, char *out, size_t len)
{
	const char *build = getenv("KCOLL_BUILD");
	char cmd[PATH_MAX * 2];
	size_t n = 0;
	FILE *p;
	int st;

	if (build)
		snprintf(cmd, sizeof(cmd), "%s/bin/kcoll-gpu-doctor", build);
	else
		snprintf(cmd, sizeof(cmd), "%s/../bin/kcoll-gpu-doctor", exe_dir);
	if (access(cmd, X_OK))
		return -1;
	snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " %s 2>&1", args);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	n = fread(out, 1, len - 1, p);
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_doctor_binary(void)
{
	static char out[1 << 16];
	int st = run_doctor("--json", out, sizeof(out));

	if (st < 0) {
		tap_skip("kcoll-gpu-doctor not built next to this test");
		tap_skip("kcoll-gpu-doctor not built next to this test");
		return;
	}
	tap_ok(st == (gpu_rc ? 1 : 0) && json_valid(out) &&
		       json_is(out, "usable", gpu_rc ? "false" : "true"),
	       "kcoll-gpu-doctor --json: valid JSON, exit status %d", gpu_rc ? 1 : 0);
	st = run_doctor("--bogus", out, sizeof(out));
	tap_ok(st == 2 && has(out, "unknown argument"), "kcoll-gpu-doctor --bogus: exit status 2");
}

/* ---- the kernels, on a GPU ------------------------------------------------- */

#define GPU_COUNT 100003	/* odd: vector body plus a tail */
#define GPU_BIG ((1u << 24) + 3)	/* more vectors than threads: grid-stride */

struct gpu_bufs {
	const struct kcoll_gpu_kernels *k;
	void *dev[MAX_NIN + 1];
	size_t bytes;
};

static void gpu_free(struct gpu_bufs *b)
{
	for (size_t i = 0; i < ARRAY_SIZE(b->dev); i++)
		if (b->dev[i])
			b->k->mem_free(b->dev[i]);
	memset(b->dev, 0, sizeof(b->dev));
}

/*
 * host inputs -> device (offset by 'shift' elements to force the scalar
 * kernel), reduce there, compare with kcoll_reduce_ref. in_place reduces into
 * in[0]'s device buffer.
 */
static int gpu_case(struct gpu_bufs *b, int dt, int op, unsigned int nin, size_t count,
		    size_t shift, int in_place, char *host, char *ref, char *got)
{
	size_t size = kcoll_core_size(dt), bytes = count * size, off = shift * size;
	const void *hin[MAX_NIN], *din[MAX_NIN];
	void *dout;
	size_t at;
	int rc;

	for (unsigned int k = 0; k < nin; k++) {
		fill(dt, host + k * bytes, count);
		hin[k] = host + k * bytes;
		din[k] = (char *)b->dev[k] + off;
		rc = b->k->copy((void *)din[k], hin[k], bytes);
		if (rc)
			goto err;
	}
	dout = in_place ? (void *)din[0] : (char *)b->dev[MAX_NIN] + off;
	rc = kcoll_gpu_reduce(dt, op, dout, din, nin, count, NULL);
	if (!rc)
		rc = b->k->stream_sync(NULL);
	if (!rc)
		rc = b->k->copy(got, dout, bytes);
	if (rc)
		goto err;
	kcoll_reduce_ref(dt, op, ref, hin, nin, count);
	if (first_diff(dt, op, ref, got, count, &at)) {
		tap_diag("%s %s nin %u count %zu shift %zu: element %zu ref 0x%llx gpu 0x%llx",
			 dtype_names[dt], op_names[op], nin, count, shift, at,
			 (unsigned long long)elem_bits(ref, at, size),
			 (unsigned long long)elem_bits(got, at, size));
		return 0;
	}
	return 1;
err:
	tap_diag("%s %s: %d (%s)", dtype_names[dt], op_names[op], rc, b->k->last_error());
	return 0;
}

static void test_gpu(void)
{
	static const unsigned int nins[] = { 1, 2, 5 };
	const char *skip = gpu_rc ? gpu_why : NULL;
	struct gpu_bufs b = { 0 };
	size_t max_bytes = (size_t)GPU_BIG * 4 + 64;
	char *host = NULL, *ref = NULL, *got = NULL;
	int rc = 0;

	if (!skip) {
		struct kcoll_gpu *g;

		kcoll_gpu_process(&g);
		kcoll_gpu_kernels(g, &b.k);
		host = malloc(MAX_NIN * (size_t)GPU_COUNT * 8 + 3 * max_bytes);
		ref = malloc(max_bytes);
		got = malloc(max_bytes);
		rc = b.k->set_device(0);
		for (size_t i = 0; i < ARRAY_SIZE(b.dev) && !rc; i++)
			rc = b.k->mem_alloc(&b.dev[i], max_bytes);
		if (rc || !host || !ref || !got)
			skip = "could not set up device 0 and its buffers";
		if (rc)
			tap_diag("%d: %s", rc, b.k->last_error());
	}

	for (int dt = 0; dt < KCOLL_DTYPE_MAX; dt++) {
		for (int op = 0; op < KCOLL_REDOP_MAX; op++) {
			int ok = 1;

			if (skip) {
				tap_skip("no GPU: %s (%s %s kernel vs kcoll_reduce_ref)", skip,
					 dtype_names[dt], op_names[op]);
				continue;
			}
			for (size_t n = 0; n < ARRAY_SIZE(nins) && ok; n++)
				for (size_t shift = 0; shift < 2 && ok; shift++)
					ok = gpu_case(&b, dt, op, nins[n], GPU_COUNT, shift, 0, host,
						      ref, got);
			tap_ok(ok, "GPU %s %s equals kcoll_reduce_ref (nin 1/2/5, vector and scalar "
				   "kernels)",
			       dtype_names[dt], op_names[op]);
		}
	}

	if (skip) {
		tap_skip("no GPU: %s (in place)", skip);
		tap_skip("no GPU: %s (nin %d, pointers in device memory)", skip, MAX_NIN);
		tap_skip("no GPU: %s (grid-stride over %u elements)", skip, GPU_BIG);
		tap_skip("no GPU: %s (argument errors)", skip);
		tap_skip("no GPU: %s (stream, pinned memory, async copies, event)", skip);
	} else {
		const void *din[2] = { b.dev[0], b.dev[1] };
		const void *dbad[2] = { (char *)b.dev[0] + 1, b.dev[1] };

		tap_ok(gpu_case(&b, KCOLL_F32, KCOLL_SUM, 2, GPU_COUNT, 0, 1, host, ref, got) &&
			       gpu_case(&b, KCOLL_F16, KCOLL_AVG, 3, GPU_COUNT, 1, 1, host, ref, got) &&
			       gpu_case(&b, KCOLL_I8, KCOLL_PROD, 5, GPU_COUNT, 0, 1, host, ref, got),
		       "GPU in place (out is in[0]): f32 sum, f16 avg, i8 prod");
		tap_ok(gpu_case(&b, KCOLL_F32, KCOLL_SUM, MAX_NIN, 4099, 0, 0, host, ref, got) &&
			       gpu_case(&b, KCOLL_BF16, KCOLL_AVG, MAX_NIN, 4099, 1, 0, host, ref, got) &&
			       gpu_case(&b, KCOLL_I64, KCOLL_MAX, MAX_NIN, 4099, 0, 0, host, ref, got),
		       "GPU nin %d (input pointers in device memory): f32 sum, bf16 avg, i64 max",
		       MAX_NIN);
		tap_ok(gpu_case(&b, KCOLL_F32, KCOLL_SUM, 3, GPU_BIG, 0, 0, host, ref, got) &&
			       gpu_case(&b, KCOLL_U8, KCOLL_MAX, 3, GPU_BIG, 0, 0, host, ref, got),
		       "GPU grid-stride loops over %u elements: f32 sum, u8 max", GPU_BIG);
		tap_ok(kcoll_gpu_reduce(KCOLL_F32, KCOLL_SUM, b.dev[2], din, 0, 1, NULL) == -EINVAL &&
			       kcoll_gpu_reduce(KCOLL_DTYPE_MAX, KCOLL_SUM, b.dev[2], din, 2, 1,
						NULL) == -EINVAL &&
			       kcoll_gpu_reduce(KCOLL_F32, KCOLL_REDOP_MAX, b.dev[2], din, 2, 1,
						NULL) == -EINVAL &&
			       kcoll_gpu_reduce(KCOLL_F32, KCOLL_SUM, b.dev[2], dbad, 2, 1, NULL) ==
				       -EINVAL &&
			       kcoll_gpu_reduce(KCOLL_U8, KCOLL_SUM, b.dev[2], din, 2, 0, NULL) == 0,
		       "GPU argument errors: nin 0, bad dtype, bad op, misaligned f32 -> -EINVAL; "
		       "count 0 -> 0");
		rc = stream_roundtrip(b.k, b.dev[0], b.dev[1], (size_t)GPU_COUNT * 4 + 3);
		tap_ok(rc == 0, "GPU stream, pinned memory (cudaHostAlloc), async copies host -> "
		       "device -> device -> host and an event: bytes back in order (%d)", rc);
	}
	if (b.k)
		gpu_free(&b);
	free(host);
	free(ref);
	free(got);
}

/* Device buffers: CUDA IPC export/import and dma-buf export, on the fake. */
#define N_IPC_TESTS 14

/* In a fork()ed child (CUDA opens a handle only in another process). */
static int ipc_child(struct kcoll_gpu *g, const struct kcoll_gpu_ipc *h, size_t need,
		     const unsigned char *want, int expect_rc)
{
	char why[KCOLL_GPU_TEXT];
	void *base, *dptr;
	int rc = kcoll_gpu_ipc_import(g, h, getppid(), need, &base, &dptr, why, sizeof(why));

	if (rc != expect_rc) {
		fprintf(stderr, "# child: import %d (%s), want %d\n", rc, why, expect_rc);
		return 1;
	}
	if (rc)
		return why[0] ? 0 : 2;
	if (memcmp(dptr, want, need) || (char *)dptr - (char *)base != (long)h->offset)
		return 3;
	return kcoll_gpu_ipc_close(g, base) ? 4 : 0;
}

static int ipc_in_child(struct kcoll_gpu *g, const struct kcoll_gpu_ipc *h, size_t need,
			const unsigned char *want, int expect_rc)
{
	int st = 0;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0)
		_exit(ipc_child(g, h, need, want, expect_rc));
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static void test_ipc(void)
{
	struct kcoll_fake_cuda f = fake_defaults();
	struct kcoll_gpu_config none = { .driver_lib = "/nonexistent/libcuda.so.1" };
	char why[KCOLL_GPU_TEXT], why2[KCOLL_GPU_TEXT], why3[KCOLL_GPU_TEXT];
	void *(*dalloc)(size_t);
	void (*dfree)(void *);
	struct kcoll_gpu_ipc h, bad;
	struct kcoll_gpu *g = NULL;
	void *base, *dptr;
	unsigned char *mem;
	struct fake_env e;
	int rc, rc2, rc3, fd;
	long page = sysconf(_SC_PAGESIZE);

	if (fake_setup(&e)) {
		for (int i = 0; i < N_IPC_TESTS; i++)
			tap_skip("the fake CUDA fixture did not load: %s", dlerror());
		return;
	}
	fake_mem_fns(&e, &dalloc, &dfree);
	mem = dalloc ? dalloc(4 * (size_t)page) : NULL;
	for (int i = 0; mem && i < 4 * page; i++)
		mem[i] = (unsigned char)(i * 7 + 1);

	rc = fake_open(&e, &f, 0, 1, "6.1.0", &g);
	rc2 = mem ? kcoll_gpu_ipc_export(g, mem + page, 2 * (size_t)page, &h, why, sizeof(why))
		  : -ENOMEM;
	tap_ok(rc == 0 && rc2 == 0 && h.offset == (unsigned long long)page &&
		       h.size == 2ULL * page && h.pid == getpid() && !h.reserved,
	       "ipc export: handle of the allocation, the offset, the size and our pid (%d %d %s)",
	       rc, rc2, rc2 ? why : "");
	rc = kcoll_gpu_ipc_export(g, mem + page, 4 * (size_t)page, &bad, why, sizeof(why));
	tap_ok(rc == -EINVAL && has(why, "runs past its allocation"),
	       "ipc export past the allocation's end: -EINVAL and why (%s)", why);
	rc = kcoll_gpu_ipc_export(g, &bad, 64, &bad, why, sizeof(why));
	tap_ok(rc == -ENOENT && has(why, "cuMemGetAddressRange"),
	       "ipc export of a host pointer: the driver's refusal, named (%s)", why);

	rc = ipc_in_child(g, &h, 2 * (size_t)page, mem + page, 0);
	tap_ok(rc == 0, "ipc round trip: another process opens the handle and reads the bytes at "
			"the offset (child %d)", rc);
	rc = kcoll_gpu_ipc_import(g, &h, getpid(), 16, &base, &dptr, why, sizeof(why));
	tap_ok(rc == -EINVAL && has(why, "process that made it") && !dptr,
	       "ipc import by the handle's own maker: -EINVAL (%s)", why);
	rc = kcoll_gpu_ipc_import(g, &h, getpid() + 1, 16, &base, &dptr, why, sizeof(why));
	tap_ok(rc == -EPERM && has(why, "only its own GPU memory"),
	       "ipc handle presented by another process: -EPERM (%s)", why);
	rc = ipc_in_child(g, &h, 2 * (size_t)page + 1, mem + page, -EINVAL);
	bad = h;
	bad.reserved = 1;
	rc2 = ipc_in_child(g, &bad, 16, mem + page, -EINVAL);
	tap_ok(rc == 0 && rc2 == 0, "ipc import needing more than the handle covers, or with "
				    "reserved bits: -EINVAL with why (children %d %d)", rc, rc2);
	kcoll_gpu_close(g);

	f.ipc_open_result = KCOLL_CUDA_INVALID_HANDLE;
	fake_open(&e, &f, 0, 1, "6.1.0", &g);
	rc = ipc_in_child(g, &h, 16, mem + page, -EBADF);
	tap_ok(rc == 0, "cuIpcOpenMemHandle fails: its error as -EBADF with why (child %d)", rc);
	kcoll_gpu_close(g);

	f = fake_defaults();
	fake_open(&e, &f, 0, 1, "6.1.0", &g);
	rc = kcoll_gpu_dmabuf_fd(g, mem, 2 * (size_t)page, &fd, why, sizeof(why));
	tap_ok(rc == 0 && fd >= 0, "dma-buf export: an fd (%d %s)", rc, rc ? why : "");
	if (fd >= 0)
		close(fd);
	rc = kcoll_gpu_dmabuf_fd(g, mem + 1, (size_t)page, &fd, why, sizeof(why));
	tap_ok(rc == -EINVAL && fd == -1 && has(why, "page-aligned"),
	       "dma-buf export of an unaligned range: -EINVAL (%s)", why);
	kcoll_gpu_close(g);
	f.dmabuf_result = KCOLL_CUDA_NOT_SUPPORTED;
	fake_open(&e, &f, 0, 1, "6.1.0", &g);
	rc = kcoll_gpu_dmabuf_fd(g, mem, (size_t)page, &fd, why, sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && fd == -1 && has(why, "cuMemGetHandleForAddressRange"),
	       "dma-buf export refused by the driver: -EOPNOTSUPP, named (%s)", why);
	kcoll_gpu_close(g);

	f = fake_defaults();
	f.ndev = 0;
	fake_open(&e, &f, 0, 1, "6.1.0", &g);
	rc = kcoll_gpu_ipc_export(g, mem, 16, &bad, why, sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && has(why, "no GPU for device buffers") &&
		       has(why, "reports no device"),
	       "no device: device-buffer calls fail -EOPNOTSUPP naming why (%s)", why);
	kcoll_gpu_close(g);

	kcoll_gpu_open(&g, &none);
	rc = kcoll_gpu_ipc_export(g, mem, 16, &bad, why, sizeof(why));
	rc2 = kcoll_gpu_ipc_import(g, &h, getpid() + 1, 16, &base, &dptr, why2, sizeof(why2));
	rc3 = kcoll_gpu_dmabuf_fd(g, mem, (size_t)page, &fd, why3, sizeof(why3));
	tap_ok(rc == -EOPNOTSUPP && rc2 == -EOPNOTSUPP && rc3 == -EOPNOTSUPP &&
		       has(why, "no CUDA driver") && has(why2, "no CUDA driver") &&
		       has(why3, "no CUDA driver") && kcoll_gpu_ipc_close(g, mem) == -EOPNOTSUPP,
	       "no driver: export, import, close and dma-buf all -EOPNOTSUPP (%s)", why);
	kcoll_gpu_close(g);

	/* what a buffer's registration ends up as */
	{
		enum kcoll_gpu_path a, b, c, d, x, y;

		a = kcoll_gpu_reg_outcome(KCOLL_GPU_PATH_DMABUF, 0, 0, why, sizeof(why));
		tap_ok(a == KCOLL_GPU_PATH_DMABUF && !why[0], "registration: dma-buf works: dma-buf");
		b = kcoll_gpu_reg_outcome(KCOLL_GPU_PATH_DMABUF, -EOPNOTSUPP, 0, why, sizeof(why));
		c = kcoll_gpu_reg_outcome(KCOLL_GPU_PATH_DMABUF, 0, -EOPNOTSUPP, why2, sizeof(why2));
		d = kcoll_gpu_reg_outcome(KCOLL_GPU_PATH_PEERMEM, 0, -EFAULT, why3, sizeof(why3));
		x = kcoll_gpu_reg_outcome(KCOLL_GPU_PATH_PEERMEM, -EINVAL, 0, NULL, 0);
		y = kcoll_gpu_reg_outcome(KCOLL_GPU_PATH_STAGING, 0, 0, NULL, 0);
		tap_ok(b == KCOLL_GPU_PATH_STAGING && has(why, "dma-buf export failed") &&
			       c == KCOLL_GPU_PATH_STAGING && has(why2, "ibv_reg_dmabuf_mr") &&
			       has(why2, "NIC driver cannot map") && d == KCOLL_GPU_PATH_STAGING &&
			       has(why3, "peermem") && x == KCOLL_GPU_PATH_PEERMEM &&
			       y == KCOLL_GPU_PATH_STAGING,
		       "registration: a failed export or NIC registration falls back to staging "
		       "with the reason (%s | %s | %s)", why, why2, why3);
	}
	if (dfree)
		dfree(mem);
	fake_teardown(&e);
}

int main(void)
{
	find_exe_dir();
	test_json_checker();
	test_errno();
	test_archs();
	test_paths();
	test_conversions();
	test_core_vs_ref();
	test_loader_missing();
	test_loader_fake();
	test_ipc();
	test_ptr_ctx();
	test_this_machine();
	test_doctor_binary();
	test_gpu();
	return tap_done();
}

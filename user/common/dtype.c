// SPDX-License-Identifier: MIT
/*
 * Data types and reduction operators of the public API: their names, element
 * sizes and parsing (kcoll_dtype_*, kcoll_redop_*). Linked into libkcoll
 * (exported from libkcoll.so), and into kcolld and the tools through it; the
 * fuzz target compiles it with the daemon's SQE checks alone.
 */
#include <errno.h>
#include <string.h>

#include <kcoll/kcoll.h>

static const struct {
	const char *name;
	size_t size;
} dtypes[KCOLL_DTYPE_MAX] = {
	[KCOLL_F32] = { "f32", 4 },  [KCOLL_F64] = { "f64", 8 },  [KCOLL_F16] = { "f16", 2 },
	[KCOLL_BF16] = { "bf16", 2 }, [KCOLL_I8] = { "i8", 1 },    [KCOLL_U8] = { "u8", 1 },
	[KCOLL_I32] = { "i32", 4 },  [KCOLL_U32] = { "u32", 4 },  [KCOLL_I64] = { "i64", 8 },
	[KCOLL_U64] = { "u64", 8 },
};

static const char *const redops[KCOLL_REDOP_MAX] = {
	[KCOLL_SUM] = "sum", [KCOLL_PROD] = "prod", [KCOLL_MIN] = "min",
	[KCOLL_MAX] = "max", [KCOLL_AVG] = "avg",
};

size_t kcoll_dtype_size(enum kcoll_dtype dt)
{
	return (unsigned int)dt < KCOLL_DTYPE_MAX ? dtypes[dt].size : 0;
}

const char *kcoll_dtype_name(enum kcoll_dtype dt)
{
	return (unsigned int)dt < KCOLL_DTYPE_MAX ? dtypes[dt].name : "?";
}

const char *kcoll_redop_name(enum kcoll_redop op)
{
	return (unsigned int)op < KCOLL_REDOP_MAX ? redops[op] : "?";
}

int kcoll_dtype_parse(const char *s, enum kcoll_dtype *out)
{
	static const struct { const char *alias; enum kcoll_dtype dt; } aliases[] = {
		{ "float", KCOLL_F32 }, { "double", KCOLL_F64 }, { "half", KCOLL_F16 },
		{ "int", KCOLL_I32 }, { "int8", KCOLL_I8 }, { "uint8", KCOLL_U8 },
		{ "int32", KCOLL_I32 }, { "uint32", KCOLL_U32 }, { "int64", KCOLL_I64 },
		{ "uint64", KCOLL_U64 }, { "float32", KCOLL_F32 }, { "float64", KCOLL_F64 },
		{ "float16", KCOLL_F16 }, { "bfloat16", KCOLL_BF16 },
	};

	for (int i = 0; i < KCOLL_DTYPE_MAX; i++) {
		if (!strcmp(s, dtypes[i].name)) {
			*out = i;
			return 0;
		}
	}
	for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
		if (!strcmp(s, aliases[i].alias)) {
			*out = aliases[i].dt;
			return 0;
		}
	}
	return -EINVAL;
}

int kcoll_redop_parse(const char *s, enum kcoll_redop *out)
{
	for (int i = 0; i < KCOLL_REDOP_MAX; i++) {
		if (!strcmp(s, redops[i])) {
			*out = i;
			return 0;
		}
	}
	return -EINVAL;
}

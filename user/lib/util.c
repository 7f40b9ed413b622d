// SPDX-License-Identifier: MIT
/* Names, sizes and error sentences of the public API. */
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

const char *kcoll_strerror(int err)
{
	switch (-err) {
	case 0:
		return "success";
	case ECONNREFUSED:
		return "kcolld is not running on this socket (start kcolld, or set KCOLL_SOCKET to its socket)";
	case ENOTCONN:
		return "the connection to kcolld was lost (the daemon exited or restarted)";
	case ECONNRESET:
		return "a peer died or left: a rank of the communicator (destroy it and create a new one) or the process owning a KV segment";
	case ETIMEDOUT:
		return "timed out: some rank did not take part in time (see KCOLL_TIMEOUT_MS)";
	case EBADMSG:
		return "ranks disagree on the operation (opcode, count, dtype, op or root differ)";
	case EFAULT:
		return "a buffer is not valid memory of the calling process";
	case EOVERFLOW:
		return "count is too large for the data type";
	case EINVAL:
		return "invalid argument (unknown data type or operator, bad rank, or malformed request)";
	case EPROTONOSUPPORT:
		return "libkcoll and kcolld speak different ABI versions: rebuild or restart kcolld";
	case EPERM:
		return "permission denied: the communicator or segment belongs to another user (segments: ask its owner for a uid grant)";
	case ECANCELED:
		return "cancelled: the communicator was destroyed";
	case EBUSY:
		return "all request slots stayed busy until the timeout";
	case EOPNOTSUPP:
		return "operation not supported by this kcolld (device buffers need a usable GPU: "
		       "run kcollctl gpu for the reason)";
	case EPROTO:
		return "protocol error talking to kcolld (corrupt ring or reply)";
	case ERANGE:
		return "a transfer entry lies beyond the end of its segment";
	case E2BIG:
		return "batch longer than KCOLL_XFER_MAX_ENTRIES or moving more than 1 TiB "
		       "(or too many notify counters): split it";
	case EIDRM:
		return "the segment was unregistered (its owner ended it or died): import a fresh descriptor";
	case EACCES:
		return "wrong access token in the segment descriptor";
	case ESTALE:
		return "the segment descriptor is from before kcolld restarted: export it again";
	case EREMOTE:
		return "the segment descriptor names another kcolld without an address to reach it";
	case ENOENT:
		return "no such segment or handle (never registered, or already closed)";
	case EMSGSIZE:
		return "notification longer than KCOLL_NOTIF_MAX_BYTES";
	case ENOBUFS:
		return "the segment owner's notification queue is full (KCOLL_SEG_NOTIF_QUEUE untaken): "
		       "its owner must take them with kcoll_seg_get_notifs; the batch's notify was not counted";
	default:
		return strerror(-err);
	}
}

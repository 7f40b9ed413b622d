// SPDX-License-Identifier: MIT
/* The error sentences of the public API (kcoll_strerror). */
#include <errno.h>
#include <string.h>

#include <kcoll/kcoll.h>

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
		return "operation not supported: device buffers and device KV segments need a usable "
		       "GPU in kcolld (run kcollctl gpu for the reason)";
	case EEXIST:
		return "already there: the rank already joined the communicator, or the memory is kcoll "
		       "memory already (kcoll_mem_alloc, registered or shared)";
	case EPROTO:
		return "protocol error talking to kcolld (corrupt ring or reply)";
	case ERANGE:
		return "a range lies outside what must hold it: a transfer entry beyond the end of its "
		       "segment, or a buffer given to kcoll_mem_share with no whole page inside";
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

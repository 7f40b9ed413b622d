// SPDX-License-Identifier: MIT
/*
 * Compile-time checks of the kcoll.ko device ABI (the section of
 * include/uapi/linux/kcoll.h between "BEGIN/END kcoll.ko device ABI").
 * Nothing to run: it must compile, for x86_64 and with -m32, so the layout
 * cannot drift between the module, a 64-bit kcolld and 32-bit clients.
 *   gcc [-m32] -Iinclude/uapi -fsyntax-only include/kcoll/abi_check_kmod.c
 */
#include <stddef.h>

#include <linux/kcoll.h>

#define KCOLL_ASSERT_SIZE(type, bytes) \
	_Static_assert(sizeof(struct type) == (bytes), "sizeof(struct " #type ")")
#define KCOLL_ASSERT_OFF(type, field, off) \
	_Static_assert(offsetof(struct type, field) == (off), #type "." #field " offset")
/* Size-first: every argument starts with __u32 size, __u32 flags. */
#define KCOLL_ASSERT_HEAD(type)				\
	KCOLL_ASSERT_OFF(type, size, 0);		\
	KCOLL_ASSERT_OFF(type, flags, 4);		\
	_Static_assert(sizeof(struct type) % 8 == 0, #type " is padded to 8")
/* The number names the struct, direction read-write, type 'k'. */
#define KCOLL_ASSERT_IOC(cmd, nr, type)						\
	_Static_assert(_IOC_TYPE(cmd) == 'k' && _IOC_NR(cmd) == (nr) &&			\
		       _IOC_DIR(cmd) == (_IOC_READ | _IOC_WRITE) &&			\
		       _IOC_SIZE(cmd) == sizeof(struct type), #cmd " encoding")

KCOLL_ASSERT_HEAD(kcoll_ioc_query);
KCOLL_ASSERT_OFF(kcoll_ioc_query, features, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_query, abi_version, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_query, page_size, 20);
KCOLL_ASSERT_OFF(kcoll_ioc_query, max_ring_entries, 24);
KCOLL_ASSERT_OFF(kcoll_ioc_query, max_grants, 28);
KCOLL_ASSERT_OFF(kcoll_ioc_query, max_buf_bytes, 32);
KCOLL_ASSERT_OFF(kcoll_ioc_query, max_pinned_bytes, 40);
KCOLL_ASSERT_SIZE(kcoll_ioc_query, 48);

KCOLL_ASSERT_HEAD(kcoll_ioc_ring_create);
KCOLL_ASSERT_OFF(kcoll_ioc_ring_create, sq_entries, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_ring_create, cq_entries, 12);
KCOLL_ASSERT_OFF(kcoll_ioc_ring_create, ring_size, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_ring_create, mmap_offset, 24);
KCOLL_ASSERT_SIZE(kcoll_ioc_ring_create, 32);

KCOLL_ASSERT_HEAD(kcoll_ioc_wait);
KCOLL_ASSERT_OFF(kcoll_ioc_wait, doorbell, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_wait, value, 12);
KCOLL_ASSERT_OFF(kcoll_ioc_wait, timeout_ms, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_wait, reserved, 20);
KCOLL_ASSERT_SIZE(kcoll_ioc_wait, 24);

KCOLL_ASSERT_HEAD(kcoll_ioc_wake);
KCOLL_ASSERT_OFF(kcoll_ioc_wake, doorbell, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_wake, reserved, 12);
KCOLL_ASSERT_SIZE(kcoll_ioc_wake, 16);

KCOLL_ASSERT_HEAD(kcoll_ioc_buf_register);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_register, addr, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_register, len, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_register, handle, 24);
KCOLL_ASSERT_SIZE(kcoll_ioc_buf_register, 32);

KCOLL_ASSERT_HEAD(kcoll_ioc_buf_unregister);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_unregister, handle, 8);
KCOLL_ASSERT_SIZE(kcoll_ioc_buf_unregister, 16);

KCOLL_ASSERT_HEAD(kcoll_ioc_buf_grant);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_grant, handle, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_grant, kind, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_grant, id, 20);
KCOLL_ASSERT_SIZE(kcoll_ioc_buf_grant, 24);

KCOLL_ASSERT_HEAD(kcoll_ioc_buf_import);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, handle, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, mmap_offset, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, map_len, 24);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, len, 32);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, page_offset, 40);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, buf_flags, 44);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, owner_pid, 48);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_import, reserved, 52);
KCOLL_ASSERT_SIZE(kcoll_ioc_buf_import, 56);

KCOLL_ASSERT_HEAD(kcoll_ioc_peer_report);
KCOLL_ASSERT_OFF(kcoll_ioc_peer_report, peer, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_peer_report, state, 12);
KCOLL_ASSERT_OFF(kcoll_ioc_peer_report, latency_us, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_peer_report, bw_mbps, 20);
KCOLL_ASSERT_SIZE(kcoll_ioc_peer_report, 24);

KCOLL_ASSERT_HEAD(kcoll_ioc_buf_dmabuf);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_dmabuf, handle, 8);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_dmabuf, dmabuf_size, 16);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_dmabuf, len, 24);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_dmabuf, fd, 32);
KCOLL_ASSERT_OFF(kcoll_ioc_buf_dmabuf, page_offset, 36);
KCOLL_ASSERT_SIZE(kcoll_ioc_buf_dmabuf, 40);

KCOLL_ASSERT_IOC(KCOLL_IOC_QUERY, 0x40, kcoll_ioc_query);
KCOLL_ASSERT_IOC(KCOLL_IOC_RING_CREATE, 0x41, kcoll_ioc_ring_create);
KCOLL_ASSERT_IOC(KCOLL_IOC_WAIT, 0x42, kcoll_ioc_wait);
KCOLL_ASSERT_IOC(KCOLL_IOC_WAKE, 0x43, kcoll_ioc_wake);
KCOLL_ASSERT_IOC(KCOLL_IOC_BUF_REGISTER, 0x44, kcoll_ioc_buf_register);
KCOLL_ASSERT_IOC(KCOLL_IOC_BUF_UNREGISTER, 0x45, kcoll_ioc_buf_unregister);
KCOLL_ASSERT_IOC(KCOLL_IOC_BUF_GRANT, 0x46, kcoll_ioc_buf_grant);
KCOLL_ASSERT_IOC(KCOLL_IOC_BUF_IMPORT, 0x47, kcoll_ioc_buf_import);
KCOLL_ASSERT_IOC(KCOLL_IOC_PEER_REPORT, 0x48, kcoll_ioc_peer_report);
KCOLL_ASSERT_IOC(KCOLL_IOC_BUF_DMABUF, 0x49, kcoll_ioc_buf_dmabuf);

/* mmap offsets: the ring at 0, handle h >= 1 in its own 4 GiB slot */
_Static_assert(KCOLL_MMAP_OFF_RING == 0, "ring mmap offset");
_Static_assert(KCOLL_MMAP_OFF_BUF(1) == 0x100000000ULL, "buffer slot size");
_Static_assert(sizeof(KCOLL_MMAP_OFF_BUF(1)) == 8, "buffer offsets are 64-bit");

/* Feature bits are distinct single bits. */
_Static_assert((KCOLL_FEAT_RING | KCOLL_FEAT_DOORBELL | KCOLL_FEAT_BUF | KCOLL_FEAT_GRANT |
		KCOLL_FEAT_PEERS | KCOLL_FEAT_DMABUF) == 0x3f, "feature bits");

_Static_assert(KCOLL_DOORBELL_SQ == 0 && KCOLL_DOORBELL_CQ == 1 && KCOLL_NR_DOORBELLS == 2,
	       "doorbell numbers");
_Static_assert(KCOLL_PEER_STATE_MAX == 5 && KCOLL_MAX_PEERS == 64, "peer report limits");
_Static_assert(KCOLL_GRANT_UID == 0 && KCOLL_GRANT_PID == 1, "grant kinds");

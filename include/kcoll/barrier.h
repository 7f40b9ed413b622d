/* SPDX-License-Identifier: MIT */
/*
 * The memory-ordering rules of kcoll in one place (C11 memory model through
 * the GCC/clang __atomic builtins, which also work on the plain __u32 fields
 * of the shared ring). Each helper says what it orders.
 */
#ifndef KCOLL_BARRIER_H
#define KCOLL_BARRIER_H

#include <sched.h>

/* Read an index the other side publishes; orders later reads of the entries
 * it covers after this load (pairs with kcoll_store_release). */
#define kcoll_load_acquire(p)		__atomic_load_n((p), __ATOMIC_ACQUIRE)

/* Publish an index; orders earlier writes of the entries it covers before
 * the index becomes visible (pairs with kcoll_load_acquire). */
#define kcoll_store_release(p, v)	__atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* Single-copy atomic access with no ordering: flags and statistics. */
#define kcoll_load_relaxed(p)		__atomic_load_n((p), __ATOMIC_RELAXED)
#define kcoll_store_relaxed(p, v)	__atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* Full fence for the sleep/wake handshake (Dekker): the sleeper stores its
 * NEED_WAKEUP flag then re-reads the index; the waker stores the index then
 * reads the flag. The fence on both sides guarantees at least one of them
 * sees the other's store, so a wakeup is never lost. */
#define kcoll_smp_mb()			__atomic_thread_fence(__ATOMIC_SEQ_CST)

static inline void kcoll_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/* One step of a busy-poll that others may need the CPU for: when there are
 * more spinning threads than cores (ranks + daemon threads on a small host),
 * a plain pause loop starves the very thread it waits for. */
static inline void kcoll_spin_yield(void)
{
	kcoll_cpu_relax();
	sched_yield();
}

#endif /* KCOLL_BARRIER_H */

// SPDX-License-Identifier: GPL-2.0
/*
 * The very file kcolld builds (user/common/c4.c: freestanding, no libc, no
 * floating point, 64-bit divisions through div64_u64 under __KERNEL__),
 * compiled into kcoll.ko.
 */
#include "../user/common/c4.c"

/* SPDX-License-Identifier: MIT */
/*
 * The "check NAME: PASS|FAIL details" lines that the helper programs a shell
 * test drives (kv_peer, kv_hostile) print for it to turn into TAP; failed
 * says whether any check failed (their exit status).
 */
#ifndef KCOLL_TESTS_PEER_CHECK_H
#define KCOLL_TESTS_PEER_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int failed;

static void check(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	printf("check %s: %s ", name, ok ? "PASS" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	failed |= !ok;
}

#endif /* KCOLL_TESTS_PEER_CHECK_H */

/* SPDX-License-Identifier: MIT */
/* A tiny TAP producer for kcoll's test programs (tests/run.sh counts the lines). */
#ifndef KCOLL_TAP_H
#define KCOLL_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_n, tap_failed;

static inline void tap_vresult(int ok, const char *fmt, va_list ap)
{
	printf("%sok %d - ", ok ? "" : "not ", ++tap_n);
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
	if (!ok)
		tap_failed++;
}

/* Record one check; returns ok so callers can bail out of dependent steps. */
static inline int __attribute__((format(printf, 2, 3))) tap_ok(int ok, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tap_vresult(ok, fmt, ap);
	va_end(ap);
	return ok;
}

static inline void __attribute__((format(printf, 1, 2))) tap_skip(const char *fmt, ...)
{
	va_list ap;

	printf("ok %d # SKIP ", ++tap_n);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static inline void __attribute__((format(printf, 1, 2))) tap_diag(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

/* Print the plan and exit with the number of failures (0 = success). */
static inline int tap_done(void)
{
	printf("1..%d\n", tap_n);
	return tap_failed ? 1 : 0;
}

#endif /* KCOLL_TAP_H */

/* SPDX-License-Identifier: MIT */
/*
 * Environment knobs (KCOLL_*): each declared once, in config.c's table, with
 * its default and a line of documentation; `kcollctl config` prints the table.
 */
#ifndef KCOLL_CONFIG_H
#define KCOLL_CONFIG_H

#include <stdio.h>

struct kcoll_knob {
	const char *name;
	const char *def;
	const char *doc;
};

/* The value of knob 'name' (environment, else default). Unknown names abort:
 * that is a programming error, caught by the first test that runs it. */
const char *kcoll_knob_str(const char *name);
/* Whether the environment sets knob 'name' (to something non-empty). */
int kcoll_knob_is_set(const char *name);
/* Numeric knob; an unparsable value logs a warning and yields the default. */
long long kcoll_knob_ll(const char *name);
/* Print every knob with its current value and doc (text or JSON). */
void kcoll_knobs_print(FILE *f, int json);

#endif /* KCOLL_CONFIG_H */

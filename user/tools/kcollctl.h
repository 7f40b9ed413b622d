/* SPDX-License-Identifier: MIT */
/* What kcollctl's commands share (kcollctl.c, kcollctl_top.c). */
#ifndef KCOLLCTL_H
#define KCOLLCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcoll/proto.h>

/*
 * Ask kcolld at path for one control reply: type KCOLL_MSG_STATUS,
 * KCOLL_MSG_METRICS or KCOLL_MSG_C4 (what: enum kcoll_c4_what), json asks
 * for JSON where the reply has both forms. The reply's text goes to out,
 * NUL-terminated. 0, or 1 when it failed (kcollctl said why on stderr).
 */
int kcollctl_fetch(const char *path, uint32_t type, bool json, uint32_t what, char *out, size_t cap);

/* kcollctl top: refresh every interval seconds, iterations times (0: until
 * interrupted). 0, 1 (kcolld went away: said why), 2 (bad arguments). */
int kcollctl_top(const char *path, double interval, long iterations, bool json);

#endif /* KCOLLCTL_H */

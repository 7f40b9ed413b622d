/* SPDX-License-Identifier: MIT */
/* Leveled logging for kcolld and the tools: "time level [where] message". */
#ifndef KCOLL_LOG_H
#define KCOLL_LOG_H

#include <stdio.h>

enum kcoll_log_level { KCOLL_LOG_ERR, KCOLL_LOG_WARN, KCOLL_LOG_INFO, KCOLL_LOG_DEBUG };

/* Log to 'f' (NULL: stderr) at most 'level'. */
void kcoll_log_setup(FILE *f, enum kcoll_log_level level);
int kcoll_log_level_parse(const char *s, enum kcoll_log_level *out);
void kcoll_log(enum kcoll_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
extern enum kcoll_log_level kcoll_log_max;

#define kc_err(...)	kcoll_log(KCOLL_LOG_ERR, __VA_ARGS__)
#define kc_warn(...)	kcoll_log(KCOLL_LOG_WARN, __VA_ARGS__)
#define kc_info(...)	kcoll_log(KCOLL_LOG_INFO, __VA_ARGS__)
#define kc_dbg(...)	do { if (kcoll_log_max >= KCOLL_LOG_DEBUG) kcoll_log(KCOLL_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif /* KCOLL_LOG_H */

// SPDX-License-Identifier: MIT
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "log.h"

enum kcoll_log_level kcoll_log_max = KCOLL_LOG_INFO;
static FILE *log_file;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *const level_names[] = { "error", "warn", "info", "debug" };

void kcoll_log_setup(FILE *f, enum kcoll_log_level level)
{
	log_file = f;
	kcoll_log_max = level;
}

int kcoll_log_level_parse(const char *s, enum kcoll_log_level *out)
{
	for (unsigned int i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (!strcmp(s, level_names[i])) {
			*out = i;
			return 0;
		}
	}
	return -EINVAL;
}

void kcoll_log(enum kcoll_log_level level, const char *fmt, ...)
{
	FILE *f = log_file ? log_file : stderr;
	struct timeval tv;
	struct tm tm;
	va_list ap;

	if (level > kcoll_log_max)
		return;
	gettimeofday(&tv, NULL);
	localtime_r(&tv.tv_sec, &tm);
	pthread_mutex_lock(&log_lock);
	fprintf(f, "%02d:%02d:%02d.%03ld %-5s ", tm.tm_hour, tm.tm_min, tm.tm_sec,
		(long)tv.tv_usec / 1000, level_names[level]);
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fflush(f);
	pthread_mutex_unlock(&log_lock);
}

/* SPDX-License-Identifier: MIT */
/*
 * A private kcolld for the GPU tests (test_gpu_ring.c, test_gpu_mh.c): start
 * the build's bin/kcolld beside the test with the fake driver's knobs and
 * the ASan options a real GPU needs, stop it, and read what it logged.
 */
#ifndef KCOLL_TESTS_GPU_KCOLLD_H
#define KCOLL_TESTS_GPU_KCOLLD_H

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

struct gpu_kcolld {
	const char *exe_dir;		/* the test's directory: kcolld is ../bin/kcolld */
	const char *dir;		/* the test's scratch directory (lsan.supp) */
	int gpu;			/* 0: no GPU library (KCOLL_GPU_LIB points nowhere) */
	int loopback;			/* listen for daemons on 127.0.0.1 */
	const char *host_alloc_max;	/* KCOLL_FAKE_CUDA_HOST_ALLOC_MAX, or NULL */
	const char *fail_copy;		/* KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC, or NULL */
};

/* The daemon's pid once its socket exists, -1 if it died or never got there. */
static inline pid_t gpu_kcolld_start(const struct gpu_kcolld *o, const char *sock, const char *log)
{
	char bin[PATH_MAX + 16];
	pid_t pid;

	snprintf(bin, sizeof(bin), "%s/../bin/kcolld", o->exe_dir);
	unlink(sock);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		const char *asan = getenv("ASAN_OPTIONS");
		char opts[PATH_MAX + 1024], supp[PATH_MAX + 64];
		FILE *f;

		if (!o->gpu)
			setenv("KCOLL_GPU_LIB", "/nonexistent/libkcoll_gpu.so", 1);
		/* The fake's knobs (gpu/fake_cuda.c); the real driver ignores them. */
		if (o->host_alloc_max)
			setenv("KCOLL_FAKE_CUDA_HOST_ALLOC_MAX", o->host_alloc_max, 1);
		if (o->fail_copy)
			setenv("KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC", o->fail_copy, 1);
		/* kcolld under ASan on a real GPU: what the test has by default. */
		snprintf(opts, sizeof(opts), "%s%sprotect_shadow_gap=0", asan ? asan : "",
			 asan ? ":" : "");
		setenv("ASAN_OPTIONS", opts, 1);
		snprintf(supp, sizeof(supp), "%s/lsan.supp", o->dir);
		f = fopen(supp, "w");
		if (f) {
			fputs("leak:libcuda.so\nleak:libkcoll_gpu.so\n", f);
			fclose(f);
			snprintf(opts, sizeof(opts), "suppressions=%s", supp);
			setenv("LSAN_OPTIONS", opts, 1);
		}
		if (o->loopback)
			execl(bin, "kcolld", "-f", "-v", "-s", sock, "-l", log, "-P", "127.0.0.1:0",
			      "-A", "127.0.0.1", (char *)NULL);
		else
			execl(bin, "kcolld", "-f", "-v", "-s", sock, "-l", log, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1200; i++) {	/* 60 s: a loaded machine, ASan */
		struct stat st;
		int status;

		if (!stat(sock, &st) && S_ISSOCK(st.st_mode))
			return pid;
		if (waitpid(pid, &status, WNOHANG) == pid)
			return -1;
		usleep(50000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* SIGTERM: the exit status (0 = drained cleanly), -1 if it had to be killed. */
static inline int kcolld_stop(pid_t pid)
{
	int status;

	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	for (int i = 0; i < 1200; i++) {	/* 60 s */
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		usleep(50000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* Lines of path holding needle; -1 if it cannot be read. */
static inline int count_in_file(const char *path, const char *needle)
{
	char line[1024];
	int n = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* A child's exit status (128 + signal when killed), -1 if not ours. */
static inline int wait_child(pid_t pid)
{
	int st;

	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#endif /* KCOLL_TESTS_GPU_KCOLLD_H */

/* SPDX-License-Identifier: MIT */
/*
 * A private kcolld for the GPU tests (test_gpu_ring.c, test_gpu_mh.c,
 * test_gpu_kv.c): start the build's bin/kcolld beside the test with the fake
 * driver's knobs and the ASan options a real GPU needs, stop it, and read
 * what it logged; the two runs each of those tests makes (the real
 * driver, then the fake in a re-execution of the program); and device
 * memory for the test itself, through the same kernels table kcolld uses.
 */
#ifndef KCOLL_TESTS_GPU_KCOLLD_H
#define KCOLL_TESTS_GPU_KCOLLD_H

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcoll/tap.h>

#include "kcoll_gpu.h"

struct gpu_kcolld {
	const char *exe_dir;		/* the test's directory: kcolld is ../bin/kcolld */
	const char *dir;		/* the test's scratch directory (lsan.supp) */
	int gpu;			/* 0: no GPU library (KCOLL_GPU_LIB points nowhere) */
	int loopback;			/* listen for daemons on 127.0.0.1 */
	const char *host_alloc_max;	/* KCOLL_FAKE_CUDA_HOST_ALLOC_MAX, or NULL */
	const char *fail_copy;		/* KCOLL_FAKE_CUDA_FAIL_COPY_ASYNC, or NULL */
};

/* The process's kernels table (cudaMalloc/cudaMemcpy or the fake), device 0. */
static const struct kcoll_gpu_kernels *K;

/* 0, or -errno with why (NULL: not wanted) filled in. */
static inline int gpu_dev_init(char *why, size_t len)
{
	struct kcoll_gpu *g;
	int rc = kcoll_gpu_process(&g);

	if (!rc)
		rc = kcoll_gpu_kernels(g, &K);
	if (!rc)
		rc = K->set_device(0);
	if (rc && why)
		snprintf(why, len, "%s", g ? kcoll_gpu_info(g)->why : "out of memory");
	return rc;
}

/* n bytes of device memory, NULL if there are none. */
static inline void *gpu_dalloc(size_t n)
{
	void *p = NULL;

	return K->mem_alloc(&p, n) ? NULL : p;
}

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

/* Can this machine run kcoll's GPU code? Asked in a child (a process must
 * not fork after cuInit): 0 or -errno, the loader's reason in why. */
static inline int gpu_test_probe(char *why, size_t len)
{
	char buf[KCOLL_GPU_TEXT + 8];
	int p[2], rc = -ENODEV;
	pid_t pid;

	snprintf(why, len, "probe failed");
	if (pipe(p))
		return rc;
	pid = fork();
	if (pid == 0) {
		int r = kcoll_gpu_available(buf + sizeof(int), sizeof(buf) - sizeof(int));

		memcpy(buf, &r, sizeof(r));
		_exit(write(p[1], buf, sizeof(buf)) != (ssize_t)sizeof(buf));
	}
	close(p[1]);
	if (read(p[0], buf, sizeof(buf)) == (ssize_t)sizeof(buf)) {
		memcpy(&rc, buf, sizeof(rc));
		buf[sizeof(buf) - 1] = '\0';
		snprintf(why, len, "%.*s", (int)len - 1, buf + sizeof(int));
	}
	close(p[0]);
	wait_child(pid);
	return rc;
}

/*
 * The two runs of a GPU test. First the real driver when this machine has a
 * usable GPU (else nchecks SKIPs saying why), in the clean first process;
 * then the program executed again with the fake driver
 * exe_dir/fixtures/libcuda-fake.so as libcuda.so.1 (a link in dir, first on
 * LD_LIBRARY_PATH, before what the caller set: scripts/gpu-check.sh adds the
 * libraries kcolld needs there) and as the kernels library, the TAP count
 * and dir carried in $<prefix>_TAP and $<prefix>_DIR. The fake run keeps
 * dir (the kcolld logs) only when a check failed. Each run calls run_all
 * with *run_name "GPU" or "fake"; exe_dir and dir (PATH_MAX each) are set
 * before. Returns main's exit status.
 */
struct gpu_test {
	const char *prefix;	/* "TEST_GPU_KV" */
	const char *tmp_name;	/* "gpu-kv": dir is /tmp/<tmp_name>-<pid> */
	int nchecks;		/* per run */
	void (*run_all)(void);
	char *exe_dir, *dir;
	const char **run_name;
};

static inline int gpu_test_main(const struct gpu_test *t, char **argv)
{
	char self[PATH_MAX], fake[PATH_MAX + 64], link[PATH_MAX + 64], env[64], name[64];
	char path[2 * PATH_MAX + 130], why[KCOLL_GPU_TEXT];
	const char *tapn, *old;
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (len <= 0)
		return 1;
	self[len] = '\0';
	snprintf(t->exe_dir, PATH_MAX, "%s", self);
	*strrchr(t->exe_dir, '/') = '\0';
	snprintf(name, sizeof(name), "%s_TAP", t->prefix);
	tapn = getenv(name);
	if (tapn) {	/* the fake run */
		snprintf(name, sizeof(name), "%s_DIR", t->prefix);
		if (sscanf(tapn, "%d %d", &tap_n, &tap_failed) != 2 || !getenv(name))
			return 1;
		snprintf(t->dir, PATH_MAX, "%s", getenv(name));
		*t->run_name = "fake";
		t->run_all();
		if (!tap_failed) {
			char cmd[PATH_MAX + 32];

			snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
			if (system(cmd))
				tap_diag("could not remove %s", t->dir);
		} else {
			tap_diag("kcolld logs kept in %s", t->dir);
		}
		return tap_done();
	}
	snprintf(t->dir, PATH_MAX, "/tmp/%s-%d", t->tmp_name, (int)getpid());
	if (mkdir(t->dir, 0700))
		return 1;
	*t->run_name = "GPU";
	if (gpu_test_probe(why, sizeof(why)) == 0) {
		t->run_all();
	} else {
		for (int i = 0; i < t->nchecks; i++)
			tap_skip("needs a GPU (%s): the same checks on the real driver", why);
	}
	snprintf(fake, sizeof(fake), "%s/fixtures/libcuda-fake.so", t->exe_dir);
	snprintf(link, sizeof(link), "%s/libcuda.so.1", t->dir);
	if (access(fake, R_OK) || symlink(fake, link)) {
		for (int i = 0; i < t->nchecks; i++)
			tap_skip("the fake CUDA driver %s is missing (make builds it)", fake);
		rmdir(t->dir);
		return tap_done();
	}
	old = getenv("LD_LIBRARY_PATH");
	snprintf(path, sizeof(path), "%s%s%s", t->dir, old && *old ? ":" : "", old ? old : "");
	setenv("LD_LIBRARY_PATH", path, 1);
	setenv("KCOLL_GPU_LIB", fake, 1);
	snprintf(env, sizeof(env), "%d %d", tap_n, tap_failed);
	snprintf(name, sizeof(name), "%s_TAP", t->prefix);
	setenv(name, env, 1);
	snprintf(name, sizeof(name), "%s_DIR", t->prefix);
	setenv(name, t->dir, 1);
	execv(self, argv);
	tap_ok(0, "re-execute %s with the fake driver: %s", self, strerror(errno));
	return tap_done();
}

#endif /* KCOLL_TESTS_GPU_KCOLLD_H */

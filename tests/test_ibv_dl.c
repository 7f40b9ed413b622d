// SPDX-License-Identifier: MIT
/*
 * The libibverbs loader (rdma/ibv_dl.c): with the machine's libibverbs.so.1
 * every table entry resolves and kcoll_rdma_init() gets as far as asking for
 * devices (the host tier has none: "no RDMA device"); a missing library and
 * one without the verbs functions make kcoll_rdma_init() fail with -ENOENT
 * and -EOPNOTSUPP and a reason that says what to install. The loader runs
 * once per process, so each KCOLL_IB_LIB case runs in a child of its own.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "kcoll/tap.h"

#include "rdma.h"

/* In a child: set KCOLL_IB_LIB=lib, run kcoll_rdma_init, report back. */
static int init_with(const char *lib, char *why, size_t whylen)
{
	int fd[2], st, rc = 1;
	pid_t pid;
	ssize_t n;

	if (pipe(fd))
		return 1;
	pid = fork();
	if (pid == 0) {
		char out[KCOLL_RDMA_WHY + 16];
		int r, len;

		close(fd[0]);
		setenv("KCOLL_IB_LIB", lib, 1);
		r = kcoll_rdma_init();
		len = snprintf(out, sizeof(out), "%d %s", r, kcoll_rdma_why());
		if (write(fd[1], out, (size_t)len) != len)
			_exit(1);
		_exit(0);
	}
	close(fd[1]);
	n = read(fd[0], why, whylen - 1);
	close(fd[0]);
	why[n > 0 ? n : 0] = '\0';
	if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st)) {
		char *text = strchr(why, ' ');

		rc = atoi(why);
		if (text)
			memmove(why, text + 1, strlen(text));
	}
	return rc;
}

static int resolved(void)
{
	const void *const *p = (const void *const *)&kcoll_ibv;
	int n = 0;

	for (size_t i = 0; i < sizeof(kcoll_ibv) / sizeof(void *); i++)
		n += p[i] != NULL;
	return n;
}

int main(void)
{
	const size_t nfns = sizeof(kcoll_ibv) / sizeof(void *);
	char why[KCOLL_RDMA_WHY + 16];
	int r;

	r = init_with("/nonexistent/libibverbs.so.1", why, sizeof(why));
	tap_ok(r == -ENOENT && strstr(why, "cannot load libibverbs (/nonexistent/libibverbs.so.1") &&
	       strstr(why, "install rdma-core's libibverbs1"),
	       "KCOLL_IB_LIB=/nonexistent/libibverbs.so.1: kcoll_rdma_init -ENOENT, why says what to "
	       "install (%s)", why);
	r = init_with("libm.so.6", why, sizeof(why));
	tap_ok(r == -EOPNOTSUPP && strstr(why, "libm.so.6 has no ibv_get_device_list"),
	       "KCOLL_IB_LIB=libm.so.6 (no verbs in it): -EOPNOTSUPP naming the first missing "
	       "function (%s)", why);

	unsetenv("KCOLL_IB_LIB");
	tap_ok(!strcmp(kcoll_ibv_lib(), "libibverbs.so.1"), "default library: libibverbs.so.1");
	r = kcoll_ibv_load(why, sizeof(why));
	if (r == -ENOENT) {
		tap_skip("libibverbs.so.1 is not installed here (%s): nothing to resolve", why);
		return tap_done();
	}
	tap_ok(r == 0, "the machine's libibverbs.so.1 loads (%d%s%s)", r, r ? ": " : "", r ? why : "");
	tap_ok(resolved() == (int)nfns, "all %zu table entries resolve (%d did)", nfns, resolved());

	r = kcoll_rdma_init();
	if (kcoll_rdma_ndevs() > 0) {
		tap_skip("this machine has RDMA devices (%s...): kcoll_rdma_init opened them",
			 kcoll_rdma_dev_name(0));
	} else {
		tap_ok(r == -ENODEV && !strncmp(kcoll_rdma_why(), "no ", 3) &&
		       strstr(kcoll_rdma_why(), "RDMA device"),
		       "kcoll_rdma_init gets past the loader to the device list: %d (%s)", r, kcoll_rdma_why());
	}
	kcoll_rdma_fini();
	return tap_done();
}

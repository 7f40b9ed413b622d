/* SPDX-License-Identifier: MIT */
/*
 * The benches' process launcher (kcoll-bench's ranks and id helper,
 * kcoll-kvbench's targets): start N children, each either forked to run a
 * function or exec'ing an argv (a launch template such as
 * "scripts/netns-cluster.sh exec %h" or "ssh host%h" in front of a command
 * line), read their stdout line by line, and stop them all when one fails,
 * when the caller asks, on SIGINT/SIGTERM/SIGHUP or at a deadline.
 *
 * Each child has stdin /dev/null, stdout a pipe to the parent (one report
 * line per message, LAUNCH_LINE_BYTES at most) and stderr the parent's. By
 * default it leads a process group of its own, so that stopping it reaches
 * whatever its launch template started; LAUNCH_SAME_GROUP keeps it in the
 * parent's (a terminal's Ctrl-C then reaches it directly). Stopping is
 * SIGTERM to each child's group, SIGKILL LAUNCH_KILL_GRACE_MS later.
 *
 * Usage: launch_init, launch_spawn for each child, then launch_run (until
 * every child has exited) or launch_poll in a loop of one's own; launch_stop
 * ends the children that serve for the whole run; launch_free. Plain C over
 * libc: no kcoll includes.
 */
#ifndef KCOLL_LAUNCH_H
#define KCOLL_LAUNCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define LAUNCH_KILL_GRACE_MS	3000	/* SIGTERM, then SIGKILL */
#define LAUNCH_DRAIN_MS		2000	/* output still arriving after every child exited */
#define LAUNCH_LINE_BYTES	1024	/* one report line */
#define LAUNCH_POLL_MS		200

struct launch;

/* What the caller makes of its children. */
struct launch_ops {
	/* A line child i wrote (newline dropped, NUL-terminated, may be edited). */
	void (*line)(struct launch *l, int i, char *line);
	/* Child i's name in messages ("rank 3 (host 1, kc-h1)"). */
	void (*label)(struct launch *l, int i, char *out, size_t len);
	/* Optional: child i failed on its own with wait status st; true if this
	 * said why, false for launch.c's "LABEL exited with status N". */
	bool (*exited)(struct launch *l, int i, int st);
};

struct launch_child {
	pid_t pid;			/* 0: reaped (or never started) */
	int fd;				/* its stdout, -1: closed */
	bool failed;			/* said why it failed (launch_child_failed) */
	size_t len;
	char buf[LAUNCH_LINE_BYTES];
};

struct launch {
	const char *prog;		/* the prefix of every message */
	const char *noun;		/* what a child is, in messages: "rank" ("child") */
	const struct launch_ops *ops;
	void *ctx;			/* the caller's */
	unsigned int flags;		/* LAUNCH_* */
	int n;
	struct launch_child *c;
	/* A time (launch_now_us) after which the run fails with deadline_msg;
	 * 0: none. */
	double deadline;
	const char *deadline_msg;
	bool failed;			/* some child failed: the rest are being stopped */
	/* Internal state. */
	bool stopping;			/* SIGTERM sent (launch_stop or a failure) */
	bool sent_kill;
	double kill_at;			/* SIGKILL what is left then; 0: not yet */
	double drain_until;
	struct pollfd *pfd;
	int *who;
};

#define LAUNCH_SAME_GROUP	0x1u	/* children stay in the parent's process group */

/* The stop signal caught since launch_catch_signals(true), 0 if none. */
extern volatile sig_atomic_t launch_stop_signal;

/* Room for n children, none started. 0 or -ENOMEM. */
int launch_init(struct launch *l, int n, const char *prog, const struct launch_ops *ops,
		void *ctx, unsigned int flags);
void launch_free(struct launch *l);

/*
 * Start child i: exec argv (argv[0] looked up in PATH; 127 if it cannot run),
 * or, argv NULL, fork and exit with fn(arg) != 0. 0 or negative errno.
 */
int launch_spawn(struct launch *l, int i, char *const *argv, int (*fn)(void *), void *arg);

/* One pass: wait up to LAUNCH_POLL_MS for output, take it, reap children, act
 * on a stop signal, the deadline or the kill time. 1 while a child runs or
 * still has output to give, 0 once everything is over. */
int launch_poll(struct launch *l);
/* launch_poll until everything is over. 0, or -1 if the run failed. */
int launch_run(struct launch *l);

/* Child i said why it failed (no second message when it exits non-zero): stop all. */
void launch_child_failed(struct launch *l, int i);
/* The run failed: stop every child (the first call only). */
void launch_fail(struct launch *l);
/* Stop every child, not a failure: their SIGTERM exits are not reported. */
void launch_stop(struct launch *l);

/* Catch (on) or default (off) SIGINT, SIGTERM and SIGHUP into launch_stop_signal;
 * launch_poll then stops every child. No SA_RESTART: blocking calls return EINTR. */
void launch_catch_signals(bool on);
/* Leave with the caught stop signal, if any, as if it had not been caught. */
void launch_restore_signal(void);

double launch_now_us(void);

/* ---- command lines ------------------------------------------------------- */

/* A growing argv (NULL-terminated, strings owned); oom: some add failed. */
struct launch_argv {
	char **v;
	int n, cap;
	bool oom;
};

void launch_argv_add(struct launch_argv *a, const char *s);
void launch_argv_addf(struct launch_argv *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* The template's words (split on blanks) for host h: %h is h, %% a percent sign. */
void launch_argv_template(struct launch_argv *a, const char *tmpl, int host);
void launch_argv_free(struct launch_argv *a);

/* ---- binary values on a report line --------------------------------------- */

/* n bytes as 2n lowercase hex digits and a NUL. */
void launch_hex_encode(const void *p, size_t n, char *hex);
/* Exactly 2n hex digits into n bytes: 0 or -EINVAL. */
int launch_hex_decode(const char *hex, void *p, size_t n);

#endif /* KCOLL_LAUNCH_H */

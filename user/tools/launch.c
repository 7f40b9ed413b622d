// SPDX-License-Identifier: MIT
/*
 * The benches' process launcher: children on pipes, their report lines, and
 * stopping them all (launch.h says how it is used).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

volatile sig_atomic_t launch_stop_signal;

double launch_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int launch_init(struct launch *l, int n, const char *prog, const struct launch_ops *ops,
		void *ctx, unsigned int flags)
{
	*l = (struct launch){ .prog = prog, .noun = "child", .ops = ops, .ctx = ctx,
			      .flags = flags, .n = n };
	l->c = calloc(n, sizeof(*l->c));
	l->pfd = calloc(n, sizeof(*l->pfd));
	l->who = calloc(n, sizeof(*l->who));
	if (!l->c || !l->pfd || !l->who) {
		launch_free(l);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++)
		l->c[i].fd = -1;
	return 0;
}

void launch_free(struct launch *l)
{
	free(l->c);
	free(l->pfd);
	free(l->who);
	l->c = NULL;
	l->pfd = NULL;
	l->who = NULL;
}

static void on_stop_signal(int sig)
{
	launch_stop_signal = sig;
}

void launch_catch_signals(bool on)
{
	struct sigaction sa = { .sa_handler = on ? on_stop_signal : SIG_DFL };

	sigemptyset(&sa.sa_mask);	/* no SA_RESTART: poll returns EINTR */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

void launch_restore_signal(void)
{
	if (!launch_stop_signal)
		return;
	launch_catch_signals(false);
	raise(launch_stop_signal);
}

/* Signal every child's process group (or the child, where it leads none). */
static void launch_signal(struct launch *l, int sig)
{
	for (int i = 0; i < l->n; i++) {
		if (l->c[i].pid <= 0)
			continue;
		if (kill(-l->c[i].pid, sig) && errno == ESRCH)
			kill(l->c[i].pid, sig);
	}
}

void launch_stop(struct launch *l)
{
	if (l->stopping)
		return;
	l->stopping = true;
	launch_signal(l, SIGTERM);
	l->kill_at = launch_now_us() + LAUNCH_KILL_GRACE_MS * 1e3;
}

void launch_fail(struct launch *l)
{
	if (l->failed)
		return;
	l->failed = true;
	launch_stop(l);
}

void launch_child_failed(struct launch *l, int i)
{
	l->c[i].failed = true;
	launch_fail(l);
}

int launch_spawn(struct launch *l, int i, char *const *argv, int (*fn)(void *), void *arg)
{
	struct launch_child *c = &l->c[i];
	bool own_group = !(l->flags & LAUNCH_SAME_GROUP);
	int p[2];

	if (pipe2(p, O_CLOEXEC))
		return -errno;
	fflush(stdout);
	fflush(stderr);
	c->pid = fork();
	if (c->pid < 0) {
		int err = -errno;

		c->pid = 0;
		close(p[0]);
		close(p[1]);
		return err;
	}
	if (c->pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		if (own_group)
			setpgid(0, 0);
		launch_catch_signals(false);
		if (null >= 0)
			dup2(null, STDIN_FILENO);
		dup2(p[1], STDOUT_FILENO);	/* the copy is not close-on-exec */
		for (int q = 0; q < i; q++)	/* earlier children's pipes (exec would close them) */
			if (l->c[q].fd >= 0)
				close(l->c[q].fd);
		if (argv) {
			execvp(argv[0], argv);
			fprintf(stderr, "%s: cannot run '%s': %s\n", l->prog, argv[0],
				strerror(errno));
			_exit(127);
		}
		i = fn(arg);
		fflush(stdout);
		_exit(i ? 1 : 0);
	}
	if (own_group)
		setpgid(c->pid, c->pid);	/* also here: no race with an early kill */
	close(p[1]);
	c->fd = p[0];
	fcntl(c->fd, F_SETFL, O_NONBLOCK);
	return 0;
}

/* Read what child i has to say; close at EOF. */
static void launch_read(struct launch *l, int i)
{
	struct launch_child *c = &l->c[i];

	for (;;) {
		ssize_t n = read(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len);
		char *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			if (c->len) {	/* a last line without its newline */
				c->buf[c->len] = '\0';
				l->ops->line(l, i, c->buf);
				c->len = 0;
			}
			close(c->fd);
			c->fd = -1;
			return;
		}
		c->len += n;
		c->buf[c->len] = '\0';
		while ((nl = strchr(c->buf, '\n'))) {
			*nl = '\0';
			l->ops->line(l, i, c->buf);
			c->len -= nl + 1 - c->buf;
			memmove(c->buf, nl + 1, c->len + 1);
		}
		if (c->len == sizeof(c->buf) - 1) {	/* too long for a report line */
			l->ops->line(l, i, c->buf);
			c->len = 0;
		}
	}
}

/* Did we cause this exit status (SIGTERM, or SIGKILL after the grace time)? */
static bool stopped_by_us(const struct launch *l, int st)
{
	int sig = WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st) - 128;	/* sh: 128 + sig */

	return (l->stopping && sig == SIGTERM) || (l->sent_kill && sig == SIGKILL);
}

/* Child i exited with status st. */
static void launch_reaped(struct launch *l, int i, int st)
{
	struct launch_child *c = &l->c[i];
	bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
	char label[160];

	c->pid = 0;
	if (ok)
		return;
	/* A child that said why, or that we stopped, needs no second message;
	 * one that died on its own (crashed, killed) does. */
	if (!c->failed && !stopped_by_us(l, st) && !(l->failed && WIFEXITED(st) &&
						      WEXITSTATUS(st) == 1) &&
	    !(l->ops->exited && l->ops->exited(l, i, st))) {
		l->ops->label(l, i, label, sizeof(label));
		if (WIFSIGNALED(st))
			fprintf(stderr, "%s: %s killed by signal %d (%s)\n", l->prog, label,
				WTERMSIG(st), strsignal(WTERMSIG(st)));
		else
			fprintf(stderr, "%s: %s exited with status %d%s\n", l->prog, label,
				WEXITSTATUS(st), WEXITSTATUS(st) == 127 ?
				" (could not run its command)" : "");
	}
	launch_fail(l);
}

int launch_poll(struct launch *l)
{
	int alive = 0, np = 0, st;
	pid_t pid;

	for (int i = 0; i < l->n; i++) {
		alive += l->c[i].pid > 0;
		if (l->c[i].fd >= 0) {
			l->who[np] = i;
			l->pfd[np++] = (struct pollfd){ .fd = l->c[i].fd, .events = POLLIN };
		}
	}
	if (!alive && !np)
		return 0;
	if (!alive) {
		/* Exited, but something it started still holds the pipe. */
		if (!l->drain_until)
			l->drain_until = launch_now_us() + LAUNCH_DRAIN_MS * 1e3;
		if (launch_now_us() > l->drain_until) {
			for (int q = 0; q < np; q++) {
				close(l->c[l->who[q]].fd);
				l->c[l->who[q]].fd = -1;
			}
			return 0;
		}
	}
	if (poll(l->pfd, np, LAUNCH_POLL_MS) > 0)
		for (int q = 0; q < np; q++)
			if (l->pfd[q].revents)
				launch_read(l, l->who[q]);
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
		for (int i = 0; i < l->n; i++)
			if (l->c[i].pid == pid)
				launch_reaped(l, i, st);
	if (launch_stop_signal && !l->failed) {
		fprintf(stderr, "%s: %s: stopping every %s\n", l->prog,
			strsignal(launch_stop_signal), l->noun);
		launch_fail(l);
	}
	if (l->deadline && launch_now_us() > l->deadline && !l->failed) {
		fprintf(stderr, "%s: %s\n", l->prog, l->deadline_msg);
		launch_fail(l);
	}
	if (l->kill_at && launch_now_us() > l->kill_at) {
		launch_signal(l, SIGKILL);
		l->kill_at = 0;
		l->sent_kill = true;
	}
	return 1;
}

int launch_run(struct launch *l)
{
	while (launch_poll(l))
		;
	return l->failed ? -1 : 0;
}

/* ---- command lines ------------------------------------------------------- */

void launch_argv_add(struct launch_argv *a, const char *s)
{
	char *copy;

	if (a->n + 2 > a->cap) {
		int cap = a->cap ? 2 * a->cap : 32;
		char **v = realloc(a->v, cap * sizeof(*v));

		if (!v) {
			a->oom = true;
			return;
		}
		a->v = v;
		a->cap = cap;
	}
	copy = strdup(s);
	if (!copy) {
		a->oom = true;
		return;
	}
	a->v[a->n++] = copy;
	a->v[a->n] = NULL;
}

void launch_argv_addf(struct launch_argv *a, const char *fmt, ...)
{
	char s[64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s, sizeof(s), fmt, ap);
	va_end(ap);
	launch_argv_add(a, s);
}

void launch_argv_free(struct launch_argv *a)
{
	for (int i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
	*a = (struct launch_argv){ 0 };
}

void launch_argv_template(struct launch_argv *a, const char *tmpl, int host)
{
	const char *p = tmpl;

	while (*p) {
		char word[4096];
		size_t n = 0;

		p += strspn(p, " \t");
		if (!*p)
			break;
		for (; *p && *p != ' ' && *p != '\t'; p++) {
			if (p[0] == '%' && p[1] == 'h') {
				n += snprintf(word + n, sizeof(word) - n, "%d", host);
				p++;
			} else if (p[0] == '%' && p[1] == '%') {
				word[n++] = '%';
				p++;
			} else {
				word[n++] = *p;
			}
			if (n >= sizeof(word) - 16) {
				a->oom = true;
				return;
			}
		}
		word[n] = '\0';
		launch_argv_add(a, word);
	}
}

/* ---- binary values on a report line --------------------------------------- */

static int hex_digit(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

void launch_hex_encode(const void *p, size_t n, char *hex)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		sprintf(hex + 2 * i, "%02x", b[i]);
	hex[2 * n] = '\0';
}

int launch_hex_decode(const char *hex, void *p, size_t n)
{
	unsigned char *b = p;

	if (strlen(hex) != 2 * n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		b[i] = (unsigned char)(hi << 4 | lo);
	}
	return 0;
}

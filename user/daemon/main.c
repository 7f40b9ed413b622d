// SPDX-License-Identifier: MIT
/*
 * kcolld: options, the listening socket, and the control thread. The control
 * thread owns client and communicator lifetimes: it accepts clients, answers
 * control messages, reaps clients whose socket closed, runs the watchdog and
 * handles signals. The data path runs on ring threads and the worker pool.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kcoll/kcoll.h>

#include "c4d.h"
#include "config.h"
#include "flow.h"
#include "kcolld.h"
#include "net.h"
#include "xport.h"
#include "log.h"
#include "metrics.h"
#include "rdma.h"
#include "reduce.h"
#ifdef KCOLL_HAVE_BPF
#include "kcolld_bpf.h"
#endif

#ifdef KCOLL_HAVE_BPF
static const bool have_bpf = true;
#else
static const bool have_bpf = false;
#endif

static bool bpf_attached(void)
{
	return kd_bpf_sums_hook != NULL;
}

/* The metrics renderer reads these rooms through main (metrics.h). */
static const struct kd_metrics_src metrics_src = {
	.c4_active_kinds = kd_c4_active_kinds,
	.nlinks = kd_net_nlinks,
	.link_ifname = kd_net_link_ifname,
	.bpf_on = bpf_attached,
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kcolld [options]\n"
		"Run the kcoll daemon: it performs collectives for local applications.\n\n"
		"  -f, --foreground       stay in the foreground (default: daemonize)\n"
		"  -s, --socket PATH      listen on PATH (default $KCOLL_SOCKET or %s)\n"
		"  -l, --log FILE         log to FILE (default: stderr; /var/log/kcolld.log when daemonized)\n"
		"  -L, --log-level LEVEL  error, warn, info (default) or debug\n"
		"  -v, --verbose          same as --log-level debug\n"
		"  -w, --workers N        data-path worker threads (default $KCOLL_WORKERS, 0 = one per CPU)\n"
		"  -p, --pidfile FILE     write the daemon's pid to FILE\n"
		"      --listen ADDR:PORT TCP address other kcollds connect to (default $KCOLL_LISTEN\n"
		"                         or 0.0.0.0:0, any free port; ids carry it)\n"
		"      --addrs A[,B...]   IPv4 addresses to advertise to peers (default: every up\n"
		"                         interface but loopback; streams are spread across them)\n"
		"  -h, --help             this help\n"
		"  -V, --version          print the version\n\n"
		"Environment knobs: `kcollctl config`. Manual: kcolld(8).\n",
		KCOLL_DEFAULT_SOCKET);
}

static int mkdir_parent(const char *path)
{
	char *dup = strdup(path), *dir;
	int r = 0;

	if (!dup)
		return -ENOMEM;
	dir = dirname(dup);
	if (mkdir(dir, 0755) && errno != EEXIST)
		r = -errno;
	free(dup);
	return r;
}

static int listen_socket(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		kc_err("socket path too long: %s", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	r = mkdir_parent(path);
	if (r) {
		kc_err("cannot create the directory of %s: %s", path, strerror(-r));
		return r;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	/* A socket file nobody answers on is stale; one that answers is a
	 * running kcolld we must not steal it from. */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		kc_err("another kcolld is already listening on %s (stop it, or use -s PATH)", path);
		close(fd);
		return -EADDRINUSE;
	}
	unlink(path);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 128)) {
		r = -errno;
		kc_err("cannot listen on %s: %s", path, strerror(errno));
		close(fd);
		return r;
	}
	/* Any local user may connect: communicators and rings are per uid/client. */
	chmod(path, 0666);
	return fd;
}

static void ep_add(int fd, void *ptr)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = ptr };

	epoll_ctl(kd.epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void on_accept(void)
{
	for (;;) {
		/* Non-blocking: a client that stops reading its replies must not
		 * stall the control thread (the reply fails and the client goes). */
		int fd = accept4(kd.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		struct kd_client *c;

		if (fd < 0)
			return;
		if (atomic_load(&kd.draining)) {
			close(fd);
			continue;
		}
		c = kd_client_new(fd);
		if (!c) {
			close(fd);
			continue;
		}
		c->next = kd.clients;
		kd.clients = c;
		atomic_fetch_add(&kd.stats.clients_total, 1);
		ep_add(fd, c);
		kc_dbg("client %u: connected (pid %d uid %d)", c->id, c->pid, c->uid);
	}
}

static void client_reap(struct kd_client *c)
{
	struct kd_client **pp;

	for (pp = &kd.clients; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	epoll_ctl(kd.epfd, EPOLL_CTL_DEL, c->sock, NULL);
	kc_dbg("client %u: gone", c->id);
	kd_client_close(c);
}

static void reply_hdr(struct kd_client *c, const struct kcoll_msg_hdr *req, void *rep, size_t len,
		      int status, int fd)
{
	struct kcoll_msg_hdr *h = rep;

	h->magic = KCOLL_PROTO_MAGIC;
	h->type = req->type;
	h->len = len;
	h->seq = req->seq;
	h->status = status;
	if (kcoll_msg_send(c->sock, rep, len, fd))
		kd_client_kill(c, "cannot send a control reply (client not reading its socket)");
}

static void on_hello(struct kd_client *c, const struct kcoll_msg_hello *m, size_t len)
{
	struct kcoll_msg_hello_reply rep = { 0 };
	int fd = -1, r;

	snprintf(rep.daemon_version, sizeof(rep.daemon_version), "%s", KCOLL_VERSION);
	rep.daemon_pid = getpid();
	if (len < sizeof(*m) || c->hello_done || c->ring) {
		r = -EPROTO;
		snprintf(rep.error, sizeof(rep.error), "malformed or repeated HELLO");
	} else if (m->proto_version != KCOLL_PROTO_VERSION || m->abi_version != KCOLL_ABI_VERSION) {
		r = -EPROTONOSUPPORT;
		snprintf(rep.error, sizeof(rep.error),
			 "client speaks protocol %u / ring ABI %u, kcolld %s speaks %u / %u: use the same kcoll build",
			 m->proto_version, m->abi_version, KCOLL_VERSION, KCOLL_PROTO_VERSION,
			 KCOLL_ABI_VERSION);
	} else {
		r = kd_client_ring_create(c, m->sq_entries, &fd);
		if (!r)
			r = kd_client_start(c);
		if (r)
			snprintf(rep.error, sizeof(rep.error), "cannot create the ring: %s", strerror(-r));
	}
	if (!r) {
		c->hello_done = true;
		rep.ring_size = c->ring_size;
	} else {
		kc_warn("client %u (pid %d): refused: %s", c->id, c->pid, rep.error);
	}
	reply_hdr(c, &m->hdr, &rep, sizeof(rep), r, r ? -1 : fd);
	if (fd >= 0)
		close(fd);
}

static void on_unique_id(struct kd_client *c, const struct kcoll_msg_hdr *m)
{
	struct {
		struct kcoll_msg_hdr hdr;
		struct kcoll_id id;
	} rep = { 0 };

	kd_net_fill_id(&rep.id);
	reply_hdr(c, m, &rep, sizeof(rep), rep.id.magic ? 0 : -EIO, -1);
}

/* kcollctl set KEY VALUE: root or the daemon's own user. */
static void on_set(struct kd_client *c, const struct kcoll_msg_set *m, ssize_t len)
{
	struct kcoll_msg_set_reply rep = { 0 };
	char key[sizeof(m->key) + 1], value[sizeof(m->value) + 1];
	int r;

	if (len < (ssize_t)sizeof(*m)) {
		reply_hdr(c, &m->hdr, &rep, sizeof(rep), -EINVAL, -1);
		return;
	}
	snprintf(key, sizeof(key), "%.*s", (int)sizeof(m->key), m->key);
	snprintf(value, sizeof(value), "%.*s", (int)sizeof(m->value), m->value);
	if (c->uid != 0 && c->uid != geteuid()) {
		snprintf(rep.error, sizeof(rep.error), "only root or the daemon's user may change it");
		r = -EPERM;
	} else if (!strcmp(key, "algo") || !strcmp(key, "streams") || !strcmp(key, "lane_bytes")) {
		r = kd_net_set(key, value, rep.error, sizeof(rep.error));
	} else {
		r = kd_tunable_set(key, value, rep.error, sizeof(rep.error));
	}
	if (!r)
		kc_info("client %u (pid %d): set %s=%s", c->id, c->pid, key, value);
	reply_hdr(c, &m->hdr, &rep, sizeof(rep), r, -1);
}

static void on_status(struct kd_client *c, const struct kcoll_msg_hdr *m)
{
	static char buf[KCOLL_MSG_BYTES];
	struct kcoll_msg_hdr *h = (struct kcoll_msg_hdr *)buf;
	size_t n = kd_status_render(buf + sizeof(*h), sizeof(buf) - sizeof(*h), m->flags & 1);

	reply_hdr(c, m, buf, sizeof(*h) + n, 0, -1);
}

/* kcollctl metrics: the text the HTTP endpoint serves, endpoint on or off. */
static void on_metrics(struct kd_client *c, const struct kcoll_msg_hdr *m)
{
	static char buf[KCOLL_MSG_BYTES];
	struct kcoll_msg_hdr *h = (struct kcoll_msg_hdr *)buf;
	long n = kd_metrics_render(buf + sizeof(*h), sizeof(buf) - sizeof(*h));

	reply_hdr(c, m, buf, sizeof(*h) + (n < 0 ? 0 : (size_t)n), n < 0 ? (int)n : 0, -1);
}

/* kcollctl anomalies / events / plan (c4d.c). */
static void on_c4(struct kd_client *c, const struct kcoll_msg_c4 *m, ssize_t len)
{
	static char buf[KCOLL_MSG_BYTES];
	struct kcoll_msg_hdr *h = (struct kcoll_msg_hdr *)buf;
	size_t n;

	if (len < (ssize_t)sizeof(*m)) {
		reply_hdr(c, &m->hdr, buf, sizeof(*h), -EINVAL, -1);
		return;
	}
	/* an option we do not know (a newer kcollctl's) would be answered as if absent */
	if (m->hdr.flags & ~(KCOLL_C4_F_JSON | KCOLL_C4_F_LOCAL)) {
		reply_hdr(c, &m->hdr, buf, sizeof(*h), -EOPNOTSUPP, -1);
		return;
	}
	n = kd_c4_render(m->what, m->since, buf + sizeof(*h), sizeof(buf) - sizeof(*h), m->hdr.flags);
	reply_hdr(c, &m->hdr, buf, sizeof(*h) + n, 0, -1);
}

/* One control message from a client. False: drop the client. */
static bool on_message(struct kd_client *c)
{
	union {
		struct kcoll_msg_hdr hdr;
		struct kcoll_msg_hello hello;
		struct kcoll_msg_mem_reg reg;
		struct kcoll_msg_mem_unreg unreg;
		struct kcoll_msg_mem_reg_kdev reg_kdev;
		struct kcoll_msg_mem_reg_dev reg_dev;
		struct kcoll_msg_comm_init init;
		struct kcoll_msg_comm_destroy destroy;
		struct kcoll_msg_comm_lane lane;
		struct kcoll_msg_set set;
		struct kcoll_msg_c4 c4;
		uint8_t raw[512];
	} m;
	struct kcoll_msg_hdr rep;
	const char *why = NULL;
	ssize_t n;
	int fd = -1, r;

	n = kcoll_msg_recv(c->sock, &m, sizeof(m), &fd);
	if (n == -EAGAIN)
		return true;
	if (n <= 0) {
		if (n < 0)
			kc_warn("client %u (pid %d): bad control message (%s); disconnecting", c->id,
				c->pid, strerror((int)-n));
		return false;
	}
	if (m.hdr.type != KCOLL_MSG_HELLO && m.hdr.type != KCOLL_MSG_STATUS &&
	    m.hdr.type != KCOLL_MSG_SET && m.hdr.type != KCOLL_MSG_C4 &&
	    m.hdr.type != KCOLL_MSG_METRICS && !c->hello_done) {
		r = -EPROTO;
		goto reply;
	}
	switch (m.hdr.type) {
	case KCOLL_MSG_HELLO:
		on_hello(c, &m.hello, n);
		goto out;
	case KCOLL_MSG_UNIQUE_ID:
		on_unique_id(c, &m.hdr);
		goto out;
	case KCOLL_MSG_STATUS:
		on_status(c, &m.hdr);
		goto out;
	case KCOLL_MSG_SET:
		on_set(c, &m.set, n);
		goto out;
	case KCOLL_MSG_C4:
		on_c4(c, &m.c4, n);
		goto out;
	case KCOLL_MSG_METRICS:
		on_metrics(c, &m.hdr);
		goto out;
	case KCOLL_MSG_MEM_REG:
		if (n < (ssize_t)sizeof(m.reg) || fd < 0) {
			r = -EINVAL;
			break;
		}
		r = kd_region_add(c, fd, m.reg.addr, m.reg.size);
		break;
	case KCOLL_MSG_MEM_REG_KDEV:
		r = n < (ssize_t)sizeof(m.reg_kdev) ? -EINVAL :
		    kd_region_add_pinned(c, m.reg_kdev.handle, m.reg_kdev.addr, m.reg_kdev.size);
		break;
	case KCOLL_MSG_MEM_UNREG:
		r = n < (ssize_t)sizeof(m.unreg) ? -EINVAL : kd_region_del(c, m.unreg.addr);
		break;
	case KCOLL_MSG_MEM_REG_DEV: {
		char dwhy[512] = "";

		r = n < (ssize_t)sizeof(m.reg_dev) ? -EINVAL : kd_region_add_dev(c, &m.reg_dev, dwhy,
										  sizeof(dwhy));
		if (r)
			kc_warn("client %u (pid %d): device buffer registration refused: %s", c->id,
				c->pid, dwhy[0] ? dwhy : strerror(-r));
		break;
	}
	case KCOLL_MSG_COMM_INIT:
		if (n < (ssize_t)sizeof(m.init)) {
			r = -EINVAL;
			break;
		}
		r = kd_comm_join(c, &m.init, &why);
		if (r == 1)
			goto out;	/* answered when the communicator forms */
		{
			struct kcoll_msg_comm_init_reply irep = { 0 };

			snprintf(irep.error, sizeof(irep.error), "%s", why ? why : "");
			reply_hdr(c, &m.hdr, &irep, sizeof(irep), r, -1);
		}
		goto out;
	case KCOLL_MSG_COMM_LANE: {
		int lfd = -1;

		r = n < (ssize_t)sizeof(m.lane) ? -EINVAL : kd_comm_take_lane(c, m.lane.comm_id, m.lane.host, &lfd);
		memset(&rep, 0, sizeof(rep));
		reply_hdr(c, &m.hdr, &rep, sizeof(rep), r, lfd);
		if (lfd >= 0)
			close(lfd);
		goto out;
	}
	case KCOLL_MSG_COMM_DESTROY:
		r = n < (ssize_t)sizeof(m.destroy) ? -EINVAL : kd_comm_destroy(c, m.destroy.comm_id);
		break;
	case KCOLL_MSG_SEG_REG:
	case KCOLL_MSG_SEG_UNREG:
	case KCOLL_MSG_SEG_IMPORT:
	case KCOLL_MSG_SEG_CLOSE:
	case KCOLL_MSG_SEG_NOTIFS: {
		static uint8_t kvrep[sizeof(struct kcoll_msg_seg_notifs_reply)];	/* control thread only */
		size_t kvlen;
		int kvfd;

		r = kd_kv_message(c, &m.hdr, n, kvrep, &kvlen, &kvfd);
		reply_hdr(c, &m.hdr, kvrep, kvlen, r, r ? -1 : kvfd);
		if (kvfd >= 0)
			close(kvfd);
		goto out;
	}
	default:
		r = -EOPNOTSUPP;
		break;
	}
reply:
	memset(&rep, 0, sizeof(rep));
	reply_hdr(c, &m.hdr, &rep, sizeof(rep), r, -1);
out:
	if (fd >= 0)
		close(fd);
	return true;
}

/*
 * Every client holds a socket and its ring's fds, every peer daemon of
 * every multi-host communicator up to 2 + streams connections, every lane
 * one more (docs/perf/lanes-scale-2026-11-27.md counted 45 at 16 hosts for
 * one communicator): the usual soft limit of 1024 runs out long before the
 * memory does. Take the hard limit, as servers that hold many connections
 * do; the systemd unit raises that (LimitNOFILE).
 */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;

		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			kc_warn("cannot raise the open-file limit from %llu to %llu: %s",
				(unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
	}
	kc_info("open-file limit: %llu", (unsigned long long)rl.rlim_cur);
}

static int setup_signals(void)
{
	sigset_t set;
	int fd;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	return fd < 0 ? -errno : fd;
}

static bool inflight_any(void)
{
	for (struct kd_client *c = kd.clients; c; c = c->next)
		if (atomic_load(&c->inflight))
			return true;
	return false;
}

/* SIGTERM: stop accepting, let admitted ops finish (bounded), then close. */
static void drain_and_close(void)
{
	int64_t deadline = kd_now_ns() + 5 * 1000000000LL;

	atomic_store(&kd.draining, true);
	epoll_ctl(kd.epfd, EPOLL_CTL_DEL, kd.listen_fd, NULL);
	close(kd.listen_fd);
	unlink(kd.socket_path);
	while (inflight_any() && kd_now_ns() < deadline) {
		kd_comm_watchdog(kd_now_ns());
		usleep(10000);
	}
	if (inflight_any())
		kc_warn("drain: operations still in flight after 5 s; closing anyway");
	while (kd.clients) {
		struct kd_client *c = kd.clients;

		if (c->ring)
			kcoll_store_release(&c->ring->status, KCOLL_RING_DEAD);
		client_reap(c);
	}
	kd_comm_watchdog(kd_now_ns());
}

static int daemonize(const char *logpath)
{
	pid_t pid = fork();
	int fd;

	if (pid < 0)
		return -errno;
	if (pid > 0)
		_exit(0);
	setsid();
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0)
		_exit(0);
	if (chdir("/"))
		return -errno;
	fd = open("/dev/null", O_RDWR);
	if (fd >= 0) {
		dup2(fd, 0);
		dup2(fd, 1);
		if (!logpath)
			dup2(fd, 2);
		if (fd > 2)
			close(fd);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "foreground", no_argument, NULL, 'f' },
		{ "socket", required_argument, NULL, 's' },
		{ "log", required_argument, NULL, 'l' },
		{ "log-level", required_argument, NULL, 'L' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "workers", required_argument, NULL, 'w' },
		{ "pidfile", required_argument, NULL, 'p' },
		{ "listen", required_argument, NULL, 'P' },
		{ "addrs", required_argument, NULL, 'A' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 }
	};
	enum kcoll_log_level level;
	const char *logpath = NULL, *pidfile = NULL;
	const char *listen_spec = kcoll_knob_str("KCOLL_LISTEN"), *addrs_spec = kcoll_knob_str("KCOLL_ADDRS");
	bool foreground = false;
	FILE *logf = NULL;
	int sigfd, opt, r;
	int64_t last_watchdog = 0, last_tune = 0;
	static int metrics_tag;	/* epoll: the metrics endpoint's nested set */

	if (kcoll_log_level_parse(kcoll_knob_str("KCOLL_LOG_LEVEL"), &level))
		level = KCOLL_LOG_INFO;
	kd.socket_path = kcoll_knob_str("KCOLL_SOCKET");
	kd.nworkers = kcoll_knob_ll("KCOLL_WORKERS");
	while ((opt = getopt_long(argc, argv, "fs:l:L:vw:p:P:A:hV", opts, NULL)) != -1) {
		switch (opt) {
		case 'f': foreground = true; break;
		case 's': kd.socket_path = optarg; break;
		case 'l': logpath = optarg; break;
		case 'L':
			if (kcoll_log_level_parse(optarg, &level)) {
				fprintf(stderr, "kcolld: unknown log level '%s' (error, warn, info, debug)\n", optarg);
				return 2;
			}
			break;
		case 'v': level = KCOLL_LOG_DEBUG; break;
		case 'w': kd.nworkers = atoi(optarg); break;
		case 'p': pidfile = optarg; break;
		case 'P': listen_spec = optarg; break;
		case 'A': addrs_spec = optarg; break;
		case 'h': usage(stdout); return 0;
		case 'V':
			printf("kcolld %s (ring ABI %d)\n", KCOLL_VERSION, KCOLL_ABI_VERSION);
			printf("built with: rdma (libibverbs) and gpu (CUDA driver), both loaded at run time%s\n",
			       have_bpf ? ", bpf (flow tracking, KCOLL_BPF=1)" : "");
			if (!have_bpf)
				printf("built without: bpf (clang, bpftool or libbpf-dev missing, or WITH_BPF=0)\n");
			return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kcolld: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!foreground && !logpath)
		logpath = "/var/log/kcolld.log";
	if (logpath) {
		logf = fopen(logpath, "a");
		if (!logf) {
			fprintf(stderr, "kcolld: cannot open log %s: %s\n", logpath, strerror(errno));
			return 1;
		}
	}
	kcoll_log_setup(logf, level);
	if (kd.nworkers <= 0)
		kd.nworkers = sysconf(_SC_NPROCESSORS_ONLN);
	kd_tunables_init();
	/* Unmapped memory must leave the RDMA registration cache (zero-copy
	 * sends, KV) before its address can be mapped again. */
	kd_unmap_subscribe(kcoll_rdma_mr_invalidate);
	/* The upward seams (docs/architecture.md, "Layers"): what rooms above
	 * the ring server and the network take part in, registered before any
	 * client or peer connects. comm.c's runner and network tables are
	 * installed by kd_pool_start and kd_net_start below. */
	if (kd_client_register(&kd_comm_client_ops) || kd_client_register(&kd_exec_client_ops) ||
	    kd_client_register(&kd_kv_client_ops) || kd_net_hello_register(KD_CONN_KV, kd_kv_accept) ||
	    kd_net_hello_register(KD_CONN_LANE, kd_net_lane_accept)) {
		kc_err("startup failed: cannot register the rooms' ops tables");
		return 1;
	}
	kd_c4_start();
	kd.spin_ns = kcoll_knob_ll("KCOLL_SPIN_US") * 1000;
	kd.start_ns = kd_now_ns();

	/* The kernel module is optional: without it ordinary buffers are copied. */
	if (kcoll_kdev_open(&kd.kdev, NULL) == 0)
		kc_info("kernel module: %s present, ordinary buffers registered with "
			"kcoll_mem_register are zero-copy", KCOLL_DEV_PATH);
	else
		kc_info("kernel module: not used: %s", kcoll_kdev_why(&kd.kdev));
	kd.listen_fd = listen_socket(kd.socket_path);
	if (kd.listen_fd < 0)
		return 1;
	if (!foreground && (r = daemonize(logpath))) {
		kc_err("cannot daemonize: %s", strerror(-r));
		return 1;
	}
	if (pidfile) {
		FILE *pf = fopen(pidfile, "w");

		if (pf) {
			fprintf(pf, "%d\n", getpid());
			fclose(pf);
		}
	}
	raise_nofile();
	sigfd = setup_signals();
	kd.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (sigfd < 0 || kd.epfd < 0 || kd_pool_start(kd.nworkers)) {
		kc_err("startup failed: %s", strerror(errno));
		return 1;
	}
	ep_add(kd.listen_fd, &kd.listen_fd);
	ep_add(sigfd, &sigfd);
	if (kd_metrics_start(kd.epfd, &metrics_tag, &metrics_src))
		return 1;
	if (kd_net_start(listen_spec, addrs_spec, kd_xport_default))
		kc_warn("multi-host communicators are disabled: this kcolld cannot listen for peers");
#ifdef KCOLL_HAVE_BPF
	kd_bpf_start();
#endif
	kc_info("kcolld %s listening on %s (%d workers, reduce=%s, pid %d)", KCOLL_VERSION,
		kd.socket_path, kd.nworkers, kcoll_reduce_impl(), getpid());

	for (;;) {
		struct epoll_event ev[32];
		int n = epoll_wait(kd.epfd, ev, 32, 100);
		int64_t now;

		for (int i = 0; i < n; i++) {
			if (ev[i].data.ptr == &kd.listen_fd) {
				on_accept();
			} else if (ev[i].data.ptr == &metrics_tag) {
				kd_metrics_event();
			} else if (ev[i].data.ptr == &sigfd) {
				struct signalfd_siginfo si;

				if (read(sigfd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo != SIGHUP) {
					kc_info("signal %d: draining and exiting", si.ssi_signo);
					goto out;
				}
			} else if ((uintptr_t)ev[i].data.ptr & 1) {
				kd_net_event((void *)((uintptr_t)ev[i].data.ptr & ~(uintptr_t)1), ev[i].events);
			} else {
				struct kd_client *c = ev[i].data.ptr;

				if ((ev[i].events & EPOLLIN) && on_message(c) && !atomic_load(&c->dead))
					continue;
				if (ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP | EPOLLERR))
					client_reap(c);
			}
		}
		now = kd_now_ns();
		kd_metrics_tick(now);
		if (now - last_watchdog > 50000000) {
			kd_net_watchdog(now);
			kd_comm_watchdog(now);
			kd_c4_tick(now);
			last_watchdog = now;
		}
		if (now - last_tune > 1000000000) {
			kd_tunables_poll();
			last_tune = now;
		}
	}
out:
	drain_and_close();
	kd_metrics_stop();
#ifdef KCOLL_HAVE_BPF
	kd_bpf_stop();
#endif
	kd_net_stop();
	kd_pool_stop();
	kd_gpu_cleanup();
	kcoll_kdev_close(&kd.kdev);
	kc_info("kcolld exiting: %lu ops ok, %lu failed", atomic_load(&kd.stats.ops_ok),
		atomic_load(&kd.stats.ops_failed));
	if (pidfile)
		unlink(pidfile);
	return 0;
}

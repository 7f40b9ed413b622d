// SPDX-License-Identifier: MIT
/*
 * The transports between daemons, best first, and the choice among them
 * (KCOLL_NET_XPORT: auto, or a transport's name). A transport whose init
 * fails is passed over (auto) or replaced by the last one, TCP, which needs
 * nothing and always works. The choice is made once and logged once, with
 * the reason every better transport was not used.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "xport.h"

/* kd_xport_loop (xport_loop.c) is for tests: its hosts live in one process. */
static const struct kd_xport_ops *const xports[] = { &kd_xport_rdma, &kd_xport_tcp };
#define NXPORTS (sizeof(xports) / sizeof(xports[0]))

static pthread_once_t pick_once = PTHREAD_ONCE_INIT;
static const struct kd_xport_ops *picked;
static char choice[768];	/* what the log line says, for kcollctl status */

/* "auto, rdma or tcp": what KCOLL_NET_XPORT accepts. */
static void names(char *buf, size_t cap)
{
	size_t n = (size_t)snprintf(buf, cap, "auto");

	for (size_t i = 0; i < NXPORTS && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "%s%s", i + 1 < NXPORTS ? ", " : " or ",
				      xports[i]->name);
}

static void pick(void)
{
	const char *want = kcoll_knob_str("KCOLL_NET_XPORT");
	const struct kd_xport_ops *named = NULL;
	char why[256], skipped[512] = "";
	size_t ns = 0;

	picked = xports[NXPORTS - 1];
	for (size_t i = 0; i < NXPORTS; i++)
		if (!strcmp(xports[i]->name, want))
			named = xports[i];
	if (!named && strcmp(want, "auto")) {
		char list[128];

		names(list, sizeof(list));
		kc_warn("KCOLL_NET_XPORT='%s' is not %s: using %s", want, list, picked->name);
		snprintf(choice, sizeof(choice), "%s (KCOLL_NET_XPORT='%s' is not %s)", picked->name, want, list);
		return;
	}
	if (named && !named->init) {
		picked = named;
		kc_info("transport between daemons: %s (KCOLL_NET_XPORT=%s)", named->name, want);
		snprintf(choice, sizeof(choice), "%s (KCOLL_NET_XPORT=%s)", named->name, want);
		return;
	}
	for (size_t i = 0; i < NXPORTS; i++) {
		const struct kd_xport_ops *x = xports[i];

		if (named && x != named)
			continue;
		why[0] = 0;
		if (x->version != KD_XPORT_VERSION || x->size != sizeof(*x)) {
			/* built against another xport.h: not this daemon's */
			snprintf(why, sizeof(why), "interface version %u size %u, kcolld has %u size %zu",
				 x->version, x->size, KD_XPORT_VERSION, sizeof(*x));
		} else if (!x->init) {
			picked = x;
			break;
		} else if (!x->init(why, sizeof(why))) {
			picked = x;	/* its init logged what it runs on */
			snprintf(choice, sizeof(choice), "%s", x->name);
			return;
		}
		if (named) {
			kc_err("transport between daemons: KCOLL_NET_XPORT=%s but %s; falling back to %s",
			       want, why, picked->name);
			snprintf(choice, sizeof(choice), "%s (KCOLL_NET_XPORT=%s but %s)", picked->name, want, why);
			return;
		}
		if (ns < sizeof(skipped))
			ns += (size_t)snprintf(skipped + ns, sizeof(skipped) - ns, "%s%s not used: %s",
					       ns ? "; " : "", x->name, why);
	}
	kc_info("transport between daemons: %s (%s)", picked->name, skipped);
	snprintf(choice, sizeof(choice), "%s (%s)", picked->name, skipped);
}

const struct kd_xport_ops *kd_xport_default(void)
{
	pthread_once(&pick_once, pick);
	return picked;
}

const char *kd_xport_choice(void)
{
	return choice;
}

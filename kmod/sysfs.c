// SPDX-License-Identifier: GPL-2.0
/*
 * /sys/kernel/kcoll: tunables kcolld reads and honours (root-writable,
 * validated), the module's counters, and the link health kcolld reports
 * through KCOLL_IOC_PEER_REPORT. Documented in docs/sysfs.md.
 */
#include <linux/capability.h>
#include <linux/jiffies.h>
#include <linux/kobject.h>
#include <linux/log2.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/sysfs.h>

#include "kcoll_mod.h"

static struct kobject *kcoll_kobj;

static const char * const kcoll_algo_names[] = { "auto", "ring", "direct" };
static int kcoll_algo;

int kcoll_algo_parse(const char *s)
{
	return sysfs_match_string(kcoll_algo_names, s);
}

static ssize_t algo_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", kcoll_algo_names[READ_ONCE(kcoll_algo)]);
}

static ssize_t algo_store(struct kobject *kobj, struct kobj_attribute *attr,
			  const char *buf, size_t count)
{
	int v;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	v = kcoll_algo_parse(buf);
	if (v < 0)
		return v;
	WRITE_ONCE(kcoll_algo, v);
	return count;
}

static struct kobj_attribute kcoll_attr_algo = __ATTR_RW(algo);

/* A numeric tunable with its accepted range. */
struct kcoll_knob {
	struct kobj_attribute attr;
	unsigned int value;
	unsigned int min;
	unsigned int max;
	bool pow2;
};

static ssize_t kcoll_knob_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct kcoll_knob *k = container_of(attr, struct kcoll_knob, attr);

	return sysfs_emit(buf, "%u\n", READ_ONCE(k->value));
}

static ssize_t kcoll_knob_store(struct kobject *kobj, struct kobj_attribute *attr,
				const char *buf, size_t count)
{
	struct kcoll_knob *k = container_of(attr, struct kcoll_knob, attr);
	unsigned int v;
	int ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	ret = kstrtouint(buf, 0, &v);
	if (ret)
		return ret;
	if (v < k->min || v > k->max || (k->pow2 && !is_power_of_2(v)))
		return -EINVAL;
	WRITE_ONCE(k->value, v);
	return count;
}

#define KCOLL_KNOB(_name, _def, _min, _max, _pow2)				\
	static struct kcoll_knob kcoll_knob_##_name = {				\
		.attr = __ATTR(_name, 0644, kcoll_knob_show, kcoll_knob_store),	\
		.value = (_def), .min = (_min), .max = (_max), .pow2 = (_pow2),	\
	}

KCOLL_KNOB(chunk_bytes, 512 * 1024, 4096, 64 * 1024 * 1024, true);
KCOLL_KNOB(timeout_ms, 30000, 1, 3600 * 1000, false);
KCOLL_KNOB(slow_ratio_pct, 200, 101, 10000, false);
KCOLL_KNOB(hang_ms, 5000, 1, 3600 * 1000, false);
KCOLL_KNOB(straggler_ms, 20, 1, 3600 * 1000, false);

/* Root only: each read runs the in-kernel C4 core on a synthetic trace. */
static ssize_t c4_selftest_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return kcoll_c4_selftest(buf, READ_ONCE(kcoll_knob_slow_ratio_pct.value),
				 READ_ONCE(kcoll_knob_hang_ms.value),
				 READ_ONCE(kcoll_knob_straggler_ms.value));
}

static struct kobj_attribute kcoll_attr_c4_selftest =
	__ATTR(c4_selftest, 0400, c4_selftest_show, NULL);

static ssize_t rings_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&kcoll_nr_rings));
}

static ssize_t registered_bytes_show(struct kobject *kobj, struct kobj_attribute *attr,
				     char *buf)
{
	return sysfs_emit(buf, "%lld\n", atomic64_read(&kcoll_registered_bytes));
}

static ssize_t pinned_pages_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%lld\n", atomic64_read(&kcoll_pinned_pages));
}

static ssize_t features_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "0x%llx\n", (unsigned long long)KCOLL_FEATURES);
}

static struct kobj_attribute kcoll_attr_rings = __ATTR_RO(rings);
static struct kobj_attribute kcoll_attr_registered_bytes = __ATTR_RO(registered_bytes);
static struct kobj_attribute kcoll_attr_pinned_pages = __ATTR_RO(pinned_pages);
static struct kobj_attribute kcoll_attr_features = __ATTR_RO(features);

/* Link health as kcolld last reported it. */
struct kcoll_peer {
	u32 state;
	u32 latency_us;
	u32 bw_mbps;
	unsigned long stamp;		/* jiffies of the report */
};

static DEFINE_SPINLOCK(kcoll_peers_lock);	/* protects kcoll_peers */
static struct kcoll_peer kcoll_peers[KCOLL_MAX_PEERS];

static const char * const kcoll_peer_state_names[KCOLL_PEER_STATE_MAX] = {
	[KCOLL_PEER_UNKNOWN] = "unknown",
	[KCOLL_PEER_OK] = "ok",
	[KCOLL_PEER_SLOW] = "slow",
	[KCOLL_PEER_HUNG] = "hung",
	[KCOLL_PEER_DOWN] = "down",
};

int kcoll_peer_report(const struct kcoll_ioc_peer_report *arg)
{
	if (!capable(CAP_NET_ADMIN))
		return -EPERM;
	if (arg->peer >= KCOLL_MAX_PEERS || arg->state >= KCOLL_PEER_STATE_MAX)
		return -EINVAL;
	spin_lock(&kcoll_peers_lock);
	kcoll_peers[arg->peer] = (struct kcoll_peer) {
		.state = arg->state,
		.latency_us = arg->latency_us,
		.bw_mbps = arg->bw_mbps,
		.stamp = jiffies,
	};
	spin_unlock(&kcoll_peers_lock);
	return 0;
}

static ssize_t peers_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct kcoll_peer snap[KCOLL_MAX_PEERS];
	unsigned long now = jiffies;
	int i, len;

	spin_lock(&kcoll_peers_lock);
	memcpy(snap, kcoll_peers, sizeof(snap));
	spin_unlock(&kcoll_peers_lock);

	len = sysfs_emit(buf, "# peer state latency_us bw_mbps age_ms\n");
	for (i = 0; i < KCOLL_MAX_PEERS; i++) {
		if (snap[i].state == KCOLL_PEER_UNKNOWN)
			continue;
		len += sysfs_emit_at(buf, len, "%d %s %u %u %u\n", i,
				     kcoll_peer_state_names[snap[i].state], snap[i].latency_us,
				     snap[i].bw_mbps, jiffies_to_msecs(now - snap[i].stamp));
	}
	return len;
}

static struct kobj_attribute kcoll_attr_peers = __ATTR_RO(peers);

static struct attribute *kcoll_attrs[] = {
	&kcoll_attr_algo.attr,
	&kcoll_knob_chunk_bytes.attr.attr,
	&kcoll_knob_timeout_ms.attr.attr,
	&kcoll_knob_slow_ratio_pct.attr.attr,
	&kcoll_knob_hang_ms.attr.attr,
	&kcoll_knob_straggler_ms.attr.attr,
	&kcoll_attr_c4_selftest.attr,
	&kcoll_attr_rings.attr,
	&kcoll_attr_registered_bytes.attr,
	&kcoll_attr_pinned_pages.attr,
	&kcoll_attr_features.attr,
	&kcoll_attr_peers.attr,
	NULL,
};

static const struct attribute_group kcoll_attr_group = {
	.attrs = kcoll_attrs,
};

int kcoll_sysfs_init(const char *algo)
{
	int ret;

	kcoll_algo = kcoll_algo_parse(algo);
	kcoll_kobj = kobject_create_and_add("kcoll", kernel_kobj);
	if (!kcoll_kobj)
		return -ENOMEM;
	ret = sysfs_create_group(kcoll_kobj, &kcoll_attr_group);
	if (ret)
		goto err_put_kobj;
	return 0;

err_put_kobj:
	kobject_put(kcoll_kobj);
	return ret;
}

void kcoll_sysfs_exit(void)
{
	sysfs_remove_group(kcoll_kobj, &kcoll_attr_group);
	kobject_put(kcoll_kobj);
}

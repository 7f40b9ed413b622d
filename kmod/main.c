// SPDX-License-Identifier: GPL-2.0
/*
 * kcoll.ko: kernel help for kcoll's collective-offload daemon.
 *
 * /dev/kcoll gives each open file a context that can hold a ring (the same
 * layout as kcolld's memfd ring) with doorbells, and registered (pinned)
 * buffers that another process may map. /sys/kernel/kcoll holds the tunables
 * kcolld honours and the module's counters. See man/kcoll.4.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/compat.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "kcoll_mod.h"

static unsigned int max_rings = 64;
module_param(max_rings, uint, 0444);
MODULE_PARM_DESC(max_rings, "Rings that may exist at once, 1..4096 (default 64)");

static unsigned int max_buf_mb = 256;
module_param(max_buf_mb, uint, 0444);
MODULE_PARM_DESC(max_buf_mb, "Largest single registration in MiB, 1..4095 and <= max_pinned_mb (default 256)");

static unsigned int max_pinned_mb = 1024;
module_param(max_pinned_mb, uint, 0444);
MODULE_PARM_DESC(max_pinned_mb, "Limit on all pinned memory in MiB, 1..1048576 (default 1024)");

static char *algo = "auto";
module_param(algo, charp, 0444);
MODULE_PARM_DESC(algo, "Initial /sys/kernel/kcoll/algo: auto, ring or direct (default auto)");

struct kcoll_limits kcoll_limits;

/* The part every ioctl argument starts with. */
struct kcoll_ioc_head {
	u32 size;
	u32 flags;
};

union kcoll_ioc_args {
	struct kcoll_ioc_head head;
	struct kcoll_ioc_query query;
	struct kcoll_ioc_ring_create ring_create;
	struct kcoll_ioc_wait wait;
	struct kcoll_ioc_wake wake;
	struct kcoll_ioc_buf_register buf_register;
	struct kcoll_ioc_buf_unregister buf_unregister;
	struct kcoll_ioc_buf_grant buf_grant;
	struct kcoll_ioc_buf_import buf_import;
	struct kcoll_ioc_peer_report peer_report;
	struct kcoll_ioc_buf_dmabuf buf_dmabuf;
};

static int kcoll_ioc_query(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	struct kcoll_ioc_query *q = &a->query;

	q->features = KCOLL_FEATURES;
	q->abi_version = KCOLL_KDEV_ABI_VERSION;
	q->page_size = PAGE_SIZE;
	q->max_ring_entries = KCOLL_RING_MAX_ENTRIES;
	q->max_grants = KCOLL_MAX_GRANTS;
	q->max_buf_bytes = kcoll_limits.max_buf_bytes;
	q->max_pinned_bytes = kcoll_limits.max_pinned_pages << PAGE_SHIFT;
	return 0;
}

static int kcoll_ioc_ring_create(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_ring_create(kf, &a->ring_create);
}

static int kcoll_ioc_wait(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_ring_wait(kf, &a->wait);
}

static int kcoll_ioc_wake(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_ring_wake(kf, &a->wake);
}

static int kcoll_ioc_buf_register(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_buf_register(kf, &a->buf_register);
}

static int kcoll_ioc_buf_unregister(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_buf_unregister(kf, a->buf_unregister.handle);
}

static int kcoll_ioc_buf_grant(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_buf_grant(kf, &a->buf_grant);
}

static int kcoll_ioc_buf_import(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_buf_import(&a->buf_import);
}

static int kcoll_ioc_peer_report(struct kcoll_file *kf, union kcoll_ioc_args *a)
{
	return kcoll_peer_report(&a->peer_report);
}

static int kcoll_ioc_buf_dmabuf(union kcoll_ioc_args *a, int **fd, struct file **file)
{
	*fd = &a->buf_dmabuf.fd;
	return kcoll_buf_dmabuf(&a->buf_dmabuf, file);
}

struct kcoll_ioctl_op {
	size_t size;		/* this module's sizeof */
	size_t min_size;	/* the first ABI version's sizeof */
	u32 flags;		/* flags this module knows */
	bool has_output;
	int (*fn)(struct kcoll_file *kf, union kcoll_ioc_args *a);
	/* instead of fn: returns a file for the fd in the reply */
	int (*fn_fd)(union kcoll_ioc_args *a, int **fd, struct file **file);
};

#define KCOLL_OP(_nr, _struct, _min, _flags, _out, _fn)			\
	[_IOC_NR(_nr) - KCOLL_IOC_FIRST_NR] = {				\
		.size = sizeof(struct _struct), .min_size = (_min),	\
		.flags = (_flags), .has_output = (_out), .fn = (_fn),	\
	}

#define KCOLL_IOC_FIRST_NR	_IOC_NR(KCOLL_IOC_QUERY)

static const struct kcoll_ioctl_op kcoll_ioctl_ops[] = {
	/* query is all output past the head: any size from 8 up is useful */
	KCOLL_OP(KCOLL_IOC_QUERY, kcoll_ioc_query, sizeof(struct kcoll_ioc_head),
		 0, true, kcoll_ioc_query),
	KCOLL_OP(KCOLL_IOC_RING_CREATE, kcoll_ioc_ring_create,
		 sizeof(struct kcoll_ioc_ring_create), 0, true, kcoll_ioc_ring_create),
	KCOLL_OP(KCOLL_IOC_WAIT, kcoll_ioc_wait, sizeof(struct kcoll_ioc_wait),
		 KCOLL_WAIT_F_INTERRUPTIBLE, false, kcoll_ioc_wait),
	KCOLL_OP(KCOLL_IOC_WAKE, kcoll_ioc_wake, sizeof(struct kcoll_ioc_wake),
		 0, false, kcoll_ioc_wake),
	KCOLL_OP(KCOLL_IOC_BUF_REGISTER, kcoll_ioc_buf_register,
		 sizeof(struct kcoll_ioc_buf_register), KCOLL_BUF_F_READONLY, true,
		 kcoll_ioc_buf_register),
	KCOLL_OP(KCOLL_IOC_BUF_UNREGISTER, kcoll_ioc_buf_unregister,
		 sizeof(struct kcoll_ioc_buf_unregister), 0, false, kcoll_ioc_buf_unregister),
	KCOLL_OP(KCOLL_IOC_BUF_GRANT, kcoll_ioc_buf_grant, sizeof(struct kcoll_ioc_buf_grant),
		 KCOLL_GRANT_F_REVOKE, false, kcoll_ioc_buf_grant),
	KCOLL_OP(KCOLL_IOC_BUF_IMPORT, kcoll_ioc_buf_import, sizeof(struct kcoll_ioc_buf_import),
		 0, true, kcoll_ioc_buf_import),
	KCOLL_OP(KCOLL_IOC_PEER_REPORT, kcoll_ioc_peer_report,
		 sizeof(struct kcoll_ioc_peer_report), 0, false, kcoll_ioc_peer_report),
	[_IOC_NR(KCOLL_IOC_BUF_DMABUF) - KCOLL_IOC_FIRST_NR] = {
		.size = sizeof(struct kcoll_ioc_buf_dmabuf),
		.min_size = sizeof(struct kcoll_ioc_buf_dmabuf),
		.has_output = true, .fn_fd = kcoll_ioc_buf_dmabuf,
	},
};

/*
 * The size-first contract: the size field, not the ioctl number, says how
 * much the caller passed (so grown structs keep their number).
 */
static long kcoll_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct kcoll_file *kf = file->private_data;
	void __user *up = (void __user *)uarg;
	const struct kcoll_ioctl_op *op;
	struct file *newfile = NULL;
	union kcoll_ioc_args args;
	int *newfd = NULL;
	unsigned int nr = _IOC_NR(cmd);
	u32 usize;
	int ret;

	if (_IOC_TYPE(cmd) != KCOLL_IOC_MAGIC || _IOC_DIR(cmd) != (_IOC_READ | _IOC_WRITE) ||
	    nr < KCOLL_IOC_FIRST_NR || nr - KCOLL_IOC_FIRST_NR >= ARRAY_SIZE(kcoll_ioctl_ops))
		return -ENOTTY;
	op = &kcoll_ioctl_ops[nr - KCOLL_IOC_FIRST_NR];

	if (get_user(usize, (u32 __user *)up))
		return -EFAULT;
	if (usize < op->min_size)
		return -EINVAL;
	if (usize > PAGE_SIZE)
		return -E2BIG;
	ret = copy_struct_from_user(&args, op->size, up, usize);
	if (ret)
		return ret;
	if (args.head.flags & ~op->flags)
		return -EOPNOTSUPP;

	ret = op->fn_fd ? op->fn_fd(&args, &newfd, &newfile) : op->fn(kf, &args);
	if (ret)
		return ret;
	if (op->has_output && copy_to_user(up, &args, min_t(size_t, usize, op->size))) {
		/* a handle the caller never learns would stay pinned until close */
		if (nr == _IOC_NR(KCOLL_IOC_BUF_REGISTER))
			kcoll_buf_unregister(kf, args.buf_register.handle);
		/* nor may an fd it never learns stay open */
		if (newfile) {
			put_unused_fd(*newfd);
			fput(newfile);
		}
		return -EFAULT;
	}
	if (newfile)
		fd_install(*newfd, newfile);
	return 0;
}

static int kcoll_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct kcoll_file *kf = file->private_data;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (vma->vm_pgoff == 0)
		return kcoll_ring_mmap(kf, vma);
	return kcoll_buf_mmap(vma);
}

static int kcoll_open(struct inode *inode, struct file *file)
{
	struct kcoll_file *kf;

	kf = kzalloc(sizeof(*kf), GFP_KERNEL);
	if (!kf)
		return -ENOMEM;
	mutex_init(&kf->lock);
	INIT_LIST_HEAD(&kf->bufs);
	file->private_data = kf;
	return 0;
}

static int kcoll_release(struct inode *inode, struct file *file)
{
	struct kcoll_file *kf = file->private_data;

	kcoll_buf_release_all(kf);
	if (kf->ring)
		kcoll_ring_destroy(kf->ring);
	mutex_destroy(&kf->lock);
	kfree(kf);
	return 0;
}

static const struct file_operations kcoll_fops = {
	.owner = THIS_MODULE,
	.open = kcoll_open,
	.release = kcoll_release,
	.unlocked_ioctl = kcoll_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = kcoll_mmap,
	.llseek = noop_llseek,
};

/* Anyone may open it: every operation checks its own permissions. */
static struct miscdevice kcoll_miscdev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kcoll",
	.fops = &kcoll_fops,
	.mode = 0666,
};

static int __init kcoll_check_params(void)
{
	if (max_rings < 1 || max_rings > 4096) {
		pr_err("max_rings=%u is out of range 1..4096; not loading\n", max_rings);
		return -EINVAL;
	}
	if (max_pinned_mb < 1 || max_pinned_mb > 1048576) {
		pr_err("max_pinned_mb=%u is out of range 1..1048576; not loading\n",
		       max_pinned_mb);
		return -EINVAL;
	}
	if (max_buf_mb < 1 || max_buf_mb > 4095 || max_buf_mb > max_pinned_mb) {
		pr_err("max_buf_mb=%u is out of range 1..min(4095, max_pinned_mb=%u); not loading\n",
		       max_buf_mb, max_pinned_mb);
		return -EINVAL;
	}
	if (kcoll_algo_parse(algo) < 0) {
		pr_err("algo=%s is not one of auto, ring, direct; not loading\n", algo);
		return -EINVAL;
	}
	kcoll_limits.max_rings = max_rings;
	kcoll_limits.max_buf_bytes = (u64)max_buf_mb << 20;
	kcoll_limits.max_pinned_pages = (u64)max_pinned_mb << (20 - PAGE_SHIFT);
	return 0;
}

static int __init kcoll_init(void)
{
	int ret;

	ret = kcoll_check_params();
	if (ret)
		return ret;
	ret = kcoll_sysfs_init(algo);
	if (ret)
		return ret;
	ret = misc_register(&kcoll_miscdev);
	if (ret) {
		pr_err("cannot register /dev/kcoll: %d\n", ret);
		goto err_sysfs;
	}
	return 0;

err_sysfs:
	kcoll_sysfs_exit();
	return ret;
}

static void __exit kcoll_exit(void)
{
	misc_deregister(&kcoll_miscdev);
	kcoll_sysfs_exit();
	kcoll_buf_exit();
}

module_init(kcoll_init);
module_exit(kcoll_exit);

MODULE_DESCRIPTION("kcoll: ring device, cross-process buffers and tunables for kcolld");
MODULE_AUTHOR("kcoll maintainers");
MODULE_LICENSE("GPL");

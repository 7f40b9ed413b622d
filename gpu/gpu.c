// SPDX-License-Identifier: MIT
/*
 * The GPU loader: dlopens the CUDA driver and libkcoll_gpu.so at run time and
 * records what it finds (struct kcoll_gpu_info) so that every "no" comes with
 * its exact reason and fix. Nothing here needs CUDA headers or libraries to
 * build; the CUDA numbers come from cuda_abi.h.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "config.h"
#include "cuda_abi.h"
#include "kcoll_gpu.h"

/* The driver entry points kcoll uses; CUresult and CUdevice are ints. */
struct kcoll_cuda_fns {
	int (*init)(unsigned int flags);
	int (*driver_get_version)(int *version);
	int (*device_get_count)(int *count);
	int (*device_get)(int *dev, int ordinal);
	int (*device_get_name)(char *name, int len, int dev);
	int (*device_get_attribute)(int *value, int attr, int dev);
	int (*device_total_mem)(size_t *bytes, int dev);
	int (*device_get_pci_bus_id)(char *id, int len, int dev);
	int (*get_error_name)(int err, const char **str);
	int (*get_error_string)(int err, const char **str);
};

/* CUipcMemHandle: the driver takes it by value (in memory, per the x86-64 ABI). */
struct kcoll_cu_ipc_handle {
	char reserved[KCOLL_CU_IPC_HANDLE_SIZE];
};

/* Entry points only the data path needs; a driver may lack them (too old). */
struct kcoll_cuda_data_fns {
	int (*ipc_get)(struct kcoll_cu_ipc_handle *handle, unsigned long long dptr);
	int (*ipc_open)(unsigned long long *dptr, struct kcoll_cu_ipc_handle handle,
			unsigned int flags);
	int (*ipc_close)(unsigned long long dptr);
	int (*addr_range)(unsigned long long *base, size_t *size, unsigned long long dptr);
	int (*dmabuf)(void *handle, unsigned long long dptr, size_t size, int type,
		      unsigned long long flags);
	int (*ptr_attr)(void *data, int attr, unsigned long long dptr);
	int (*ctx_retain)(void **ctx, int dev);		/* cuDevicePrimaryCtxRetain */
	int (*ctx_set)(void *ctx);			/* cuCtxSetCurrent */
	int (*ctx_release)(int dev);			/* cuDevicePrimaryCtxRelease */
};

static const struct {
	const char *name;
	size_t off;
} cuda_data_syms[] = {
	{ "cuIpcGetMemHandle", offsetof(struct kcoll_cuda_data_fns, ipc_get) },
	/* cuda.h maps these to their _v2 entry points */
	{ "cuIpcOpenMemHandle_v2", offsetof(struct kcoll_cuda_data_fns, ipc_open) },
	{ "cuIpcCloseMemHandle", offsetof(struct kcoll_cuda_data_fns, ipc_close) },
	{ "cuMemGetAddressRange_v2", offsetof(struct kcoll_cuda_data_fns, addr_range) },
	{ "cuMemGetHandleForAddressRange", offsetof(struct kcoll_cuda_data_fns, dmabuf) },
	{ "cuPointerGetAttribute", offsetof(struct kcoll_cuda_data_fns, ptr_attr) },
	{ "cuDevicePrimaryCtxRetain", offsetof(struct kcoll_cuda_data_fns, ctx_retain) },
	{ "cuCtxSetCurrent", offsetof(struct kcoll_cuda_data_fns, ctx_set) },
	/* cuda.h maps it to the _v2 entry point */
	{ "cuDevicePrimaryCtxRelease_v2", offsetof(struct kcoll_cuda_data_fns, ctx_release) },
};

static const struct {
	const char *name;
	size_t off;
} cuda_syms[] = {
	{ "cuInit", offsetof(struct kcoll_cuda_fns, init) },
	{ "cuDriverGetVersion", offsetof(struct kcoll_cuda_fns, driver_get_version) },
	{ "cuDeviceGetCount", offsetof(struct kcoll_cuda_fns, device_get_count) },
	{ "cuDeviceGet", offsetof(struct kcoll_cuda_fns, device_get) },
	{ "cuDeviceGetName", offsetof(struct kcoll_cuda_fns, device_get_name) },
	{ "cuDeviceGetAttribute", offsetof(struct kcoll_cuda_fns, device_get_attribute) },
	/* cuda.h maps cuDeviceTotalMem to the _v2 (size_t) entry point */
	{ "cuDeviceTotalMem_v2", offsetof(struct kcoll_cuda_fns, device_total_mem) },
	{ "cuDeviceGetPCIBusId", offsetof(struct kcoll_cuda_fns, device_get_pci_bus_id) },
	{ "cuGetErrorName", offsetof(struct kcoll_cuda_fns, get_error_name) },
	{ "cuGetErrorString", offsetof(struct kcoll_cuda_fns, get_error_string) },
};

struct kcoll_gpu {
	void *driver_dl;
	void *kernels_dl;
	struct kcoll_cuda_fns cu;
	struct kcoll_cuda_data_fns dcu;	/* NULL members: this driver lacks them */
	const struct kcoll_gpu_kernels *k;
	struct kcoll_gpu_info info;
	pthread_mutex_t ctx_lock;
	void *ctx[KCOLL_GPU_MAX_DEVICES];	/* retained primary contexts */
	unsigned long serial;			/* names this instance in thread caches */
};

static unsigned long gpu_serial;

/* Messages are bounded on purpose: a truncated reason beats none. */
static void __attribute__((format(printf, 3, 4)))
set_text(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

#define SET(buf, ...) set_text((buf), sizeof(buf), __VA_ARGS__)

/* "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected", or the number. */
static void cuda_describe(const struct kcoll_gpu *g, int err, char *buf, size_t len)
{
	const char *name = NULL, *text = NULL;

	if (g->cu.get_error_name && g->cu.get_error_name(err, &name) != KCOLL_CUDA_SUCCESS)
		name = NULL;
	if (g->cu.get_error_string && g->cu.get_error_string(err, &text) != KCOLL_CUDA_SUCCESS)
		text = NULL;
	if (name && text)
		snprintf(buf, len, "%s: %s", name, text);
	else
		snprintf(buf, len, "CUDA error %d", err);
}

const char *kcoll_gpu_path_name(enum kcoll_gpu_path p)
{
	switch (p) {
	case KCOLL_GPU_PATH_DMABUF:
		return "dma-buf";
	case KCOLL_GPU_PATH_PEERMEM:
		return "peermem";
	case KCOLL_GPU_PATH_STAGING:
		return "host-staging";
	default:
		return "none";
	}
}

enum kcoll_gpu_path kcoll_gpu_pick_path(const struct kcoll_gpu_path_facts *f, char *reason,
					size_t rlen, char *fix, size_t flen)
{
	char why_not_dmabuf[256], dmabuf_fix[256];

	set_text(reason, rlen, "%s", "");
	set_text(fix, flen, "%s", "");
	if (f->rdma_devices <= 0) {
		set_text(reason, rlen,
			 "no RDMA device (class/infiniband is empty): GPU data leaves this node "
			 "through host memory");
		set_text(fix, flen,
			 "nothing to do for a single node (GPUs share buffers via CUDA IPC); for "
			 "GPUDirect RDMA install an RDMA NIC and its driver (e.g. mlx5_ib)");
		return KCOLL_GPU_PATH_STAGING;
	}
	if (f->dmabuf == 1 && f->kernel_dmabuf == 1)
		return KCOLL_GPU_PATH_DMABUF;

	if (f->dmabuf == 1) {
		SET(why_not_dmabuf, "Linux older than 5.12 cannot register dma-buf memory with an "
				    "RDMA NIC");
		SET(dmabuf_fix, "for dma-buf: boot Linux 5.12 or newer");
	} else {
		SET(why_not_dmabuf, "%s",
		    f->dmabuf == 0 ? "the GPU driver does not export dma-buf "
				     "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)"
				   : "the GPU driver predates dma-buf export (CUDA < 11.7)");
		SET(dmabuf_fix,
		    "for dma-buf: use the NVIDIA open GPU kernel modules (nvidia-open, driver 515 "
		    "or newer)%s",
		    f->kernel_dmabuf == 1 ? "" : " on Linux 5.12 or newer");
	}
	if (f->gdr == 1 && f->peermem == 1) {
		set_text(reason, rlen, "%s", why_not_dmabuf);
		set_text(fix, flen, "%s", dmabuf_fix);
		return KCOLL_GPU_PATH_PEERMEM;
	}
	if (f->gdr == 1) {
		set_text(reason, rlen, "%s, and nvidia_peermem is not loaded", why_not_dmabuf);
		set_text(fix, flen,
			 "modprobe nvidia-peermem (it needs MLNX_OFED's peer-memory API); or, "
			 "better, %s",
			 dmabuf_fix);
	} else {
		set_text(reason, rlen, "%s, and the device %s GPUDirect RDMA "
			 "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED %s)",
			 why_not_dmabuf, f->gdr == 0 ? "does not support" : "may predate",
			 f->gdr == 0 ? "= 0" : "unknown: driver older than CUDA 11.3");
		if (f->gdr == 0)
			set_text(fix, flen,
				 "none for this device: GPUDirect RDMA needs a data-center GPU; "
				 "host staging is its best path");
		else
			set_text(fix, flen, "install a current NVIDIA driver");
	}
	return KCOLL_GPU_PATH_STAGING;
}

int kcoll_gpu_arch_runs(const char *archs, int major, int minor)
{
	const char *p = archs;

	while (p && *p) {
		int n, len = 0, is_sass;

		p += strspn(p, " ");
		if (sscanf(p, "sm_%d%n", &n, &len) == 1)
			is_sass = 1;
		else if (sscanf(p, "compute_%d%n", &n, &len) == 1)
			is_sass = 0;
		else
			len = 0;
		if (len) {
			int exact = p[len] == 'a';	/* sm_90a: that one device only */

			if (exact ? n == major * 10 + minor
				  : is_sass ? n / 10 == major && n % 10 <= minor
					    : major * 10 + minor >= n)
				return 1;
		}
		p += strcspn(p, " ");
	}
	return 0;
}

static int path_exists(const char *root, const char *rel)
{
	char path[PATH_MAX];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	return stat(path, &st) == 0;
}

/* Kernel modules, RDMA devices and the kernel release: known without a driver. */
static void probe_system(struct kcoll_gpu_info *in, const struct kcoll_gpu_config *cfg)
{
	const char *root = cfg->sysfs_root ? cfg->sysfs_root : "/sys";
	char dir[PATH_MAX];
	struct utsname u;
	int maj = 0, min = 0;
	struct dirent *de;
	DIR *d;

	in->nvidia_peermem = path_exists(root, "module/nvidia_peermem");
	in->nv_peer_mem = path_exists(root, "module/nv_peer_mem");
	in->ib_peer_mem = path_exists(root, "module/ib_peer_mem");

	snprintf(dir, sizeof(dir), "%s/class/infiniband", root);
	d = opendir(dir);
	while (d && (de = readdir(d))) {
		size_t used = strlen(in->rdma);

		if (de->d_name[0] == '.')
			continue;
		in->nrdma++;
		snprintf(in->rdma + used, sizeof(in->rdma) - used, "%s%s", used ? " " : "",
			 de->d_name);
	}
	if (d)
		closedir(d);

	if (cfg->kernel_release)
		SET(in->kernel_release, "%s", cfg->kernel_release);
	else if (uname(&u) == 0)
		SET(in->kernel_release, "%s", u.release);
	if (sscanf(in->kernel_release, "%d.%d", &maj, &min) == 2)
		in->kernel_dmabuf = maj > 5 || (maj == 5 && min >= 12);
}

static void default_kernels_path(char *buf, size_t len)
{
	const char *env = kcoll_knob_str("KCOLL_GPU_LIB");
	char exe[PATH_MAX], resolved[PATH_MAX];
	ssize_t n;

	if (env && *env) {
		snprintf(buf, len, "%s", env);
		return;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		char *slash;

		exe[n] = '\0';
		slash = strrchr(exe, '/');
		if (slash) {
			*slash = '\0';
			set_text(buf, len, "%s/../lib/libkcoll_gpu.so", exe);
			if (realpath(buf, resolved)) {
				set_text(buf, len, "%s", resolved);
				return;
			}
		}
	}
	snprintf(buf, len, "libkcoll_gpu.so");
}

static void load_kernels(struct kcoll_gpu *g, const struct kcoll_gpu_config *cfg)
{
	struct kcoll_gpu_info *in = &g->info;
	const struct kcoll_gpu_kernels *k;

	if (cfg->kernels_lib)
		SET(in->kernels_lib, "%s", cfg->kernels_lib);
	else
		default_kernels_path(in->kernels_lib, sizeof(in->kernels_lib));

	if (cfg->driver_only) {
		SET(in->kernels_error, "not loaded: this process needs only the driver");
		return;
	}
	/* NODELETE: the static CUDA runtime inside must never be unmapped */
	g->kernels_dl = dlopen(in->kernels_lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!g->kernels_dl) {
		SET(in->kernels_error, "%s", dlerror());
		return;
	}
	k = dlsym(g->kernels_dl, KCOLL_GPU_KERNELS_SYMBOL);
	if (!k) {
		SET(in->kernels_error, "%s: not a kcoll GPU library (it has no %s)",
		    in->kernels_lib, KCOLL_GPU_KERNELS_SYMBOL);
		return;
	}
	if (k->version != KCOLL_GPU_KERNELS_VERSION || k->size < sizeof(*k)) {
		SET(in->kernels_error,
		    "%s: built by another kcoll (table version %u, %u bytes; this kcoll needs "
		    "version %u, %zu bytes): rebuild it with this tree",
		    in->kernels_lib, k->version, k->size, KCOLL_GPU_KERNELS_VERSION, sizeof(*k));
		return;
	}
	in->kernels_loaded = 1;
	in->runtime_version = k->runtime_version;
	in->min_driver_version = k->min_driver_version;
	SET(in->archs, "%s", k->archs);
	g->k = k;
}

/* Returns 0 or the errno for info->rc, filling why and fix. */
static int load_driver(struct kcoll_gpu *g, const struct kcoll_gpu_config *cfg)
{
	struct kcoll_gpu_info *in = &g->info;
	char desc[256];
	int err;

	SET(in->driver_lib, "%s", cfg->driver_lib ? cfg->driver_lib : "libcuda.so.1");
	g->driver_dl = dlopen(in->driver_lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!g->driver_dl) {
		SET(in->driver_error, "%s", dlerror());
		SET(in->why, "no CUDA driver: %s", in->driver_error);
		SET(in->fix, "install the NVIDIA driver (it provides libcuda.so.1), or run on a "
			     "machine with an NVIDIA GPU");
		return -ENODEV;
	}
	for (size_t i = 0; i < sizeof(cuda_syms) / sizeof(cuda_syms[0]); i++) {
		void *sym = dlsym(g->driver_dl, cuda_syms[i].name);

		if (!sym) {
			SET(in->driver_error, "%s has no %s", in->driver_lib, cuda_syms[i].name);
			SET(in->why, "CUDA driver too old: %s", in->driver_error);
			SET(in->fix, "install a current NVIDIA driver");
			return -EOPNOTSUPP;
		}
		memcpy((char *)&g->cu + cuda_syms[i].off, &sym, sizeof(sym));
	}
	for (size_t i = 0; i < sizeof(cuda_data_syms) / sizeof(cuda_data_syms[0]); i++) {
		void *sym = dlsym(g->driver_dl, cuda_data_syms[i].name);

		memcpy((char *)&g->dcu + cuda_data_syms[i].off, &sym, sizeof(sym));
	}
	in->ipc = g->dcu.ipc_get && g->dcu.ipc_open && g->dcu.ipc_close && g->dcu.addr_range;
	in->dmabuf_export = g->dcu.dmabuf != NULL;
	in->driver_loaded = 1;

	err = g->cu.init(0);
	if (err != KCOLL_CUDA_SUCCESS) {
		const char *vis = getenv("CUDA_VISIBLE_DEVICES");

		cuda_describe(g, err, desc, sizeof(desc));
		SET(in->driver_error, "cuInit: %s", desc);
		switch (err) {
		case KCOLL_CUDA_NO_DEVICE:
			SET(in->why, "%s%s%s%s", in->driver_error,
			    vis ? " (CUDA_VISIBLE_DEVICES=\"" : "", vis ? vis : "", vis ? "\")" : "");
			SET(in->fix, "check nvidia-smi; in a container pass the GPUs in (--gpus all); "
				     "check CUDA_VISIBLE_DEVICES");
			break;
		case KCOLL_CUDA_STUB_LIBRARY:
			SET(in->why, "%s is the CUDA toolkit's stub, not a driver", in->driver_lib);
			SET(in->fix, "take the toolkit's lib/stubs directory out of LD_LIBRARY_PATH "
				     "and install the NVIDIA driver");
			break;
		case KCOLL_CUDA_SYSTEM_DRIVER_MISMATCH:
			SET(in->why, "%s", in->driver_error);
			SET(in->fix, "libcuda and the loaded nvidia kernel module differ in version: "
				     "reload the module or reboot after the driver upgrade");
			break;
		default:
			SET(in->why, "%s", in->driver_error);
			SET(in->fix, "see dmesg and nvidia-smi for the driver's complaint");
			break;
		}
		return -ENODEV;
	}
	if (g->cu.driver_get_version(&in->driver_version) != KCOLL_CUDA_SUCCESS)
		in->driver_version = 0;
	return 0;
}

/* An attribute as 1/0, or -1 when this driver does not know it. */
static int attr_flag(const struct kcoll_gpu *g, int attr, int dev)
{
	int v = 0;

	if (g->cu.device_get_attribute(&v, attr, dev) != KCOLL_CUDA_SUCCESS)
		return -1;
	return !!v;
}

static void probe_device(struct kcoll_gpu *g, struct kcoll_gpu_device *d, int ordinal)
{
	const struct kcoll_gpu_info *in = &g->info;
	struct kcoll_gpu_path_facts f;
	size_t mem = 0;
	int dev, err;

	d->index = ordinal;
	err = g->cu.device_get(&dev, ordinal);
	if (err != KCOLL_CUDA_SUCCESS) {
		char desc[256];

		cuda_describe(g, err, desc, sizeof(desc));
		SET(d->why, "cuDeviceGet(%d): %s", ordinal, desc);
		return;
	}
	if (g->cu.device_get_name(d->name, sizeof(d->name), dev) != KCOLL_CUDA_SUCCESS)
		SET(d->name, "unknown");
	if (g->cu.device_get_attribute(&d->cc_major, KCOLL_CU_ATTR_CC_MAJOR, dev) ||
	    g->cu.device_get_attribute(&d->cc_minor, KCOLL_CU_ATTR_CC_MINOR, dev))
		d->cc_major = d->cc_minor = 0;
	if (g->cu.device_get_attribute(&d->sm_count, KCOLL_CU_ATTR_MULTIPROCESSOR_COUNT, dev))
		d->sm_count = 0;
	if (g->cu.device_total_mem(&mem, dev) == KCOLL_CUDA_SUCCESS)
		d->mem_bytes = mem;
	if (g->cu.device_get_pci_bus_id(d->pci_bus_id, sizeof(d->pci_bus_id), dev))
		SET(d->pci_bus_id, "unknown");
	d->dmabuf = attr_flag(g, KCOLL_CU_ATTR_DMA_BUF_SUPPORTED, dev);
	d->gdr = attr_flag(g, KCOLL_CU_ATTR_GPU_DIRECT_RDMA_SUPPORTED, dev);

	if (!in->kernels_loaded)
		SET(d->why, "libkcoll_gpu.so is not loaded");
	else if (!kcoll_gpu_arch_runs(in->archs, d->cc_major, d->cc_minor))
		SET(d->why, "compute capability %d.%d: libkcoll_gpu.so carries no image it runs (%s)",
		    d->cc_major, d->cc_minor, in->archs);
	else
		d->usable = 1;

	f.dmabuf = d->dmabuf;
	f.gdr = d->gdr;
	f.peermem = in->nvidia_peermem || in->nv_peer_mem;
	f.kernel_dmabuf = in->kernel_dmabuf;
	f.rdma_devices = in->nrdma;
	d->path = kcoll_gpu_pick_path(&f, d->path_reason, sizeof(d->path_reason), d->path_fix,
				      sizeof(d->path_fix));
}

static int probe_devices(struct kcoll_gpu *g)
{
	struct kcoll_gpu_info *in = &g->info;
	struct kcoll_gpu_device *slowest = NULL;
	char desc[256];
	int err, n;

	err = g->cu.device_get_count(&in->ndev);
	if (err != KCOLL_CUDA_SUCCESS) {
		cuda_describe(g, err, desc, sizeof(desc));
		SET(in->why, "cuDeviceGetCount: %s", desc);
		SET(in->fix, "see dmesg and nvidia-smi for the driver's complaint");
		return -ENODEV;
	}
	if (in->ndev <= 0) {
		in->ndev = 0;
		SET(in->why, "the CUDA driver reports no device");
		SET(in->fix, "check nvidia-smi and CUDA_VISIBLE_DEVICES");
		return -ENODEV;
	}
	n = in->ndev < KCOLL_GPU_MAX_DEVICES ? in->ndev : KCOLL_GPU_MAX_DEVICES;
	for (int i = 0; i < n; i++) {
		struct kcoll_gpu_device *d = &in->dev[i];

		probe_device(g, d, i);
		if (!d->usable)
			continue;
		in->nusable++;
		if (!slowest || d->path < slowest->path)
			slowest = d;
	}

	if (!in->kernels_loaded) {
		SET(in->why, "GPU present but libkcoll_gpu.so is not usable: %s", in->kernels_error);
		SET(in->fix, "build it (make, with nvcc at $NVCC or /usr/local/cuda/bin/nvcc) "
			     "or set KCOLL_GPU_LIB to its path");
		return -EOPNOTSUPP;
	}
	if (in->driver_version && in->driver_version < in->min_driver_version) {
		SET(in->why, "CUDA driver too old: it supports CUDA %d.%d, libkcoll_gpu.so was "
			     "built with CUDA %d.%d and needs %d.%d",
		    in->driver_version / 1000, in->driver_version % 1000 / 10,
		    in->runtime_version / 1000, in->runtime_version % 1000 / 10,
		    in->min_driver_version / 1000, in->min_driver_version % 1000 / 10);
		SET(in->fix, "install a driver for CUDA %d.%d or newer, or rebuild "
			     "libkcoll_gpu.so with an older CUDA toolkit",
		    in->min_driver_version / 1000, in->min_driver_version % 1000 / 10);
		return -EOPNOTSUPP;
	}
	if (!slowest) {
		SET(in->why, "no device runs the kernels in libkcoll_gpu.so (%s): %s", in->archs,
		    in->dev[0].why);
		SET(in->fix, "rebuild with GPU_ARCHS naming your devices' sm_XY (make GPU_ARCHS=...)");
		return -EOPNOTSUPP;
	}
	in->path = slowest->path;
	SET(in->path_reason, "%s", slowest->path_reason);
	SET(in->path_fix, "%s", slowest->path_fix);
	return 0;
}

int kcoll_gpu_open(struct kcoll_gpu **gp, const struct kcoll_gpu_config *cfg)
{
	static const struct kcoll_gpu_config defaults;
	struct kcoll_gpu *g;
	int rc;

	*gp = NULL;
	g = calloc(1, sizeof(*g));
	if (g) {
		pthread_mutex_init(&g->ctx_lock, NULL);
		g->serial = __atomic_add_fetch(&gpu_serial, 1, __ATOMIC_RELAXED);
	}
	if (!g)
		return -ENOMEM;
	if (!cfg)
		cfg = &defaults;

	probe_system(&g->info, cfg);
	load_kernels(g, cfg);
	rc = load_driver(g, cfg);
	if (!rc)
		rc = probe_devices(g);
	g->info.rc = rc;
	*gp = g;
	return rc;
}

void kcoll_gpu_close(struct kcoll_gpu *g)
{
	if (!g)
		return;
	for (int d = 0; d < KCOLL_GPU_MAX_DEVICES; d++) {
		if (g->ctx[d] && g->dcu.ctx_release)
			g->dcu.ctx_release(d);
	}
	pthread_mutex_destroy(&g->ctx_lock);
	if (g->kernels_dl)
		dlclose(g->kernels_dl);
	if (g->driver_dl)
		dlclose(g->driver_dl);
	free(g);
}

const struct kcoll_gpu_info *kcoll_gpu_info(const struct kcoll_gpu *g)
{
	return &g->info;
}

int kcoll_gpu_kernels(const struct kcoll_gpu *g, const struct kcoll_gpu_kernels **k)
{
	*k = g->info.rc == 0 ? g->k : NULL;
	return g->info.rc;
}

/* The process-wide instance: probed once, never closed. */
static pthread_once_t proc_once = PTHREAD_ONCE_INIT;
static struct kcoll_gpu *proc_gpu;
static int proc_rc;

static void proc_open(void)
{
	proc_rc = kcoll_gpu_open(&proc_gpu, NULL);
}

int kcoll_gpu_process(struct kcoll_gpu **gp)
{
	pthread_once(&proc_once, proc_open);
	*gp = proc_gpu;
	return proc_rc;
}

int kcoll_gpu_available(char *why, size_t len)
{
	struct kcoll_gpu *g;
	int rc = kcoll_gpu_process(&g);

	if (why && len)
		snprintf(why, len, "%s", g ? g->info.why : "out of memory");
	return rc;
}

int kcoll_gpu_reduce(int dtype, int op, void *out, const void *const *in, unsigned int nin,
		     size_t count, void *stream)
{
	struct kcoll_gpu *g;
	int rc = kcoll_gpu_process(&g);

	if (rc)
		return rc;
	return g->k->reduce_n(dtype, op, out, in, nin, count, stream);
}

/*
 * The gate of the data-path calls: a driver that initialised and a device.
 * sym is the entry point the caller needs (NULL: this driver lacks it).
 */
static int data_gate(const struct kcoll_gpu *g, const void *sym, const char *name, char *why,
		     size_t len)
{
	if (!g || !g->info.driver_loaded || g->info.ndev <= 0 ||
	    (g->info.rc && g->info.rc != -EOPNOTSUPP)) {
		if (why && len)
			snprintf(why, len, "no GPU for device buffers: %s",
				 g ? g->info.why : "no CUDA loader");
		return -EOPNOTSUPP;
	}
	if (!sym) {
		if (why && len)
			snprintf(why, len, "CUDA driver too old for device buffers: %s has no %s; "
				 "install a current NVIDIA driver", g->info.driver_lib, name);
		return -EOPNOTSUPP;
	}
	return 0;
}

static int cuda_fail(const struct kcoll_gpu *g, int err, const char *call, char *why, size_t len)
{
	char desc[256];

	if (why && len) {
		cuda_describe(g, err, desc, sizeof(desc));
		snprintf(why, len, "%s: %s", call, desc);
	}
	return kcoll_cuda_errno(err);
}

int kcoll_gpu_ipc_export(struct kcoll_gpu *g, const void *dptr, size_t size,
			 struct kcoll_gpu_ipc *h, char *why, size_t len)
{
	unsigned long long p = (unsigned long long)(uintptr_t)dptr, base = 0;
	struct kcoll_cu_ipc_handle ch;
	size_t alloc = 0;
	int rc, err;

	_Static_assert(sizeof(ch.reserved) == sizeof(h->handle), "IPC handle size");
	rc = data_gate(g, g ? g->dcu.ipc_get : NULL, "cuIpcGetMemHandle", why, len);
	if (!rc)
		rc = data_gate(g, g->dcu.addr_range, "cuMemGetAddressRange_v2", why, len);
	if (rc)
		return rc;
	memset(h, 0, sizeof(*h));
	err = g->dcu.addr_range(&base, &alloc, p);
	if (err)
		return cuda_fail(g, err, "cuMemGetAddressRange (is it a device pointer?)", why, len);
	if (!size || size > alloc - (p - base)) {
		if (why && len)
			snprintf(why, len, "device buffer of %zu bytes at offset %llu runs past its "
				 "allocation of %zu bytes", size, p - base, alloc);
		return -EINVAL;
	}
	err = g->dcu.ipc_get(&ch, base);
	if (err)
		return cuda_fail(g, err, "cuIpcGetMemHandle", why, len);
	memcpy(h->handle, ch.reserved, sizeof(h->handle));
	h->offset = p - base;
	h->size = size;
	h->pid = (int)getpid();
	return 0;
}

int kcoll_gpu_ipc_import(struct kcoll_gpu *g, const struct kcoll_gpu_ipc *h, int peer_pid,
			 size_t need, void **base, void **dptr, char *why, size_t len)
{
	struct kcoll_cu_ipc_handle ch;
	unsigned long long p = 0;
	int rc, err;

	*base = *dptr = NULL;
	rc = data_gate(g, g ? g->dcu.ipc_open : NULL, "cuIpcOpenMemHandle_v2", why, len);
	if (rc)
		return rc;
	if (h->pid != peer_pid) {
		if (why && len)
			snprintf(why, len, "device buffer handle made by pid %d, presented by pid %d: "
				 "a rank may register only its own GPU memory", h->pid, peer_pid);
		return -EPERM;
	}
	if (h->pid == (int)getpid()) {
		if (why && len)
			snprintf(why, len, "CUDA cannot open an IPC handle in the process that made "
				 "it (pid %d): device buffers go to kcolld, another process", h->pid);
		return -EINVAL;
	}
	if (h->reserved || need > h->size) {
		if (why && len)
			snprintf(why, len, "device buffer handle covers %llu bytes, the operation "
				 "needs %zu%s", h->size, need, h->reserved ? " (reserved bits set)" : "");
		return -EINVAL;
	}
	memcpy(ch.reserved, h->handle, sizeof(ch.reserved));
	err = g->dcu.ipc_open(&p, ch, KCOLL_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (err)
		return cuda_fail(g, err, "cuIpcOpenMemHandle", why, len);
	*base = (void *)(uintptr_t)p;
	*dptr = (void *)(uintptr_t)(p + h->offset);
	return 0;
}

int kcoll_gpu_ipc_close(struct kcoll_gpu *g, void *base)
{
	int rc = data_gate(g, g ? g->dcu.ipc_close : NULL, "cuIpcCloseMemHandle", NULL, 0);

	if (rc)
		return rc;
	return kcoll_cuda_errno(g->dcu.ipc_close((unsigned long long)(uintptr_t)base));
}

int kcoll_gpu_dmabuf_fd(struct kcoll_gpu *g, const void *dptr, size_t size, int *fd, char *why,
			size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t p = (uintptr_t)dptr;
	int rc, err, h = -1;

	*fd = -1;
	rc = data_gate(g, g ? g->dcu.dmabuf : NULL, "cuMemGetHandleForAddressRange (CUDA 11.7)",
		       why, len);
	if (rc)
		return rc;
	if (page <= 0)
		page = 4096;
	if (!size || p % (uintptr_t)page || size % (size_t)page) {
		if (why && len)
			snprintf(why, len, "dma-buf export needs page-aligned address and size "
				 "(%p, %zu bytes)", dptr, size);
		return -EINVAL;
	}
	err = g->dcu.dmabuf(&h, (unsigned long long)p, size,
			    KCOLL_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (err)
		return cuda_fail(g, err, "cuMemGetHandleForAddressRange(DMA_BUF_FD)", why, len);
	*fd = h;
	return 0;
}

enum kcoll_gpu_path kcoll_gpu_reg_outcome(enum kcoll_gpu_path planned, int export_rc,
					  int reg_rc, char *why, size_t len)
{
	if (why && len)
		why[0] = '\0';
	if (planned == KCOLL_GPU_PATH_NONE)
		return KCOLL_GPU_PATH_NONE;
	if (planned == KCOLL_GPU_PATH_STAGING)
		return KCOLL_GPU_PATH_STAGING;
	if (planned == KCOLL_GPU_PATH_DMABUF && export_rc) {
		if (why && len)
			snprintf(why, len, "dma-buf export failed (%s): staging through host memory",
				 strerror(-export_rc));
		return KCOLL_GPU_PATH_STAGING;
	}
	if (reg_rc) {
		if (why && len)
			snprintf(why, len, "%s failed (%s)%s: staging through host memory",
				 planned == KCOLL_GPU_PATH_DMABUF ? "ibv_reg_dmabuf_mr"
								  : "ibv_reg_mr of GPU memory (peermem)",
				 strerror(-reg_rc),
				 reg_rc == -EOPNOTSUPP || reg_rc == -ENOSYS
					 ? "; the NIC driver cannot map it"
					 : reg_rc == -EPERM || reg_rc == -ENOMEM
						   ? "; check ulimit -l (locked memory)"
						   : "");
		return KCOLL_GPU_PATH_STAGING;
	}
	return planned;
}

int kcoll_gpu_ptr_query(struct kcoll_gpu *g, const void *ptr, struct kcoll_gpu_ptr *out, char *why,
			size_t len)
{
	unsigned long long p = (unsigned long long)(uintptr_t)ptr, base = 0, id = 0;
	unsigned int type = 0;
	size_t size = 0;
	int rc, err, ord = -1, managed = 0;

	memset(out, 0, sizeof(*out));
	out->dev = -1;
	rc = data_gate(g, g ? g->dcu.ptr_attr : NULL, "cuPointerGetAttribute", why, len);
	if (!rc)
		rc = data_gate(g, g->dcu.addr_range, "cuMemGetAddressRange_v2", why, len);
	if (rc)
		return rc;
	/* Host memory CUDA does not know: CUDA_ERROR_INVALID_VALUE. */
	err = g->dcu.ptr_attr(&type, KCOLL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
	if (err || type != KCOLL_CU_MEMORYTYPE_DEVICE)
		return 0;
	/* Managed memory is host-accessible and has no IPC handle: host. */
	if (!g->dcu.ptr_attr(&managed, KCOLL_CU_POINTER_ATTRIBUTE_IS_MANAGED, p) && managed)
		return 0;
	err = g->dcu.addr_range(&base, &size, p);
	if (!err)
		err = g->dcu.ptr_attr(&id, KCOLL_CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
	if (!err)
		err = g->dcu.ptr_attr(&ord, KCOLL_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
	if (err)
		return cuda_fail(g, err, "cuPointerGetAttribute/cuMemGetAddressRange", why, len);
	if (ord < 0 || ord >= g->info.ndev || ord >= KCOLL_GPU_MAX_DEVICES) {
		if (why && len)
			snprintf(why, len, "device pointer on device %d, which the probe did not see "
				 "(%d devices)", ord, g->info.ndev);
		return -ENODEV;
	}
	out->is_device = 1;
	out->base = base;
	out->size = size;
	out->buffer_id = id;
	out->dev = ord;
	snprintf(out->pci_bus_id, sizeof(out->pci_bus_id), "%s", g->info.dev[ord].pci_bus_id);
	return 0;
}

int kcoll_gpu_device_by_pci(const struct kcoll_gpu *g, const char *pci_bus_id)
{
	if (!g || !pci_bus_id[0])
		return -ENODEV;
	for (int d = 0; d < g->info.ndev && d < KCOLL_GPU_MAX_DEVICES; d++) {
		if (!strcasecmp(g->info.dev[d].pci_bus_id, pci_bus_id))
			return d;
	}
	return -ENODEV;
}

int kcoll_gpu_ctx_enter(struct kcoll_gpu *g, int dev, char *why, size_t len)
{
	static __thread unsigned long cur_serial;	/* 0: none */
	static __thread int cur_dev = -1;
	void *ctx;
	int rc, err = 0;

	rc = data_gate(g, g ? g->dcu.ctx_retain : NULL, "cuDevicePrimaryCtxRetain", why, len);
	if (!rc)
		rc = data_gate(g, g->dcu.ctx_set, "cuCtxSetCurrent", why, len);
	if (rc)
		return rc;
	if (dev < 0 || dev >= g->info.ndev || dev >= KCOLL_GPU_MAX_DEVICES) {
		if (why && len)
			snprintf(why, len, "no CUDA device %d (%d seen)", dev, g->info.ndev);
		return -ENODEV;
	}
	if (cur_serial == g->serial && cur_dev == dev)
		return 0;	/* already current on this thread */
	pthread_mutex_lock(&g->ctx_lock);
	if (!g->ctx[dev])
		err = g->dcu.ctx_retain(&g->ctx[dev], dev);
	ctx = g->ctx[dev];
	pthread_mutex_unlock(&g->ctx_lock);
	if (err)
		return cuda_fail(g, err, "cuDevicePrimaryCtxRetain", why, len);
	err = g->dcu.ctx_set(ctx);
	if (err)
		return cuda_fail(g, err, "cuCtxSetCurrent", why, len);
	cur_serial = g->serial;
	cur_dev = dev;
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * kcoll's GPU room, host side: a loader that dlopens the CUDA driver
 * (libcuda.so.1) and kcoll's kernels (libkcoll_gpu.so) at run time, so that
 * kcolld and the tools build, link and run where no CUDA is installed, plus
 * the doctor that explains what this machine can do. docs/gpu.md has the design.
 *
 * Conventions: int functions return 0 or a negative errno. Link with -ldl
 * ($(GPU_LDLIBS)). Environment: KCOLL_GPU_LIB names libkcoll_gpu.so.
 */
#ifndef KCOLL_GPU_H
#define KCOLL_GPU_H

#include <stddef.h>
#include <stdio.h>

#include "kernels.h"

#define KCOLL_GPU_MAX_DEVICES	32
#define KCOLL_GPU_TEXT		512	/* size of every reason/fix string below */

/* How GPU buffers reach an RDMA NIC, fastest first. */
enum kcoll_gpu_path {
	KCOLL_GPU_PATH_NONE = 0,	/* no usable GPU */
	KCOLL_GPU_PATH_STAGING,		/* copy through pinned host memory */
	KCOLL_GPU_PATH_PEERMEM,		/* nvidia-peermem registers GPU pages with the NIC */
	KCOLL_GPU_PATH_DMABUF,		/* the GPU exports a dma-buf the NIC maps (upstream) */
};

/* Inputs of the path choice for one device; 1 yes, 0 no, -1 unknown. */
struct kcoll_gpu_path_facts {
	int dmabuf;		/* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
	int gdr;		/* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED */
	int peermem;		/* nvidia_peermem or nv_peer_mem loaded */
	int kernel_dmabuf;	/* running kernel >= 5.12 (RDMA dma-buf MRs) */
	int rdma_devices;	/* entries in /sys/class/infiniband */
};

struct kcoll_gpu_device {
	int index;
	char name[128];
	int cc_major, cc_minor;
	int sm_count;
	unsigned long long mem_bytes;
	char pci_bus_id[32];
	int dmabuf;		/* 1, 0, -1 unknown (driver older than CUDA 11.7) */
	int gdr;		/* 1, 0, -1 unknown (driver older than CUDA 11.3) */
	int usable;		/* libkcoll_gpu.so carries an image this device runs */
	char why[KCOLL_GPU_TEXT];	/* when !usable */
	enum kcoll_gpu_path path;
	char path_reason[KCOLL_GPU_TEXT];	/* why not a faster path; "" when fastest */
	char path_fix[KCOLL_GPU_TEXT];
};

/* Everything the loader learnt; the doctor prints it. */
struct kcoll_gpu_info {
	int rc;				/* kcoll_gpu_available()'s answer */
	char why[KCOLL_GPU_TEXT];	/* when rc != 0 */
	char fix[KCOLL_GPU_TEXT];

	char driver_lib[256];
	int driver_loaded;
	char driver_error[KCOLL_GPU_TEXT];
	int driver_version;		/* cuDriverGetVersion, e.g. 13000; 0 unknown */
	int ipc;			/* the driver has the CUDA IPC entry points */
	int dmabuf_export;		/* ... and cuMemGetHandleForAddressRange */

	char kernels_lib[4096];
	int kernels_loaded;
	char kernels_error[KCOLL_GPU_TEXT];
	int runtime_version;		/* CUDA runtime libkcoll_gpu.so was built with */
	int min_driver_version;
	char archs[128];

	int ndev;			/* devices the driver reports */
	int nusable;
	struct kcoll_gpu_device dev[KCOLL_GPU_MAX_DEVICES];

	int nvidia_peermem, nv_peer_mem, ib_peer_mem;	/* loaded, per /sys/module */
	int nrdma;
	char rdma[256];			/* RDMA device names, space separated */
	char kernel_release[65];
	int kernel_dmabuf;

	enum kcoll_gpu_path path;	/* slowest path among usable devices */
	char path_reason[KCOLL_GPU_TEXT];
	char path_fix[KCOLL_GPU_TEXT];
};

/* Where to look; NULL fields take the defaults (tests point them at fakes). */
struct kcoll_gpu_config {
	const char *driver_lib;		/* default "libcuda.so.1" */
	const char *kernels_lib;	/* default $KCOLL_GPU_LIB, <exe dir>/../lib/libkcoll_gpu.so,
					 * then libkcoll_gpu.so on the loader's path */
	const char *sysfs_root;		/* default "/sys" */
	const char *kernel_release;	/* default uname -r */
	int driver_only;		/* skip the kernels library: for a process that only
					 * registers device buffers (libkcoll in an application) */
};

struct kcoll_gpu;

/*
 * Probe everything once. *gp is set whenever the result is not -ENOMEM, even
 * when the GPU is unusable (the info says why): close it in every case.
 * Returns info->rc: 0, -ENODEV (no driver, no device) or -EOPNOTSUPP (driver
 * too old, kernels missing or built for other devices).
 */
int kcoll_gpu_open(struct kcoll_gpu **gp, const struct kcoll_gpu_config *cfg);
void kcoll_gpu_close(struct kcoll_gpu *g);
const struct kcoll_gpu_info *kcoll_gpu_info(const struct kcoll_gpu *g);
/* The kernels table in *k when the GPU is usable; else *k = NULL and info->rc. */
int kcoll_gpu_kernels(const struct kcoll_gpu *g, const struct kcoll_gpu_kernels **k);

/*
 * The process-wide answer, probed once with the default config: 0 when kcoll
 * can run GPU reductions here, else -ENODEV/-EOPNOTSUPP and the exact reason
 * in why (may be NULL). Thread-safe.
 */
int kcoll_gpu_available(char *why, size_t len);
/* The process-wide instance in *gp (NULL only with -ENOMEM); returns its rc. */
int kcoll_gpu_process(struct kcoll_gpu **gp);
/* kcoll_gpu_reduce_n of the process-wide library (kernels.h has the contract);
 * kcoll_gpu_available()'s error when there is none. */
int kcoll_gpu_reduce(int dtype, int op, void *out, const void *const *in, unsigned int nin,
		     size_t count, void *stream);

/*
 * Device buffers shared with kcolld through CUDA IPC. The application exports
 * (it owns the allocation and its CUDA context); kcolld imports, in another
 * process: CUDA refuses to open a handle in the process that made it. The
 * handle names the whole allocation, so the buffer's offset inside it travels
 * too. Fixed layout: it is passed on registration as bytes.
 */
struct kcoll_gpu_ipc {
	unsigned char handle[64];	/* CUipcMemHandle (KCOLL_CU_IPC_HANDLE_SIZE) */
	unsigned long long offset;	/* buffer start - allocation base */
	unsigned long long size;	/* buffer bytes, within the allocation */
	int pid;			/* the exporting process */
	unsigned int reserved;		/* 0 */
};

/*
 * Every call below returns -EOPNOTSUPP when this process has no CUDA driver or
 * no device (why says which, from the probe), or when the driver lacks the
 * entry point (too old). why may be NULL; otherwise it always gets a sentence.
 */
/* Fill *h for [dptr, dptr + size), which must lie inside one device allocation. */
int kcoll_gpu_ipc_export(struct kcoll_gpu *g, const void *dptr, size_t size,
			 struct kcoll_gpu_ipc *h, char *why, size_t len);
/*
 * Open *h for peer_pid (the process kcolld knows is on the other end): -EPERM
 * when the handle was made by another process, -EINVAL when opened by its own
 * maker, with reserved bits, or when need > h->size. *dptr is the buffer
 * (allocation base + offset); kcoll_gpu_ipc_close(g, *dptr - offset) unmaps it,
 * so keep the base: kcoll_gpu_ipc_import sets *base too.
 */
int kcoll_gpu_ipc_import(struct kcoll_gpu *g, const struct kcoll_gpu_ipc *h, int peer_pid,
			 size_t need, void **base, void **dptr, char *why, size_t len);
int kcoll_gpu_ipc_close(struct kcoll_gpu *g, void *base);
/*
 * A dma-buf fd for [dptr, dptr + size) (cuMemGetHandleForAddressRange,
 * CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) for ibv_reg_dmabuf_mr; the caller closes
 * it. dptr and size must be page aligned (the driver's rule).
 */
int kcoll_gpu_dmabuf_fd(struct kcoll_gpu *g, const void *dptr, size_t size, int *fd, char *why,
			size_t len);
/* What the driver says about a pointer (kcoll_gpu_ptr_query). */
struct kcoll_gpu_ptr {
	int is_device;			/* device memory; the rest is set only then */
	unsigned long long base;	/* the allocation holding it */
	unsigned long long size;
	unsigned long long buffer_id;	/* CU_POINTER_ATTRIBUTE_BUFFER_ID: new per allocation */
	int dev;			/* device ordinal in this process */
	char pci_bus_id[32];		/* the same device, as any process names it */
};

/*
 * Is ptr device memory, and which allocation? 0 with is_device = 0 for memory
 * the driver does not know (host memory), pinned host memory and managed
 * memory (host-accessible, no IPC handle). Needs cuPointerGetAttribute.
 */
int kcoll_gpu_ptr_query(struct kcoll_gpu *g, const void *ptr, struct kcoll_gpu_ptr *out, char *why,
			size_t len);
/* This process's ordinal of the device with that PCI bus id, or -ENODEV. */
int kcoll_gpu_device_by_pci(const struct kcoll_gpu *g, const char *pci_bus_id);
/*
 * Make dev's primary context current on the calling thread (retained once per
 * instance, released by kcoll_gpu_close): the driver's IPC calls and kcolld's
 * copies and reductions need one. Cheap when it already is.
 */
int kcoll_gpu_ctx_enter(struct kcoll_gpu *g, int dev, char *why, size_t len);

/*
 * How one buffer reaches the NIC after trying: planned is the probe's path for
 * its device, export_rc what kcoll_gpu_dmabuf_fd returned (ignored unless
 * planned is dma-buf), reg_rc what registering it with the NIC returned (0 or
 * -errno; ignored when export failed). Returns the path taken and, when it is
 * not planned, the reason in why (the caller logs it).
 */
enum kcoll_gpu_path kcoll_gpu_reg_outcome(enum kcoll_gpu_path planned, int export_rc,
					  int reg_rc, char *why, size_t len);

/* Pure helpers, exposed for the doctor and the tests. */
enum kcoll_gpu_path kcoll_gpu_pick_path(const struct kcoll_gpu_path_facts *f, char *reason,
					size_t rlen, char *fix, size_t flen);
const char *kcoll_gpu_path_name(enum kcoll_gpu_path p);
/* Does a library carrying images 'archs' ("sm_80 sm_90 compute_90") run on cc major.minor? */
int kcoll_gpu_arch_runs(const char *archs, int major, int minor);

/*
 * Print the report (text, or one JSON object when json) for the default
 * config / for cfg. Returns what kcoll_gpu_open returned (0 = usable GPU),
 * or -EIO when out could not be written.
 */
int kcoll_gpu_doctor(FILE *out, int json);
int kcoll_gpu_doctor_with(FILE *out, int json, const struct kcoll_gpu_config *cfg);

#endif /* KCOLL_GPU_H */

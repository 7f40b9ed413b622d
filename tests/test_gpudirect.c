// SPDX-License-Identifier: MIT
/*
 * GPUDirect RDMA registration's decisions (rdma/gpudirect.c) on the fake CUDA
 * driver (gpu/fake_cuda.h) and without an RDMA device: each way a device
 * buffer falls back to host staging, with its reason, and no fd leaks. The
 * successful dma-buf and peermem registrations need a GPU and an RDMA NIC:
 * they SKIP here with that reason.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kcoll/tap.h"

#include "fake_cuda.h"
#include "gpudirect.h"
#include "kcoll_gpu.h"
#include "rdma.h"

static int has(const char *s, const char *sub)
{
	if (!strstr(s, sub)) {
		tap_diag("\"%s\" lacks \"%s\"", s, sub);
		return 0;
	}
	return 1;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	while (d && (de = readdir(d)))
		n += de->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

int main(void)
{
	struct kcoll_gpu_config none = { .driver_lib = "/nonexistent/libcuda.so.1" };
	char exe[PATH_MAX], fake[PATH_MAX + 32], why[1024];
	void *(*dalloc)(size_t) = NULL;
	void (*dfree)(void *) = NULL;
	void (*set)(const struct kcoll_fake_cuda *) = NULL;
	struct kcoll_fake_cuda f = {
		.driver_version = 13000, .ndev = 1, .cc_major = 9, .dmabuf = 1, .gdr = 1,
		.mem_bytes = 1ULL << 30, .kernels_version = KCOLL_GPU_KERNELS_VERSION,
		.min_driver_version = 13000, .archs = "sm_90",
	};
	struct kcoll_gpu_config cfg = { .kernel_release = "6.1.0" };
	enum kcoll_gpu_path path;
	struct kcoll_gpu *g;
	struct ibv_mr *mr;
	ssize_t n;
	void *dl, *sym, *mem;
	int rc, fds;

	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = '\0';
	if (strrchr(exe, '/'))
		*strrchr(exe, '/') = '\0';
	snprintf(fake, sizeof(fake), "%s/fixtures/libcuda-fake.so", exe);
	dl = dlopen(fake, RTLD_NOW | RTLD_LOCAL);
	if (dl) {
		sym = dlsym(dl, "kcoll_fake_cuda_set");
		memcpy(&set, &sym, sizeof(sym));
		sym = dlsym(dl, "kcoll_fake_cuda_alloc");
		memcpy(&dalloc, &sym, sizeof(sym));
		sym = dlsym(dl, "kcoll_fake_cuda_free");
		memcpy(&dfree, &sym, sizeof(sym));
	}
	if (!set || !dalloc || !dfree) {
		for (int i = 0; i < 6; i++)
			tap_skip("the fake CUDA fixture %s did not load", fake);
		return tap_done();
	}
	mem = dalloc(1 << 16);

	/* no CUDA at all */
	kcoll_gpu_open(&g, &none);
	mr = (struct ibv_mr *)1;
	rc = kcoll_rdma_mr_get_dmabuf(0, g, KCOLL_GPU_PATH_DMABUF, mem, 1 << 16, &mr, &path, why,
				      sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && path == KCOLL_GPU_PATH_STAGING && !mr &&
		       has(why, "dma-buf export failed") && has(why, "no CUDA driver"),
	       "no CUDA driver: staging, and why (%s)", why);
	kcoll_gpu_close(g);

	/* the fake exports a dma-buf; no RDMA device takes it */
	cfg.driver_lib = cfg.kernels_lib = fake;
	set(&f);
	rc = kcoll_gpu_open(&g, &cfg);
	fds = count_fds();
	rc = rc ? rc : kcoll_rdma_mr_get_dmabuf(0, g, KCOLL_GPU_PATH_DMABUF, mem, 1 << 16, &mr,
						&path, why, sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && path == KCOLL_GPU_PATH_STAGING && !mr &&
		       has(why, "ibv_reg_dmabuf_mr failed") && count_fds() == fds,
	       "dma-buf exported but the NIC registration fails: staging, the fd closed (%s)",
	       why);
	rc = kcoll_rdma_mr_get_dmabuf(0, g, KCOLL_GPU_PATH_DMABUF, (char *)mem + 1, 4096, &mr,
				      &path, why, sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && path == KCOLL_GPU_PATH_STAGING &&
		       has(why, "dma-buf export failed") && has(why, "page-aligned"),
	       "an unaligned buffer cannot be exported: staging (%s)", why);
	rc = kcoll_rdma_mr_get_dmabuf(0, g, KCOLL_GPU_PATH_PEERMEM, mem, 1 << 16, &mr, &path, why,
				      sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && path == KCOLL_GPU_PATH_STAGING && has(why, "peermem"),
	       "peermem planned but ibv_reg_mr fails: staging (%s)", why);
	rc = kcoll_rdma_mr_get_dmabuf(0, g, KCOLL_GPU_PATH_STAGING, mem, 1 << 16, &mr, &path, why,
				      sizeof(why));
	tap_ok(rc == -EOPNOTSUPP && path == KCOLL_GPU_PATH_STAGING &&
		       has(why, "path is host-staging"),
	       "staging planned (no GPUDirect on this host): staging, and says so (%s)", why);
	kcoll_gpu_close(g);

	tap_skip("a dma-buf or peermem registration that succeeds needs a GPU and an RDMA NIC "
		 "(none here)");
	dfree(mem);
	dlclose(dl);
	return tap_done();
}

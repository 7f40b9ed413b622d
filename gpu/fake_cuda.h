/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for libcuda.so.1 that tests/test_gpu.c points the loader at, so
 * that the loader's and the doctor's every branch runs without a GPU. Built
 * by gpu/build.mk as $(TBIN)/fixtures/libcuda-fake.so; never installed.
 * The test dlopens the same file, calls kcoll_fake_cuda_set, then has the
 * loader open it: both see one instance.
 */
#ifndef KCOLL_GPU_FAKE_CUDA_H
#define KCOLL_GPU_FAKE_CUDA_H

struct kcoll_fake_cuda {
	int init_result;		/* what cuInit returns (a CUresult) */
	int driver_version;		/* cuDriverGetVersion */
	int ndev;
	int cc_major, cc_minor;
	int dmabuf, gdr;		/* attribute values; -1: the query fails (old driver) */
	unsigned long long mem_bytes;
};

void kcoll_fake_cuda_set(const struct kcoll_fake_cuda *cfg);

#endif /* KCOLL_GPU_FAKE_CUDA_H */

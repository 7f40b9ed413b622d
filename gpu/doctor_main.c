// SPDX-License-Identifier: MIT
/*
 * kcoll-gpu-doctor [--json]: the GPU report without kcollctl.
 * Exit status: 0 a GPU is usable, 1 none is (the report says why), 2 usage
 * or output error. man/kcoll-gpu-doctor.8.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kcoll_gpu.h"

int main(int argc, char **argv)
{
	int json = 0, rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: %s [--json]\n"
			       "Reports the CUDA driver, devices, GPUDirect RDMA support and the\n"
			       "path kcoll takes. Exit status: 0 GPU usable, 1 not, 2 error.\n",
			       argv[0]);
			return 0;
		} else {
			fprintf(stderr, "%s: unknown argument '%s' (try --help)\n", argv[0], argv[i]);
			return 2;
		}
	}
	rc = kcoll_gpu_doctor(stdout, json);
	if (rc == -EIO || rc == -ENOMEM) {
		fprintf(stderr, "%s: %s\n", argv[0], strerror(-rc));
		return 2;
	}
	return rc ? 1 : 0;
}

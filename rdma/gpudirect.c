// SPDX-License-Identifier: MIT
/* GPUDirect RDMA registration with the host-staging fallback (gpudirect.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpudirect.h"
#include "log.h"
#include "rdma.h"

int kcoll_rdma_mr_get_dmabuf(int dev, struct kcoll_gpu *g, enum kcoll_gpu_path planned,
			     void *dptr, size_t len, struct ibv_mr **mr,
			     enum kcoll_gpu_path *path, char *why, size_t whylen)
{
	char ewhy[KCOLL_GPU_TEXT] = "", rwhy[KCOLL_GPU_TEXT];
	int export_rc = 0, reg_rc = 0, fd = -1;

	*mr = NULL;
	if (planned == KCOLL_GPU_PATH_DMABUF) {
		export_rc = kcoll_gpu_dmabuf_fd(g, dptr, len, &fd, ewhy, sizeof(ewhy));
		if (!export_rc) {
			reg_rc = kcoll_rdma_mr_get_fd(dev, dptr, len, fd, mr);
			close(fd);	/* the registration holds its own reference */
		}
	} else if (planned == KCOLL_GPU_PATH_PEERMEM) {
		reg_rc = kcoll_rdma_mr_get(dev, dptr, len, mr);
	}
	*path = kcoll_gpu_reg_outcome(planned, export_rc, reg_rc, rwhy, sizeof(rwhy));
	if (*path == planned && planned >= KCOLL_GPU_PATH_PEERMEM) {
		if (why && whylen)
			why[0] = '\0';
		return 0;
	}
	*mr = NULL;
	if (planned < KCOLL_GPU_PATH_PEERMEM)
		snprintf(rwhy, sizeof(rwhy), "the GPU's path is %s: staging through host memory",
			 kcoll_gpu_path_name(planned));
	if (why && whylen)
		snprintf(why, whylen, "%s%s%s", rwhy, ewhy[0] ? "; " : "", ewhy);
	kcoll_log(KCOLL_LOG_INFO, "rdma: device buffer %p (%zu bytes) on %s: %s%s%s", dptr, len,
		  kcoll_rdma_dev_name(dev), rwhy, ewhy[0] ? "; " : "", ewhy);
	return -EOPNOTSUPP;
}

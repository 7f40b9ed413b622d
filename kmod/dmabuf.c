// SPDX-License-Identifier: GPL-2.0
/*
 * A registration's pinned pages as a dma-buf (KCOLL_IOC_BUF_DMABUF): the
 * importer VMAs of buf.c are PFN maps that ib_umem cannot pin, while an RDMA
 * NIC takes a dma-buf (ibv_reg_dmabuf_mr) and reads the registrant's memory
 * directly.
 *
 * Lifetime: the dma-buf holds one reference on the registration, dropped by
 * its release (the last fd, mapping and device attachment gone), so its
 * pages stay pinned until then, as for an importer VMA. dma_buf_export()
 * also takes a reference on this module (exp_info.owner): rmmod is refused
 * while a dma-buf exists.
 *
 * The pages never move, so the exporter is a static one and needs no fences
 * or move_notify: map_dma_buf builds an sg_table of the pages and maps it
 * for the attaching device.
 */
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/fcntl.h>
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "kcoll_mod.h"

MODULE_IMPORT_NS(DMA_BUF);

static struct sg_table *kcoll_dmabuf_map(struct dma_buf_attachment *attach,
					 enum dma_data_direction dir)
{
	struct kcoll_buf *buf = attach->dmabuf->priv;
	struct sg_table *sgt;
	int ret;

	/* devices may read a read-only registration, never write it */
	if ((buf->flags & KCOLL_BUF_F_READONLY) && dir != DMA_TO_DEVICE)
		return ERR_PTR(-EACCES);
	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table_from_pages(sgt, buf->pages, buf->npages, 0,
					buf->npages << PAGE_SHIFT, GFP_KERNEL);
	if (ret)
		goto err_free;
	ret = dma_map_sgtable(attach->dev, sgt, dir, 0);
	if (ret)
		goto err_free_table;
	return sgt;

err_free_table:
	sg_free_table(sgt);
err_free:
	kfree(sgt);
	return ERR_PTR(ret);
}

static void kcoll_dmabuf_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
			       enum dma_data_direction dir)
{
	dma_unmap_sgtable(attach->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(sgt);
}

static void kcoll_dmabuf_release(struct dma_buf *dmabuf)
{
	kcoll_buf_put(dmabuf->priv);
}

/*
 * The VMA holds the dma-buf's file, which holds the registration: no
 * vm_ops needed. Anonymous pages cannot be vm_insert_page'd: PFN map them.
 */
static int kcoll_dmabuf_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct kcoll_buf *buf = dmabuf->priv;
	unsigned long first = vma->vm_pgoff;
	unsigned long n = vma_pages(vma);
	unsigned long i;
	int ret;

	/* an O_RDONLY dma-buf's shared mappings lose VM_SHARED, not VM_MAYSHARE */
	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	if (first >= buf->npages || n > buf->npages - first)
		return -EINVAL;
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	for (i = 0; i < n; i++) {
		ret = remap_pfn_range(vma, vma->vm_start + i * PAGE_SIZE,
				      page_to_pfn(buf->pages[first + i]), PAGE_SIZE,
				      vma->vm_page_prot);
		if (ret)
			return ret;	/* mmap_region() zaps what was mapped */
	}
	return 0;
}

static const struct dma_buf_ops kcoll_dmabuf_ops = {
	.map_dma_buf = kcoll_dmabuf_map,
	.unmap_dma_buf = kcoll_dmabuf_unmap,
	.release = kcoll_dmabuf_release,
	.mmap = kcoll_dmabuf_mmap,
};

/*
 * Export handle's pages. The fd is reserved here and installed by the caller
 * once the reply reached userspace (*filep holds the dma-buf until then).
 */
int kcoll_buf_dmabuf(struct kcoll_ioc_buf_dmabuf *arg, struct file **filep)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp);
	struct dma_buf *dmabuf;
	struct kcoll_buf *buf;
	int fd, ret;

	buf = kcoll_buf_get(arg->handle);
	if (!buf)
		return -ENOENT;
	ret = kcoll_buf_may_map(buf);
	if (ret)
		goto err_put;
	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		ret = fd;
		goto err_put;
	}
	exp.ops = &kcoll_dmabuf_ops;
	exp.size = buf->npages << PAGE_SHIFT;
	exp.flags = (buf->flags & KCOLL_BUF_F_READONLY) ? O_RDONLY : O_RDWR;
	exp.priv = buf;
	dmabuf = dma_buf_export(&exp);
	if (IS_ERR(dmabuf)) {
		ret = PTR_ERR(dmabuf);
		goto err_put_fd;
	}
	/* the lookup's reference is now the dma-buf's */
	arg->dmabuf_size = exp.size;
	arg->len = buf->len;
	arg->fd = fd;
	arg->page_offset = buf->page_offset;
	*filep = dmabuf->file;
	return 0;

err_put_fd:
	put_unused_fd(fd);
err_put:
	kcoll_buf_put(buf);
	return ret;
}

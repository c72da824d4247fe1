// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma rings in guest memory (§4) and their user-space mappings; the same
 * page sets back device memory (vrdma_dm.c).
 */
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "vrdma.h"

/**
 * vrdma_pages_alloc - allocate @npages zeroed, DMA-mapped pages into @r
 * @dev: the device
 * @r: cleared by the caller; gets pages, dma and npages (no mapping, no depth)
 * @npages: number of pages
 *
 * The pages of a ring and of device memory (vrdma_dm.c). On failure @r is
 * freed again.
 */
int vrdma_pages_alloc(struct vrdma_dev *dev, struct vrdma_ring *r, u32 npages)
{
	u32 i;

	r->npages = npages;
	r->pages = kvcalloc(npages, sizeof(*r->pages), GFP_KERNEL);
	r->dma = kvcalloc(npages, sizeof(*r->dma), GFP_KERNEL);
	if (!r->pages || !r->dma)
		goto err;

	for (i = 0; i < npages; i++) {
		r->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!r->pages[i])
			goto err;
		r->dma[i] = dma_map_page(dev->dma_dev, r->pages[i], 0,
					 PAGE_SIZE, DMA_BIDIRECTIONAL);
		if (dma_mapping_error(dev->dma_dev, r->dma[i])) {
			__free_page(r->pages[i]);
			r->pages[i] = NULL;
			goto err;
		}
	}
	return 0;

err:
	vrdma_ring_free(dev, r);
	return -ENOMEM;
}

/**
 * vrdma_ring_alloc - allocate a zeroed ring of @depth entries
 * @dev: the device
 * @r: the ring to fill in
 * @depth: number of entries, a power of two (0: no ring)
 * @entry_shift: log2 of the entry size
 */
int vrdma_ring_alloc(struct vrdma_dev *dev, struct vrdma_ring *r, u32 depth,
		     u32 entry_shift)
{
	size_t bytes = (size_t)depth << entry_shift;
	int err;

	BUILD_BUG_ON(PAGE_SIZE != VRDMA_PAGE_SIZE);
	BUILD_BUG_ON(sizeof(struct vrdma_ring_ctrl) > VRDMA_PAGE_SIZE);

	memset(r, 0, sizeof(*r));
	if (!depth)
		return 0;
	if (!is_power_of_2(depth) || entry_shift > VRDMA_MAX_WQE_SHIFT)
		return -EINVAL;

	err = vrdma_pages_alloc(dev, r, 1 + DIV_ROUND_UP(bytes, VRDMA_PAGE_SIZE));
	if (err)
		return err;
	r->depth = depth;
	r->entry_shift = entry_shift;

	r->va = vmap(r->pages, r->npages, VM_MAP, PAGE_KERNEL);
	if (!r->va) {
		vrdma_ring_free(dev, r);
		return -ENOMEM;
	}
	r->ctrl = r->va;
	r->entries = r->va + VRDMA_PAGE_SIZE;
	return 0;
}

void vrdma_ring_free(struct vrdma_dev *dev, struct vrdma_ring *r)
{
	u32 i;

	if (r->va)
		vunmap(r->va);
	for (i = 0; r->pages && i < r->npages; i++) {
		if (!r->pages[i])
			break;
		dma_unmap_page(dev->dma_dev, r->dma[i], PAGE_SIZE,
			       DMA_BIDIRECTIONAL);
		__free_page(r->pages[i]);
	}
	kvfree(r->pages);
	kvfree(r->dma);
	memset(r, 0, sizeof(*r));
}

/*
 * Free @r if the device has let go of it (@released), else keep its pages
 * until the device is reset (§14.1).
 */
void vrdma_ring_retire(struct vrdma_dev *dev, struct vrdma_ring *r,
		       bool released)
{
	if (released)
		vrdma_ring_free(dev, r);
	else
		vrdma_quarantine_ring(dev, r);
}

/* The page list the device gets: control page first (§4). */
__le64 *vrdma_ring_page_list(struct vrdma_ring *r)
{
	__le64 *pl;
	u32 i;

	pl = kvmalloc_array(max(r->npages, 1U), sizeof(*pl), GFP_KERNEL);
	if (!pl)
		return NULL;
	for (i = 0; i < r->npages; i++)
		pl[i] = cpu_to_le64(r->dma[i]);
	return pl;
}

/*
 * Expose @r to user space. The entry holds its own page references so it
 * stays valid however its lifetime interleaves with the ring's.
 */
struct rdma_user_mmap_entry *vrdma_ring_mmap_entry(struct ib_ucontext *uctx,
						   struct vrdma_ring *r,
						   u64 *offset, u64 *size)
{
	struct vrdma_mmap_entry *e;
	u32 i;
	int err;

	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		return ERR_PTR(-ENOMEM);
	e->pages = kvcalloc(r->npages, sizeof(*e->pages), GFP_KERNEL);
	if (!e->pages) {
		kfree(e);
		return ERR_PTR(-ENOMEM);
	}
	for (i = 0; i < r->npages; i++) {
		get_page(r->pages[i]);
		e->pages[i] = r->pages[i];
	}
	e->npages = r->npages;

	err = rdma_user_mmap_entry_insert(uctx, &e->rdma,
					  (size_t)r->npages << PAGE_SHIFT);
	if (err) {
		vrdma_mmap_free(&e->rdma);
		return ERR_PTR(err);
	}
	*offset = rdma_user_mmap_get_offset(&e->rdma);
	*size = (u64)r->npages << PAGE_SHIFT;
	return &e->rdma;
}

int vrdma_mmap(struct ib_ucontext *uctx, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *entry;
	struct vrdma_mmap_entry *e;
	int err;

	entry = rdma_user_mmap_entry_get(uctx, vma);
	if (!entry)
		return -EINVAL;
	e = to_vmmap(entry);
	if (vma_pages(vma) != e->npages) {
		err = -EINVAL;
		goto out;
	}
	err = vm_map_pages_zero(vma, e->pages, e->npages);
out:
	rdma_user_mmap_entry_put(entry);
	return err;
}

void vrdma_mmap_free(struct rdma_user_mmap_entry *entry)
{
	struct vrdma_mmap_entry *e = to_vmmap(entry);
	u32 i;

	for (i = 0; i < e->npages; i++)
		put_page(e->pages[i]);
	kvfree(e->pages);
	kfree(e);
}

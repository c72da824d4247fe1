// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma on-demand paging (§10, §12).
 *
 * Nothing is translated at registration. The device asks for a chunk with
 * a FAULT page request on the pagereq queue; a worker faults the pages in
 * with ib_umem_odp_map_dma_and_lock() and answers with ODP_PAGE_RESP while
 * holding umem_mutex, so an invalidation cannot slip in between. The
 * interval notifier sends ODP_INVALIDATE and returns only once the device
 * confirms that no access to the range is in flight.
 *
 * Implicit MRs cover the whole address space: one child umem per chunk of
 * 1 << odp_chunk_shift bytes, created when the device first asks for it and
 * kept in mr->children until the MR is deregistered.
 *
 * Page requests of one chunk are handled in the order the device sent
 * them (see vrdma_pagereq_queue()).
 */
#include <linux/delay.h>
#include <linux/hash.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <rdma/ib_umem_odp.h>

#include "vrdma.h"

/*
 * TEST ONLY: VM tests make the handling of a RECLAIM slow, as a preempted
 * worker would be, to check that a later FAULT of the same chunk still waits
 * for it (see vrdma_pagereq_queue()). 0 (the default) outside tests.
 */
static unsigned int test_reclaim_delay_ms;
module_param(test_reclaim_delay_ms, uint, 0644);
MODULE_PARM_DESC(test_reclaim_delay_ms,
		 "TEST ONLY: ms to wait before acting on an ODP RECLAIM (default 0, at most 1000)");

struct vrdma_pr_work {
	struct work_struct work;
	struct vrdma_dev *dev;
	struct vrdma_page_req req;
};

static u64 vrdma_odp_va_to_iova(struct vrdma_mr *mr, u64 va)
{
	if (mr->implicit)
		return va;
	return mr->odp_iova + (va - mr->umem->address);
}

static void vrdma_odp_invalidate_cmd(struct vrdma_mr *mr, u64 iova, u64 len)
{
	struct vrdma_cmd_odp_invalidate req = {};
	int err;

	req.mr_key = cpu_to_le32(mr->ibmr.lkey);
	req.iova = cpu_to_le64(iova);
	req.length = cpu_to_le64(len);
	err = vrdma_cmd(mr->dev, VRDMA_CMD_ODP_INVALIDATE, &req, sizeof(req),
			NULL, 0, NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT && err != -ENOENT)
		dev_warn_ratelimited(&mr->dev->vdev->dev,
				     "ODP_INVALIDATE %#x: %d\n",
				     mr->ibmr.lkey, err);
}

static bool vrdma_odp_invalidate(struct mmu_interval_notifier *mni,
				 const struct mmu_notifier_range *range,
				 unsigned long cur_seq)
{
	struct ib_umem_odp *odp = container_of(mni, struct ib_umem_odp,
					       notifier);
	struct vrdma_mr *mr;
	u64 start, end;

	/* ODP_INVALIDATE waits for the device: only where we may sleep. */
	if (!mmu_notifier_range_blockable(range))
		return false;

	mutex_lock(&odp->umem_mutex);
	mmu_interval_set_seq(mni, cur_seq);
	mr = odp->private;
	/* Nothing was handed to the device yet. */
	if (!mr || !odp->npages)
		goto out;
	start = max_t(u64, ib_umem_start(odp), range->start);
	end = min_t(u64, ib_umem_end(odp), range->end);
	if (start >= end)
		goto out;
	vrdma_odp_invalidate_cmd(mr, vrdma_odp_va_to_iova(mr, start),
				 end - start);
	ib_umem_odp_unmap_dma_pages(odp, start, end);
out:
	mutex_unlock(&odp->umem_mutex);
	return true;
}

static const struct mmu_interval_notifier_ops vrdma_odp_ops = {
	.invalidate = vrdma_odp_invalidate,
};

struct ib_mr *vrdma_reg_odp_mr(struct vrdma_pd *pd, u64 start, u64 length,
			       u64 virt_addr, int access)
{
	struct vrdma_dev *dev = to_vdev(pd->ibpd.device);
	struct vrdma_cmd_reg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	struct ib_umem_odp *odp;
	struct vrdma_mr *mr;
	u16 opcode;
	int err;

	if (!dev->has_odp)
		return ERR_PTR(-EOPNOTSUPP);

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->dev = dev;
	mr->odp = true;
	xa_init(&mr->children);
	xa_init(&mr->fault_rr);
	refcount_set(&mr->refs, 1);
	init_completion(&mr->free);

	if (!start && length == U64_MAX) {
		if (virt_addr || !dev->has_odp_implicit) {
			err = -EINVAL;
			goto err_free;
		}
		odp = ib_umem_odp_alloc_implicit(&dev->ib, access);
		mr->implicit = true;
		opcode = VRDMA_CMD_REG_IMPLICIT_MR;
	} else {
		if (!length || length > VCFG64(dev, max_mr_size)) {
			err = -EINVAL;
			goto err_free;
		}
		odp = ib_umem_odp_get(&dev->ib, start, length, access,
				      &vrdma_odp_ops);
		opcode = VRDMA_CMD_REG_ODP_MR;
	}
	if (IS_ERR(odp)) {
		err = PTR_ERR(odp);
		goto err_free;
	}
	mr->umem = &odp->umem;
	mr->odp_iova = virt_addr;

	req.pdn = cpu_to_le32(pd->pdn);
	req.access = cpu_to_le32(vrdma_access(access) | VRDMA_ACCESS_ON_DEMAND);
	req.iova = cpu_to_le64(mr->implicit ? 0 : virt_addr);
	req.length = cpu_to_le64(length);
	req.page_shift = cpu_to_le32(VRDMA_PAGE_SHIFT);
	err = vrdma_cmd(dev, opcode, &req, sizeof(req), NULL, 0, &resp,
			sizeof(resp));
	if (err)
		goto err_umem;
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);

	/* Before any fault can map pages, so invalidations find the MR. */
	mutex_lock(&odp->umem_mutex);
	odp->private = mr;
	mutex_unlock(&odp->umem_mutex);
	err = xa_insert(&dev->odp_mrs, VRDMA_KEY_INDEX(mr->ibmr.lkey), mr,
			GFP_KERNEL);
	if (err)
		goto err_dereg;
	return &mr->ibmr;

err_dereg:
	{
		struct vrdma_handle h = { .handle = resp.lkey };

		vrdma_cmd(dev, VRDMA_CMD_DEREG_MR, &h, sizeof(h), NULL, 0,
			  NULL, 0);
	}
err_umem:
	ib_umem_odp_release(odp);
err_free:
	xa_destroy(&mr->fault_rr);
	kfree(mr);
	return ERR_PTR(err);
}

/* Step 1 of deregistration: no new page request finds the MR. */
void vrdma_odp_unpublish(struct vrdma_mr *mr)
{
	xa_erase(&mr->dev->odp_mrs, VRDMA_KEY_INDEX(mr->ibmr.lkey));
	if (refcount_dec_and_test(&mr->refs))
		complete(&mr->free);
	wait_for_completion(&mr->free);
}

/* Step 2, after DEREG_MR: children first, then the parent. */
void vrdma_odp_dereg(struct vrdma_mr *mr)
{
	struct ib_umem_odp *child;
	unsigned long idx;

	xa_for_each(&mr->children, idx, child)
		ib_umem_odp_release(child);
	xa_destroy(&mr->children);
	xa_destroy(&mr->fault_rr);
	ib_umem_odp_release(to_ib_umem_odp(mr->umem));
	mr->umem = NULL;
}

/*
 * The ODP MR whose current key is @key, with a reference that keeps it
 * registered in the device (vrdma_odp_unpublish() waits for it).
 */
struct vrdma_mr *vrdma_odp_mr_get(struct vrdma_dev *dev, u32 key)
{
	struct vrdma_mr *mr;

	xa_lock(&dev->odp_mrs);
	mr = xa_load(&dev->odp_mrs, VRDMA_KEY_INDEX(key));
	if (mr && mr->ibmr.lkey == key)
		refcount_inc(&mr->refs);
	else
		mr = NULL;
	xa_unlock(&dev->odp_mrs);
	return mr;
}

void vrdma_odp_mr_put(struct vrdma_mr *mr)
{
	if (refcount_dec_and_test(&mr->refs))
		complete(&mr->free);
}

/* log2 of the ODP chunk size (§12.4), 2 MiB if the device's is unusable. */
static u32 vrdma_odp_chunk_shift(struct vrdma_dev *dev)
{
	u32 shift = VCFG(dev, odp_chunk_shift);

	if (shift < VRDMA_ODP_CHUNK_SHIFT_MIN ||
	    shift > VRDMA_ODP_CHUNK_SHIFT_MAX)
		shift = 21;
	return shift;
}

/* The child umem of an implicit MR covering @va, created on first use. */
static struct ib_umem_odp *vrdma_odp_child(struct vrdma_mr *mr, u64 va)
{
	u32 shift = vrdma_odp_chunk_shift(mr->dev);
	struct ib_umem_odp *root = to_ib_umem_odp(mr->umem);
	struct ib_umem_odp *child, *old;
	unsigned long idx;

	idx = va >> shift;
	child = xa_load(&mr->children, idx);
	if (child)
		return child;

	child = ib_umem_odp_alloc_child(root, idx << shift, 1UL << shift,
					&vrdma_odp_ops);
	if (IS_ERR(child))
		return child;
	mutex_lock(&child->umem_mutex);
	child->private = mr;
	mutex_unlock(&child->umem_mutex);

	old = xa_cmpxchg(&mr->children, idx, NULL, child, GFP_KERNEL);
	if (old) {
		/* Lost a race with another worker (or no memory). */
		ib_umem_odp_release(child);
		if (xa_is_err(old))
			return ERR_PTR(xa_err(old));
		return old;
	}
	return child;
}

static int vrdma_odp_resp(struct vrdma_dev *dev, const struct vrdma_page_req *req,
			  u32 status, u32 flags, u64 iova, const __le64 *pl,
			  u32 npages)
{
	struct vrdma_cmd_odp_page_resp resp = {};

	resp.req_id = req->req_id;
	resp.mr_key = req->mr_key;
	resp.status = cpu_to_le32(status);
	resp.flags = cpu_to_le32(flags);
	resp.iova = cpu_to_le64(iova);
	resp.npages = cpu_to_le32(npages);
	return vrdma_cmd(dev, VRDMA_CMD_ODP_PAGE_RESP, &resp, sizeof(resp), pl,
			 npages * sizeof(*pl), NULL, 0);
}

static u32 vrdma_odp_errno_status(int err)
{
	return err == -EPERM || err == -EACCES ? VRDMA_STATUS_ACCESS :
						  VRDMA_STATUS_BAD_ADDRESS;
}

struct vrdma_odp_seg {
	u64 start;
	u64 end;
	bool writable;
};

#define VRDMA_ODP_MAX_SEGS	16

/*
 * The readable VMA pieces of [*start, *end) in the owning process,
 * adjacent ones merged; with @write only writable ones. Picks one of them
 * (round robin per chunk) and narrows [*start, *end) to it.
 */
static int vrdma_odp_pick_segment(struct vrdma_mr *mr, struct ib_umem_odp *odp,
				  u64 iova, bool write, u64 *start, u64 *end,
				  bool *writable)
{
	struct mm_struct *mm = odp->umem.owning_mm;
	struct vrdma_odp_seg *segs;
	struct vm_area_struct *vma;
	unsigned long chunk, turn;
	int n = 0;
	void *old;

	segs = kcalloc(VRDMA_ODP_MAX_SEGS, sizeof(*segs), GFP_KERNEL);
	if (!segs)
		return -ENOMEM;
	if (!mmget_not_zero(mm)) {
		kfree(segs);
		return -EFAULT;
	}
	mmap_read_lock(mm);
	for (vma = find_vma_intersection(mm, *start, *end); vma;
	     vma = find_vma_intersection(mm, vma->vm_end, *end)) {
		u64 s = max_t(u64, *start, vma->vm_start);
		u64 e = min_t(u64, *end, vma->vm_end);
		bool w = vma->vm_flags & VM_WRITE;

		if (!(vma->vm_flags & VM_READ) ||
		    (vma->vm_flags & (VM_IO | VM_PFNMAP)) || (write && !w))
			continue;
		if (n && segs[n - 1].end == s) {
			segs[n - 1].end = e;
			segs[n - 1].writable &= w;
			continue;
		}
		if (n == VRDMA_ODP_MAX_SEGS)
			break;
		segs[n].start = s;
		segs[n].end = e;
		segs[n].writable = w;
		n++;
	}
	mmap_read_unlock(mm);
	mmput(mm);

	if (!n) {
		kfree(segs);
		return write ? -EACCES : -EFAULT;
	}
	turn = 0;
	if (n > 1) {
		chunk = iova >> min_t(u32, VCFG(mr->dev, odp_chunk_shift), 63);
		old = xa_load(&mr->fault_rr, chunk);
		turn = old ? xa_to_value(old) + 1 : 0;
		xa_store(&mr->fault_rr, chunk, xa_mk_value(turn & LONG_MAX),
			 GFP_KERNEL);
	}
	*start = segs[turn % n].start;
	*end = segs[turn % n].end;
	*writable = segs[turn % n].writable;
	kfree(segs);
	return 0;
}

static void vrdma_odp_fault(struct vrdma_dev *dev, struct vrdma_mr *mr,
			    const struct vrdma_page_req *req)
{
	u64 iova = le64_to_cpu(req->iova);
	u64 len = le64_to_cpu(req->length);
	bool write = le32_to_cpu(req->flags) & VRDMA_PAGEREQ_F_WRITE;
	struct ib_umem_odp *odp;
	u64 va, va_end, access;
	u32 i, npages, flags = 0, status;
	bool seg_writable;
	__le64 *pl;
	int ret;

	if (!len || iova + len < iova) {
		status = VRDMA_STATUS_BAD_ADDRESS;
		goto err;
	}
	if (mr->implicit) {
		odp = vrdma_odp_child(mr, iova);
		if (IS_ERR(odp)) {
			status = vrdma_odp_errno_status(PTR_ERR(odp));
			goto err;
		}
		va = iova;
	} else {
		odp = to_ib_umem_odp(mr->umem);
		if (iova < mr->odp_iova ||
		    iova - mr->odp_iova >= mr->umem->length) {
			status = VRDMA_STATUS_BAD_ADDRESS;
			goto err;
		}
		va = mr->umem->address + (iova - mr->odp_iova);
	}
	/* Page-aligned, clipped to this umem (the chunk of an implicit MR). */
	va_end = min_t(u64, ALIGN(va + len, VRDMA_PAGE_SIZE),
		       ib_umem_end(odp));
	va = ALIGN_DOWN(va, VRDMA_PAGE_SIZE);
	if (va < ib_umem_start(odp) || va >= va_end) {
		status = VRDMA_STATUS_BAD_ADDRESS;
		goto err;
	}
	if (write && !odp->umem.writable) {
		status = VRDMA_STATUS_ACCESS;
		goto err;
	}
	/*
	 * A chunk may straddle holes and read-only mappings, and faulting
	 * them fails. Answer one mappable segment (§12.4: a response may
	 * cover part of the chunk, the rest faults again); repeated faults
	 * of the same chunk rotate through its segments.
	 */
	ret = vrdma_odp_pick_segment(mr, odp, iova, write, &va, &va_end,
				     &seg_writable);
	if (ret) {
		status = vrdma_odp_errno_status(ret);
		goto err;
	}
	npages = (va_end - va) >> VRDMA_PAGE_SHIFT;
	pl = kvmalloc_array(npages, sizeof(*pl), GFP_KERNEL);
	if (!pl) {
		status = VRDMA_STATUS_NO_RESOURCES;
		goto err;
	}

	access = vrdma_odp_access_mask(odp->umem.writable && seg_writable);
	ret = ib_umem_odp_map_dma_and_lock(odp, va, va_end - va, access, true);
	if (ret < 0) {
		kvfree(pl);
		status = vrdma_odp_errno_status(ret);
		goto err;
	}
	/*
	 * umem_mutex held: no invalidation until the device has the pages.
	 * The device wants 4 KiB pages; a umem page may be larger (hugetlb).
	 */
	flags = VRDMA_ODP_RESP_F_WRITABLE;
	for (i = 0; i < npages; i++) {
		u64 off = va - ib_umem_start(odp) + ((u64)i << VRDMA_PAGE_SHIFT);
		bool writable;
		dma_addr_t d;

		ret = vrdma_odp_page_dma(odp, off >> odp->page_shift, &d,
					 &writable);
		if (ret) {
			mutex_unlock(&odp->umem_mutex);
			kvfree(pl);
			status = vrdma_odp_errno_status(ret);
			goto err;
		}
		if (!writable)
			flags = 0;
		pl[i] = cpu_to_le64(d + (off & (BIT_ULL(odp->page_shift) - 1)));
	}
	ret = vrdma_odp_resp(dev, req, VRDMA_STATUS_OK, flags,
			     vrdma_odp_va_to_iova(mr, va), pl, npages);
	mutex_unlock(&odp->umem_mutex);
	/* After a timeout the device may yet read the page list. */
	vrdma_cmd_tail_free(dev, pl, ret);
	if (ret)
		dev_warn_ratelimited(&dev->vdev->dev,
				     "ODP_PAGE_RESP %#x: %d\n", mr->ibmr.lkey,
				     ret);
	return;
err:
	vrdma_odp_resp(dev, req, status, 0, iova, NULL, 0);
}

static void vrdma_odp_reclaim(struct vrdma_mr *mr,
			      const struct vrdma_page_req *req)
{
	u64 iova = le64_to_cpu(req->iova);
	u64 len = le64_to_cpu(req->length);
	struct ib_umem_odp *odp;
	u64 va;

	if (mr->implicit) {
		u32 shift = vrdma_odp_chunk_shift(mr->dev);

		odp = xa_load(&mr->children, iova >> shift);
		if (!odp)
			return;
		va = iova;
	} else {
		if (iova < mr->odp_iova)
			return;
		odp = to_ib_umem_odp(mr->umem);
		va = mr->umem->address + (iova - mr->odp_iova);
	}
	mutex_lock(&odp->umem_mutex);
	if (odp->npages)
		ib_umem_odp_unmap_dma_pages(odp, va, va + len);
	mutex_unlock(&odp->umem_mutex);
}

static void vrdma_pagereq_work(struct work_struct *work)
{
	struct vrdma_pr_work *pw = container_of(work, struct vrdma_pr_work,
						work);
	struct vrdma_dev *dev = pw->dev;
	u32 type = le32_to_cpu(pw->req.type);
	struct vrdma_mr *mr;

	mr = vrdma_odp_mr_get(dev, le32_to_cpu(pw->req.mr_key));
	if (type == VRDMA_PAGEREQ_FAULT) {
		if (mr)
			vrdma_odp_fault(dev, mr, &pw->req);
		else
			vrdma_odp_resp(dev, &pw->req, VRDMA_STATUS_BAD_ADDRESS,
				       0, le64_to_cpu(pw->req.iova), NULL, 0);
	} else if (type == VRDMA_PAGEREQ_RECLAIM) {
		u32 delay = READ_ONCE(test_reclaim_delay_ms);

		if (delay)
			msleep(min(delay, 1000U));
		if (mr)
			vrdma_odp_reclaim(mr, &pw->req);
	} else {
		dev_warn_ratelimited(&dev->vdev->dev,
				     "unknown page request %u\n", type);
	}
	if (mr)
		vrdma_odp_mr_put(mr);
	kfree(pw);
}

static int vrdma_pagereq_post(struct vrdma_dev *dev, struct vrdma_page_req *r)
{
	struct scatterlist sg;

	sg_init_one(&sg, r, sizeof(*r));
	return virtqueue_add_inbuf(dev->vqs[VRDMA_VQ_PAGEREQ], &sg, 1, r,
				   GFP_ATOMIC);
}

/*
 * Page requests of one chunk MUST be handled in the order the device sent
 * them. The device drops a chunk (RECLAIM) and may fault it in again right
 * after (FAULT); if a worker answered that FAULT first and the RECLAIM ran
 * afterwards, ib_umem_odp_unmap_dma_pages() would unmap the pages the
 * device has just installed: the device would keep translations the
 * driver no longer tracks, and since an invalidation skips umems with no
 * mapped pages, no ODP_INVALIDATE would ever revoke them before the pages
 * are freed.
 *
 * Each request therefore goes to one of VRDMA_ODP_NR_WQ ordered workqueues
 * chosen by (MR key index, chunk). The interrupt handler queues requests in
 * the order the device returned them, an ordered workqueue runs its items
 * one at a time in queue order, so all requests of a chunk run in device
 * order; other chunks spread over the queues and are still answered
 * concurrently (§12.4 step 6). A FAULT's iova is inside its chunk (clipped
 * to the MR start) and a RECLAIM drops one chunk (§12.6), so the start
 * address names the chunk for both.
 */
static void vrdma_pagereq_queue(struct vrdma_dev *dev, struct vrdma_pr_work *pw)
{
	u64 chunk = le64_to_cpu(pw->req.iova) >> vrdma_odp_chunk_shift(dev);
	u64 key = VRDMA_KEY_INDEX(le32_to_cpu(pw->req.mr_key));
	u32 q = hash_64(chunk ^ (key << 32), ilog2(VRDMA_ODP_NR_WQ));

	queue_work(dev->odp_wq[q], &pw->work);
}

int vrdma_odp_wq_init(struct vrdma_dev *dev)
{
	int i;

	BUILD_BUG_ON(!is_power_of_2(VRDMA_ODP_NR_WQ));
	for (i = 0; i < VRDMA_ODP_NR_WQ; i++) {
		dev->odp_wq[i] = alloc_ordered_workqueue("vrdma_odp%d",
							 WQ_MEM_RECLAIM, i);
		if (!dev->odp_wq[i]) {
			vrdma_odp_wq_destroy(dev);
			return -ENOMEM;
		}
	}
	return 0;
}

/* After the device was reset (no more page requests): waits for workers. */
void vrdma_odp_wq_destroy(struct vrdma_dev *dev)
{
	int i;

	for (i = 0; i < VRDMA_ODP_NR_WQ; i++) {
		if (dev->odp_wq[i])
			destroy_workqueue(dev->odp_wq[i]);
		dev->odp_wq[i] = NULL;
	}
}

void vrdma_pagereq_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_page_req *r;
	struct vrdma_pr_work *pw;
	unsigned long flags;
	unsigned int len;
	bool posted = false;

	spin_lock_irqsave(&dev->pr_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		while ((r = virtqueue_get_buf(vq, &len))) {
			if (len >= sizeof(*r) && dev->odp_wq[0]) {
				pw = kmalloc(sizeof(*pw), GFP_ATOMIC);
				if (pw) {
					INIT_WORK(&pw->work, vrdma_pagereq_work);
					pw->dev = dev;
					pw->req = *r;
					vrdma_pagereq_queue(dev, pw);
				} else {
					dev_warn_ratelimited(&dev->vdev->dev,
							     "page request dropped\n");
				}
			}
			memset(r, 0, sizeof(*r));
			if (!vrdma_pagereq_post(dev, r))
				posted = true;
		}
	} while (!virtqueue_enable_cb(vq));
	if (posted)
		virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->pr_lock, flags);
}

/* Call after virtio_device_ready(). */
int vrdma_pagereq_init(struct vrdma_dev *dev)
{
	unsigned long flags;
	int i, err = 0;

	dev->pr_bufs = kcalloc(VRDMA_NUM_PAGEREQ_BUFS, sizeof(*dev->pr_bufs),
			       GFP_KERNEL);
	if (!dev->pr_bufs)
		return -ENOMEM;
	spin_lock_irqsave(&dev->pr_lock, flags);
	for (i = 0; i < VRDMA_NUM_PAGEREQ_BUFS; i++) {
		err = vrdma_pagereq_post(dev, &dev->pr_bufs[i]);
		if (err)
			break;
	}
	virtqueue_kick(dev->vqs[VRDMA_VQ_PAGEREQ]);
	spin_unlock_irqrestore(&dev->pr_lock, flags);
	return i ? 0 : err;
}

/* Call after the device was reset. */
void vrdma_pagereq_cleanup(struct vrdma_dev *dev)
{
	if (!dev->pr_bufs)
		return;
	while (virtqueue_detach_unused_buf(dev->vqs[VRDMA_VQ_PAGEREQ]))
		;
	kfree(dev->pr_bufs);
	dev->pr_bufs = NULL;
}

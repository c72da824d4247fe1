// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma shared receive queues: a receive WQE ring in guest memory (§4,
 * §6.2) that the device reads whenever it needs a receive WQE.
 */
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

struct vrdma_srq *vrdma_srq_get(struct vrdma_dev *dev, u32 srqn)
{
	struct vrdma_srq *srq;
	unsigned long flags;

	xa_lock_irqsave(&dev->srqs, flags);
	srq = xa_load(&dev->srqs, srqn);
	if (srq)
		refcount_inc(&srq->refs);
	xa_unlock_irqrestore(&dev->srqs, flags);
	return srq;
}

void vrdma_srq_put(struct vrdma_srq *srq)
{
	if (refcount_dec_and_test(&srq->refs))
		complete(&srq->free);
}

/* True if the device released the SRQ's ring (vrdma_released()). */
static bool vrdma_destroy_srq_cmd(struct vrdma_dev *dev, u32 srqn)
{
	struct vrdma_handle req = { .handle = cpu_to_le32(srqn) };
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_DESTROY_SRQ, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DESTROY_SRQ %u: %d\n", srqn, err);
	return vrdma_released(err);
}

int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		     struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct ib_srq_attr *attr = &init->attr;
	struct vrdma_cmd_create_srq req = {};
	struct vrdma_create_srq_resp uresp = {};
	struct vrdma_handle resp;
	u32 depth, shift;
	__le64 *pl;
	int err;

	if (init->srq_type != IB_SRQT_BASIC &&
	    (init->srq_type != IB_SRQT_XRC ||
	     !(VCFG(dev, device_caps) & VRDMA_DEVCAP_XRC)))
		return -EOPNOTSUPP;
	if (attr->max_wr > VCFG(dev, max_srq_wr) ||
	    attr->max_sge > VCFG(dev, max_srq_sge) ||
	    attr->srq_limit > attr->max_wr)
		return -EINVAL;
	depth = roundup_pow_of_two(max(attr->max_wr, 1U));
	if (depth > VCFG(dev, max_srq_wr))
		return -EINVAL;
	srq->max_sge = max(attr->max_sge, 1U);
	shift = max_t(u32, VRDMA_RQ_MIN_SHIFT,
		      order_base_2(sizeof(struct vrdma_recv_wqe) +
				   srq->max_sge * sizeof(struct vrdma_sge)));
	if (shift > VRDMA_MAX_WQE_SHIFT)
		return -EINVAL;

	srq->user = !!udata;
	spin_lock_init(&srq->lock);
	mutex_init(&srq->resize_mutex);
	refcount_set(&srq->refs, 1);
	init_completion(&srq->free);

	err = vrdma_ring_alloc(dev, &srq->ring, depth, shift);
	if (err)
		return err;
	pl = vrdma_ring_page_list(&srq->ring);
	if (!pl) {
		err = -ENOMEM;
		goto err_ring;
	}
	req.pdn = cpu_to_le32(to_vpd(ibsrq->pd)->pdn);
	req.depth = cpu_to_le32(depth);
	req.wqe_shift = shift;
	req.max_sge = cpu_to_le32(srq->max_sge);
	req.srq_limit = cpu_to_le32(attr->srq_limit);
	req.npages = cpu_to_le32(srq->ring.npages);
	if (init->srq_type == IB_SRQT_XRC) {
		/* §13.7: its own domain and CQ; peers name it in the XRCETH. */
		req.srq_type = VRDMA_SRQT_XRC;
		req.xrcdn = cpu_to_le32(to_vxrcd(init->ext.xrc.xrcd)->xrcdn);
		req.cqn = cpu_to_le32(to_vcq(init->ext.cq)->cqn);
	}
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_SRQ, &req, sizeof(req), pl,
			srq->ring.npages * sizeof(*pl), &resp, sizeof(resp));
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/* After a timeout the device may yet create the SRQ. */
		vrdma_ring_retire(dev, &srq->ring, !vrdma_cmd_unsettled(err));
		mutex_destroy(&srq->resize_mutex);
		return err;
	}
	srq->srqn = le32_to_cpu(resp.handle);
	if (init->srq_type == IB_SRQT_XRC)
		ibsrq->ext.xrc.srq_num = srq->srqn;

	err = xa_insert_irq(&dev->srqs, srq->srqn, srq, GFP_KERNEL);
	if (err)
		goto err_destroy;

	attr->max_wr = depth;
	attr->max_sge = srq->max_sge;

	if (udata) {
		srq->mmap = vrdma_ring_mmap_entry(vrdma_uctx(udata),
						  &srq->ring,
						  &uresp.mmap_offset,
						  &uresp.mmap_size);
		if (IS_ERR(srq->mmap)) {
			err = PTR_ERR(srq->mmap);
			srq->mmap = NULL;
			goto err_erase;
		}
		uresp.srqn = srq->srqn;
		uresp.depth = depth;
		uresp.wqe_shift = shift;
		err = ib_copy_to_udata(udata, &uresp,
				       min(udata->outlen, sizeof(uresp)));
		if (err)
			goto err_mmap;
	}
	return 0;

err_mmap:
	rdma_user_mmap_entry_remove(srq->mmap);
	srq->mmap = NULL;
err_erase:
	xa_erase_irq(&dev->srqs, srq->srqn);
err_destroy:
	vrdma_ring_retire(dev, &srq->ring,
			  vrdma_destroy_srq_cmd(dev, srq->srqn));
	mutex_destroy(&srq->resize_mutex);
	return err;
err_ring:
	vrdma_ring_free(dev, &srq->ring);
	mutex_destroy(&srq->resize_mutex);
	return err;
}

static void vrdma_srq_set_resizing(struct vrdma_srq *srq, bool on)
{
	unsigned long flags;

	spin_lock_irqsave(&srq->lock, flags);
	srq->resizing = on;
	spin_unlock_irqrestore(&srq->lock, flags);
}

/*
 * §11.7 MODIFY_SRQ with VRDMA_SRQ_MAX_WR: the device copies the posted WQEs
 * to the start of a new ring and takes WQEs from it when the command
 * completes. Kernel posters are refused (-EBUSY) while the command is
 * outstanding, because WQEs posted to the old ring then might not be
 * copied; libvrdma holds its SRQ lock across the command for the same
 * reason. For user SRQs the new ring's mapping goes to the address the
 * provider passed (struct vrdma_modify_srq_cmd).
 */
static int vrdma_resize_srq(struct vrdma_dev *dev, struct vrdma_srq *srq,
			    struct ib_srq_attr *attr,
			    enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct rdma_user_mmap_entry *mmap = NULL;
	struct vrdma_cmd_modify_srq req = {};
	struct vrdma_modify_srq_resp uresp = {};
	struct vrdma_modify_srq_cmd ucmd = {};
	struct vrdma_ring ring, old;
	unsigned long flags;
	u32 depth;
	__le64 *pl;
	int err;

	if (!(VCFG(dev, device_caps) & VRDMA_DEVCAP_SRQ_RESIZE))
		return -EOPNOTSUPP;
	if (!attr->max_wr || attr->max_wr > VCFG(dev, max_srq_wr))
		return -EINVAL;
	depth = roundup_pow_of_two(attr->max_wr);
	if (depth > VCFG(dev, max_srq_wr))
		return -EINVAL;
	if ((mask & IB_SRQ_LIMIT) && attr->srq_limit > depth)
		return -EINVAL;
	if (udata) {
		if (udata->inlen < sizeof(ucmd))
			return -EINVAL;
		err = ib_copy_from_udata(&ucmd, udata, sizeof(ucmd));
		if (err)
			return err;
	}

	mutex_lock(&srq->resize_mutex);
	err = vrdma_ring_alloc(dev, &ring, depth, srq->ring.entry_shift);
	if (err)
		goto out_unlock;
	pl = vrdma_ring_page_list(&ring);
	if (!pl) {
		vrdma_ring_free(dev, &ring);
		err = -ENOMEM;
		goto out_unlock;
	}
	req.srqn = cpu_to_le32(srq->srqn);
	req.attr_mask = cpu_to_le32(VRDMA_SRQ_MAX_WR |
				    (mask & IB_SRQ_LIMIT ? VRDMA_SRQ_LIMIT : 0));
	req.max_wr = cpu_to_le32(depth);
	req.srq_limit = cpu_to_le32(attr->srq_limit);
	req.npages = cpu_to_le32(ring.npages);

	vrdma_srq_set_resizing(srq, true);
	err = vrdma_cmd(dev, VRDMA_CMD_MODIFY_SRQ, &req, sizeof(req), pl,
			ring.npages * sizeof(*pl), NULL, 0);
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/* After a timeout the device may yet switch to @ring. */
		vrdma_ring_retire(dev, &ring, !vrdma_cmd_unsettled(err));
		vrdma_srq_set_resizing(srq, false);
		goto out_unlock;
	}

	if (udata) {
		mmap = vrdma_ring_mmap_entry(vrdma_uctx(udata), &ring,
					     &uresp.mmap_offset,
					     &uresp.mmap_size);
		if (IS_ERR(mmap)) {
			/* The device already uses the new ring. */
			err = PTR_ERR(mmap);
			mmap = NULL;
		}
	}

	spin_lock_irqsave(&srq->lock, flags);
	old = srq->ring;
	srq->ring = ring;
	srq->resizing = false;
	spin_unlock_irqrestore(&srq->lock, flags);

	if (srq->mmap)
		rdma_user_mmap_entry_remove(srq->mmap);
	srq->mmap = mmap;
	/* The device acknowledged the switch: it no longer reads @old. */
	vrdma_ring_free(dev, &old);

	if (udata && !err) {
		uresp.depth = depth;
		if (copy_to_user(u64_to_user_ptr(ucmd.resp_addr), &uresp,
				 sizeof(uresp)))
			err = -EFAULT;
	}
out_unlock:
	mutex_unlock(&srq->resize_mutex);
	return err;
}

int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		     enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_cmd_modify_srq req = {};

	if (mask & ~(IB_SRQ_MAX_WR | IB_SRQ_LIMIT))
		return -EINVAL;
	if (mask & IB_SRQ_MAX_WR)
		return vrdma_resize_srq(dev, srq, attr, mask, udata);
	if ((mask & IB_SRQ_LIMIT) && attr->srq_limit > srq->ring.depth)
		return -EINVAL;
	req.srqn = cpu_to_le32(srq->srqn);
	req.attr_mask = cpu_to_le32(mask & IB_SRQ_LIMIT ? VRDMA_SRQ_LIMIT : 0);
	req.srq_limit = cpu_to_le32(attr->srq_limit);
	return vrdma_cmd(dev, VRDMA_CMD_MODIFY_SRQ, &req, sizeof(req), NULL, 0,
			 NULL, 0);
}

int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_handle req = { .handle = cpu_to_le32(srq->srqn) };
	struct vrdma_resp_query_srq resp;
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_QUERY_SRQ, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err)
		return err;
	attr->max_wr = le32_to_cpu(resp.max_wr);
	attr->max_sge = le32_to_cpu(resp.max_sge);
	attr->srq_limit = le32_to_cpu(resp.srq_limit);
	return 0;
}

int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	bool released;

	released = vrdma_destroy_srq_cmd(dev, srq->srqn);
	xa_erase_irq(&dev->srqs, srq->srqn);
	vrdma_srq_put(srq);
	wait_for_completion(&srq->free);
	if (srq->mmap)
		rdma_user_mmap_entry_remove(srq->mmap);
	vrdma_ring_retire(dev, &srq->ring, released);
	mutex_destroy(&srq->resize_mutex);
	return 0;
}

int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			const struct ib_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_ring *r = &srq->ring;
	unsigned long flags;
	int err, n;

	if (srq->user) {
		*bad_wr = wr;
		return -EINVAL;
	}
	spin_lock_irqsave(&srq->lock, flags);
	if (srq->resizing) {
		spin_unlock_irqrestore(&srq->lock, flags);
		*bad_wr = wr;
		return -EBUSY;
	}
	err = vrdma_post_recv_ring(r, &wr, srq->max_sge, &n);
	spin_unlock_irqrestore(&srq->lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

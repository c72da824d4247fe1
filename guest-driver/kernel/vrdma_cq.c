// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma completion queues: rings of 64-byte CQEs in guest memory (§4, §7),
 * arming in the control page (§5.3).
 */
#include <linux/if_vlan.h>
#include <linux/slab.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

struct vrdma_cq *vrdma_cq_get(struct vrdma_dev *dev, u32 cqn)
{
	struct vrdma_cq *cq;
	unsigned long flags;

	xa_lock_irqsave(&dev->cqs, flags);
	cq = xa_load(&dev->cqs, cqn);
	if (cq)
		refcount_inc(&cq->refs);
	xa_unlock_irqrestore(&dev->cqs, flags);
	return cq;
}

void vrdma_cq_put(struct vrdma_cq *cq)
{
	if (refcount_dec_and_test(&cq->refs))
		complete(&cq->free);
}

static int vrdma_cq_depth(struct vrdma_dev *dev, int cqe, u32 *depth)
{
	u32 max = VCFG(dev, max_cqe);

	if (cqe < 1 || cqe > max)
		return -EINVAL;
	*depth = roundup_pow_of_two(cqe);
	if (*depth > max)
		return -EINVAL;
	return 0;
}

/* Allocate a ring and hand it to the device (CREATE_CQ or RESIZE_CQ). */
static int vrdma_cq_ring_cmd(struct vrdma_dev *dev, u16 opcode, u32 cqn,
			     struct vrdma_ring *ring, u32 depth, u32 *out)
{
	struct vrdma_cmd_create_cq req = {};
	struct vrdma_handle resp;
	__le64 *pl;
	int err;

	err = vrdma_ring_alloc(dev, ring, depth, VRDMA_CQE_SHIFT);
	if (err)
		return err;
	pl = vrdma_ring_page_list(ring);
	if (!pl) {
		vrdma_ring_free(dev, ring);
		return -ENOMEM;
	}
	req.cqn = cpu_to_le32(cqn);
	req.depth = cpu_to_le32(depth);
	req.npages = cpu_to_le32(ring->npages);
	err = vrdma_cmd(dev, opcode, &req, sizeof(req), pl,
			ring->npages * sizeof(*pl), &resp, sizeof(resp));
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/* After a timeout the device may yet switch to @ring. */
		vrdma_ring_retire(dev, ring, !vrdma_cmd_unsettled(err));
		return err;
	}
	*out = le32_to_cpu(resp.handle);
	return 0;
}

/* True if the device released the CQ's ring (vrdma_released()). */
static bool vrdma_destroy_cq_cmd(struct vrdma_dev *dev, u32 cqn)
{
	struct vrdma_handle req = { .handle = cpu_to_le32(cqn) };
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_DESTROY_CQ, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DESTROY_CQ %u: %d\n", cqn, err);
	return vrdma_released(err);
}

int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		    struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_create_cq_resp uresp = {};
	u32 depth;
	int err;

	if (attr->flags)
		return -EOPNOTSUPP;
	err = vrdma_cq_depth(dev, attr->cqe, &depth);
	if (err)
		return err;

	spin_lock_init(&cq->lock);
	mutex_init(&cq->resize_mutex);
	refcount_set(&cq->refs, 1);
	init_completion(&cq->free);
	cq->user = !!udata;

	err = vrdma_cq_ring_cmd(dev, VRDMA_CMD_CREATE_CQ, 0, &cq->ring, depth,
				&cq->cqn);
	if (err)
		return err;
	ibcq->cqe = depth;

	err = xa_insert_irq(&dev->cqs, cq->cqn, cq, GFP_KERNEL);
	if (err)
		goto err_destroy;

	if (udata) {
		cq->mmap = vrdma_ring_mmap_entry(vrdma_uctx(udata),
						 &cq->ring, &uresp.mmap_offset,
						 &uresp.mmap_size);
		if (IS_ERR(cq->mmap)) {
			err = PTR_ERR(cq->mmap);
			cq->mmap = NULL;
			goto err_erase;
		}
		uresp.cqn = cq->cqn;
		uresp.depth = depth;
		err = ib_copy_to_udata(udata, &uresp,
				       min(udata->outlen, sizeof(uresp)));
		if (err)
			goto err_mmap;
	}
	return 0;

err_mmap:
	rdma_user_mmap_entry_remove(cq->mmap);
err_erase:
	xa_erase_irq(&dev->cqs, cq->cqn);
err_destroy:
	vrdma_ring_retire(dev, &cq->ring, vrdma_destroy_cq_cmd(dev, cq->cqn));
	mutex_destroy(&cq->resize_mutex);
	return err;
}

int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	bool released;

	released = vrdma_destroy_cq_cmd(dev, cq->cqn);
	xa_erase_irq(&dev->cqs, cq->cqn);
	vrdma_cq_put(cq);
	wait_for_completion(&cq->free);
	if (cq->mmap)
		rdma_user_mmap_entry_remove(cq->mmap);
	vrdma_ring_retire(dev, &cq->ring, released);
	mutex_destroy(&cq->resize_mutex);
	return 0;
}

/*
 * ib_uverbs runs resize_cq with only a shared lock on the CQ, so two
 * resizes of one CQ can overlap. resize_mutex makes them one after the
 * other: the ring freed below is always the one the device used until the
 * RESIZE_CQ it has just acknowledged (§11.6: the old ring's pages are free
 * when the command completes), never a ring a later, still outstanding
 * RESIZE_CQ left in place; and kernel pollers stay off the CQ for the
 * whole of each command (§5, Driver Requirements).
 */
int vrdma_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_resize_cq_resp uresp = {};
	struct rdma_user_mmap_entry *mmap = NULL;
	struct vrdma_ring ring, old;
	unsigned long flags;
	u32 depth, copied;
	int err;

	err = vrdma_cq_depth(dev, cqe, &depth);
	if (err)
		return err;

	mutex_lock(&cq->resize_mutex);
	if (depth == cq->ring.depth)
		goto out_unlock;

	/* Kernel pollers see an empty CQ until the new ring is in place. */
	spin_lock_irqsave(&cq->lock, flags);
	cq->resizing = true;
	spin_unlock_irqrestore(&cq->lock, flags);

	err = vrdma_cq_ring_cmd(dev, VRDMA_CMD_RESIZE_CQ, cq->cqn, &ring,
				depth, &copied);
	if (err)
		goto out;

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

	spin_lock_irqsave(&cq->lock, flags);
	old = cq->ring;
	cq->ring = ring;
	ring.ctrl->cq_arm = old.ctrl->cq_arm;
	ibcq->cqe = depth;
	cq->resizing = false;
	spin_unlock_irqrestore(&cq->lock, flags);

	if (cq->mmap)
		rdma_user_mmap_entry_remove(cq->mmap);
	cq->mmap = mmap;
	/* The device acknowledged the switch: it no longer writes @old. */
	vrdma_ring_free(dev, &old);
	mutex_unlock(&cq->resize_mutex);
	dev_dbg(&dev->vdev->dev, "CQ %u resized to %u, %u CQEs moved\n",
		cq->cqn, depth, copied);

	if (udata && !err) {
		uresp.depth = depth;
		err = ib_copy_to_udata(udata, &uresp,
				       min(udata->outlen, sizeof(uresp)));
	}
	return err;
out:
	spin_lock_irqsave(&cq->lock, flags);
	cq->resizing = false;
	spin_unlock_irqrestore(&cq->lock, flags);
out_unlock:
	mutex_unlock(&cq->resize_mutex);
	return err;
}

/* §5.5: the device holds CQ events back by count and period. */
int vrdma_modify_cq(struct ib_cq *ibcq, u16 cq_count, u16 cq_period)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_cmd_modify_cq req = {
		.cqn = cpu_to_le32(cq->cqn),
		.cq_count = cpu_to_le16(cq_count),
		.cq_period = cpu_to_le16(cq_period),
	};

	if (!(VCFG(dev, device_caps) & VRDMA_DEVCAP_CQ_MODERATION))
		return -EOPNOTSUPP;
	return vrdma_cmd(dev, VRDMA_CMD_MODIFY_CQ, &req, sizeof(req), NULL, 0,
			 NULL, 0);
}

/* VRDMA_WC_* equal enum ib_wc_opcode except REG_MR and FLUSH (§7). */
static enum ib_wc_opcode vrdma_wc_opcode(u8 opcode)
{
	switch (opcode) {
	case VRDMA_WC_REG_MR:
		return IB_WC_REG_MR;
	case VRDMA_WC_FLUSH:
	case VRDMA_WC_ATOMIC_WRITE:
		return vrdma_ibta15_wc_opcode(opcode);
	default:
		return opcode;
	}
}

static void vrdma_cqe_to_wc(struct vrdma_dev *dev, const struct vrdma_cqe *cqe,
			    struct ib_wc *wc)
{
	u16 vlan = le16_to_cpu(cqe->vlan_id);

	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64_to_cpu(cqe->wr_id);
	wc->status = cqe->status <= VRDMA_WC_GENERAL_ERR ?
		     cqe->status : IB_WC_GENERAL_ERR;
	wc->opcode = vrdma_wc_opcode(cqe->opcode);
	wc->vendor_err = le32_to_cpu(cqe->vendor_err);
	wc->byte_len = le32_to_cpu(cqe->byte_len);
	wc->qp = xa_load(&dev->qps, le32_to_cpu(cqe->qpn));
	wc->src_qp = le32_to_cpu(cqe->src_qp);
	wc->pkey_index = le16_to_cpu(cqe->pkey_index);
	wc->sl = cqe->sl;
	wc->port_num = 1;
	if (cqe->flags & VRDMA_WC_F_GRH)
		wc->wc_flags |= IB_WC_GRH;
	if (cqe->flags & VRDMA_WC_F_IMM) {
		wc->wc_flags |= IB_WC_WITH_IMM;
		wc->ex.imm_data = (__force __be32)cqe->ex;
	} else if (cqe->flags & VRDMA_WC_F_INV) {
		wc->wc_flags |= IB_WC_WITH_INVALIDATE;
		wc->ex.invalidate_rkey = le32_to_cpu(cqe->ex);
	}
	if (wc->opcode & IB_WC_RECV) {
		memcpy(wc->smac, cqe->smac, ETH_ALEN);
		wc->wc_flags |= IB_WC_WITH_SMAC;
		/* 0 and 0xffff both mean untagged (VID 0 is priority only). */
		if (vlan && vlan < VLAN_N_VID) {
			wc->vlan_id = vlan;
			wc->wc_flags |= IB_WC_WITH_VLAN;
		}
		if (cqe->network_hdr_type) {
			wc->network_hdr_type = cqe->network_hdr_type;
			wc->wc_flags |= IB_WC_WITH_NETWORK_HDR_TYPE;
		}
	}
}

int vrdma_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_ring *r = &cq->ring;
	unsigned long flags;
	u32 cons, prod;
	int n = 0;

	spin_lock_irqsave(&cq->lock, flags);
	if (cq->resizing || cq->user)
		goto out;
	cons = le32_to_cpu(r->ctrl->consumer);
	/* Acquire: the CQE is written before the producer (§4). */
	prod = le32_to_cpu(smp_load_acquire(&r->ctrl->producer));
	if (prod - cons > r->depth) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CQ %u: bad producer %u (consumer %u)\n",
				    cq->cqn, prod, cons);
		goto out;
	}
	while (n < num && cons != prod) {
		vrdma_cqe_to_wc(dev, vrdma_ring_entry(r, cons), &wc[n]);
		cons++;
		n++;
	}
	if (n)
		/* Release: CQEs are read before the device may reuse them. */
		smp_store_release(&r->ctrl->consumer, cpu_to_le32(cons));
out:
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_ring_ctrl *ctrl;
	unsigned long irqflags;
	u32 arm, prod, cons;
	int ret = 0;

	arm = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED ?
	      VRDMA_CQ_ARM_SOLICITED : VRDMA_CQ_ARM_NEXT;

	spin_lock_irqsave(&cq->lock, irqflags);
	ctrl = cq->ring.ctrl;
	WRITE_ONCE(ctrl->cq_arm, cpu_to_le32(arm));
	/*
	 * Full fence against the device's "write CQE, advance producer,
	 * fence, read cq_arm" (§5.3): one of the two sides sees the other.
	 */
	mb();
	if (flags & IB_CQ_REPORT_MISSED_EVENTS) {
		prod = le32_to_cpu(READ_ONCE(ctrl->producer));
		cons = le32_to_cpu(ctrl->consumer);
		ret = prod != cons;
	}
	spin_unlock_irqrestore(&cq->lock, irqflags);
	return ret;
}

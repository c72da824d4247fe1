// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma queue pairs (§13): creation with SQ/RQ rings in guest memory,
 * the IBTA state machine in the device, and the kernel data path that
 * writes send WQEs (§6.1) and receive WQEs (§6.2).
 */
#include <linux/slab.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

#define VRDMA_SEND_HDR	sizeof(struct vrdma_send_wqe)
#define VRDMA_RECV_HDR	sizeof(struct vrdma_recv_wqe)
#define VRDMA_SGE	sizeof(struct vrdma_sge)

struct vrdma_qp *vrdma_qp_get(struct vrdma_dev *dev, u32 qpn)
{
	struct vrdma_qp *qp;
	unsigned long flags;

	xa_lock_irqsave(&dev->qps, flags);
	qp = xa_load(&dev->qps, qpn);
	if (qp)
		refcount_inc(&qp->refs);
	xa_unlock_irqrestore(&dev->qps, flags);
	return qp;
}

void vrdma_qp_put(struct vrdma_qp *qp)
{
	if (refcount_dec_and_test(&qp->refs))
		complete(&qp->free);
}

static u32 vrdma_slot_shift(size_t bytes, u32 min_shift)
{
	return max_t(u32, min_shift, order_base_2(bytes));
}

static int vrdma_qp_type(struct vrdma_dev *dev, enum ib_qp_type type)
{
	bool xrc = VCFG(dev, device_caps) & VRDMA_DEVCAP_XRC;

	switch (type) {
	case IB_QPT_XRC_INI:
		return xrc ? VRDMA_QPT_XRC_INI : -EOPNOTSUPP;
	case IB_QPT_XRC_TGT:
		return xrc ? VRDMA_QPT_XRC_TGT : -EOPNOTSUPP;
	case IB_QPT_RC:
		return VRDMA_QPT_RC;
	case IB_QPT_UC:
		return VRDMA_QPT_UC;
	case IB_QPT_UD:
		return VRDMA_QPT_UD;
	case IB_QPT_GSI:
		return VRDMA_QPT_GSI;
	default:
		return -EOPNOTSUPP;
	}
}

/* True if the device released the QP's rings (vrdma_released()). */
static bool vrdma_destroy_qp_cmd(struct vrdma_dev *dev, u32 qpn)
{
	struct vrdma_handle req = { .handle = cpu_to_le32(qpn) };
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_DESTROY_QP, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DESTROY_QP %u: %d\n", qpn, err);
	return vrdma_released(err);
}

static int vrdma_qp_user_resp(struct vrdma_qp *qp, struct ib_udata *udata)
{
	struct ib_ucontext *uctx = vrdma_uctx(udata);
	struct vrdma_create_qp_resp uresp = {};
	int err;

	qp->sq_mmap = vrdma_ring_mmap_entry(uctx, &qp->sq,
					    &uresp.sq_mmap_offset,
					    &uresp.sq_mmap_size);
	if (IS_ERR(qp->sq_mmap)) {
		err = PTR_ERR(qp->sq_mmap);
		qp->sq_mmap = NULL;
		return err;
	}
	if (qp->rq.depth) {
		qp->rq_mmap = vrdma_ring_mmap_entry(uctx, &qp->rq,
						    &uresp.rq_mmap_offset,
						    &uresp.rq_mmap_size);
		if (IS_ERR(qp->rq_mmap)) {
			err = PTR_ERR(qp->rq_mmap);
			qp->rq_mmap = NULL;
			return err;
		}
	}
	uresp.qpn = qp->qpn;
	uresp.sq_depth = qp->sq.depth;
	uresp.rq_depth = qp->rq.depth;
	uresp.sq_wqe_shift = qp->sq.entry_shift;
	uresp.rq_wqe_shift = qp->rq.entry_shift;
	return ib_copy_to_udata(udata, &uresp,
				min(udata->outlen, sizeof(uresp)));
}

/* @released: the device no longer accesses the rings (else quarantined). */
static void vrdma_qp_free_rings(struct vrdma_dev *dev, struct vrdma_qp *qp,
				bool released)
{
	if (qp->sq_mmap)
		rdma_user_mmap_entry_remove(qp->sq_mmap);
	if (qp->rq_mmap)
		rdma_user_mmap_entry_remove(qp->rq_mmap);
	qp->sq_mmap = NULL;
	qp->rq_mmap = NULL;
	vrdma_ring_retire(dev, &qp->sq, released);
	vrdma_ring_retire(dev, &qp->rq, released);
}

/*
 * An XRC target QP (§13.7) has no rings, CQs or PD, only its XRC domain.
 * ib_core owns it (ib_create_qp_user() creates it without udata, and
 * ibv_open_qp() shares it), so there is nothing to map for user space.
 */
static int vrdma_create_xrc_tgt(struct vrdma_dev *dev, struct vrdma_qp *qp,
				struct ib_qp_init_attr *init)
{
	struct vrdma_cmd_create_qp req = {};
	struct vrdma_resp_create_qp resp;
	int err;

	if (!init->xrcd)
		return -EINVAL;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	refcount_set(&qp->refs, 1);
	INIT_LIST_HEAD(&qp->ctr_node);
	init_completion(&qp->free);

	req.qp_type = cpu_to_le32(VRDMA_QPT_XRC_TGT);
	req.srqn = cpu_to_le32(VRDMA_NO_SRQ);
	req.xrcdn = cpu_to_le32(to_vxrcd(init->xrcd)->xrcdn);
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_QP, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err)
		return err;
	qp->qpn = le32_to_cpu(resp.qpn);
	qp->ibqp.qp_num = qp->qpn;
	err = xa_insert_irq(&dev->qps, qp->qpn, qp, GFP_KERNEL);
	if (err) {
		vrdma_destroy_qp_cmd(dev, qp->qpn);
		return err;
	}
	memset(&init->cap, 0, sizeof(init->cap));
	return 0;
}

int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		    struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ib_qp_cap *cap = &init->cap;
	struct vrdma_cmd_create_qp req = {};
	struct vrdma_resp_create_qp resp;
	u32 sq_depth, rq_depth = 0, sq_shift, rq_shift = 0, max_wr;
	size_t sq_bytes;
	__le64 *pl;
	int type, err;

	type = vrdma_qp_type(dev, init->qp_type);
	if (type < 0)
		return type;
	if (init->create_flags & ~IB_QP_CREATE_SCATTER_FCS)
		return -EOPNOTSUPP;
	if (type == VRDMA_QPT_XRC_TGT)
		return vrdma_create_xrc_tgt(dev, qp, init);
	/* An XRC initiator is a send queue only (§13.7). */
	if (type == VRDMA_QPT_XRC_INI) {
		cap->max_recv_wr = 0;
		cap->max_recv_sge = 0;
	}
	max_wr = VCFG(dev, max_qp_wr);
	if (cap->max_send_wr > max_wr || cap->max_recv_wr > max_wr ||
	    cap->max_send_sge > VCFG(dev, max_send_sge) ||
	    cap->max_recv_sge > VCFG(dev, max_recv_sge) ||
	    cap->max_inline_data > VCFG(dev, max_inline_data))
		return -EINVAL;

	qp->user = !!udata;
	qp->sq_sig_all = init->sq_sig_type == IB_SIGNAL_ALL_WR;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	refcount_set(&qp->refs, 1);
	INIT_LIST_HEAD(&qp->ctr_node);
	init_completion(&qp->free);

	sq_depth = roundup_pow_of_two(max(cap->max_send_wr, 1U));
	qp->max_send_sge = max(cap->max_send_sge, 1U);
	sq_bytes = VRDMA_SEND_HDR + max_t(size_t, qp->max_send_sge * VRDMA_SGE,
					  cap->max_inline_data);
	sq_shift = vrdma_slot_shift(sq_bytes, VRDMA_SQ_MIN_SHIFT);
	if (sq_shift > VRDMA_MAX_WQE_SHIFT || sq_depth > max_wr)
		return -EINVAL;
	/* Whatever fits the slot, within the device limits. */
	qp->max_send_sge = min_t(u32, ((1U << sq_shift) - VRDMA_SEND_HDR) /
				 VRDMA_SGE, VCFG(dev, max_send_sge));
	qp->max_inline = min_t(u32, (1U << sq_shift) - VRDMA_SEND_HDR,
			       VCFG(dev, max_inline_data));

	if (!init->srq && type != VRDMA_QPT_XRC_INI) {
		rq_depth = roundup_pow_of_two(max(cap->max_recv_wr, 1U));
		qp->max_recv_sge = max(cap->max_recv_sge, 1U);
		rq_shift = vrdma_slot_shift(VRDMA_RECV_HDR + qp->max_recv_sge *
					    VRDMA_SGE, VRDMA_RQ_MIN_SHIFT);
		if (rq_shift > VRDMA_MAX_WQE_SHIFT || rq_depth > max_wr)
			return -EINVAL;
		qp->max_recv_sge = min_t(u32, ((1U << rq_shift) -
					 VRDMA_RECV_HDR) / VRDMA_SGE,
					 VCFG(dev, max_recv_sge));
	}

	err = vrdma_ring_alloc(dev, &qp->sq, sq_depth, sq_shift);
	if (err)
		return err;
	err = vrdma_ring_alloc(dev, &qp->rq, rq_depth, rq_shift);
	if (err)
		goto err_rings;

	pl = kvmalloc_array(qp->sq.npages + qp->rq.npages, sizeof(*pl),
			    GFP_KERNEL);
	if (!pl) {
		err = -ENOMEM;
		goto err_rings;
	}
	for (err = 0; err < qp->sq.npages; err++)
		pl[err] = cpu_to_le64(qp->sq.dma[err]);
	for (err = 0; err < qp->rq.npages; err++)
		pl[qp->sq.npages + err] = cpu_to_le64(qp->rq.dma[err]);

	req.pdn = cpu_to_le32(to_vpd(ibqp->pd)->pdn);
	req.qp_type = cpu_to_le32(type);
	req.send_cqn = cpu_to_le32(to_vcq(init->send_cq)->cqn);
	req.recv_cqn = cpu_to_le32(init->recv_cq ?
				   to_vcq(init->recv_cq)->cqn : 0);
	req.srqn = cpu_to_le32(init->srq && type != VRDMA_QPT_XRC_INI ?
			       to_vsrq(init->srq)->srqn : VRDMA_NO_SRQ);
	req.sq_depth = cpu_to_le32(sq_depth);
	req.rq_depth = cpu_to_le32(rq_depth);
	req.sq_wqe_shift = sq_shift;
	req.rq_wqe_shift = rq_shift;
	req.sq_sig_all = qp->sq_sig_all;
	req.max_send_sge = cpu_to_le32(qp->max_send_sge);
	req.max_recv_sge = cpu_to_le32(qp->max_recv_sge);
	req.max_inline_data = cpu_to_le32(qp->max_inline);
	req.sq_npages = cpu_to_le32(qp->sq.npages);
	req.rq_npages = cpu_to_le32(qp->rq.npages);
	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_QP, &req, sizeof(req), pl,
			(qp->sq.npages + qp->rq.npages) * sizeof(*pl), &resp,
			sizeof(resp));
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/* After a timeout the device may yet create the QP. */
		vrdma_qp_free_rings(dev, qp, !vrdma_cmd_unsettled(err));
		return err;
	}
	qp->qpn = le32_to_cpu(resp.qpn);
	ibqp->qp_num = qp->qpn;
	if (init->qp_type == IB_QPT_GSI && qp->qpn != VRDMA_GSI_QPN)
		dev_warn(&dev->vdev->dev, "GSI QP got QPN %u\n", qp->qpn);

	err = xa_insert_irq(&dev->qps, qp->qpn, qp, GFP_KERNEL);
	if (err)
		goto err_destroy;

	cap->max_send_wr = sq_depth;
	cap->max_recv_wr = rq_depth;
	cap->max_send_sge = qp->max_send_sge;
	cap->max_recv_sge = qp->max_recv_sge;
	cap->max_inline_data = qp->max_inline;

	if (udata) {
		err = vrdma_qp_user_resp(qp, udata);
		if (err)
			goto err_erase;
	}
	return 0;

err_erase:
	xa_erase_irq(&dev->qps, qp->qpn);
err_destroy:
	vrdma_qp_free_rings(dev, qp, vrdma_destroy_qp_cmd(dev, qp->qpn));
	return err;
err_rings:
	vrdma_qp_free_rings(dev, qp, true);
	return err;
}

int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	bool released;

	released = vrdma_destroy_qp_cmd(dev, qp->qpn);
	xa_erase_irq(&dev->qps, qp->qpn);
	vrdma_qp_put(qp);
	wait_for_completion(&qp->free);
	vrdma_qp_free_rings(dev, qp, released);
	return 0;
}

#define VRDMA_QP_MASK_ALL	(IB_QP_DEST_QPN * 2 - 1)

int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		    struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_cmd_modify_qp req = {};
	struct vrdma_qp_attr *a = &req.attr;
	int err;

	if (mask & ~VRDMA_QP_MASK_ALL)
		return -EOPNOTSUPP;
	if ((mask & IB_QP_PORT) && attr->port_num != 1)
		return -EINVAL;

	req.qpn = cpu_to_le32(qp->qpn);
	req.attr_mask = cpu_to_le32(mask);
	a->qp_state = cpu_to_le32(attr->qp_state);
	a->cur_qp_state = cpu_to_le32(attr->cur_qp_state);
	a->path_mtu = cpu_to_le32(attr->path_mtu);
	a->qkey = cpu_to_le32(attr->qkey);
	a->rq_psn = cpu_to_le32(attr->rq_psn);
	a->sq_psn = cpu_to_le32(attr->sq_psn);
	a->dest_qp_num = cpu_to_le32(attr->dest_qp_num);
	/* Only these mean something for a QP; ULPs pass MR flags too. */
	a->qp_access_flags = cpu_to_le32(attr->qp_access_flags &
					 VRDMA_QP_ACCESS_ALLOWED);
	a->pkey_index = cpu_to_le16(attr->pkey_index);
	a->en_sqd_async_notify = attr->en_sqd_async_notify;
	a->max_rd_atomic = attr->max_rd_atomic;
	a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	a->min_rnr_timer = attr->min_rnr_timer;
	a->timeout = attr->timeout;
	a->retry_cnt = attr->retry_cnt;
	a->rnr_retry = attr->rnr_retry;
	a->port_num = attr->port_num;
	a->max_send_wr = cpu_to_le32(attr->cap.max_send_wr);
	a->max_recv_wr = cpu_to_le32(attr->cap.max_recv_wr);
	a->max_send_sge = cpu_to_le32(attr->cap.max_send_sge);
	a->max_recv_sge = cpu_to_le32(attr->cap.max_recv_sge);
	a->max_inline_data = cpu_to_le32(attr->cap.max_inline_data);
	if (mask & IB_QP_AV) {
		if (!(rdma_ah_get_ah_flags(&attr->ah_attr) & IB_AH_GRH))
			return -EINVAL;
		vrdma_fill_av(&a->av, &attr->ah_attr);
	}
	err = vrdma_cmd(dev, VRDMA_CMD_MODIFY_QP, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (!err && (mask & IB_QP_STATE))
		WRITE_ONCE(qp->in_error, attr->qp_state == IB_QPS_ERR);
	return err;
}

/*
 * ib_drain_sq() / ib_drain_rq(). ib_core's own drain moves the QP to ERROR,
 * posts one more WR and waits for its completion. A broken device (§14.1)
 * refuses the MODIFY_QP and completes nothing: the generic drain WARNs, or
 * waits forever, in every kernel ULP that drains before it destroys a QP
 * (nvmet-rdma, nvme-rdma, ...) and in the recovery (§2.4) that unregisters
 * the device under them. Here a broken device has nothing left to drain;
 * a working one is drained as ib_core would, with a wait that gives up if
 * the device breaks meanwhile.
 */
struct vrdma_drain {
	struct ib_cqe cqe;
	struct completion done;
};

static void vrdma_drain_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vrdma_drain *d = container_of(wc->wr_cqe, struct vrdma_drain,
					     cqe);

	complete(&d->done);
}

static void vrdma_drain(struct ib_qp *ibqp, bool sq)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };
	struct ib_cq *cq = sq ? ibqp->send_cq : ibqp->recv_cq;
	struct vrdma_drain *d;
	int err;

	if (READ_ONCE(dev->broken))
		return;
	err = ib_modify_qp(ibqp, &attr, IB_QP_STATE);
	if (err)
		goto fail;
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d) {
		err = -ENOMEM;
		goto fail;
	}
	d->cqe.done = vrdma_drain_done;
	init_completion(&d->done);
	if (sq) {
		struct ib_rdma_wr wr = {
			.wr = { .wr_cqe = &d->cqe, .opcode = IB_WR_RDMA_WRITE },
		};

		err = ib_post_send(ibqp, &wr.wr, NULL);
	} else {
		struct ib_recv_wr wr = { .wr_cqe = &d->cqe };

		err = ib_post_recv(ibqp, &wr, NULL);
	}
	if (err) {
		kfree(d);
		goto fail;
	}
	while (!wait_for_completion_timeout(&d->done, HZ / 10)) {
		if (cq->poll_ctx == IB_POLL_DIRECT)
			ib_process_cq_direct(cq, -1);
		/*
		 * The device may still write the drain WR's completion, which
		 * points at d: leave d to it (it is freed by nobody; a few
		 * bytes per QP that was draining when the device broke).
		 */
		if (READ_ONCE(dev->broken))
			return;
	}
	kfree(d);
	return;
fail:
	if (!READ_ONCE(dev->broken))
		dev_warn(&dev->vdev->dev, "QP %u: %s drain failed: %d\n",
			 to_vqp(ibqp)->qpn, sq ? "SQ" : "RQ", err);
}

void vrdma_drain_sq(struct ib_qp *ibqp)
{
	vrdma_drain(ibqp, true);
}

void vrdma_drain_rq(struct ib_qp *ibqp)
{
	vrdma_drain(ibqp, false);
}

int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		   struct ib_qp_init_attr *init)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_handle req = { .handle = cpu_to_le32(qp->qpn) };
	struct vrdma_qp_attr a;
	union ib_gid dgid;
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_QUERY_QP, &req, sizeof(req), NULL, 0,
			&a, sizeof(a));
	if (err)
		return err;

	memset(attr, 0, sizeof(*attr));
	attr->qp_state = le32_to_cpu(a.qp_state);
	attr->cur_qp_state = le32_to_cpu(a.cur_qp_state);
	attr->path_mtu = le32_to_cpu(a.path_mtu);
	attr->path_mig_state = IB_MIG_MIGRATED;
	attr->qkey = le32_to_cpu(a.qkey);
	attr->rq_psn = le32_to_cpu(a.rq_psn);
	attr->sq_psn = le32_to_cpu(a.sq_psn);
	attr->dest_qp_num = le32_to_cpu(a.dest_qp_num);
	attr->qp_access_flags = le32_to_cpu(a.qp_access_flags);
	attr->pkey_index = le16_to_cpu(a.pkey_index);
	attr->en_sqd_async_notify = a.en_sqd_async_notify;
	attr->sq_draining = a.sq_draining;
	attr->max_rd_atomic = a.max_rd_atomic;
	attr->max_dest_rd_atomic = a.max_dest_rd_atomic;
	attr->min_rnr_timer = a.min_rnr_timer;
	attr->timeout = a.timeout;
	attr->retry_cnt = a.retry_cnt;
	attr->rnr_retry = a.rnr_retry;
	attr->port_num = 1;
	attr->cap.max_send_wr = qp->sq.depth;
	attr->cap.max_recv_wr = qp->rq.depth;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;

	if (ibqp->qp_type == IB_QPT_RC || ibqp->qp_type == IB_QPT_UC) {
		attr->ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
		memcpy(dgid.raw, a.av.dgid, sizeof(dgid.raw));
		rdma_ah_set_grh(&attr->ah_attr, &dgid,
				le32_to_cpu(a.av.flow_label),
				a.av.sgid_index, a.av.hop_limit,
				a.av.traffic_class);
		rdma_ah_set_sl(&attr->ah_attr, a.av.sl);
		rdma_ah_set_port_num(&attr->ah_attr, 1);
		memcpy(attr->ah_attr.roce.dmac, a.av.dmac, ETH_ALEN);
	}

	memset(init, 0, sizeof(*init));
	init->qp_type = ibqp->qp_type;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = attr->cap;
	init->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR :
					     IB_SIGNAL_REQ_WR;
	return 0;
}

/* Copy inline data from kernel virtual addresses (IB_SEND_INLINE). */
static int vrdma_copy_inline(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			     u8 *dst, struct vrdma_send_wqe *wqe)
{
	u32 total = 0;
	int i;

	for (i = 0; i < wr->num_sge; i++) {
		u32 len = wr->sg_list[i].length;

		if (len > qp->max_inline - total)
			return -EINVAL;
		memcpy(dst + total, (void *)(uintptr_t)wr->sg_list[i].addr,
		       len);
		total += len;
	}
	wqe->inline_len = cpu_to_le32(total);
	wqe->flags |= VRDMA_SEND_INLINE;
	return 0;
}

static int vrdma_build_send(struct vrdma_qp *qp, const struct ib_send_wr *wr,
			    void *slot)
{
	struct vrdma_send_wqe *wqe = slot;
	struct vrdma_sge *sge = slot + VRDMA_SEND_HDR;
	bool ud = qp->ibqp.qp_type == IB_QPT_UD ||
		  qp->ibqp.qp_type == IB_QPT_GSI;
	struct vrdma_mr *mr;
	int i;

	memset(wqe, 0, VRDMA_SEND_HDR);
	wqe->wr_id = cpu_to_le64(wr->wr_id);

	switch (wr->opcode) {
	case IB_WR_SEND:
		wqe->opcode = VRDMA_WR_SEND;
		break;
	case IB_WR_SEND_WITH_IMM:
		wqe->opcode = VRDMA_WR_SEND_WITH_IMM;
		wqe->ex = (__force __le32)wr->ex.imm_data;
		break;
	case IB_WR_SEND_WITH_INV:
		wqe->opcode = VRDMA_WR_SEND_WITH_INV;
		wqe->ex = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	case IB_WR_RDMA_WRITE:
		wqe->opcode = VRDMA_WR_RDMA_WRITE;
		break;
	case IB_WR_RDMA_WRITE_WITH_IMM:
		wqe->opcode = VRDMA_WR_RDMA_WRITE_WITH_IMM;
		wqe->ex = (__force __le32)wr->ex.imm_data;
		break;
	case IB_WR_RDMA_READ:
		wqe->opcode = VRDMA_WR_RDMA_READ;
		break;
	case IB_WR_ATOMIC_CMP_AND_SWP:
		wqe->opcode = VRDMA_WR_ATOMIC_CMP_AND_SWP;
		break;
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		wqe->opcode = VRDMA_WR_ATOMIC_FETCH_AND_ADD;
		break;
	case IB_WR_LOCAL_INV:
		wqe->opcode = VRDMA_WR_LOCAL_INV;
		wqe->ex = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	case IB_WR_REG_MR:
		wqe->opcode = VRDMA_WR_REG_MR;
		break;
	default:
		/* IB_WR_ATOMIC_WRITE and IB_WR_FLUSH are for user space only. */
		return -EINVAL;
	}
	if (ud && wqe->opcode != VRDMA_WR_SEND &&
	    wqe->opcode != VRDMA_WR_SEND_WITH_IMM)
		return -EINVAL;

	if ((wr->send_flags & IB_SEND_SIGNALED) || qp->sq_sig_all)
		wqe->flags |= VRDMA_SEND_SIGNALED;
	if (wr->send_flags & IB_SEND_SOLICITED)
		wqe->flags |= VRDMA_SEND_SOLICITED;
	if (wr->send_flags & IB_SEND_FENCE)
		wqe->flags |= VRDMA_SEND_FENCE;

	switch (wqe->opcode) {
	case VRDMA_WR_RDMA_WRITE:
	case VRDMA_WR_RDMA_WRITE_WITH_IMM:
	case VRDMA_WR_RDMA_READ:
		wqe->wr.rdma.remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		wqe->wr.rdma.rkey = cpu_to_le32(rdma_wr(wr)->rkey);
		break;
	case VRDMA_WR_ATOMIC_CMP_AND_SWP:
	case VRDMA_WR_ATOMIC_FETCH_AND_ADD:
		wqe->wr.atomic.remote_addr =
			cpu_to_le64(atomic_wr(wr)->remote_addr);
		wqe->wr.atomic.rkey = cpu_to_le32(atomic_wr(wr)->rkey);
		wqe->wr.atomic.compare_add =
			cpu_to_le64(atomic_wr(wr)->compare_add);
		wqe->wr.atomic.swap = cpu_to_le64(atomic_wr(wr)->swap);
		break;
	case VRDMA_WR_REG_MR:
		mr = to_vmr(reg_wr(wr)->mr);
		if (!mr->pl)
			return -EINVAL;
		wqe->wr.reg.iova = cpu_to_le64(mr->ibmr.iova);
		wqe->wr.reg.length = cpu_to_le64(mr->ibmr.length);
		wqe->wr.reg.key = cpu_to_le32(reg_wr(wr)->key);
		wqe->wr.reg.access = cpu_to_le32(vrdma_access(reg_wr(wr)->access));
		wqe->wr.reg.page_list_len = cpu_to_le32(mr->npages);
		wqe->wr.reg.page_shift = cpu_to_le32(ilog2(mr->ibmr.page_size));
		wqe->wr.reg.page_list_addr = cpu_to_le64(mr->pl_dma);
		return 0;
	case VRDMA_WR_LOCAL_INV:
		return 0;
	default:
		break;
	}
	if (ud) {
		wqe->wr.ud.ah_index = cpu_to_le32(to_vah(ud_wr(wr)->ah)->ah_index);
		wqe->wr.ud.remote_qpn = cpu_to_le32(ud_wr(wr)->remote_qpn);
		wqe->wr.ud.remote_qkey = cpu_to_le32(ud_wr(wr)->remote_qkey);
	}

	if ((wr->send_flags & IB_SEND_INLINE) && wr->num_sge &&
	    wqe->opcode != VRDMA_WR_RDMA_READ)
		return vrdma_copy_inline(qp, wr, slot + VRDMA_SEND_HDR, wqe);

	if (wr->num_sge > qp->max_send_sge)
		return -EINVAL;
	wqe->num_sge = wr->num_sge;
	for (i = 0; i < wr->num_sge; i++) {
		sge[i].addr = cpu_to_le64(wr->sg_list[i].addr);
		sge[i].length = cpu_to_le32(wr->sg_list[i].length);
		sge[i].lkey = cpu_to_le32(wr->sg_list[i].lkey);
	}
	return 0;
}

int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		    const struct ib_send_wr **bad_wr)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_ring *r = &qp->sq;
	unsigned long flags;
	u32 prod, cons;
	int err = 0, n = 0;

	/* User space wrote the WQEs; this is its SQ doorbell (§8). */
	if (qp->user) {
		if (wr) {
			*bad_wr = wr;
			return -EINVAL;
		}
		return vrdma_doorbell(dev, VRDMA_DB_SQ, qp->qpn);
	}

	spin_lock_irqsave(&qp->sq_lock, flags);
	prod = le32_to_cpu(r->ctrl->producer);
	for (; wr; wr = wr->next) {
		cons = le32_to_cpu(READ_ONCE(r->ctrl->consumer));
		if (prod - cons >= r->depth) {
			err = -ENOMEM;
			break;
		}
		err = vrdma_build_send(qp, wr, vrdma_ring_entry(r, prod));
		if (err)
			break;
		prod++;
		n++;
	}
	if (n) {
		/* Entries before the producer (§4). */
		virt_wmb();
		WRITE_ONCE(r->ctrl->producer, cpu_to_le32(prod));
	}
	spin_unlock_irqrestore(&qp->sq_lock, flags);

	if (err)
		*bad_wr = wr;
	if (n) {
		int dberr = vrdma_doorbell(dev, VRDMA_DB_SQ, qp->qpn);

		if (dberr && !err) {
			/* The WQEs are in the ring; a later doorbell finds them. */
			dev_warn_ratelimited(&dev->vdev->dev,
					     "QP %u: SQ doorbell failed: %d\n",
					     qp->qpn, dberr);
		}
	}
	return err;
}

static int vrdma_write_recv_wqe(void *slot, const struct ib_recv_wr *wr,
				u32 max_sge)
{
	struct vrdma_recv_wqe *wqe = slot;
	struct vrdma_sge *sge = slot + VRDMA_RECV_HDR;
	int i;

	if (wr->num_sge > max_sge)
		return -EINVAL;
	wqe->wr_id = cpu_to_le64(wr->wr_id);
	wqe->num_sge = cpu_to_le32(wr->num_sge);
	wqe->reserved = 0;
	for (i = 0; i < wr->num_sge; i++) {
		sge[i].addr = cpu_to_le64(wr->sg_list[i].addr);
		sge[i].length = cpu_to_le32(wr->sg_list[i].length);
		sge[i].lkey = cpu_to_le32(wr->sg_list[i].lkey);
	}
	return 0;
}

/*
 * Write the chain @*wr into the receive ring @r (a QP's RQ or an SRQ) and
 * publish what fit with one producer store (§4). The caller holds the
 * ring's lock. Returns 0, or the error of the WR left in @*wr, the first one
 * not posted; *@posted counts the WQEs published.
 */
int vrdma_post_recv_ring(struct vrdma_ring *r, const struct ib_recv_wr **wr,
			 u32 max_sge, int *posted)
{
	u32 prod = le32_to_cpu(r->ctrl->producer), cons;
	int err = 0, n = 0;

	for (; *wr; *wr = (*wr)->next) {
		cons = le32_to_cpu(READ_ONCE(r->ctrl->consumer));
		if (prod - cons >= r->depth) {
			err = -ENOMEM;
			break;
		}
		err = vrdma_write_recv_wqe(vrdma_ring_entry(r, prod), *wr,
					   max_sge);
		if (err)
			break;
		prod++;
		n++;
	}
	if (n) {
		/* Entries before the producer (§4). */
		virt_wmb();
		WRITE_ONCE(r->ctrl->producer, cpu_to_le32(prod));
	}
	*posted = n;
	return err;
}

int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		    const struct ib_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_ring *r = &qp->rq;
	unsigned long flags;
	int err, n;

	if (qp->user || !r->depth) {
		*bad_wr = wr;
		return -EINVAL;
	}

	spin_lock_irqsave(&qp->rq_lock, flags);
	err = vrdma_post_recv_ring(r, &wr, qp->max_recv_sge, &n);
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	if (err)
		*bad_wr = wr;
	/*
	 * The device reads the RQ only when a message arrives; in ERROR
	 * nothing arrives, so tell it to flush these WQEs (ib_drain_rq()).
	 */
	if (n && READ_ONCE(qp->in_error))
		vrdma_doorbell(to_vdev(ibqp->device), VRDMA_DB_RQ, qp->qpn);
	return err;
}

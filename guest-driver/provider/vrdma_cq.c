// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma completion queues (device-spec §4, §5.3, §7).
 *
 * The CQ ring is mmapped: polling reads CQEs the device wrote and
 * release-stores our consumer index; arming stores cq_arm in the control
 * page. Neither enters the kernel. The device posts the CQ_COMP event,
 * which vrdma.ko forwards to the completion channel.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vrdma.h"

enum {
	VRDMA_CQ_SUP_WC_FLAGS = IBV_WC_STANDARD_FLAGS,
	VRDMA_CQ_SUP_COMP_MASK = IBV_CQ_INIT_ATTR_MASK_FLAGS |
				 IBV_CQ_INIT_ATTR_MASK_PD,
	VRDMA_CQ_SUP_CREATE_FLAGS = IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
};

static int vrdma_cq_map(struct ibv_context *ctx, struct vrdma_cq *cq,
			const struct vrdma_create_cq_resp *resp)
{
	int ret;

	ret = vrdma_map_ring(ctx, &cq->ring, resp->mmap_offset,
			     resp->mmap_size, resp->depth, VRDMA_CQE_SHIFT,
			     VRDMA_CQE_SHIFT);
	if (ret)
		return ret;
	vrdma_cq_sync(&cq->ring);
	cq->cqn = resp->cqn;
	return 0;
}

struct ibv_cq *vrdma_create_cq(struct ibv_context *ctx, int cqe,
			       struct ibv_comp_channel *channel,
			       int comp_vector)
{
	struct uvrdma_create_cq_resp resp = {};
	struct ibv_create_cq cmd;
	struct vrdma_cq *cq;
	int ret;

	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_create_cq(ctx, cqe, channel, comp_vector, &cq->vcq.cq,
				&cmd, sizeof(cmd), &resp.ibv_resp,
				sizeof(resp));
	if (ret)
		goto err_free;

	ret = vrdma_cq_map(ctx, cq, &resp.drv_payload);
	if (ret)
		goto err_destroy;

	vrdma_lock_init(&cq->lock, true);
	return &cq->vcq.cq;

err_destroy:
	ibv_cmd_destroy_cq(&cq->vcq.cq);
err_free:
	free(cq);
	errno = ret;
	return NULL;
}

/* Extended CQ polling (ibv_start_poll & co) ------------------------------- */

static int vrdma_start_poll(struct ibv_cq_ex *ibcq,
			    struct ibv_poll_cq_attr *attr)
{
	struct vrdma_cq *cq = ex_to_vcq(ibcq);

	if (attr->comp_mask)
		return EINVAL;

	vrdma_lock(&cq->lock);
	cq->cur = vrdma_cq_peek(&cq->ring);
	if (!cq->cur) {
		vrdma_unlock(&cq->lock);
		return ENOENT;
	}
	ibcq->wr_id = le64toh(cq->cur->wr_id);
	ibcq->status = vrdma_wc_status(cq->cur->status);
	return 0;
}

static int vrdma_next_poll(struct ibv_cq_ex *ibcq)
{
	struct vrdma_cq *cq = ex_to_vcq(ibcq);

	cq->ring.head++;
	cq->cur = vrdma_cq_peek(&cq->ring);
	if (!cq->cur)
		return ENOENT;
	ibcq->wr_id = le64toh(cq->cur->wr_id);
	ibcq->status = vrdma_wc_status(cq->cur->status);
	return 0;
}

static void vrdma_end_poll(struct ibv_cq_ex *ibcq)
{
	struct vrdma_cq *cq = ex_to_vcq(ibcq);

	if (cq->cur) {
		cq->ring.head++;
		cq->cur = NULL;
	}
	vrdma_cq_publish(&cq->ring);
	vrdma_unlock(&cq->lock);
}

static enum ibv_wc_opcode vrdma_read_opcode(struct ibv_cq_ex *ibcq)
{
	return vrdma_wc_opcode(ex_to_vcq(ibcq)->cur->opcode);
}

static uint32_t vrdma_read_vendor_err(struct ibv_cq_ex *ibcq)
{
	return le32toh(ex_to_vcq(ibcq)->cur->vendor_err);
}

static uint32_t vrdma_read_byte_len(struct ibv_cq_ex *ibcq)
{
	return le32toh(ex_to_vcq(ibcq)->cur->byte_len);
}

static __be32 vrdma_read_imm_data(struct ibv_cq_ex *ibcq)
{
	uint32_t ex = vrdma_cqe_ex(ex_to_vcq(ibcq)->cur);
	__be32 out;

	memcpy(&out, &ex, sizeof(out));
	return out;
}

static uint32_t vrdma_read_qp_num(struct ibv_cq_ex *ibcq)
{
	return le32toh(ex_to_vcq(ibcq)->cur->qpn);
}

static uint32_t vrdma_read_src_qp(struct ibv_cq_ex *ibcq)
{
	return le32toh(ex_to_vcq(ibcq)->cur->src_qp);
}

static unsigned int vrdma_read_wc_flags(struct ibv_cq_ex *ibcq)
{
	return vrdma_wc_flags(ex_to_vcq(ibcq)->cur->flags);
}

static uint32_t vrdma_read_slid(struct ibv_cq_ex *ibcq)
{
	return 0;
}

static uint8_t vrdma_read_sl(struct ibv_cq_ex *ibcq)
{
	return vrdma_cqe_sl(ex_to_vcq(ibcq)->cur);
}

static uint8_t vrdma_read_dlid_path_bits(struct ibv_cq_ex *ibcq)
{
	return 0;
}

struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *ctx,
				     struct ibv_cq_init_attr_ex *attr)
{
	struct uvrdma_create_cq_ex_resp resp = {};
	struct ibv_create_cq_ex cmd;
	struct vrdma_cq *cq;
	struct ibv_cq_ex *ex;
	bool need_lock = true;
	int ret;

	if ((attr->wc_flags & ~(uint64_t)VRDMA_CQ_SUP_WC_FLAGS) ||
	    (attr->comp_mask & ~(uint32_t)VRDMA_CQ_SUP_COMP_MASK) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (attr->flags & ~(uint32_t)VRDMA_CQ_SUP_CREATE_FLAGS))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/*
	 * The CQ of a parent domain (ibv_create_cq_ex(3)) must name one; with
	 * a thread domain, or when the application promises a single thread,
	 * the provider takes no lock.
	 */
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		if (!attr->parent_domain ||
		    !to_vpd(attr->parent_domain)->protection_domain) {
			errno = EINVAL;
			return NULL;
		}
		if (vrdma_pd_single_threaded(attr->parent_domain))
			need_lock = false;
	}
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	    (attr->flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED))
		need_lock = false;

	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_create_cq_ex(ctx, attr, &cq->vcq, &cmd, sizeof(cmd),
				   &resp.ibv_resp, sizeof(resp), 0);
	if (ret)
		goto err_free;

	ret = vrdma_cq_map(ctx, cq, &resp.drv_payload);
	if (ret)
		goto err_destroy;

	vrdma_lock_init(&cq->lock, need_lock);

	ex = &cq->vcq.cq_ex;
	ex->start_poll = vrdma_start_poll;
	ex->next_poll = vrdma_next_poll;
	ex->end_poll = vrdma_end_poll;
	ex->read_opcode = vrdma_read_opcode;
	ex->read_vendor_err = vrdma_read_vendor_err;
	ex->read_wc_flags = vrdma_read_wc_flags;
	if (attr->wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		ex->read_byte_len = vrdma_read_byte_len;
	if (attr->wc_flags & IBV_WC_EX_WITH_IMM)
		ex->read_imm_data = vrdma_read_imm_data;
	if (attr->wc_flags & IBV_WC_EX_WITH_QP_NUM)
		ex->read_qp_num = vrdma_read_qp_num;
	if (attr->wc_flags & IBV_WC_EX_WITH_SRC_QP)
		ex->read_src_qp = vrdma_read_src_qp;
	if (attr->wc_flags & IBV_WC_EX_WITH_SLID)
		ex->read_slid = vrdma_read_slid;
	if (attr->wc_flags & IBV_WC_EX_WITH_SL)
		ex->read_sl = vrdma_read_sl;
	if (attr->wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		ex->read_dlid_path_bits = vrdma_read_dlid_path_bits;
	return ex;

err_destroy:
	ibv_cmd_destroy_cq(&cq->vcq.cq);
err_free:
	free(cq);
	errno = ret;
	return NULL;
}

int vrdma_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	const struct vrdma_cqe *cqe;
	int n;

	vrdma_lock(&cq->lock);
	for (n = 0; n < ne; n++) {
		cqe = vrdma_cq_peek(&cq->ring);
		if (!cqe)
			break;
		vrdma_cqe_to_wc(cqe, &wc[n]);
		cq->ring.head++;
	}
	if (n)
		vrdma_cq_publish(&cq->ring);
	else if (vrdma_ring_error(&cq->ring) != VRDMA_RING_ERR_NONE)
		/* §4: the device stopped this CQ (overflow); it is drained */
		n = -1;
	vrdma_unlock(&cq->lock);
	return n;
}

int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	vrdma_cq_arm(&to_vcq(ibcq)->ring, solicited_only);
	return 0;
}

/*
 * Drop the unread CQEs of QP qpn (the QP went to RESET, §13.3), as libmlx5
 * does. The entries in [head, producer) that belong to other QPs are moved
 * towards producer, in order, and our consumer skips the freed slots. The
 * device writes no CQE for a QP in RESET, and those it writes for other QPs
 * meanwhile land at or after the producer we read, which we do not touch.
 */
void vrdma_cq_clean(struct vrdma_cq *cq, uint32_t qpn)
{
	struct vrdma_ring *r = &cq->ring;
	uint32_t prod, keep, i;

	vrdma_lock(&cq->lock);
	prod = vrdma_load_acquire(&r->ctrl->producer);
	if (prod - r->head > r->depth)
		goto out;	/* nonsense from the device: leave it to poll */
	keep = prod;
	for (i = prod; i != r->head;) {
		struct vrdma_cqe *cqe = vrdma_ring_slot(r, --i);

		if (le32toh(cqe->qpn) == qpn)
			continue;
		if (--keep != i)
			memcpy(vrdma_ring_slot(r, keep), cqe, sizeof(*cqe));
	}
	if (keep != r->head) {
		r->head = keep;
		vrdma_cq_publish(r);
	}
out:
	vrdma_unlock(&cq->lock);
}

int vrdma_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct uvrdma_resize_cq_resp resp = {};
	struct vrdma_create_cq_resp map = {};
	struct ibv_resize_cq cmd;
	struct vrdma_ring old;
	int ret;

	vrdma_lock(&cq->lock);
	/* the kernel copies unpolled CQEs, so publish what we consumed */
	vrdma_cq_publish(&cq->ring);
	ret = ibv_cmd_resize_cq(ibcq, cqe, &cmd, sizeof(cmd), &resp.ibv_resp,
				sizeof(resp));
	if (ret)
		goto out;

	/* same depth: the kernel kept the ring and sent no new mapping */
	if (!resp.drv_payload.mmap_size)
		goto out;

	old = cq->ring;
	map.cqn = cq->cqn;
	map.depth = resp.drv_payload.depth;
	map.mmap_offset = resp.drv_payload.mmap_offset;
	map.mmap_size = resp.drv_payload.mmap_size;
	ret = vrdma_cq_map(ibcq->context, cq, &map);
	if (ret) {
		/* the old mapping stays valid until we drop it */
		cq->ring = old;
		goto out;
	}
	vrdma_unmap_ring(&old);
out:
	vrdma_unlock(&cq->lock);
	return ret;
}

/* §5.5 CQ moderation: count and period go to the device through the kernel. */
int vrdma_modify_cq(struct ibv_cq *ibcq, struct ibv_modify_cq_attr *attr)
{
	struct ibv_modify_cq cmd = {};

	return ibv_cmd_modify_cq(ibcq, attr, &cmd, sizeof(cmd));
}

int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret;

	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;
	vrdma_unmap_ring(&cq->ring);
	vrdma_lock_destroy(&cq->lock);
	free(cq);
	return 0;
}

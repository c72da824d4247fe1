// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma shared receive queues (device-spec §4, §6.2).
 *
 * The SRQ ring holds receive WQEs like an RQ; post_srq_recv writes them and
 * release-stores the producer, the device takes them when a QP needs one.
 */
#include <errno.h>
#include <stdlib.h>

#include "vrdma.h"

/* Map the ring the kernel created; @max_sge is the kernel's answer. */
static int vrdma_srq_map(struct ibv_context *ctx, struct vrdma_srq *srq,
			 const struct vrdma_create_srq_resp *resp,
			 uint32_t max_sge)
{
	uint32_t slot_sges;
	int ret;

	ret = vrdma_map_ring(ctx, &srq->rq.ring, resp->mmap_offset,
			     resp->mmap_size, resp->depth, resp->wqe_shift,
			     VRDMA_RQ_MIN_SHIFT);
	if (ret)
		return ret;
	vrdma_wq_sync(&srq->rq.ring);
	srq->srqn = resp->srqn;
	slot_sges = ((1U << resp->wqe_shift) - VRDMA_RECV_WQE_HDR) /
		    sizeof(struct vrdma_sge);
	srq->rq.max_sge = max_sge < slot_sges ? max_sge : slot_sges;
	vrdma_lock_init(&srq->rq.lock, true);
	return 0;
}

struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd,
				 struct ibv_srq_init_attr *attr)
{
	struct uvrdma_create_srq_resp resp = {};
	struct ibv_create_srq cmd;
	struct vrdma_srq *srq;
	int ret;

	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_create_srq(pd, &srq->vsrq.srq, attr, &cmd, sizeof(cmd),
				 &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;

	/* attr->attr was updated from the kernel's answer */
	ret = vrdma_srq_map(pd->context, srq, &resp.drv_payload,
			    attr->attr.max_sge);
	if (ret)
		goto err_destroy;
	return &srq->vsrq.srq;

err_destroy:
	ibv_cmd_destroy_srq(&srq->vsrq.srq);
err_free:
	free(srq);
	errno = ret;
	return NULL;
}

/*
 * ibv_create_srq_ex: basic SRQs as ibv_create_srq, and XRC SRQs (§13.7)
 * with their XRC domain and CQ. Posting works the same for both.
 */
struct ibv_srq *vrdma_create_srq_ex(struct ibv_context *ctx,
				    struct ibv_srq_init_attr_ex *attr)
{
	const uint32_t sup = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	struct uvrdma_create_xsrq_resp resp = {};
	struct uvrdma_create_xsrq cmd = {};
	enum ibv_srq_type type = IBV_SRQT_BASIC;
	struct vrdma_srq *srq;
	int ret;

	if (attr->comp_mask & ~sup) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)
		type = attr->srq_type;
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		errno = EINVAL;
		return NULL;
	}
	if (type == IBV_SRQT_BASIC) {
		struct ibv_srq_init_attr basic = {
			.srq_context = attr->srq_context,
			.attr = attr->attr,
		};
		struct ibv_srq *s = vrdma_create_srq(attr->pd, &basic);

		if (s)
			attr->attr = basic.attr;
		return s;
	}
	if (type != IBV_SRQT_XRC ||
	    !(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd ||
	    !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
		errno = type == IBV_SRQT_XRC ? EINVAL : EOPNOTSUPP;
		return NULL;
	}

	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_create_srq_ex(ctx, &srq->vsrq, attr, &cmd.ibv_cmd,
				    sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;
	ret = vrdma_srq_map(ctx, srq, &resp.drv_payload, attr->attr.max_sge);
	if (ret)
		goto err_destroy;
	return &srq->vsrq.srq;

err_destroy:
	ibv_cmd_destroy_srq(&srq->vsrq.srq);
err_free:
	free(srq);
	errno = ret;
	return NULL;
}

/* ibv_get_srq_num: the XRC SRQ number peers put in the XRCETH (§13.7). */
int vrdma_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num)
{
	struct verbs_srq *vsrq = &to_vsrq(ibsrq)->vsrq;

	if (vsrq->srq_type != IBV_SRQT_XRC)
		return EINVAL;
	*srq_num = vsrq->srq_num;
	return 0;
}

/*
 * §11.7 MODIFY_SRQ. With IBV_SRQ_MAX_WR the device moves the posted WQEs to
 * a new ring that the kernel maps for us: its mapping comes back through
 * resp_addr (the uverbs command has no response). The SRQ lock is held
 * across the command so that nothing is posted to the old ring while the
 * device copies it; posting continues at the new ring's producer.
 */
int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		     int attr_mask)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_modify_srq_resp map = {};
	struct uvrdma_modify_srq cmd = {};
	struct vrdma_ring old;
	int ret;

	if (!(attr_mask & IBV_SRQ_MAX_WR))
		return ibv_cmd_modify_srq(ibsrq, attr, attr_mask, &cmd.ibv_cmd,
					  sizeof(cmd));

	cmd.drv_payload.resp_addr = (uintptr_t)&map;
	vrdma_lock(&srq->rq.lock);
	ret = ibv_cmd_modify_srq(ibsrq, attr, attr_mask, &cmd.ibv_cmd,
				 sizeof(cmd));
	if (ret)
		goto out;
	old = srq->rq.ring;
	ret = vrdma_map_ring(ibsrq->context, &srq->rq.ring, map.mmap_offset,
			     map.mmap_size, map.depth, old.shift,
			     VRDMA_RQ_MIN_SHIFT);
	if (ret) {
		/* the device already uses the new ring: nothing to post to */
		srq->rq.ring = old;
		goto out;
	}
	vrdma_wq_sync(&srq->rq.ring);
	vrdma_unmap_ring(&old);
out:
	vrdma_unlock(&srq->rq.lock);
	return ret;
}

int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

int vrdma_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	int ret;

	ret = ibv_cmd_destroy_srq(ibsrq);
	if (ret)
		return ret;
	vrdma_unmap_ring(&srq->rq.ring);
	vrdma_lock_destroy(&srq->rq.lock);
	free(srq);
	return 0;
}

int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad_wr)
{
	struct vrdma_rq *rq = &to_vsrq(ibsrq)->rq;
	uint32_t start;
	int ret = 0;

	vrdma_lock(&rq->lock);
	start = rq->ring.head;
	for (; wr; wr = wr->next) {
		ret = vrdma_post_one_recv(rq, wr);
		if (ret) {
			*bad_wr = wr;
			break;
		}
	}
	if (rq->ring.head != start)
		vrdma_wq_publish(&rq->ring);
	vrdma_unlock(&rq->lock);
	return ret;
}

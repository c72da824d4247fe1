// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma queue pairs: creation and the send/receive data path
 * (device-spec §4, §6, §8).
 *
 * post_recv writes RQ entries and release-stores the producer: the device
 * reads the RQ producer whenever it needs a receive WQE, so there is no
 * doorbell. post_send (and ibv_wr_complete) write SQ entries, publish the
 * producer and ring one SQ doorbell per call: a zero-WR IB_USER_VERBS
 * post_send command on cmd_fd, which vrdma.ko turns into a VRDMA_DB_SQ
 * record on the doorbell virtqueue.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ccan/array_size.h>
#include <util/udma_barrier.h>

#include "vrdma.h"

#define VRDMA_OP(op)	(1U << (op))

/* Which send opcodes each transport accepts (IBTA transport/opcode table) */
static const uint32_t vrdma_qpt_ops[] = {
	[IBV_QPT_RC] = VRDMA_OP(VRDMA_WR_RDMA_WRITE) |
		       VRDMA_OP(VRDMA_WR_RDMA_WRITE_WITH_IMM) |
		       VRDMA_OP(VRDMA_WR_SEND) |
		       VRDMA_OP(VRDMA_WR_SEND_WITH_IMM) |
		       VRDMA_OP(VRDMA_WR_RDMA_READ) |
		       VRDMA_OP(VRDMA_WR_ATOMIC_CMP_AND_SWP) |
		       VRDMA_OP(VRDMA_WR_ATOMIC_FETCH_AND_ADD) |
		       VRDMA_OP(VRDMA_WR_SEND_WITH_INV) |
		       VRDMA_OP(VRDMA_WR_ATOMIC_WRITE) |
		       VRDMA_OP(VRDMA_WR_FLUSH) |
		       VRDMA_OP(VRDMA_WR_LOCAL_INV) |
		       VRDMA_OP(VRDMA_WR_BIND_MW),
	[IBV_QPT_UC] = VRDMA_OP(VRDMA_WR_RDMA_WRITE) |
		       VRDMA_OP(VRDMA_WR_RDMA_WRITE_WITH_IMM) |
		       VRDMA_OP(VRDMA_WR_SEND) |
		       VRDMA_OP(VRDMA_WR_SEND_WITH_IMM) |
		       VRDMA_OP(VRDMA_WR_LOCAL_INV) |
		       VRDMA_OP(VRDMA_WR_BIND_MW),
	[IBV_QPT_UD] = VRDMA_OP(VRDMA_WR_SEND) |
		       VRDMA_OP(VRDMA_WR_SEND_WITH_IMM),
	/* §13.7: RC's operations except ATOMIC_WRITE, FLUSH and BIND_MW */
	[IBV_QPT_XRC_SEND] = VRDMA_OP(VRDMA_WR_RDMA_WRITE) |
			     VRDMA_OP(VRDMA_WR_RDMA_WRITE_WITH_IMM) |
			     VRDMA_OP(VRDMA_WR_SEND) |
			     VRDMA_OP(VRDMA_WR_SEND_WITH_IMM) |
			     VRDMA_OP(VRDMA_WR_RDMA_READ) |
			     VRDMA_OP(VRDMA_WR_ATOMIC_CMP_AND_SWP) |
			     VRDMA_OP(VRDMA_WR_ATOMIC_FETCH_AND_ADD) |
			     VRDMA_OP(VRDMA_WR_SEND_WITH_INV) |
			     VRDMA_OP(VRDMA_WR_LOCAL_INV),
};

/* Opcodes whose payload may be carried inline */
static const uint32_t vrdma_inline_ops =
	VRDMA_OP(VRDMA_WR_RDMA_WRITE) | VRDMA_OP(VRDMA_WR_RDMA_WRITE_WITH_IMM) |
	VRDMA_OP(VRDMA_WR_SEND) | VRDMA_OP(VRDMA_WR_SEND_WITH_IMM) |
	VRDMA_OP(VRDMA_WR_SEND_WITH_INV);

/* ibv_wr_* builders offered per transport (send_ops_flags) */
enum {
	VRDMA_UD_SEND_OPS = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
	VRDMA_UC_SEND_OPS = VRDMA_UD_SEND_OPS | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			    IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW,
	VRDMA_RC_SEND_OPS = VRDMA_UC_SEND_OPS | IBV_QP_EX_WITH_RDMA_READ |
			    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
			    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
			    IBV_QP_EX_WITH_SEND_WITH_INV |
			    IBV_QP_EX_WITH_ATOMIC_WRITE |
			    IBV_QP_EX_WITH_FLUSH,
	VRDMA_XRC_SEND_OPS = VRDMA_UD_SEND_OPS | IBV_QP_EX_WITH_RDMA_WRITE |
			     IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			     IBV_QP_EX_WITH_LOCAL_INV |
			     IBV_QP_EX_WITH_RDMA_READ |
			     IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
			     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
			     IBV_QP_EX_WITH_SEND_WITH_INV,
	VRDMA_QP_SUP_COMP_MASK = IBV_QP_INIT_ATTR_PD |
				 IBV_QP_INIT_ATTR_XRCD |
				 IBV_QP_INIT_ATTR_CREATE_FLAGS |
				 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
};

static int vrdma_ibv_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
		return VRDMA_WR_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return VRDMA_WR_RDMA_WRITE_WITH_IMM;
	case IBV_WR_SEND:
		return VRDMA_WR_SEND;
	case IBV_WR_SEND_WITH_IMM:
		return VRDMA_WR_SEND_WITH_IMM;
	case IBV_WR_RDMA_READ:
		return VRDMA_WR_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return VRDMA_WR_ATOMIC_CMP_AND_SWP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return VRDMA_WR_ATOMIC_FETCH_AND_ADD;
	case IBV_WR_SEND_WITH_INV:
		return VRDMA_WR_SEND_WITH_INV;
	case IBV_WR_LOCAL_INV:
		return VRDMA_WR_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return VRDMA_WR_BIND_MW;
	default:
		/* TSO, FLUSH, ATOMIC_WRITE (ibv_wr_* only), DRIVER1 */
		return -1;
	}
}

static bool vrdma_qp_op_ok(const struct vrdma_qp *qp, int op)
{
	enum ibv_qp_type t = qp->vqp.qp.qp_type;

	return op >= 0 && t < ARRAY_SIZE(vrdma_qpt_ops) &&
	       (vrdma_qpt_ops[t] & VRDMA_OP(op));
}

/*
 * IBTA 10.8.2 / ibv_post_send(3): the SQ accepts work from RTS on (SQD, SQE,
 * ERR flush it), the RQ from INIT on; earlier states fail with EINVAL.
 * libibverbs keeps qp->state from modify_qp/query_qp.
 */
static bool vrdma_sq_state_ok(const struct vrdma_qp *qp)
{
	return qp->vqp.qp.state >= IBV_QPS_RTS &&
	       qp->vqp.qp.state != IBV_QPS_UNKNOWN;
}

static bool vrdma_rq_state_ok(const struct vrdma_qp *qp)
{
	return qp->vqp.qp.state != IBV_QPS_RESET &&
	       qp->vqp.qp.state != IBV_QPS_UNKNOWN;
}

/* One SQ doorbell for everything published so far (§8). */
static int vrdma_ring_sq_doorbell(struct vrdma_qp *qp)
{
	struct ib_uverbs_post_send_resp resp;
	struct ibv_post_send cmd = {};

	cmd.hdr.command = IB_USER_VERBS_CMD_POST_SEND;
	cmd.hdr.in_words = sizeof(cmd) / 4;
	cmd.hdr.out_words = sizeof(resp) / 4;
	cmd.response = (uintptr_t)&resp;
	cmd.qp_handle = qp->vqp.qp.handle;
	cmd.wr_count = 0;
	cmd.sge_count = 0;
	cmd.wqe_size = sizeof(struct ib_uverbs_send_wr);

	if (write(qp->vqp.qp.context->cmd_fd, &cmd, sizeof(cmd)) !=
	    sizeof(cmd))
		return errno;
	return 0;
}

/* Entries were written at [published producer, head): make them visible. */
static void vrdma_sq_publish(struct vrdma_qp *qp)
{
	udma_to_device_barrier();
	vrdma_wq_publish(&qp->sq.ring);
}

static void vrdma_wqe_set_sge(struct vrdma_sge *dst, uint64_t addr,
			      uint32_t length, uint32_t lkey)
{
	dst->addr = htole64(addr);
	dst->length = htole32(length);
	dst->lkey = htole32(lkey);
}

static struct vrdma_sge *vrdma_wqe_sges(struct vrdma_send_wqe *wqe)
{
	return (struct vrdma_sge *)(wqe + 1);
}

static uint8_t vrdma_send_flags(const struct vrdma_qp *qp,
				unsigned int send_flags)
{
	uint8_t flags = 0;

	if ((send_flags & IBV_SEND_SIGNALED) || qp->sq_sig_all)
		flags |= VRDMA_SEND_SIGNALED;
	if (send_flags & IBV_SEND_SOLICITED)
		flags |= VRDMA_SEND_SOLICITED;
	if (send_flags & IBV_SEND_FENCE)
		flags |= VRDMA_SEND_FENCE;
	return flags;
}

/* Copy a gather list as inline payload behind the WQE header. */
static int vrdma_wqe_inline(struct vrdma_qp *qp, struct vrdma_send_wqe *wqe,
			    size_t num, const struct ibv_data_buf *bufs,
			    const struct ibv_sge *sges)
{
	uint8_t *dst = (uint8_t *)(wqe + 1);
	size_t total = 0, len, i;
	const void *src;

	if (!(vrdma_inline_ops & VRDMA_OP(wqe->opcode)))
		return EINVAL;

	for (i = 0; i < num; i++) {
		if (bufs) {
			src = bufs[i].addr;
			len = bufs[i].length;
		} else {
			src = (const void *)(uintptr_t)sges[i].addr;
			len = sges[i].length;
		}
		if (len > qp->sq.max_inline - total)
			return EINVAL;
		memcpy(dst + total, src, len);
		total += len;
	}
	wqe->flags |= VRDMA_SEND_INLINE;
	wqe->num_sge = 0;
	wqe->inline_len = htole32(total);
	return 0;
}

static int vrdma_wqe_sge_list(struct vrdma_qp *qp, struct vrdma_send_wqe *wqe,
			      size_t num, const struct ibv_sge *sg)
{
	struct vrdma_sge *dst = vrdma_wqe_sges(wqe);
	size_t i;

	if (num > qp->sq.max_sge)
		return EINVAL;
	for (i = 0; i < num; i++)
		vrdma_wqe_set_sge(&dst[i], sg[i].addr, sg[i].length,
				  sg[i].lkey);
	wqe->flags &= ~VRDMA_SEND_INLINE;
	wqe->num_sge = num;
	wqe->inline_len = 0;
	return 0;
}

/* Window rights of a bind (§12.8 step 1); IBV_ACCESS_* bits as VRDMA_ACCESS_*. */
static uint32_t vrdma_mw_access(unsigned int ibv_access)
{
	uint32_t a = 0;

	if (ibv_access & IBV_ACCESS_LOCAL_WRITE)
		a |= VRDMA_ACCESS_LOCAL_WRITE;
	if (ibv_access & IBV_ACCESS_REMOTE_WRITE)
		a |= VRDMA_ACCESS_REMOTE_WRITE;
	if (ibv_access & IBV_ACCESS_REMOTE_READ)
		a |= VRDMA_ACCESS_REMOTE_READ;
	if (ibv_access & IBV_ACCESS_REMOTE_ATOMIC)
		a |= VRDMA_ACCESS_REMOTE_ATOMIC;
	if (ibv_access & IBV_ACCESS_ZERO_BASED)
		a |= VRDMA_ACCESS_ZERO_BASED;
	/* anything else is refused by the device (MW_BIND_ERR) */
	if (ibv_access & ~(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			   IBV_ACCESS_ZERO_BASED))
		a |= VRDMA_ACCESS_MW_BIND;
	return a;
}

/* wr.bind_mw: the window by its current rkey, its rkey after the bind. */
static void vrdma_wqe_bind(struct vrdma_send_wqe *wqe, struct ibv_mw *mw,
			   uint32_t rkey, const struct ibv_mw_bind_info *bi)
{
	wqe->wr.bind_mw.mw_key = htole32(mw->rkey);
	wqe->wr.bind_mw.new_key = htole32(rkey);
	wqe->wr.bind_mw.mr_key = htole32(bi->mr ? bi->mr->lkey : 0);
	wqe->wr.bind_mw.addr = htole64(bi->addr);
	wqe->wr.bind_mw.length = htole64(bi->length);
	wqe->wr.bind_mw.access = htole32(vrdma_mw_access(bi->mw_access_flags));
	/*
	 * The next bind names the window by this rkey (rdma-core's consumers
	 * derive the next one with ibv_inc_rkey(mw->rkey)).
	 */
	mw->rkey = rkey;
}

/* Build one WQE from a classic ibv_send_wr. */
static int vrdma_build_send_wqe(struct vrdma_qp *qp,
				struct vrdma_send_wqe *wqe,
				const struct ibv_send_wr *wr)
{
	int op = vrdma_ibv_opcode(wr->opcode);

	if (!vrdma_qp_op_ok(qp, op) || wr->num_sge < 0)
		return EINVAL;

	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = htole64(wr->wr_id);
	wqe->opcode = op;
	wqe->flags = vrdma_send_flags(qp, wr->send_flags);

	switch (op) {
	case VRDMA_WR_SEND_WITH_IMM:
	case VRDMA_WR_RDMA_WRITE_WITH_IMM:
		/* wire order in, wire order out: copy the bytes as they are */
		memcpy(&wqe->ex, &wr->imm_data, sizeof(wqe->ex));
		break;
	case VRDMA_WR_SEND_WITH_INV:
	case VRDMA_WR_LOCAL_INV:
		wqe->ex = htole32(wr->invalidate_rkey);
		break;
	default:
		break;
	}

	/* Local operations carry no SGEs and no inline data (§6.1). */
	if (op == VRDMA_WR_LOCAL_INV)
		return 0;
	if (op == VRDMA_WR_BIND_MW) {
		if (!wr->bind_mw.mw)
			return EINVAL;
		vrdma_wqe_bind(wqe, wr->bind_mw.mw, wr->bind_mw.rkey,
			       &wr->bind_mw.bind_info);
		return 0;
	}

	switch (op) {
	case VRDMA_WR_RDMA_WRITE:
	case VRDMA_WR_RDMA_WRITE_WITH_IMM:
	case VRDMA_WR_RDMA_READ:
		wqe->wr.rdma.remote_addr = htole64(wr->wr.rdma.remote_addr);
		wqe->wr.rdma.rkey = htole32(wr->wr.rdma.rkey);
		break;
	case VRDMA_WR_ATOMIC_CMP_AND_SWP:
	case VRDMA_WR_ATOMIC_FETCH_AND_ADD:
		wqe->wr.atomic.remote_addr =
			htole64(wr->wr.atomic.remote_addr);
		wqe->wr.atomic.rkey = htole32(wr->wr.atomic.rkey);
		wqe->wr.atomic.compare_add = htole64(wr->wr.atomic.compare_add);
		wqe->wr.atomic.swap = htole64(wr->wr.atomic.swap);
		break;
	default:
		break;
	}

	/* §6.1: the XRC SRQ at the target, carried in the XRCETH */
	if (qp->vqp.qp.qp_type == IBV_QPT_XRC_SEND)
		wqe->xrc_srqn = htole32(wr->qp_type.xrc.remote_srqn);

	if (qp->vqp.qp.qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return EINVAL;
		wqe->wr.ud.ah_index = htole32(to_vah(wr->wr.ud.ah)->ah_index);
		wqe->wr.ud.remote_qpn = htole32(wr->wr.ud.remote_qpn);
		wqe->wr.ud.remote_qkey = htole32(wr->wr.ud.remote_qkey);
	}

	if (wr->send_flags & IBV_SEND_INLINE)
		return vrdma_wqe_inline(qp, wqe, wr->num_sge, NULL,
					wr->sg_list);
	return vrdma_wqe_sge_list(qp, wqe, wr->num_sge, wr->sg_list);
}

int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_ring *sq = &qp->sq.ring;
	uint32_t start;
	int ret = 0, db;

	/* An XRC_RECV QP has no send queue (§13.7). */
	if (wr && (!sq->map || !vrdma_sq_state_ok(qp))) {
		*bad_wr = wr;
		return EINVAL;
	}

	vrdma_lock(&qp->sq.lock);
	start = sq->head;
	for (; wr; wr = wr->next) {
		if (!vrdma_wq_free(sq)) {
			ret = ENOMEM;
			break;
		}
		ret = vrdma_build_send_wqe(qp, vrdma_ring_slot(sq, sq->head),
					   wr);
		if (ret)
			break;
		sq->head++;
	}
	if (ret)
		*bad_wr = wr;
	if (sq->head == start) {
		vrdma_unlock(&qp->sq.lock);
		return ret;
	}
	vrdma_sq_publish(qp);
	vrdma_unlock(&qp->sq.lock);

	db = vrdma_ring_sq_doorbell(qp);
	return ret ? ret : db;
}

/* Receive side (also used by SRQs) ---------------------------------------- */

int vrdma_post_one_recv(struct vrdma_rq *rq, const struct ibv_recv_wr *wr)
{
	struct vrdma_recv_wqe *wqe;
	struct vrdma_sge *sge;
	int i;

	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > rq->max_sge)
		return EINVAL;
	if (!vrdma_wq_free(&rq->ring))
		return ENOMEM;

	wqe = vrdma_ring_slot(&rq->ring, rq->ring.head);
	wqe->wr_id = htole64(wr->wr_id);
	wqe->num_sge = htole32(wr->num_sge);
	wqe->reserved = 0;
	sge = (struct vrdma_sge *)(wqe + 1);
	for (i = 0; i < wr->num_sge; i++)
		vrdma_wqe_set_sge(&sge[i], wr->sg_list[i].addr,
				  wr->sg_list[i].length, wr->sg_list[i].lkey);
	rq->ring.head++;
	return 0;
}

int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_rq *rq = &qp->rq;
	uint32_t start;
	int ret = 0;

	if (!wr)
		return 0;
	if (!rq->ring.map || !vrdma_rq_state_ok(qp)) {
		/* the QP receives through its SRQ, or is in RESET */
		*bad_wr = wr;
		return EINVAL;
	}

	vrdma_lock(&rq->lock);
	start = rq->ring.head;
	for (; wr; wr = wr->next) {
		ret = vrdma_post_one_recv(rq, wr);
		if (ret) {
			*bad_wr = wr;
			break;
		}
	}
	/* no doorbell: the device reads the RQ producer when it needs one */
	if (rq->ring.head != start)
		vrdma_wq_publish(&rq->ring);
	vrdma_unlock(&rq->lock);
	return ret;
}

/* ibv_wr_* (extended QP) --------------------------------------------------- */

static struct vrdma_send_wqe *vrdma_wr_new(struct ibv_qp_ex *ibqp, int op)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	struct vrdma_ring *sq = &qp->sq.ring;
	struct vrdma_send_wqe *wqe;

	qp->wr_cur = NULL;
	if (qp->wr_err)
		return NULL;
	if (!vrdma_qp_op_ok(qp, op)) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	if (!vrdma_wq_free(sq)) {
		qp->wr_err = ENOMEM;
		return NULL;
	}

	wqe = vrdma_ring_slot(sq, sq->head);
	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = htole64(ibqp->wr_id);
	wqe->opcode = op;
	wqe->flags = vrdma_send_flags(qp, ibqp->wr_flags);
	sq->head++;
	qp->wr_cur = wqe;
	return wqe;
}

static void vrdma_wr_rdma(struct ibv_qp_ex *ibqp, int op, uint32_t rkey,
			  uint64_t remote_addr)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp, op);

	if (!wqe)
		return;
	wqe->wr.rdma.remote_addr = htole64(remote_addr);
	wqe->wr.rdma.rkey = htole32(rkey);
}

static void vrdma_wr_rdma_write(struct ibv_qp_ex *ibqp, uint32_t rkey,
				uint64_t remote_addr)
{
	vrdma_wr_rdma(ibqp, VRDMA_WR_RDMA_WRITE, rkey, remote_addr);
}

static void vrdma_wr_rdma_write_imm(struct ibv_qp_ex *ibqp, uint32_t rkey,
				    uint64_t remote_addr, __be32 imm_data)
{
	vrdma_wr_rdma(ibqp, VRDMA_WR_RDMA_WRITE_WITH_IMM, rkey, remote_addr);
	if (ex_to_vqp(ibqp)->wr_cur)
		memcpy(&ex_to_vqp(ibqp)->wr_cur->ex, &imm_data,
		       sizeof(imm_data));
}

static void vrdma_wr_rdma_read(struct ibv_qp_ex *ibqp, uint32_t rkey,
			       uint64_t remote_addr)
{
	vrdma_wr_rdma(ibqp, VRDMA_WR_RDMA_READ, rkey, remote_addr);
}

static void vrdma_wr_atomic(struct ibv_qp_ex *ibqp, int op, uint32_t rkey,
			    uint64_t remote_addr, uint64_t compare_add,
			    uint64_t swap)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp, op);

	if (!wqe)
		return;
	wqe->wr.atomic.remote_addr = htole64(remote_addr);
	wqe->wr.atomic.rkey = htole32(rkey);
	wqe->wr.atomic.compare_add = htole64(compare_add);
	wqe->wr.atomic.swap = htole64(swap);
}

static void vrdma_wr_atomic_cmp_swp(struct ibv_qp_ex *ibqp, uint32_t rkey,
				    uint64_t remote_addr, uint64_t compare,
				    uint64_t swap)
{
	vrdma_wr_atomic(ibqp, VRDMA_WR_ATOMIC_CMP_AND_SWP, rkey, remote_addr,
			compare, swap);
}

static void vrdma_wr_atomic_fetch_add(struct ibv_qp_ex *ibqp, uint32_t rkey,
				      uint64_t remote_addr, uint64_t add)
{
	vrdma_wr_atomic(ibqp, VRDMA_WR_ATOMIC_FETCH_AND_ADD, rkey, remote_addr,
			add, 0);
}

/* IBTA 1.5 ATOMIC WRITE: the 8 bytes travel in the WQE, no SGE */
static void vrdma_wr_atomic_write(struct ibv_qp_ex *ibqp, uint32_t rkey,
				  uint64_t remote_addr, const void *atomic_wr)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp, VRDMA_WR_ATOMIC_WRITE);

	if (!wqe)
		return;
	wqe->wr.atomic_write.remote_addr = htole64(remote_addr);
	wqe->wr.atomic_write.rkey = htole32(rkey);
	memcpy(wqe->wr.atomic_write.data, atomic_wr,
	       sizeof(wqe->wr.atomic_write.data));
}

/* IBTA 1.5 FLUSH: IBV_FLUSH_* equal VRDMA_FLUSH_* (§6.1) */
static void vrdma_wr_flush(struct ibv_qp_ex *ibqp, uint32_t rkey,
			   uint64_t remote_addr, size_t len, uint8_t type,
			   uint8_t level)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp, VRDMA_WR_FLUSH);

	if (!wqe)
		return;
	wqe->wr.flush.remote_addr = htole64(remote_addr);
	wqe->wr.flush.rkey = htole32(rkey);
	wqe->wr.flush.placement = type;
	wqe->wr.flush.selectivity = level;
	wqe->wr.flush.length = htole64(len);
}

static void vrdma_wr_send(struct ibv_qp_ex *ibqp)
{
	vrdma_wr_new(ibqp, VRDMA_WR_SEND);
}

static void vrdma_wr_send_imm(struct ibv_qp_ex *ibqp, __be32 imm_data)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp,
						  VRDMA_WR_SEND_WITH_IMM);

	if (wqe)
		memcpy(&wqe->ex, &imm_data, sizeof(imm_data));
}

static void vrdma_wr_send_inv(struct ibv_qp_ex *ibqp, uint32_t invalidate_rkey)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp,
						  VRDMA_WR_SEND_WITH_INV);

	if (wqe)
		wqe->ex = htole32(invalidate_rkey);
}

static void vrdma_wr_local_inv(struct ibv_qp_ex *ibqp, uint32_t invalidate_rkey)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp, VRDMA_WR_LOCAL_INV);

	if (wqe)
		wqe->ex = htole32(invalidate_rkey);
}

static void vrdma_wr_bind_mw(struct ibv_qp_ex *ibqp, struct ibv_mw *mw,
			     uint32_t rkey,
			     const struct ibv_mw_bind_info *bind_info)
{
	struct vrdma_send_wqe *wqe = vrdma_wr_new(ibqp, VRDMA_WR_BIND_MW);

	if (!wqe)
		return;
	if (!mw || !bind_info) {
		ex_to_vqp(ibqp)->wr_err = EINVAL;
		return;
	}
	vrdma_wqe_bind(wqe, mw, rkey, bind_info);
}

static void vrdma_wr_set_ud_addr(struct ibv_qp_ex *ibqp, struct ibv_ah *ah,
				 uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	struct vrdma_send_wqe *wqe = qp->wr_cur;

	if (!wqe)
		return;
	if (qp->vqp.qp.qp_type != IBV_QPT_UD || !ah) {
		qp->wr_err = EINVAL;
		return;
	}
	wqe->wr.ud.ah_index = htole32(to_vah(ah)->ah_index);
	wqe->wr.ud.remote_qpn = htole32(remote_qpn);
	wqe->wr.ud.remote_qkey = htole32(remote_qkey);
}

static void vrdma_wr_set_xrc_srqn(struct ibv_qp_ex *ibqp,
				  uint32_t remote_srqn)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	struct vrdma_send_wqe *wqe = qp->wr_cur;

	if (!wqe)
		return;
	if (qp->vqp.qp.qp_type != IBV_QPT_XRC_SEND) {
		qp->wr_err = EINVAL;
		return;
	}
	wqe->xrc_srqn = htole32(remote_srqn);
}

static void vrdma_wr_set_sge(struct ibv_qp_ex *ibqp, uint32_t lkey,
			     uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	int ret;

	if (!qp->wr_cur)
		return;
	ret = vrdma_wqe_sge_list(qp, qp->wr_cur, 1, &sge);
	if (ret)
		qp->wr_err = ret;
}

static void vrdma_wr_set_sge_list(struct ibv_qp_ex *ibqp, size_t num_sge,
				  const struct ibv_sge *sg_list)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	int ret;

	if (!qp->wr_cur)
		return;
	ret = vrdma_wqe_sge_list(qp, qp->wr_cur, num_sge, sg_list);
	if (ret)
		qp->wr_err = ret;
}

static void vrdma_wr_set_inline_data(struct ibv_qp_ex *ibqp, void *addr,
				     size_t length)
{
	struct ibv_data_buf buf = { .addr = addr, .length = length };
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	int ret;

	if (!qp->wr_cur)
		return;
	ret = vrdma_wqe_inline(qp, qp->wr_cur, 1, &buf, NULL);
	if (ret)
		qp->wr_err = ret;
}

static void vrdma_wr_set_inline_data_list(struct ibv_qp_ex *ibqp,
					  size_t num_buf,
					  const struct ibv_data_buf *buf_list)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	int ret;

	if (!qp->wr_cur)
		return;
	ret = vrdma_wqe_inline(qp, qp->wr_cur, num_buf, buf_list, NULL);
	if (ret)
		qp->wr_err = ret;
}

static void vrdma_wr_start(struct ibv_qp_ex *ibqp)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);

	vrdma_lock(&qp->sq.lock);
	qp->wr_start_head = qp->sq.ring.head;
	qp->wr_cur = NULL;
	qp->wr_err = vrdma_sq_state_ok(qp) ? 0 : EINVAL;
}

/* ibv_wr_complete: all or nothing; on error no WQE of the batch is posted */
static int vrdma_wr_complete(struct ibv_qp_ex *ibqp)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);
	bool posted;
	int ret;

	ret = qp->wr_err;
	if (ret)
		qp->sq.ring.head = qp->wr_start_head;
	posted = qp->sq.ring.head != qp->wr_start_head;
	if (posted)
		vrdma_sq_publish(qp);
	qp->wr_cur = NULL;
	vrdma_unlock(&qp->sq.lock);

	if (posted)
		ret = vrdma_ring_sq_doorbell(qp);
	return ret;
}

static void vrdma_wr_abort(struct ibv_qp_ex *ibqp)
{
	struct vrdma_qp *qp = ex_to_vqp(ibqp);

	qp->sq.ring.head = qp->wr_start_head;
	qp->wr_cur = NULL;
	vrdma_unlock(&qp->sq.lock);
}

static void vrdma_set_wr_ops(struct vrdma_qp *qp, uint64_t ops)
{
	struct ibv_qp_ex *ex = &qp->vqp.qp_ex;

	if (ops & IBV_QP_EX_WITH_RDMA_WRITE)
		ex->wr_rdma_write = vrdma_wr_rdma_write;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
		ex->wr_rdma_write_imm = vrdma_wr_rdma_write_imm;
	if (ops & IBV_QP_EX_WITH_RDMA_READ)
		ex->wr_rdma_read = vrdma_wr_rdma_read;
	if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
		ex->wr_atomic_cmp_swp = vrdma_wr_atomic_cmp_swp;
	if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
		ex->wr_atomic_fetch_add = vrdma_wr_atomic_fetch_add;
	if (ops & IBV_QP_EX_WITH_ATOMIC_WRITE)
		ex->wr_atomic_write = vrdma_wr_atomic_write;
	if (ops & IBV_QP_EX_WITH_FLUSH)
		ex->wr_flush = vrdma_wr_flush;
	if (ops & IBV_QP_EX_WITH_SEND)
		ex->wr_send = vrdma_wr_send;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM)
		ex->wr_send_imm = vrdma_wr_send_imm;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_INV)
		ex->wr_send_inv = vrdma_wr_send_inv;
	if (ops & IBV_QP_EX_WITH_LOCAL_INV)
		ex->wr_local_inv = vrdma_wr_local_inv;
	if (ops & IBV_QP_EX_WITH_BIND_MW)
		ex->wr_bind_mw = vrdma_wr_bind_mw;

	ex->wr_set_ud_addr = vrdma_wr_set_ud_addr;
	ex->wr_set_xrc_srqn = vrdma_wr_set_xrc_srqn;
	ex->wr_set_sge = vrdma_wr_set_sge;
	ex->wr_set_sge_list = vrdma_wr_set_sge_list;
	ex->wr_set_inline_data = vrdma_wr_set_inline_data;
	ex->wr_set_inline_data_list = vrdma_wr_set_inline_data_list;
	ex->wr_start = vrdma_wr_start;
	ex->wr_complete = vrdma_wr_complete;
	ex->wr_abort = vrdma_wr_abort;
}

/* QP objects ---------------------------------------------------------------- */

static int vrdma_check_qp_attr(const struct ibv_qp_init_attr_ex *attr)
{
	uint64_t sup_ops;

	if (attr->comp_mask & ~(uint32_t)VRDMA_QP_SUP_COMP_MASK)
		return EOPNOTSUPP;
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	    attr->create_flags)
		return EOPNOTSUPP;

	switch (attr->qp_type) {
	case IBV_QPT_RC:
		sup_ops = VRDMA_RC_SEND_OPS;
		break;
	case IBV_QPT_UC:
		sup_ops = VRDMA_UC_SEND_OPS;
		break;
	case IBV_QPT_UD:
		sup_ops = VRDMA_UD_SEND_OPS;
		break;
	case IBV_QPT_XRC_SEND:
		sup_ops = VRDMA_XRC_SEND_OPS;
		break;
	case IBV_QPT_XRC_RECV:
		/* No send queue; created in the kernel on the XRCD (§13.7). */
		if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd)
			return EINVAL;
		sup_ops = 0;
		break;
	default:
		return EOPNOTSUPP;
	}

	/* TSO: not offered */
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (attr->send_ops_flags & ~sup_ops))
		return EOPNOTSUPP;
	return 0;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

static int vrdma_qp_map(struct ibv_context *ctx, struct vrdma_qp *qp,
			const struct ibv_qp_init_attr_ex *attr,
			const struct vrdma_create_qp_resp *resp)
{
	/* A QP of a thread domain is used by one thread at a time. */
	bool need_lock = !((attr->comp_mask & IBV_QP_INIT_ATTR_PD) &&
			   vrdma_pd_single_threaded(attr->pd));
	uint32_t slot;
	int ret;

	ret = vrdma_map_ring(ctx, &qp->sq.ring, resp->sq_mmap_offset,
			     resp->sq_mmap_size, resp->sq_depth,
			     resp->sq_wqe_shift, VRDMA_SQ_MIN_SHIFT);
	if (ret)
		return ret;
	vrdma_wq_sync(&qp->sq.ring);
	slot = 1U << resp->sq_wqe_shift;
	qp->sq.max_sge = min_u32(attr->cap.max_send_sge,
				 (slot - VRDMA_SEND_WQE_HDR) /
					 sizeof(struct vrdma_sge));
	qp->sq.max_inline = min_u32(attr->cap.max_inline_data,
				    slot - VRDMA_SEND_WQE_HDR);
	vrdma_lock_init(&qp->sq.lock, need_lock);

	/* An XRC_SEND QP has no receive side. */
	if (attr->srq || attr->qp_type == IBV_QPT_XRC_SEND)
		return 0;

	ret = vrdma_map_ring(ctx, &qp->rq.ring, resp->rq_mmap_offset,
			     resp->rq_mmap_size, resp->rq_depth,
			     resp->rq_wqe_shift, VRDMA_RQ_MIN_SHIFT);
	if (ret) {
		vrdma_unmap_ring(&qp->sq.ring);
		return ret;
	}
	vrdma_wq_sync(&qp->rq.ring);
	slot = 1U << resp->rq_wqe_shift;
	qp->rq.max_sge = min_u32(attr->cap.max_recv_sge,
				 (slot - VRDMA_RECV_WQE_HDR) /
					 sizeof(struct vrdma_sge));
	vrdma_lock_init(&qp->rq.lock, need_lock);
	return 0;
}

struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *ctx,
				  struct ibv_qp_init_attr_ex *attr)
{
	struct uvrdma_create_qp_ex_resp resp = {};
	struct ibv_create_qp_ex cmd = {};
	struct vrdma_qp *qp;
	int ret;

	ret = vrdma_check_qp_attr(attr);
	if (ret) {
		errno = ret;
		return NULL;
	}

	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_create_qp_ex2(ctx, &qp->vqp, attr, &cmd, sizeof(cmd),
				    &resp.ibv_resp, sizeof(resp));
	if (ret)
		goto err_free;

	if (attr->qp_type == IBV_QPT_XRC_RECV) {
		/*
		 * The kernel owns an XRC target (ib_core creates it without
		 * our udata): no rings to map, the QPN is the core's answer.
		 */
		vrdma_lock_init(&qp->sq.lock, true);
		qp->qpn = qp->vqp.qp.qp_num;
		return &qp->vqp.qp;
	}

	ret = vrdma_qp_map(ctx, qp, attr, &resp.drv_payload);
	if (ret)
		goto err_destroy;

	qp->qpn = resp.drv_payload.qpn;
	qp->sq_sig_all = attr->sq_sig_all;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		vrdma_set_wr_ops(qp, attr->send_ops_flags);
		qp->vqp.comp_mask |= VERBS_QP_EX;
	}
	return &qp->vqp.qp;

err_destroy:
	ibv_cmd_destroy_qp(&qp->vqp.qp);
err_free:
	free(qp);
	errno = ret;
	return NULL;
}

/*
 * ibv_open_qp: another handle on an XRC target QP of a shared XRC domain
 * (§13.7). It has no rings here either; the kernel does the sharing.
 */
struct ibv_qp *vrdma_open_qp(struct ibv_context *ctx,
			     struct ibv_qp_open_attr *attr)
{
	struct ib_uverbs_create_qp_resp resp = {};
	struct ibv_open_qp cmd = {};
	struct vrdma_qp *qp;
	int ret;

	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_open_qp(ctx, &qp->vqp, sizeof(qp->vqp), attr, &cmd,
			      sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(qp);
		errno = ret;
		return NULL;
	}
	vrdma_lock_init(&qp->sq.lock, true);
	qp->qpn = qp->vqp.qp.qp_num;
	return &qp->vqp.qp;
}

struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd,
			       struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex attr_ex = {};
	struct ibv_qp *qp;

	memcpy(&attr_ex, attr, sizeof(*attr));
	attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	attr_ex.pd = pd;
	qp = vrdma_create_qp_ex(pd->context, &attr_ex);
	if (qp)
		attr->cap = attr_ex.cap;
	return qp;
}

int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		   int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd;

	return ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd,
				sizeof(cmd));
}

int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		    int attr_mask)
{
	struct ib_uverbs_ex_modify_qp_resp resp = {};
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ibv_modify_qp_ex cmd_ex = {};
	struct ibv_modify_qp cmd = {};
	int ret;

	if (attr_mask & ~(IBV_QP_RATE_LIMIT - 1))
		ret = ibv_cmd_modify_qp_ex(ibqp, attr, attr_mask, &cmd_ex,
					   sizeof(cmd_ex), &resp,
					   sizeof(resp));
	else
		ret = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd,
					sizeof(cmd));
	if (ret)
		return ret;

	/*
	 * §13: any -> RESET discards the queues. Take our producer from the
	 * control page again so we agree with however the kernel reset it.
	 */
	if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET &&
	    qp->sq.ring.map) {
		vrdma_lock(&qp->sq.lock);
		vrdma_wq_sync(&qp->sq.ring);
		vrdma_unlock(&qp->sq.lock);
		if (qp->rq.ring.map) {
			vrdma_lock(&qp->rq.lock);
			vrdma_wq_sync(&qp->rq.ring);
			vrdma_unlock(&qp->rq.lock);
		}
		/*
		 * Completions of the old life of the QP (flushes, errors) would
		 * be read as the first results of the new one. Receive CQEs of
		 * an SRQ QP stay: they carry SRQ buffers the application must
		 * get back.
		 */
		if (ibqp->recv_cq && !ibqp->srq)
			vrdma_cq_clean(to_vcq(ibqp->recv_cq), ibqp->qp_num);
		if (ibqp->send_cq && ibqp->send_cq != ibqp->recv_cq)
			vrdma_cq_clean(to_vcq(ibqp->send_cq), ibqp->qp_num);
	}
	return 0;
}

int vrdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	int ret;

	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret)
		return ret;

	vrdma_unmap_ring(&qp->sq.ring);
	vrdma_lock_destroy(&qp->sq.lock);
	if (qp->rq.ring.map) {
		vrdma_unmap_ring(&qp->rq.ring);
		vrdma_lock_destroy(&qp->rq.lock);
	}
	free(qp);
	return 0;
}

/*
 * ibv_bind_mw (type 1, §12.8): a BIND_MW WQE on @ibqp that gives the window
 * its next rkey; ibv_bind_mw(3) promises the new rkey at return.
 */
int vrdma_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *mw,
		  struct ibv_mw_bind *mw_bind)
{
	struct ibv_mw_bind_info *bi = &mw_bind->bind_info;
	struct ibv_send_wr wr = {}, *bad;

	if (mw->type != IBV_MW_TYPE_1)
		return EINVAL;
	if (!bi->mr && (bi->addr || bi->length))
		return EINVAL;
	wr.wr_id = mw_bind->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = mw_bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = *bi;
	return vrdma_post_send(ibqp, &wr, &bad);
}

// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Stand-ins for libibverbs so the provider links without a kernel: the
 * create commands answer with rings laid out in the test's memfd.
 */
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "vrdma.h"
#include "stubs.h"

struct stub_state stub;

int ibv_cmd_create_qp_ex2(struct ibv_context *context, struct verbs_qp *qp,
			  struct ibv_qp_init_attr_ex *attr,
			  struct ibv_create_qp_ex *cmd, size_t cmd_size,
			  struct ib_uverbs_ex_create_qp_resp *resp,
			  size_t resp_size)
{
	struct uvrdma_create_qp_ex_resp *r = (void *)resp;

	if (resp_size != sizeof(*r))
		return EINVAL;
	qp->qp.context = context;
	qp->qp.qp_type = attr->qp_type;
	qp->qp.handle = STUB_QP_HANDLE;
	qp->qp.qp_num = STUB_QPN;
	qp->qp.srq = attr->srq;
	/* the tests post right away: pretend modify_qp took it to RTS */
	qp->qp.state = IBV_QPS_RTS;
	r->drv_payload.qpn = STUB_QPN;
	r->drv_payload.sq_depth = STUB_DEPTH;
	r->drv_payload.sq_wqe_shift = STUB_SQ_SHIFT;
	r->drv_payload.sq_mmap_offset = STUB_SQ_OFF;
	r->drv_payload.sq_mmap_size = STUB_RING_SIZE;
	if (!attr->srq) {
		r->drv_payload.rq_depth = STUB_DEPTH;
		r->drv_payload.rq_wqe_shift = STUB_RQ_SHIFT;
		r->drv_payload.rq_mmap_offset = STUB_RQ_OFF;
		r->drv_payload.rq_mmap_size = STUB_RING_SIZE;
	}
	attr->cap.max_send_sge = 4;
	attr->cap.max_recv_sge = 3;
	attr->cap.max_inline_data = 64;
	return 0;
}

int ibv_cmd_destroy_qp(struct ibv_qp *qp)
{
	return 0;
}

int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		      int attr_mask, struct ibv_modify_qp *cmd,
		      size_t cmd_size)
{
	stub.modify_calls++;
	return stub.modify_ret;
}

int ibv_cmd_modify_qp_ex(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int attr_mask, struct ibv_modify_qp_ex *cmd,
			 size_t cmd_size,
			 struct ib_uverbs_ex_modify_qp_resp *resp,
			 size_t resp_size)
{
	stub.modify_ex_calls++;
	return stub.modify_ret;
}

int ibv_cmd_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *qp_attr,
		     int attr_mask, struct ibv_qp_init_attr *qp_init_attr,
		     struct ibv_query_qp *cmd, size_t cmd_size)
{
	return 0;
}

static void stub_cq_resp(struct ibv_context *ctx, struct ibv_cq *cq,
			 struct vrdma_create_cq_resp *r)
{
	cq->context = ctx;
	r->cqn = 7;
	r->depth = STUB_DEPTH;
	r->mmap_offset = STUB_CQ_OFF;
	r->mmap_size = STUB_RING_SIZE;
}

int ibv_cmd_create_cq(struct ibv_context *context, int cqe,
		      struct ibv_comp_channel *channel, int comp_vector,
		      struct ibv_cq *cq, struct ibv_create_cq *cmd,
		      size_t cmd_size, struct ib_uverbs_create_cq_resp *resp,
		      size_t resp_size)
{
	struct uvrdma_create_cq_resp *r = (void *)resp;

	if (resp_size != sizeof(*r))
		return EINVAL;
	stub_cq_resp(context, cq, &r->drv_payload);
	return 0;
}

int ibv_cmd_create_cq_ex(struct ibv_context *context,
			 const struct ibv_cq_init_attr_ex *cq_attr,
			 struct verbs_cq *cq, struct ibv_create_cq_ex *cmd,
			 size_t cmd_size,
			 struct ib_uverbs_ex_create_cq_resp *resp,
			 size_t resp_size, uint32_t cmd_flags)
{
	struct uvrdma_create_cq_ex_resp *r = (void *)resp;

	if (resp_size != sizeof(*r))
		return EINVAL;
	stub_cq_resp(context, &cq->cq, &r->drv_payload);
	return 0;
}

int ibv_cmd_resize_cq(struct ibv_cq *cq, int cqe, struct ibv_resize_cq *cmd,
		      size_t cmd_size, struct ib_uverbs_resize_cq_resp *resp,
		      size_t resp_size)
{
	struct uvrdma_resize_cq_resp *r = (void *)resp;

	if (cqe == STUB_DEPTH)
		return 0;	/* unchanged depth: no udata written */

	/* the "kernel" moved the unpolled CQEs to a new ring at SRQ_OFF+ */
	r->drv_payload.depth = 2 * STUB_DEPTH;
	r->drv_payload.mmap_offset = STUB_CQ2_OFF;
	r->drv_payload.mmap_size = STUB_RING_SIZE;
	return 0;
}

struct ibv_modify_cq_attr stub_modify_cq_attr;

int ibv_cmd_modify_cq(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr,
		      struct ibv_modify_cq *cmd, size_t cmd_size)
{
	stub_modify_cq_attr = *attr;
	return 0;
}

int ibv_cmd_destroy_cq(struct ibv_cq *cq)
{
	return 0;
}

int ibv_cmd_create_srq(struct ibv_pd *pd, struct ibv_srq *srq,
		       struct ibv_srq_init_attr *attr,
		       struct ibv_create_srq *cmd, size_t cmd_size,
		       struct ib_uverbs_create_srq_resp *resp,
		       size_t resp_size)
{
	struct uvrdma_create_srq_resp *r = (void *)resp;

	srq->context = pd->context;
	r->drv_payload.srqn = 3;
	r->drv_payload.depth = STUB_DEPTH;
	r->drv_payload.wqe_shift = STUB_RQ_SHIFT;
	r->drv_payload.mmap_offset = STUB_SRQ_OFF;
	r->drv_payload.mmap_size = STUB_RING_SIZE;
	attr->attr.max_sge = 2;
	return 0;
}

/* An XRC SRQ (srq_num 0x1234) on the same ring as the basic one. */
int ibv_cmd_create_srq_ex(struct ibv_context *context, struct verbs_srq *srq,
			  struct ibv_srq_init_attr_ex *attr_ex,
			  struct ibv_create_xsrq *cmd, size_t cmd_size,
			  struct ib_uverbs_create_srq_resp *resp,
			  size_t resp_size)
{
	struct uvrdma_create_xsrq_resp *r = (void *)resp;

	if (resp_size != sizeof(*r))
		return EINVAL;
	srq->srq.context = context;
	/* as libibverbs' create_srq_ex does */
	srq->srq_type = attr_ex->srq_type;
	srq->srq_num = STUB_XRC_SRQN;
	r->drv_payload.srqn = STUB_XRC_SRQN;
	r->drv_payload.depth = STUB_DEPTH;
	r->drv_payload.wqe_shift = STUB_RQ_SHIFT;
	r->drv_payload.mmap_offset = STUB_SRQ_OFF;
	r->drv_payload.mmap_size = STUB_RING_SIZE;
	attr_ex->attr.max_sge = 2;
	return 0;
}

int ibv_cmd_open_xrcd(struct ibv_context *context, struct verbs_xrcd *xrcd,
		      int vxrcd_size, struct ibv_xrcd_init_attr *attr,
		      struct ibv_open_xrcd *cmd, size_t cmd_size,
		      struct ib_uverbs_open_xrcd_resp *resp, size_t resp_size)
{
	xrcd->xrcd.context = context;
	return 0;
}

int ibv_cmd_close_xrcd(struct verbs_xrcd *xrcd)
{
	return 0;
}

int ibv_cmd_open_qp(struct ibv_context *context, struct verbs_qp *qp,
		    int vqp_sz, struct ibv_qp_open_attr *attr,
		    struct ibv_open_qp *cmd, size_t cmd_size,
		    struct ib_uverbs_create_qp_resp *resp, size_t resp_size)
{
	qp->qp.context = context;
	qp->qp.qp_type = attr->qp_type;
	qp->qp.qp_num = attr->qp_num;
	qp->qp.state = IBV_QPS_RTS;
	return 0;
}

int ibv_cmd_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		       int srq_attr_mask, struct ibv_modify_srq *cmd,
		       size_t cmd_size)
{
	struct uvrdma_modify_srq *c = (void *)cmd;
	struct vrdma_modify_srq_resp *r;

	if (!(srq_attr_mask & IBV_SRQ_MAX_WR))
		return 0;
	if (cmd_size < sizeof(*c) || !c->drv_payload.resp_addr)
		return EINVAL;
	/* the "kernel" moved the SRQ to a new ring at CQ2_OFF */
	r = (void *)(uintptr_t)c->drv_payload.resp_addr;
	r->depth = 2 * STUB_DEPTH;
	r->mmap_offset = STUB_CQ2_OFF;
	r->mmap_size = STUB_RING_SIZE;
	return 0;
}

int ibv_cmd_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		      struct ibv_query_srq *cmd, size_t cmd_size)
{
	return 0;
}

int ibv_cmd_destroy_srq(struct ibv_srq *srq)
{
	return 0;
}

/* Referenced by vrdma.c's control path, not exercised here. */
int ibv_cmd_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice,
		      uint32_t flags, struct ibv_sge *sg_list,
		      uint32_t num_sge)
{
	return EOPNOTSUPP;
}

int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd,
		     struct ibv_alloc_pd *cmd, size_t cmd_size,
		     struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_dealloc_pd(struct ibv_pd *pd)
{
	return EOPNOTSUPP;
}

int ibv_cmd_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			 uint16_t lid)
{
	return EOPNOTSUPP;
}

int ibv_cmd_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			 uint16_t lid)
{
	return EOPNOTSUPP;
}

int ibv_cmd_create_ah(struct ibv_pd *pd, struct ibv_ah *ah,
		      struct ibv_ah_attr *attr,
		      struct ib_uverbs_create_ah_resp *resp, size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_destroy_ah(struct ibv_ah *ah)
{
	return EOPNOTSUPP;
}

int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
		   uint64_t hca_va, int access, struct verbs_mr *vmr,
		   struct ibv_reg_mr *cmd, size_t cmd_size,
		   struct ib_uverbs_reg_mr_resp *resp, size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_dereg_mr(struct verbs_mr *vmr)
{
	return EOPNOTSUPP;
}

int ibv_cmd_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type,
		     struct ibv_mw *mw, struct ibv_alloc_mw *cmd,
		     size_t cmd_size,
		     struct ib_uverbs_alloc_mw_resp *resp, size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_dealloc_mw(struct ibv_mw *mw)
{
	return EOPNOTSUPP;
}

int ibv_cmd_rereg_mr(struct verbs_mr *vmr, uint32_t flags, void *addr,
		     size_t length, uint64_t hca_va, int access,
		     struct ibv_pd *pd, struct ibv_rereg_mr *cmd,
		     size_t cmd_sz, struct ib_uverbs_rereg_mr_resp *resp,
		     size_t resp_sz)
{
	return EOPNOTSUPP;
}

int ibv_cmd_get_context(struct verbs_context *context,
			struct ibv_get_context *cmd, size_t cmd_size,
			struct ib_uverbs_get_context_resp *resp,
			size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_query_device_any(struct ibv_context *context,
			     const struct ibv_query_device_ex_input *input,
			     struct ibv_device_attr_ex *attr, size_t attr_size,
			     struct ib_uverbs_ex_query_device_resp *resp,
			     size_t *resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_query_port(struct ibv_context *context, uint8_t port_num,
		       struct ibv_port_attr *port_attr,
		       struct ibv_query_port *cmd, size_t cmd_size)
{
	return EOPNOTSUPP;
}

void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd,
				    size_t alloc_size,
				    struct verbs_context *context_offset,
				    uint32_t driver_id)
{
	return NULL;
}

void verbs_set_ops(struct verbs_context *vctx,
		   const struct verbs_context_ops *ops)
{
}

void verbs_uninit_context(struct verbs_context *context)
{
}

void verbs_register_driver_34(const struct verbs_device_ops *ops)
{
	stub.registered = ops;
}

void __verbs_log(struct verbs_context *ctx, uint32_t level,
		 const char *fmt, ...)
{
}

/* libibverbs' own: the extended QP exists when VERBS_QP_EX is set */
struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct verbs_qp *vqp = (struct verbs_qp *)qp;

	return (vqp->comp_mask & VERBS_QP_EX) ? &vqp->qp_ex : NULL;
}

/* Device memory: the "kernel" hands out offset 0 of the memfd. */
int ibv_cmd_alloc_dm(struct ibv_context *ctx,
		     const struct ibv_alloc_dm_attr *dm_attr,
		     struct verbs_dm *dm, struct ibv_command_buffer *link)
{
	dm->dm.context = ctx;
	dm->handle = 9;
	return 0;
}

int ibv_cmd_free_dm(struct verbs_dm *dm)
{
	return 0;
}

int ibv_cmd_reg_dm_mr(struct ibv_pd *pd, struct verbs_dm *dm,
		      uint64_t offset, size_t length, unsigned int access,
		      struct verbs_mr *vmr, struct ibv_command_buffer *link)
{
	vmr->ibv_mr.pd = pd;
	vmr->ibv_mr.lkey = 0x900;
	return 0;
}

int ibv_cmd_query_mr(struct ibv_pd *pd, struct verbs_mr *vmr,
		     uint32_t mr_handle)
{
	return EOPNOTSUPP;
}

int ibv_cmd_query_context(struct ibv_context *ctx,
			  struct ibv_command_buffer *driver)
{
	return EOPNOTSUPP;
}

int execute_ioctl(struct ibv_context *context, struct ibv_command_buffer *cmd)
{
	return EOPNOTSUPP;
}

// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma: device matching, context, and the control-path verbs that are
 * plain uverbs commands (device/port query, PD, MR, AH).
 *
 * Data-path objects live in vrdma_cq.c (CQ), vrdma_qp.c (QP, SQ/RQ) and
 * vrdma_srq.c (SRQ). Verbs left out of the ops table (XRC, WQs, flows,
 * ...) are answered EOPNOTSUPP by libibverbs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "vrdma.h"

static const struct verbs_match_ent vrdma_match_table[] = {
	VERBS_NAME_MATCH("vrdma", NULL),
	{},
};

int vrdma_map_ring(struct ibv_context *ctx, struct vrdma_ring *r,
		   uint64_t offset, uint64_t size, uint32_t depth,
		   uint32_t shift, uint32_t min_shift)
{
	void *map;

	if (!size || size > SIZE_MAX)
		return EINVAL;

	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED,
		   ctx->cmd_fd, offset);
	if (map == MAP_FAILED)
		return errno;

	if (vrdma_ring_init(r, map, size, depth, shift, min_shift)) {
		munmap(map, size);
		return EINVAL;
	}
	return 0;
}

void vrdma_unmap_ring(struct vrdma_ring *r)
{
	if (r->map)
		munmap(r->map, r->map_size);
	r->map = NULL;
	r->map_size = 0;
}

static int vrdma_query_device_ex(struct ibv_context *ctx,
				 const struct ibv_query_device_ex_input *input,
				 struct ibv_device_attr_ex *attr,
				 size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	/*
	 * ODP (explicit and implicit) and atomic caps come from the kernel,
	 * which fills them from the device config (§2.2).
	 */
	ret = ibv_cmd_query_device_any(ctx, input, attr, attr_size, &resp,
				       &resp_size);
	if (ret)
		return ret;

	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

static int vrdma_query_port(struct ibv_context *ctx, uint8_t port,
			    struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(ctx, port, attr, &cmd, sizeof(cmd));
}

static struct ibv_pd *vrdma_alloc_pd(struct ibv_context *ctx)
{
	struct ib_uverbs_alloc_pd_resp resp;
	struct ibv_alloc_pd cmd;
	struct vrdma_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_alloc_pd(ctx, &pd->ibv_pd, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	return &pd->ibv_pd;
}

int vrdma_dealloc_pd(struct ibv_pd *ibpd)
{
	struct vrdma_pd *pd = to_vpd(ibpd);
	int ret;

	if (pd->protection_domain) {
		/* A parent domain: nothing of it is in the kernel. */
		atomic_fetch_sub(&pd->protection_domain->refs, 1);
		if (pd->td)
			atomic_fetch_sub(&pd->td->refs, 1);
		free(pd);
		return 0;
	}
	if (atomic_load(&pd->refs))
		return EBUSY;
	ret = ibv_cmd_dealloc_pd(ibpd);
	if (ret)
		return ret;
	free(pd);
	return 0;
}

/* Thread domains (ibv_alloc_td(3)) are a provider promise, not an object of the device. */
struct ibv_td *vrdma_alloc_td(struct ibv_context *ctx,
			      struct ibv_td_init_attr *attr)
{
	struct vrdma_td *td;

	if (attr->comp_mask) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	td = calloc(1, sizeof(*td));
	if (!td) {
		errno = ENOMEM;
		return NULL;
	}
	td->ibv_td.context = ctx;
	return &td->ibv_td;
}

int vrdma_dealloc_td(struct ibv_td *ibtd)
{
	struct vrdma_td *td = container_of(ibtd, struct vrdma_td, ibv_td);

	if (atomic_load(&td->refs))
		return EBUSY;
	free(td);
	return 0;
}

struct ibv_pd *
vrdma_alloc_parent_domain(struct ibv_context *ctx,
			  struct ibv_parent_domain_init_attr *attr)
{
	struct vrdma_pd *parent, *pd;

	if (attr->comp_mask & ~(uint32_t)(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
					  IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!attr->pd || attr->pd->context != ctx ||
	    to_vpd(attr->pd)->protection_domain ||
	    (attr->td && attr->td->context != ctx)) {
		errno = EINVAL;
		return NULL;
	}

	parent = calloc(1, sizeof(*parent));
	if (!parent) {
		errno = ENOMEM;
		return NULL;
	}
	pd = to_vpd(attr->pd);
	parent->protection_domain = pd;
	parent->ibv_pd.context = ctx;
	parent->ibv_pd.handle = pd->ibv_pd.handle;
	if (attr->td) {
		parent->td = container_of(attr->td, struct vrdma_td, ibv_td);
		atomic_fetch_add(&parent->td->refs, 1);
	}
	atomic_fetch_add(&pd->refs, 1);
	return &parent->ibv_pd;
}

/* XRC domains (§13.7): the kernel shares them between processes by inode. */
struct ibv_xrcd *vrdma_open_xrcd(struct ibv_context *ctx,
				 struct ibv_xrcd_init_attr *attr)
{
	struct ib_uverbs_open_xrcd_resp resp = {};
	struct ibv_open_xrcd cmd = {};
	struct verbs_xrcd *xrcd;
	int ret;

	xrcd = calloc(1, sizeof(*xrcd));
	if (!xrcd) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_open_xrcd(ctx, xrcd, sizeof(*xrcd), attr, &cmd,
				sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(xrcd);
		errno = ret;
		return NULL;
	}
	return &xrcd->xrcd;
}

int vrdma_close_xrcd(struct ibv_xrcd *ibxrcd)
{
	struct verbs_xrcd *xrcd = container_of(ibxrcd, struct verbs_xrcd, xrcd);
	int ret;

	ret = ibv_cmd_close_xrcd(xrcd);
	if (ret)
		return ret;
	free(xrcd);
	return 0;
}

/*
 * Plain, explicit ODP and implicit ODP MRs all go through the same command:
 * an implicit ODP MR is addr NULL, length SIZE_MAX, IBV_ACCESS_ON_DEMAND,
 * which the kernel recognises and registers with VRDMA_CMD_REG_IMPLICIT_MR.
 */
static struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr,
				   size_t length, uint64_t hca_va, int access)
{
	struct ib_uverbs_reg_mr_resp resp;
	struct ibv_reg_mr cmd;
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd,
			     sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

static int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret;

	ret = ibv_cmd_dereg_mr(vmr);
	if (ret)
		return ret;
	free(vmr);
	return 0;
}

/*
 * The kernel registers a new MR and retires the old one (the device cannot
 * change an MR in place); ibv_cmd_rereg_mr copies the new keys into vmr.
 */
static int vrdma_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd,
			  void *addr, size_t length, int access)
{
	struct ib_uverbs_rereg_mr_resp resp;
	struct ibv_rereg_mr cmd;

	return ibv_cmd_rereg_mr(vmr, flags, addr, length, (uintptr_t)addr,
				access, pd, &cmd, sizeof(cmd), &resp,
				sizeof(resp));
}

/* Memory windows (§12.8): the kernel allocates them in the device. */
static struct ibv_mw *vrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct ib_uverbs_alloc_mw_resp resp;
	struct ibv_alloc_mw cmd;
	struct ibv_mw *mw;
	int ret;

	mw = calloc(1, sizeof(*mw));
	if (!mw) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_alloc_mw(pd, type, mw, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret) {
		free(mw);
		errno = ret;
		return NULL;
	}
	return mw;
}

static int vrdma_dealloc_mw(struct ibv_mw *mw)
{
	int ret;

	ret = ibv_cmd_dealloc_mw(mw);
	if (ret)
		return ret;
	free(mw);
	return 0;
}

static int vrdma_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice,
			   uint32_t flags, struct ibv_sge *sg_list,
			   uint32_t num_sge)
{
	return ibv_cmd_advise_mr(pd, advice, flags, sg_list, num_sge);
}

/* The AH lives in the device; UD WQEs carry only its index (§6.1). */
static struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd,
				      struct ibv_ah_attr *attr)
{
	struct uvrdma_create_ah_resp resp = {};
	struct vrdma_ah *ah;
	int ret;

	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}

	ret = ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp.ibv_resp,
				sizeof(resp));
	if (ret) {
		free(ah);
		errno = ret;
		return NULL;
	}
	ah->ah_index = resp.drv_payload.ah_index;
	return &ah->ibv_ah;
}

static int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	struct vrdma_ah *ah = to_vah(ibah);
	int ret;

	ret = ibv_cmd_destroy_ah(ibah);
	if (ret)
		return ret;
	free(ah);
	return 0;
}

static void vrdma_free_context(struct ibv_context *ibctx);

static const struct verbs_context_ops vrdma_ctx_ops = {
	.query_device_ex = vrdma_query_device_ex,
	.query_port = vrdma_query_port,
	.alloc_pd = vrdma_alloc_pd,
	.dealloc_pd = vrdma_dealloc_pd,
	.alloc_td = vrdma_alloc_td,
	.dealloc_td = vrdma_dealloc_td,
	.alloc_parent_domain = vrdma_alloc_parent_domain,
	.reg_mr = vrdma_reg_mr,
	.dereg_mr = vrdma_dereg_mr,
	.rereg_mr = vrdma_rereg_mr,
	.advise_mr = vrdma_advise_mr,
	.alloc_mw = vrdma_alloc_mw,
	.dealloc_mw = vrdma_dealloc_mw,
	.bind_mw = vrdma_bind_mw,
	.create_cq = vrdma_create_cq,
	.create_cq_ex = vrdma_create_cq_ex,
	.poll_cq = vrdma_poll_cq,
	.req_notify_cq = vrdma_req_notify_cq,
	.resize_cq = vrdma_resize_cq,
	.modify_cq = vrdma_modify_cq,
	.destroy_cq = vrdma_destroy_cq,
	.create_srq = vrdma_create_srq,
	.create_srq_ex = vrdma_create_srq_ex,
	.get_srq_num = vrdma_get_srq_num,
	.open_xrcd = vrdma_open_xrcd,
	.close_xrcd = vrdma_close_xrcd,
	.open_qp = vrdma_open_qp,
	.modify_srq = vrdma_modify_srq,
	.query_srq = vrdma_query_srq,
	.destroy_srq = vrdma_destroy_srq,
	.post_srq_recv = vrdma_post_srq_recv,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.query_qp = vrdma_query_qp,
	.modify_qp = vrdma_modify_qp,
	.destroy_qp = vrdma_destroy_qp,
	.post_send = vrdma_post_send,
	.post_recv = vrdma_post_recv,
	.create_ah = vrdma_create_ah,
	.destroy_ah = vrdma_destroy_ah,
	.attach_mcast = ibv_cmd_attach_mcast,
	.detach_mcast = ibv_cmd_detach_mcast,
	.alloc_dm = vrdma_alloc_dm,
	.free_dm = vrdma_free_dm,
	.reg_dm_mr = vrdma_reg_dm_mr,
	.import_pd = vrdma_import_pd,
	.unimport_pd = vrdma_unimport_pd,
	.import_mr = vrdma_import_mr,
	.unimport_mr = vrdma_unimport_mr,
	.import_dm = vrdma_import_dm,
	.unimport_dm = vrdma_unimport_dm,
	.free_context = vrdma_free_context,
};

/* The response of alloc_ucontext, or of QUERY_CONTEXT for an import. */
static int vrdma_set_context(struct vrdma_context *ctx,
			     const struct vrdma_alloc_ucontext_resp *resp)
{
	if (resp->abi_version != VRDMA_UVERBS_ABI_VERSION) {
		verbs_err(&ctx->ibv_ctx,
			  "vrdma: kernel uverbs ABI %u, libvrdma expects %u\n",
			  resp->abi_version, VRDMA_UVERBS_ABI_VERSION);
		return EPROTONOSUPPORT;
	}
	ctx->max_inline_data = resp->max_inline_data;
	ctx->max_send_sge = resp->max_send_sge;
	ctx->max_recv_sge = resp->max_recv_sge;
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return 0;
}

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev,
						 int cmd_fd,
						 void *private_data)
{
	struct uvrdma_alloc_ucontext_resp resp = {};
	struct vrdma_context *ctx;
	struct ibv_get_context cmd;
	int ret;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;

	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp)))
		goto err;
	ret = vrdma_set_context(ctx, &resp.drv_payload);
	if (ret) {
		errno = ret;
		goto err;
	}
	return &ctx->ibv_ctx;

err:
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

/*
 * ibv_import_device(3): a context on a command fd another context opened
 * (shared with dup or over a unix socket). The kernel's ucontext already
 * exists; QUERY_CONTEXT answers its vrdma_alloc_ucontext_resp again.
 */
static struct verbs_context *vrdma_import_context(struct ibv_device *ibdev,
						  int cmd_fd)
{
	DECLARE_COMMAND_BUFFER_LINK(driver_attr, UVERBS_OBJECT_DEVICE,
				    UVERBS_METHOD_QUERY_CONTEXT, 1, NULL);
	struct vrdma_alloc_ucontext_resp resp = {};
	struct vrdma_context *ctx;
	int ret;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;

	fill_attr_out_ptr(driver_attr, VRDMA_UAPI_ATTR_QUERY_CONTEXT_RESP,
			  &resp);
	ret = ibv_cmd_query_context(&ctx->ibv_ctx.context, driver_attr);
	if (!ret)
		ret = vrdma_set_context(ctx, &resp);
	if (ret) {
		verbs_uninit_context(&ctx->ibv_ctx);
		free(ctx);
		errno = ret;
		return NULL;
	}
	return &ctx->ibv_ctx;
}

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *unused)
{
	struct vrdma_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vrdma_uninit_device(struct verbs_device *vdev)
{
	free(container_of(vdev, struct vrdma_device, ibv_dev));
}

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "vrdma",
	/*
	 * vrdma.ko sets uverbs_abi_ver = VRDMA_UVERBS_ABI_VERSION; the real
	 * check is the abi_version of the alloc_ucontext response.
	 */
	.match_min_abi_version = 0,
	.match_max_abi_version = VRDMA_UVERBS_ABI_VERSION,
	.match_table = vrdma_match_table,
	.alloc_device = vrdma_device_alloc,
	.uninit_device = vrdma_uninit_device,
	.alloc_context = vrdma_alloc_context,
	.import_context = vrdma_import_context,
};
PROVIDER_DRIVER(vrdma, vrdma_dev_ops);

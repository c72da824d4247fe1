// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma device memory (ibv_alloc_dm) and the driver's uverbs attributes and
 * methods (DM_ALLOC's mmap offset; QUERY_CONTEXT, PD_QUERY and DM_QUERY for
 * importing a shared context and its objects, ibv_import_device(3)).
 *
 * The device has no memory of its own that a guest could address: every
 * byte it reads or writes is guest RAM (§12.3). Device memory is therefore
 * a driver object: zeroed guest pages that the process maps (the provider
 * implements ibv_memcpy_to_dm / _from_dm on the mapping) and that MRs
 * registered with ibv_reg_dm_mr describe to the device. Such an MR is an
 * ordinary page-list MR (REG_MR, §11.8) with iova 0, which is what
 * IBV_ACCESS_ZERO_BASED, mandatory for DM MRs, asks for. It is no faster
 * than other memory; it exists so that verbs applications using DM run.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/uverbs_ioctl.h>
#include <rdma/uverbs_std_types.h>

#include "vrdma.h"

#define UVERBS_MODULE_NAME vrdma_ib
#include <rdma/uverbs_named_ioctl.h>

static struct vrdma_dm *to_vdm(struct ib_dm *ibdm)
{
	return container_of(ibdm, struct vrdma_dm, ibdm);
}

struct ib_dm *vrdma_alloc_dm(struct ib_device *ibdev,
			     struct ib_ucontext *uctx,
			     struct ib_dm_alloc_attr *attr,
			     struct uverbs_attr_bundle *attrs)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	struct vrdma_dm *dm;
	u64 offset, size, bytes;
	int err;

	/* The pages are page-aligned, so any alignment up to a page holds. */
	if (!attr->length || attr->length > VRDMA_DM_MAX_SIZE ||
	    attr->alignment > PAGE_SHIFT)
		return ERR_PTR(-EINVAL);
	bytes = PAGE_ALIGN(attr->length);
	if (atomic64_add_return(bytes, &dev->dm_bytes) > VRDMA_DM_MAX_SIZE) {
		err = -ENOMEM;
		goto err_budget;
	}

	dm = kzalloc(sizeof(*dm), GFP_KERNEL);
	if (!dm) {
		err = -ENOMEM;
		goto err_budget;
	}
	err = vrdma_pages_alloc(dev, &dm->mem, bytes >> PAGE_SHIFT);
	if (err)
		goto err_free;
	dm->mmap = vrdma_ring_mmap_entry(uctx, &dm->mem, &offset, &size);
	if (IS_ERR(dm->mmap)) {
		err = PTR_ERR(dm->mmap);
		goto err_pages;
	}
	err = uverbs_copy_to(attrs, VRDMA_UAPI_ATTR_ALLOC_DM_MMAP_OFFSET,
			     &offset, sizeof(offset));
	if (err)
		goto err_mmap;
	return &dm->ibdm;

err_mmap:
	rdma_user_mmap_entry_remove(dm->mmap);
err_pages:
	vrdma_ring_free(dev, &dm->mem);
err_free:
	kfree(dm);
err_budget:
	atomic64_sub(bytes, &dev->dm_bytes);
	return ERR_PTR(err);
}

/* ib_core calls this only when no MR of @ibdm is left (its usecnt). */
int vrdma_dealloc_dm(struct ib_dm *ibdm, struct uverbs_attr_bundle *attrs)
{
	struct vrdma_dm *dm = to_vdm(ibdm);
	struct vrdma_dev *dev = to_vdev(ibdm->device);
	u64 bytes = (u64)dm->mem.npages << PAGE_SHIFT;

	/* The mapping holds its own page references (vrdma_ring_mmap_entry). */
	rdma_user_mmap_entry_remove(dm->mmap);
	/* A DEREG_MR that did not settle: the device may still write (§14.1). */
	if (READ_ONCE(dm->unsettled))
		vrdma_quarantine_ring(dev, &dm->mem);
	else
		vrdma_ring_free(dev, &dm->mem);
	atomic64_sub(bytes, &dev->dm_bytes);
	kfree(dm);
	return 0;
}

/*
 * A page-list MR over [offset, offset + length) of the DM with iova 0. The
 * device takes the offset into the first page from the iova (§11.8
 * REG_MR), so iova 0 needs a page-aligned @attr->offset. A DM MR of length
 * 0 covers no byte: the device is not asked (REG_MR needs a length of at
 * least 1) and the MR gets key 0, which is never valid (§12.1), so every
 * access of one byte or more through it fails while zero-length accesses
 * need no valid key anyway (§12.3).
 */
struct ib_mr *vrdma_reg_dm_mr(struct ib_pd *ibpd, struct ib_dm *ibdm,
			      struct ib_dm_mr_attr *attr,
			      struct uverbs_attr_bundle *attrs)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_dm *dm = to_vdm(ibdm);
	struct vrdma_cmd_reg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	u32 first, npages, i;
	struct vrdma_mr *mr;
	__le64 *pl;
	int err;

	/* ib_core checked the range against the DM and ZERO_BASED. */
	if (attr->offset & ~PAGE_MASK)
		return ERR_PTR(-EINVAL);
	mr = vrdma_mr_new(dev);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->dm = dm;
	mr->access = attr->access_flags;
	if (!attr->length)
		return &mr->ibmr;

	first = attr->offset >> PAGE_SHIFT;
	npages = DIV_ROUND_UP(attr->length, PAGE_SIZE);
	pl = kvmalloc_array(npages, sizeof(*pl), GFP_KERNEL);
	if (!pl) {
		err = -ENOMEM;
		goto err_free;
	}
	for (i = 0; i < npages; i++)
		pl[i] = cpu_to_le64(dm->mem.dma[first + i]);

	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.access = cpu_to_le32(vrdma_access(attr->access_flags));
	req.iova = 0;
	req.length = cpu_to_le64(attr->length);
	req.page_shift = cpu_to_le32(PAGE_SHIFT);
	req.npages = cpu_to_le32(npages);
	err = vrdma_cmd(dev, VRDMA_CMD_REG_MR, &req, sizeof(req), pl,
			npages * sizeof(*pl), &resp, sizeof(resp));
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/* After a timeout the device may yet register the pages. */
		if (vrdma_cmd_unsettled(err))
			WRITE_ONCE(dm->unsettled, true);
		goto err_free;
	}
	vrdma_mr_set_keys(mr, &resp);
	return &mr->ibmr;

err_free:
	kfree(mr);
	return ERR_PTR(err);
}

/* The context of a shared command fd, for ibv_import_device(3). */
int vrdma_query_ucontext(struct ib_ucontext *uctx,
			 struct uverbs_attr_bundle *attrs)
{
	struct vrdma_alloc_ucontext_resp resp = {};

	if (!uverbs_attr_is_valid(attrs, VRDMA_UAPI_ATTR_QUERY_CONTEXT_RESP))
		return 0;
	vrdma_fill_ucontext_resp(to_vdev(uctx->device), &resp);
	return uverbs_copy_to(attrs, VRDMA_UAPI_ATTR_QUERY_CONTEXT_RESP, &resp,
			      sizeof(resp));
}

/* ibv_import_pd(3): the handle names a PD of this context. */
static int
UVERBS_HANDLER(VRDMA_UAPI_METHOD_PD_QUERY)(struct uverbs_attr_bundle *attrs)
{
	struct ib_pd *pd =
		uverbs_attr_get_obj(attrs, VRDMA_UAPI_ATTR_QUERY_PD_HANDLE);
	u32 pdn;

	if (IS_ERR(pd))
		return PTR_ERR(pd);
	pdn = to_vpd(pd)->pdn;
	return uverbs_copy_to(attrs, VRDMA_UAPI_ATTR_QUERY_PD_RESP_PDN, &pdn,
			      sizeof(pdn));
}

DECLARE_UVERBS_NAMED_METHOD(VRDMA_UAPI_METHOD_PD_QUERY,
			    UVERBS_ATTR_IDR(VRDMA_UAPI_ATTR_QUERY_PD_HANDLE,
					    UVERBS_OBJECT_PD,
					    UVERBS_ACCESS_READ, UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(VRDMA_UAPI_ATTR_QUERY_PD_RESP_PDN,
						UVERBS_ATTR_TYPE(u32),
						UA_MANDATORY));

ADD_UVERBS_METHODS(vrdma_ib_pd, UVERBS_OBJECT_PD,
		   &UVERBS_METHOD(VRDMA_UAPI_METHOD_PD_QUERY));

/* ibv_import_dm(3): where the DM of a handle of this context is mapped. */
static int
UVERBS_HANDLER(VRDMA_UAPI_METHOD_DM_QUERY)(struct uverbs_attr_bundle *attrs)
{
	struct ib_dm *ibdm =
		uverbs_attr_get_obj(attrs, VRDMA_UAPI_ATTR_QUERY_DM_HANDLE);
	u64 offset, length;
	int err;

	if (IS_ERR(ibdm))
		return PTR_ERR(ibdm);
	offset = rdma_user_mmap_get_offset(to_vdm(ibdm)->mmap);
	length = ibdm->length;
	err = uverbs_copy_to(attrs, VRDMA_UAPI_ATTR_QUERY_DM_RESP_MMAP_OFFSET,
			     &offset, sizeof(offset));
	if (err)
		return err;
	return uverbs_copy_to(attrs, VRDMA_UAPI_ATTR_QUERY_DM_RESP_LENGTH,
			      &length, sizeof(length));
}

DECLARE_UVERBS_NAMED_METHOD(VRDMA_UAPI_METHOD_DM_QUERY,
			    UVERBS_ATTR_IDR(VRDMA_UAPI_ATTR_QUERY_DM_HANDLE,
					    UVERBS_OBJECT_DM,
					    UVERBS_ACCESS_READ, UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(VRDMA_UAPI_ATTR_QUERY_DM_RESP_MMAP_OFFSET,
						UVERBS_ATTR_TYPE(u64),
						UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(VRDMA_UAPI_ATTR_QUERY_DM_RESP_LENGTH,
						UVERBS_ATTR_TYPE(u64),
						UA_MANDATORY));

ADD_UVERBS_ATTRIBUTES_SIMPLE(vrdma_ib_dm, UVERBS_OBJECT_DM,
			     UVERBS_METHOD_DM_ALLOC,
			     UVERBS_ATTR_PTR_OUT(VRDMA_UAPI_ATTR_ALLOC_DM_MMAP_OFFSET,
						 UVERBS_ATTR_TYPE(u64),
						 UA_MANDATORY));

ADD_UVERBS_METHODS(vrdma_ib_dm_query, UVERBS_OBJECT_DM,
		   &UVERBS_METHOD(VRDMA_UAPI_METHOD_DM_QUERY));

/* The response is struct vrdma_alloc_ucontext_resp, up to its last field. */
#define VRDMA_UCONTEXT_RESP	struct vrdma_alloc_ucontext_resp
ADD_UVERBS_ATTRIBUTES_SIMPLE(vrdma_ib_query_context, UVERBS_OBJECT_DEVICE,
			     UVERBS_METHOD_QUERY_CONTEXT,
			     UVERBS_ATTR_PTR_OUT(VRDMA_UAPI_ATTR_QUERY_CONTEXT_RESP,
						 UVERBS_ATTR_STRUCT(VRDMA_UCONTEXT_RESP,
								    max_recv_sge),
						 UA_OPTIONAL));

const struct uapi_definition vrdma_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_DM, &vrdma_ib_dm),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_DM, &vrdma_ib_dm_query),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_DEVICE, &vrdma_ib_query_context),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_PD, &vrdma_ib_pd),
	{}
};

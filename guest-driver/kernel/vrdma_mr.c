// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma memory regions (§12): DMA MRs, page-list MRs from pinned user
 * memory, fast-registration MRs whose page list lives in a driver buffer,
 * and the entry points of on-demand paging (vrdma_odp.c).
 */
#include <linux/dma-mapping.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

u32 vrdma_access(int ib_access)
{
	/* The low bits equal enum ib_access_flags (§11). */
	return ib_access & (VRDMA_ACCESS_LOCAL_WRITE |
			    VRDMA_ACCESS_REMOTE_WRITE |
			    VRDMA_ACCESS_REMOTE_READ |
			    VRDMA_ACCESS_REMOTE_ATOMIC |
			    VRDMA_ACCESS_MW_BIND |
			    VRDMA_ACCESS_ZERO_BASED |
			    VRDMA_ACCESS_ON_DEMAND |
			    VRDMA_ACCESS_FLUSH_GLOBAL |
			    VRDMA_ACCESS_FLUSH_PERSISTENT);
}

struct vrdma_mr *vrdma_mr_new(struct vrdma_dev *dev)
{
	struct vrdma_mr *mr = kzalloc(sizeof(*mr), GFP_KERNEL);

	if (!mr)
		return NULL;
	mr->dev = dev;
	xa_init(&mr->children);
	refcount_set(&mr->refs, 1);
	init_completion(&mr->free);
	return mr;
}

void vrdma_mr_set_keys(struct vrdma_mr *mr,
		       const struct vrdma_resp_reg_mr *resp)
{
	mr->ibmr.lkey = le32_to_cpu(resp->lkey);
	mr->ibmr.rkey = le32_to_cpu(resp->rkey);
}

static int vrdma_dereg_cmd(struct vrdma_dev *dev, u32 lkey)
{
	struct vrdma_handle req = { .handle = cpu_to_le32(lkey) };

	return vrdma_cmd(dev, VRDMA_CMD_DEREG_MR, &req, sizeof(req), NULL, 0,
			 NULL, 0);
}

/*
 * Unpin @umem if the device has let go of it (@released), else keep the
 * pages pinned until the device is reset (§14.1): unpinned, they would be
 * reused while the device may still write them.
 */
static void vrdma_umem_retire(struct vrdma_dev *dev, struct ib_umem *umem,
			      bool released)
{
	if (released)
		ib_umem_release(umem);
	else
		vrdma_quarantine_umem(dev, umem);
}

struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_reg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	struct vrdma_mr *mr;
	int err;

	mr = vrdma_mr_new(dev);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.access = cpu_to_le32(vrdma_access(access));
	req.length = cpu_to_le64(U64_MAX);
	err = vrdma_cmd(dev, VRDMA_CMD_REG_DMA_MR, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err) {
		kfree(mr);
		return ERR_PTR(err);
	}
	vrdma_mr_set_keys(mr, &resp);
	return &mr->ibmr;
}

static unsigned long vrdma_pgsz_bitmap(struct vrdma_dev *dev)
{
	unsigned long bitmap = VCFG64(dev, page_size_cap) & ~(SZ_4K - 1UL);

	return bitmap ?: SZ_4K;
}

/*
 * Pin [start, start + length) and describe it as a page list in the largest
 * page size the device and the mapping allow. On success the caller owns
 * *umem and the kvmalloc'ed *plp.
 */
static int vrdma_pin_pages(struct ib_device *ibdev, u64 start, u64 length,
			   u64 virt_addr, int access, struct ib_umem **umem,
			   __le64 **plp, size_t *npages, unsigned int *shift)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	struct ib_block_iter biter;
	unsigned long pgsz;
	size_t i = 0;
	__le64 *pl;

	if (!length || length > VCFG64(dev, max_mr_size))
		return -EINVAL;
	*umem = vrdma_umem_get(ibdev, start, length, access);
	if (IS_ERR(*umem))
		return PTR_ERR(*umem);
	pgsz = ib_umem_find_best_pgsz(*umem, vrdma_pgsz_bitmap(dev), virt_addr);
	if (!pgsz)
		goto err_inval;
	*npages = ib_umem_num_dma_blocks(*umem, pgsz);
	pl = kvmalloc_array(*npages, sizeof(*pl), GFP_KERNEL);
	if (!pl) {
		ib_umem_release(*umem);
		return -ENOMEM;
	}
	rdma_umem_for_each_dma_block(*umem, &biter, pgsz)
		pl[i++] = cpu_to_le64(rdma_block_iter_dma_address(&biter));
	*plp = pl;
	*shift = ilog2(pgsz);
	return 0;

err_inval:
	ib_umem_release(*umem);
	return -EINVAL;
}

struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				u64 virt_addr, int access,
				struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_reg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	struct vrdma_mr *mr;
	unsigned int shift;
	size_t npages;
	__le64 *pl;
	int err;

	if (access & IB_ACCESS_ON_DEMAND) {
		struct ib_mr *ibmr = vrdma_reg_odp_mr(to_vpd(ibpd), start,
						      length, virt_addr, access);

		if (!IS_ERR(ibmr))
			to_vmr(ibmr)->access = access;
		return ibmr;
	}

	mr = vrdma_mr_new(dev);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	err = vrdma_pin_pages(ibpd->device, start, length, virt_addr, access,
			      &mr->umem, &pl, &npages, &shift);
	if (err)
		goto err_free;

	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.access = cpu_to_le32(vrdma_access(access));
	req.iova = cpu_to_le64(virt_addr);
	req.length = cpu_to_le64(length);
	req.page_shift = cpu_to_le32(shift);
	req.npages = cpu_to_le32(npages);
	err = vrdma_cmd(dev, VRDMA_CMD_REG_MR, &req, sizeof(req), pl,
			npages * sizeof(*pl), &resp, sizeof(resp));
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/* After a timeout the device may yet register the pages. */
		vrdma_umem_retire(dev, mr->umem, !vrdma_cmd_unsettled(err));
		goto err_free;
	}
	vrdma_mr_set_keys(mr, &resp);
	mr->access = access;
	return &mr->ibmr;

err_free:
	kfree(mr);
	return ERR_PTR(err);
}

struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			     u32 max_num_sg)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_reg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	struct vrdma_mr *mr;
	int err;

	if (type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EOPNOTSUPP);
	if (!max_num_sg || max_num_sg > VCFG(dev, max_fast_reg_page_list_len))
		return ERR_PTR(-EINVAL);

	mr = vrdma_mr_new(dev);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->pl_max = max_num_sg;
	mr->pl = dma_alloc_coherent(dev->dma_dev, max_num_sg * sizeof(*mr->pl),
				    &mr->pl_dma, GFP_KERNEL);
	if (!mr->pl) {
		err = -ENOMEM;
		goto err_free;
	}
	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.npages = cpu_to_le32(max_num_sg);
	err = vrdma_cmd(dev, VRDMA_CMD_ALLOC_FAST_REG_MR, &req, sizeof(req),
			NULL, 0, &resp, sizeof(resp));
	if (err)
		goto err_pl;
	vrdma_mr_set_keys(mr, &resp);
	return &mr->ibmr;

err_pl:
	dma_free_coherent(dev->dma_dev, max_num_sg * sizeof(*mr->pl), mr->pl,
			  mr->pl_dma);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

static int vrdma_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vrdma_mr *mr = to_vmr(ibmr);

	if (mr->npages == mr->pl_max)
		return -ENOMEM;
	mr->pl[mr->npages++] = cpu_to_le64(addr);
	return 0;
}

int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		    unsigned int *sg_offset)
{
	struct vrdma_mr *mr = to_vmr(ibmr);

	mr->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vrdma_set_page);
}

/*
 * Re-registration in place (§11 REREG_MR): the device swaps PD, access and
 * page list of the MR and keeps its keys, which applications and peers
 * already hold. The pages are pinned again even when only the access changes
 * (a new write permission needs writable pins). On failure the MR is as it
 * was. ODP MRs are not re-registered (their translation lives in the device's
 * fault path, not in a page list).
 */
struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start,
				  u64 length, u64 virt_addr, int access,
				  struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibmr->device);
	struct vrdma_mr *mr = to_vmr(ibmr);
	struct vrdma_cmd_rereg_mr req = {};
	struct vrdma_resp_reg_mr resp;
	struct ib_umem *umem;
	unsigned int shift;
	size_t npages;
	__le64 *pl;
	int err;

	if (!mr->umem || mr->odp)
		return ERR_PTR(-EOPNOTSUPP);
	if (!(flags & IB_MR_REREG_PD))
		ibpd = ibmr->pd;
	if (!(flags & IB_MR_REREG_ACCESS))
		access = mr->access;
	if (access & IB_ACCESS_ON_DEMAND)
		return ERR_PTR(-EOPNOTSUPP);
	if (!(flags & IB_MR_REREG_TRANS)) {
		start = mr->umem->address;
		length = mr->umem->length;
		virt_addr = ibmr->iova;
	}

	err = vrdma_pin_pages(ibmr->device, start, length, virt_addr, access,
			      &umem, &pl, &npages, &shift);
	if (err)
		return ERR_PTR(err);
	req.key = cpu_to_le32(ibmr->lkey);
	req.pdn = cpu_to_le32(to_vpd(ibpd)->pdn);
	req.access = cpu_to_le32(vrdma_access(access));
	req.iova = cpu_to_le64(virt_addr);
	req.length = cpu_to_le64(length);
	req.page_shift = cpu_to_le32(shift);
	req.npages = cpu_to_le32(npages);
	err = vrdma_cmd(dev, VRDMA_CMD_REREG_MR, &req, sizeof(req), pl,
			npages * sizeof(*pl), &resp, sizeof(resp));
	vrdma_cmd_tail_free(dev, pl, err);
	if (err) {
		/*
		 * After a timeout the device may yet switch to the new pages
		 * (the old ones stay in mr->umem until DEREG_MR succeeds).
		 */
		vrdma_umem_retire(dev, umem, !vrdma_cmd_unsettled(err));
		return ERR_PTR(err);
	}
	/* The device no longer reaches the old pages: unpin them. */
	ib_umem_release(mr->umem);
	mr->umem = umem;
	mr->access = access;
	return NULL;
}

int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_mr *mr = to_vmr(ibmr);
	struct vrdma_dev *dev = mr->dev;
	size_t pl_size = mr->pl_max * sizeof(*mr->pl);
	bool released;
	int err;

	/* A DM MR of length 0 was never registered (vrdma_reg_dm_mr). */
	if (mr->dm && !ibmr->lkey) {
		kfree(mr);
		return 0;
	}
	if (mr->odp)
		vrdma_odp_unpublish(mr);
	err = vrdma_dereg_cmd(dev, ibmr->lkey);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DEREG_MR %#x: %d\n", ibmr->lkey,
			 err);
	released = vrdma_released(err);
	/*
	 * ODP pages belong to the process and cannot be held back: only a
	 * reset protects them from a device that does not answer.
	 */
	if (mr->odp)
		vrdma_odp_dereg(mr);
	else if (mr->umem)
		vrdma_umem_retire(dev, mr->umem, released);
	else if (mr->dm && !released)
		/* vrdma_dealloc_dm then keeps the pages until a reset */
		WRITE_ONCE(mr->dm->unsettled, true);
	/* The device reads the page list when a REG_MR WQE is executed. */
	if (mr->pl && released)
		dma_free_coherent(dev->dma_dev, pl_size, mr->pl, mr->pl_dma);
	else if (mr->pl)
		vrdma_quarantine_coherent(dev, mr->pl, mr->pl_dma, pl_size);
	kfree(mr);
	return 0;
}

/*
 * The device accepts the key of an MR in any PD (§11.8 ADVISE_MR), so the
 * PD check is the driver's: without it a process could make the device
 * fault in (and, for PREFETCH_WRITE, map writable) pages of another
 * context's ODP MR. Only ODP MRs can be advised (the device does nothing
 * for the others), and the driver knows each of them in dev->odp_mrs.
 * Every SGE is checked before the first command is sent, so a rejected
 * call has no effect; the references keep each MR, and with it its key,
 * registered until the commands are done.
 *
 * Errors follow ibv_advise_mr(3): EFAULT for an lkey that is invalid (not
 * an ODP MR of @ibpd) or without write access for PREFETCH_WRITE.
 */
static int vrdma_advise_get_mrs(struct vrdma_dev *dev, struct ib_pd *ibpd,
				bool write, const struct ib_sge *sg_list,
				u32 num_sge, struct vrdma_mr **mrs)
{
	u32 i;

	for (i = 0; i < num_sge; i++) {
		mrs[i] = vrdma_odp_mr_get(dev, sg_list[i].lkey);
		if (!mrs[i] || mrs[i]->ibmr.pd != ibpd ||
		    (write && !mrs[i]->umem->writable))
			goto err;
	}
	return 0;
err:
	if (mrs[i])
		vrdma_odp_mr_put(mrs[i]);
	while (i--)
		vrdma_odp_mr_put(mrs[i]);
	return -EFAULT;
}

int vrdma_advise_mr(struct ib_pd *ibpd, enum ib_uverbs_advise_mr_advice advice,
		    u32 flags, struct ib_sge *sg_list, u32 num_sge,
		    struct uverbs_attr_bundle *attrs)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_cmd_advise_mr req = {};
	bool write = false;
	struct vrdma_mr **mrs;
	u32 i;
	int err = 0;

	if (!dev->has_odp)
		return -EOPNOTSUPP;
	switch (advice) {
	case IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH:
		req.advice = cpu_to_le32(VRDMA_ADVISE_PREFETCH);
		break;
	case IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE:
		req.advice = cpu_to_le32(VRDMA_ADVISE_PREFETCH_WRITE);
		write = true;
		break;
	case IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT:
		req.advice = cpu_to_le32(VRDMA_ADVISE_PREFETCH_NO_FAULT);
		break;
	default:
		return -EOPNOTSUPP;
	}
	if (flags & ~IB_UVERBS_ADVISE_MR_FLAG_FLUSH)
		return -EOPNOTSUPP;
	if (flags & IB_UVERBS_ADVISE_MR_FLAG_FLUSH)
		req.flags = cpu_to_le32(VRDMA_ADVISE_F_FLUSH);
	if (!num_sge)
		return 0;

	mrs = kcalloc(num_sge, sizeof(*mrs), GFP_KERNEL);
	if (!mrs)
		return -ENOMEM;
	err = vrdma_advise_get_mrs(dev, ibpd, write, sg_list, num_sge, mrs);
	if (err)
		goto out_free;

	for (i = 0; i < num_sge && !err; i++) {
		req.lkey = cpu_to_le32(sg_list[i].lkey);
		req.iova = cpu_to_le64(sg_list[i].addr);
		req.length = cpu_to_le64(sg_list[i].length);
		err = vrdma_cmd(dev, VRDMA_CMD_ADVISE_MR, &req, sizeof(req),
				NULL, 0, NULL, 0);
	}
	for (i = 0; i < num_sge; i++)
		vrdma_odp_mr_put(mrs[i]);
out_free:
	kfree(mrs);
	return err;
}

/*
 * Memory windows (§12.8). The device keeps the window; binding is a BIND_MW
 * WQE that libvrdma posts on a QP (for type 1 on behalf of ibv_bind_mw), and
 * kernel ULPs have no bind verb, so the kernel only allocates and frees.
 */
int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibmw->device);
	struct vrdma_cmd_alloc_mw req = {
		.pdn = cpu_to_le32(to_vpd(ibmw->pd)->pdn),
	};
	struct vrdma_handle resp;
	int err;

	switch (ibmw->type) {
	case IB_MW_TYPE_1:
		req.type = cpu_to_le32(VRDMA_MW_TYPE_1);
		break;
	case IB_MW_TYPE_2:
		req.type = cpu_to_le32(VRDMA_MW_TYPE_2);
		break;
	default:
		return -EINVAL;
	}
	err = vrdma_cmd(dev, VRDMA_CMD_ALLOC_MW, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err)
		return err;
	ibmw->rkey = le32_to_cpu(resp.handle);
	return 0;
}

int vrdma_dealloc_mw(struct ib_mw *ibmw)
{
	struct vrdma_dev *dev = to_vdev(ibmw->device);
	struct vrdma_handle req = { .handle = cpu_to_le32(ibmw->rkey) };
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_DEALLOC_MW, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DEALLOC_MW %#x: %d\n", ibmw->rkey,
			 err);
	/* A window holds no guest memory: the core may free it regardless. */
	return 0;
}

// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma device memory (ibv_alloc_dm(3)) and imported objects
 * (ibv_import_device(3), ibv_import_pd, ibv_import_mr, ibv_import_dm).
 *
 * vrdma.ko allocates device memory as zeroed guest pages and hands out
 * their mmap offset (vrdma_uapi.h); ibv_memcpy_to_dm / _from_dm are copies
 * into and out of that mapping, in 4-byte units as on hardware DM, so
 * applications written against vrdma keep working there. ibv_reg_dm_mr
 * registers an MR over it with iova 0 (IBV_ACCESS_ZERO_BASED).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vrdma.h"

static bool vrdma_dm_range_ok(const struct vrdma_dm *dm, uint64_t offset,
			      size_t length)
{
	return !(offset % VRDMA_DM_ACCESS_ALIGN) &&
	       !(length % VRDMA_DM_ACCESS_ALIGN) && offset <= dm->length &&
	       length <= dm->length - offset;
}

static int vrdma_memcpy_to_dm(struct ibv_dm *ibdm, uint64_t dm_offset,
			      const void *host_addr, size_t length)
{
	struct vrdma_dm *dm = to_vdm(ibdm);

	if (!vrdma_dm_range_ok(dm, dm_offset, length))
		return EINVAL;
	memcpy((uint8_t *)dm->map + dm_offset, host_addr, length);
	return 0;
}

static int vrdma_memcpy_from_dm(void *host_addr, struct ibv_dm *ibdm,
				uint64_t dm_offset, size_t length)
{
	struct vrdma_dm *dm = to_vdm(ibdm);

	if (!vrdma_dm_range_ok(dm, dm_offset, length))
		return EINVAL;
	memcpy(host_addr, (const uint8_t *)dm->map + dm_offset, length);
	return 0;
}

struct ibv_dm *vrdma_alloc_dm(struct ibv_context *ctx,
			      struct ibv_alloc_dm_attr *attr)
{
	DECLARE_COMMAND_BUFFER(cmdb, UVERBS_OBJECT_DM, UVERBS_METHOD_DM_ALLOC,
			       1);
	long page = sysconf(_SC_PAGESIZE);
	uint64_t offset = 0;
	struct vrdma_dm *dm;
	int ret;

	if (attr->comp_mask) {
		errno = EINVAL;
		return NULL;
	}
	if (!attr->length || page <= 0 || attr->length > SIZE_MAX - page) {
		errno = EINVAL;
		return NULL;
	}
	dm = calloc(1, sizeof(*dm));
	if (!dm) {
		errno = ENOMEM;
		return NULL;
	}
	fill_attr_out_ptr(cmdb, VRDMA_UAPI_ATTR_ALLOC_DM_MMAP_OFFSET, &offset);
	ret = ibv_cmd_alloc_dm(ctx, attr, &dm->vdm, cmdb);
	if (ret)
		goto err_free;

	dm->length = attr->length;
	dm->map_size = (attr->length + page - 1) & ~((uint64_t)page - 1);
	dm->map = mmap(NULL, dm->map_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		       ctx->cmd_fd, offset);
	if (dm->map == MAP_FAILED) {
		ret = errno;
		goto err_cmd;
	}
	dm->vdm.dm.memcpy_to_dm = vrdma_memcpy_to_dm;
	dm->vdm.dm.memcpy_from_dm = vrdma_memcpy_from_dm;
	return &dm->vdm.dm;

err_cmd:
	ibv_cmd_free_dm(&dm->vdm);
err_free:
	free(dm);
	errno = ret;
	return NULL;
}

int vrdma_free_dm(struct ibv_dm *ibdm)
{
	struct vrdma_dm *dm = to_vdm(ibdm);
	int ret;

	ret = ibv_cmd_free_dm(&dm->vdm);
	if (ret)
		return ret;
	munmap(dm->map, dm->map_size);
	free(dm);
	return 0;
}

struct ibv_mr *vrdma_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *ibdm,
			       uint64_t dm_offset, size_t length,
			       unsigned int access)
{
	struct vrdma_dm *dm = to_vdm(ibdm);
	struct verbs_mr *vmr;
	int ret;

	/*
	 * The kernel checks the range, and that dm_offset is page-aligned:
	 * it maps iova 0 to the start of a page (device-spec §11.8).
	 */
	vmr = calloc(1, sizeof(*vmr));
	if (!vmr) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_reg_dm_mr(pd, &dm->vdm, dm_offset, length, access, vmr,
				NULL);
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

/* Imported objects -------------------------------------------------------- */

/* The DM of a handle of this (imported) context, mapped once more. */
struct ibv_dm *vrdma_import_dm(struct ibv_context *ctx, uint32_t dm_handle)
{
	DECLARE_COMMAND_BUFFER(cmdb, UVERBS_OBJECT_DM,
			       VRDMA_UAPI_METHOD_DM_QUERY, 3);
	long page = sysconf(_SC_PAGESIZE);
	uint64_t offset, length;
	struct vrdma_dm *dm;
	int ret;

	dm = calloc(1, sizeof(*dm));
	if (!dm) {
		errno = ENOMEM;
		return NULL;
	}
	fill_attr_in_obj(cmdb, VRDMA_UAPI_ATTR_QUERY_DM_HANDLE, dm_handle);
	fill_attr_out_ptr(cmdb, VRDMA_UAPI_ATTR_QUERY_DM_RESP_MMAP_OFFSET,
			  &offset);
	fill_attr_out_ptr(cmdb, VRDMA_UAPI_ATTR_QUERY_DM_RESP_LENGTH, &length);
	ret = execute_ioctl(ctx, cmdb);
	if (ret)
		goto err;
	if (!length || page <= 0 || length > SIZE_MAX - page) {
		ret = EINVAL;
		goto err;
	}
	dm->length = length;
	dm->map_size = (length + page - 1) & ~((uint64_t)page - 1);
	dm->map = mmap(NULL, dm->map_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		       ctx->cmd_fd, offset);
	if (dm->map == MAP_FAILED) {
		ret = errno;
		goto err;
	}
	dm->vdm.handle = dm_handle;
	dm->vdm.dm.handle = dm_handle;
	dm->vdm.dm.comp_mask = IBV_DM_MASK_HANDLE;
	dm->vdm.dm.context = ctx;
	dm->vdm.dm.memcpy_to_dm = vrdma_memcpy_to_dm;
	dm->vdm.dm.memcpy_from_dm = vrdma_memcpy_from_dm;
	return &dm->vdm.dm;

err:
	free(dm);
	errno = ret;
	return NULL;
}

/* Only the provider's object goes; the DM stays with its owner. */
void vrdma_unimport_dm(struct ibv_dm *ibdm)
{
	struct vrdma_dm *dm = to_vdm(ibdm);

	munmap(dm->map, dm->map_size);
	free(dm);
}

struct ibv_pd *vrdma_import_pd(struct ibv_context *ctx, uint32_t pd_handle)
{
	DECLARE_COMMAND_BUFFER(cmdb, UVERBS_OBJECT_PD,
			       VRDMA_UAPI_METHOD_PD_QUERY, 2);
	struct vrdma_pd *pd;
	uint32_t pdn;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	/* The kernel checks that the handle names a PD of this context. */
	fill_attr_in_obj(cmdb, VRDMA_UAPI_ATTR_QUERY_PD_HANDLE, pd_handle);
	fill_attr_out_ptr(cmdb, VRDMA_UAPI_ATTR_QUERY_PD_RESP_PDN, &pdn);
	ret = execute_ioctl(ctx, cmdb);
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	pd->ibv_pd.context = ctx;
	pd->ibv_pd.handle = pd_handle;
	return &pd->ibv_pd;
}

void vrdma_unimport_pd(struct ibv_pd *ibpd)
{
	free(to_vpd(ibpd));
}

struct ibv_mr *vrdma_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr) {
		errno = ENOMEM;
		return NULL;
	}
	ret = ibv_cmd_query_mr(pd, vmr, mr_handle);
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

void vrdma_unimport_mr(struct ibv_mr *mr)
{
	free(container_of(mr, struct verbs_mr, ibv_mr));
}

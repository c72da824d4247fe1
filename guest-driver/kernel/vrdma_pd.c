// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma protection domains (§11: CREATE_PD, DESTROY_PD).
 */
#include "vrdma.h"

int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = to_vpd(ibpd);
	struct vrdma_handle req = {}, resp;
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_CREATE_PD, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err)
		return err;
	pd->pdn = le32_to_cpu(resp.handle);
	return 0;
}

int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_handle req = { .handle = cpu_to_le32(to_vpd(ibpd)->pdn) };
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_DESTROY_PD, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DESTROY_PD %u: %d\n",
			 to_vpd(ibpd)->pdn, err);
	/* The core frees the PD whatever we return; keep going. */
	return 0;
}

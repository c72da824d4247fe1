// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma protection domains (§11: CREATE_PD, DESTROY_PD) and XRC domains
 * (§13.7: ALLOC_XRCD, DEALLOC_XRCD).
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

int vrdma_alloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibxrcd->device);
	struct vrdma_handle req = {}, resp;
	int err;

	if (!(VCFG(dev, device_caps) & VRDMA_DEVCAP_XRC))
		return -EOPNOTSUPP;
	err = vrdma_cmd(dev, VRDMA_CMD_ALLOC_XRCD, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err)
		return err;
	to_vxrcd(ibxrcd)->xrcdn = le32_to_cpu(resp.handle);
	return 0;
}

int vrdma_dealloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibxrcd->device);
	u32 xrcdn = to_vxrcd(ibxrcd)->xrcdn;
	struct vrdma_handle req = { .handle = cpu_to_le32(xrcdn) };
	int err;

	err = vrdma_cmd(dev, VRDMA_CMD_DEALLOC_XRCD, &req, sizeof(req), NULL, 0,
			NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn(&dev->vdev->dev, "DEALLOC_XRCD %u: %d\n", xrcdn, err);
	/* As DESTROY_PD: the core frees the XRCD whatever we return. */
	return 0;
}

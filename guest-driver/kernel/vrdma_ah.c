// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma address handles (§11: CREATE_AH, DESTROY_AH). Kernel AHs may be
 * created and destroyed in atomic context (the MAD layer does), so those
 * commands use the polling path of the control queue.
 */
#include <linux/etherdevice.h>
#include <linux/if_vlan.h>
#include <rdma/ib_cache.h>

#include "vrdma.h"

void vrdma_fill_av(struct vrdma_av *av, const struct rdma_ah_attr *attr)
{
	const struct ib_global_route *grh = rdma_ah_read_grh(attr);
	u16 vlan_id = VRDMA_VLAN_NONE;

	memset(av, 0, sizeof(*av));
	memcpy(av->dgid, grh->dgid.raw, sizeof(av->dgid));
	/*
	 * The flow label is 20 bits (§11.5); ULPs may pass all ones for "any"
	 * (UCX does), which hardware drivers mask as well.
	 */
	av->flow_label = cpu_to_le32(grh->flow_label & IB_GRH_FLOWLABEL_MASK);
	av->sgid_index = grh->sgid_index;
	av->hop_limit = grh->hop_limit;
	av->traffic_class = grh->traffic_class;
	av->sl = rdma_ah_get_sl(attr);
	if (attr->type == RDMA_AH_ATTR_TYPE_ROCE)
		ether_addr_copy(av->dmac, attr->roce.dmac);
	if (grh->sgid_attr &&
	    rdma_read_gid_l2_fields(grh->sgid_attr, &vlan_id, NULL))
		vlan_id = VRDMA_VLAN_NONE;
	if (vlan_id >= VLAN_N_VID)
		vlan_id = VRDMA_VLAN_NONE;
	av->vlan_id = cpu_to_le16(vlan_id);
}

int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init,
		    struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct vrdma_ah *ah = to_vah(ibah);
	struct vrdma_cmd_create_ah req = {};
	struct vrdma_create_ah_resp uresp = {};
	struct vrdma_handle resp;
	int err;

	if (!(rdma_ah_get_ah_flags(init->ah_attr) & IB_AH_GRH))
		return -EINVAL;
	req.pdn = cpu_to_le32(to_vpd(ibah->pd)->pdn);
	vrdma_fill_av(&req.av, init->ah_attr);

	if (init->flags & RDMA_CREATE_AH_SLEEPABLE)
		err = vrdma_cmd(dev, VRDMA_CMD_CREATE_AH, &req, sizeof(req),
				NULL, 0, &resp, sizeof(resp));
	else
		err = vrdma_cmd_atomic(dev, VRDMA_CMD_CREATE_AH, &req,
				       sizeof(req), &resp, sizeof(resp));
	if (err)
		return err;
	ah->ah_index = le32_to_cpu(resp.handle);

	if (udata && udata->outlen) {
		uresp.ah_index = ah->ah_index;
		err = ib_copy_to_udata(udata, &uresp,
				       min(udata->outlen, sizeof(uresp)));
		if (err) {
			vrdma_destroy_ah(ibah, RDMA_DESTROY_AH_SLEEPABLE);
			return err;
		}
	}
	return 0;
}

int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct vrdma_handle req = {
		.handle = cpu_to_le32(to_vah(ibah)->ah_index),
	};
	int err;

	if (flags & RDMA_DESTROY_AH_SLEEPABLE)
		err = vrdma_cmd(dev, VRDMA_CMD_DESTROY_AH, &req, sizeof(req),
				NULL, 0, NULL, 0);
	else
		err = vrdma_cmd_atomic(dev, VRDMA_CMD_DESTROY_AH, &req,
				       sizeof(req), NULL, 0);
	if (err && err != -EIO && err != -ETIMEDOUT)
		dev_warn_ratelimited(&dev->vdev->dev, "DESTROY_AH %u: %d\n",
				     to_vah(ibah)->ah_index, err);
	return 0;
}

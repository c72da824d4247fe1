// SPDX-License-Identifier: GPL-2.0
/*
 * UD multicast (device spec §15.8): a UD QP joins a group GID on the
 * device. Joining the group on the network (IGMP/MLD) is done by the
 * network stack through the netdev, e.g. by the RDMA CM.
 */

#include "vrdma.h"

static int vrdma_mcast_cmd(struct ib_qp *ibqp, const union ib_gid *gid,
			   u16 opcode)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_cmd_mcast req = {
		.qpn = cpu_to_le32(to_vqp(ibqp)->qpn),
	};

	if (!VCFG(dev, max_mcast_grp))
		return -EOPNOTSUPP;
	memcpy(req.gid, gid->raw, sizeof(req.gid));
	return vrdma_cmd(dev, opcode, &req, sizeof(req), NULL, 0, NULL, 0);
}

int vrdma_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return vrdma_mcast_cmd(ibqp, gid, VRDMA_CMD_ATTACH_MCAST);
}

int vrdma_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	return vrdma_mcast_cmd(ibqp, gid, VRDMA_CMD_DETACH_MCAST);
}

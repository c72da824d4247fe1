// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma device, port and context verbs, and the ib_device_ops table.
 */
#include <linux/etherdevice.h>
#include <rdma/ib_addr.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_mad.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma.h"

int vrdma_query_device(struct ib_device *ibdev, struct ib_device_attr *attr,
		       struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibdev);

	memset(attr, 0, sizeof(*attr));
	attr->fw_ver = VCFG64(dev, fw_ver);
	attr->sys_image_guid = cpu_to_be64(VCFG64(dev, node_guid));
	attr->max_mr_size = VCFG64(dev, max_mr_size);
	/* A driver object in guest RAM (vrdma_dm.c), whatever the device. */
	attr->max_dm_size = VRDMA_DM_MAX_SIZE;
	attr->page_size_cap = VCFG64(dev, page_size_cap) & ~(u64)(SZ_4K - 1);
	if (!attr->page_size_cap)
		attr->page_size_cap = SZ_4K;
	attr->vendor_id = VCFG(dev, vendor_id);
	attr->vendor_part_id = VCFG(dev, vendor_part_id);
	attr->hw_ver = VCFG(dev, hw_ver);
	attr->max_qp = VCFG(dev, max_qp);
	attr->max_qp_wr = VCFG(dev, max_qp_wr);
	attr->device_cap_flags = IB_DEVICE_MEM_MGT_EXTENSIONS |
				 IB_DEVICE_RC_RNR_NAK_GEN |
				 IB_DEVICE_SYS_IMAGE_GUID |
				 IB_DEVICE_PORT_ACTIVE_EVENT |
				 IB_DEVICE_N_NOTIFY_CQ;
	attr->device_cap_flags |= vrdma_ibta15_cap_flags(VCFG(dev, device_caps));
	/* §2.2: a nonzero max_mw offers both window types (§12.8). */
	if (VCFG(dev, max_mw))
		attr->device_cap_flags |= IB_DEVICE_MEM_WINDOW |
					  IB_DEVICE_MEM_WINDOW_TYPE_2B;
	if (VCFG(dev, device_caps) & VRDMA_DEVCAP_SRQ_RESIZE)
		attr->device_cap_flags |= IB_DEVICE_SRQ_RESIZE;
	if (VCFG(dev, device_caps) & VRDMA_DEVCAP_XRC)
		attr->device_cap_flags |= IB_DEVICE_XRC;
	if (VCFG(dev, device_caps) & VRDMA_DEVCAP_CQ_MODERATION) {
		attr->cq_caps.max_cq_moderation_count = U16_MAX;
		attr->cq_caps.max_cq_moderation_period = U16_MAX;
	}
	attr->max_send_sge = VCFG(dev, max_send_sge);
	attr->max_recv_sge = VCFG(dev, max_recv_sge);
	attr->max_sge_rd = attr->max_send_sge;
	attr->max_cq = VCFG(dev, max_cq);
	attr->max_cqe = VCFG(dev, max_cqe);
	attr->max_mr = VCFG(dev, max_mr);
	attr->max_pd = VCFG(dev, max_pd);
	attr->max_qp_rd_atom = VCFG(dev, max_qp_rd_atom);
	attr->max_qp_init_rd_atom = VCFG(dev, max_qp_init_rd_atom);
	attr->max_res_rd_atom = attr->max_qp * attr->max_qp_rd_atom;
	attr->max_srq = VCFG(dev, max_srq);
	attr->max_srq_wr = VCFG(dev, max_srq_wr);
	attr->max_srq_sge = VCFG(dev, max_srq_sge);
	attr->max_ah = VCFG(dev, max_ah);
	attr->max_mw = VCFG(dev, max_mw);
	attr->max_mcast_grp = VCFG(dev, max_mcast_grp);
	attr->max_mcast_qp_attach = VCFG(dev, max_mcast_qp_attach);
	attr->max_total_mcast_qp_attach =
		attr->max_mcast_grp * attr->max_mcast_qp_attach;
	attr->max_fast_reg_page_list_len = VCFG(dev, max_fast_reg_page_list_len);
	attr->max_pkeys = 1;
	attr->local_ca_ack_delay = 15;
	switch (VCFG(dev, atomic_cap)) {
	case VRDMA_ATOMIC_HCA:
		attr->atomic_cap = IB_ATOMIC_HCA;
		break;
	case VRDMA_ATOMIC_GLOB:
		attr->atomic_cap = IB_ATOMIC_GLOB;
		break;
	default:
		attr->atomic_cap = IB_ATOMIC_NONE;
		break;
	}
	attr->masked_atomic_cap = IB_ATOMIC_NONE;

	if (dev->has_odp) {
		u32 general = VCFG(dev, odp_general_caps);

		attr->kernel_cap_flags |= IBK_ON_DEMAND_PAGING;
		attr->odp_caps.general_caps = IB_ODP_SUPPORT;
		if (dev->has_odp_implicit &&
		    (general & VRDMA_ODP_SUPPORT_IMPLICIT))
			attr->odp_caps.general_caps |= IB_ODP_SUPPORT_IMPLICIT;
		/* Same bit values as IB_ODP_SUPPORT_* (§2.2). */
		attr->odp_caps.per_transport_caps.rc_odp_caps =
			VCFG(dev, odp_rc_caps);
		attr->odp_caps.per_transport_caps.uc_odp_caps =
			VCFG(dev, odp_uc_caps);
		attr->odp_caps.per_transport_caps.ud_odp_caps =
			VCFG(dev, odp_ud_caps);
		/* XRC has RC's responder and so RC's ODP caps (§13.7). */
		if (VCFG(dev, device_caps) & VRDMA_DEVCAP_XRC)
			attr->odp_caps.per_transport_caps.xrc_odp_caps =
				VCFG(dev, odp_rc_caps);
	}
	return 0;
}

static int vrdma_query_port(struct ib_device *ibdev, u32 port,
			    struct ib_port_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	bool active = READ_ONCE(dev->port_state) == VRDMA_PORT_ACTIVE;
	unsigned int mtu = dev->netdev ? READ_ONCE(dev->netdev->mtu) :
					 ETH_DATA_LEN;

	if (port != 1)
		return -EINVAL;
	attr->state = active ? IB_PORT_ACTIVE : IB_PORT_DOWN;
	attr->phys_state = active ? IB_PORT_PHYS_STATE_LINK_UP :
				    IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = IB_MTU_4096;
	attr->active_mtu = iboe_get_mtu(mtu);
	attr->gid_tbl_len = VCFG(dev, max_gid);
	attr->port_cap_flags = IB_PORT_CM_SUP;
	attr->max_msg_sz = VCFG(dev, max_msg_sz);
	attr->pkey_tbl_len = 1;
	attr->active_width = IB_WIDTH_4X;
	attr->active_speed = IB_SPEED_QDR;
	attr->max_vl_num = 1;
	return 0;
}

static int vrdma_get_port_immutable(struct ib_device *ibdev, u32 port,
				    struct ib_port_immutable *immutable)
{
	struct ib_port_attr attr = {};
	int err;

	err = ib_query_port(ibdev, port, &attr);
	if (err)
		return err;
	immutable->pkey_tbl_len = attr.pkey_tbl_len;
	immutable->gid_tbl_len = attr.gid_tbl_len;
	immutable->core_cap_flags = RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
	immutable->max_mad_size = IB_MGMT_MAD_SIZE;
	return 0;
}

static enum rdma_link_layer vrdma_get_link_layer(struct ib_device *ibdev,
						 u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int vrdma_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			    u16 *pkey)
{
	if (index > 0)
		return -EINVAL;
	*pkey = IB_DEFAULT_PKEY_FULL;
	return 0;
}

static int vrdma_query_gid(struct ib_device *ibdev, u32 port, int index,
			   union ib_gid *gid)
{
	const struct ib_gid_attr *attr;

	attr = rdma_get_gid_attr(ibdev, port, index);
	if (IS_ERR(attr))
		return PTR_ERR(attr);
	*gid = attr->gid;
	rdma_put_gid_attr(attr);
	return 0;
}

static int vrdma_gid_cmd(const struct ib_gid_attr *attr, u16 opcode)
{
	struct vrdma_dev *dev = to_vdev(attr->device);
	struct vrdma_cmd_gid req = {};

	req.index = cpu_to_le32(attr->index);
	req.type = cpu_to_le32(attr->gid_type == IB_GID_TYPE_ROCE ?
			       VRDMA_GID_TYPE_ROCE_V1 :
			       VRDMA_GID_TYPE_ROCE_V2);
	memcpy(req.gid, attr->gid.raw, sizeof(req.gid));
	return vrdma_cmd(dev, opcode, &req, sizeof(req), NULL, 0, NULL, 0);
}

static int vrdma_add_gid(const struct ib_gid_attr *attr, void **context)
{
	return vrdma_gid_cmd(attr, VRDMA_CMD_ADD_GID);
}

static int vrdma_del_gid(const struct ib_gid_attr *attr, void **context)
{
	int err = vrdma_gid_cmd(attr, VRDMA_CMD_DEL_GID);

	/* A dead device has no GIDs left to delete. */
	return err == -EIO || err == -ETIMEDOUT ? 0 : err;
}

void vrdma_fill_ucontext_resp(struct vrdma_dev *dev,
			      struct vrdma_alloc_ucontext_resp *resp)
{
	resp->abi_version = VRDMA_UVERBS_ABI_VERSION;
	resp->max_inline_data = VCFG(dev, max_inline_data);
	resp->max_send_sge = VCFG(dev, max_send_sge);
	resp->max_recv_sge = VCFG(dev, max_recv_sge);
}

static int vrdma_alloc_ucontext(struct ib_ucontext *uctx,
				struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(uctx->device);
	struct vrdma_alloc_ucontext_resp resp = {};

	/*
	 * Allowed on a broken device: it needs no command, and lets tools
	 * such as ibv_devinfo show the port down; every command fails.
	 */
	vrdma_fill_ucontext_resp(dev, &resp);
	return ib_copy_to_udata(udata, &resp, min(udata->outlen, sizeof(resp)));
}

static void vrdma_dealloc_ucontext(struct ib_ucontext *uctx)
{
}

/*
 * Rings are ordinary pages whose references the mappings hold, so nothing
 * has to be revoked when the device goes away under a process.
 */
static void vrdma_disassociate_ucontext(struct ib_ucontext *uctx)
{
}

static void vrdma_get_dev_fw_str(struct ib_device *ibdev, char *str)
{
	struct vrdma_dev *dev = to_vdev(ibdev);

	snprintf(str, IB_FW_VERSION_NAME_MAX, "%llu", VCFG64(dev, fw_ver));
}

const struct ib_device_ops vrdma_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = VRDMA_UVERBS_ABI_VERSION,

	.add_gid = vrdma_add_gid,
	.advise_mr = vrdma_advise_mr,
	.alloc_dm = vrdma_alloc_dm,
	.alloc_hw_device_stats = vrdma_alloc_hw_device_stats,
	.alloc_hw_port_stats = vrdma_alloc_hw_port_stats,
	.alloc_mr = vrdma_alloc_mr,
	.alloc_mw = vrdma_alloc_mw,
	.alloc_pd = vrdma_alloc_pd,
	.alloc_xrcd = vrdma_alloc_xrcd,
	.alloc_ucontext = vrdma_alloc_ucontext,
	.attach_mcast = vrdma_attach_mcast,
	.counter_alloc_stats = vrdma_counter_alloc_stats,
	.counter_bind_qp = vrdma_ib_counter_bind_qp,
	.counter_dealloc = vrdma_counter_dealloc,
	.counter_unbind_qp = vrdma_ib_counter_unbind_qp,
	.counter_update_stats = vrdma_counter_update_stats,
	.create_ah = vrdma_create_ah,
	.create_cq = vrdma_ib_create_cq,
	.create_qp = vrdma_create_qp,
	.create_srq = vrdma_create_srq,
	.create_user_ah = vrdma_create_ah,
	.dealloc_dm = vrdma_dealloc_dm,
	.dealloc_mw = vrdma_dealloc_mw,
	.dealloc_pd = vrdma_dealloc_pd,
	.dealloc_xrcd = vrdma_dealloc_xrcd,
	.dealloc_ucontext = vrdma_dealloc_ucontext,
	.del_gid = vrdma_del_gid,
	.dereg_mr = vrdma_dereg_mr,
	.destroy_ah = vrdma_destroy_ah,
	.detach_mcast = vrdma_detach_mcast,
	.destroy_cq = vrdma_destroy_cq,
	.destroy_qp = vrdma_destroy_qp,
	.destroy_srq = vrdma_destroy_srq,
	.disassociate_ucontext = vrdma_disassociate_ucontext,
	.drain_rq = vrdma_drain_rq,
	.drain_sq = vrdma_drain_sq,
	.get_dev_fw_str = vrdma_get_dev_fw_str,
	.get_dma_mr = vrdma_get_dma_mr,
	.get_hw_stats = vrdma_get_hw_stats,
	.get_link_layer = vrdma_get_link_layer,
	.get_port_immutable = vrdma_get_port_immutable,
	.map_mr_sg = vrdma_map_mr_sg,
	.mmap = vrdma_mmap,
	.mmap_free = vrdma_mmap_free,
	.modify_cq = vrdma_modify_cq,
	.modify_qp = vrdma_modify_qp,
	.modify_srq = vrdma_modify_srq,
	.poll_cq = vrdma_poll_cq,
	.post_recv = vrdma_post_recv,
	.post_send = vrdma_post_send,
	.post_srq_recv = vrdma_post_srq_recv,
	.query_device = vrdma_query_device,
	.query_gid = vrdma_query_gid,
	.query_pkey = vrdma_query_pkey,
	.query_port = vrdma_query_port,
	.query_qp = vrdma_query_qp,
	.query_ucontext = vrdma_query_ucontext,
	.query_srq = vrdma_query_srq,
	.reg_dm_mr = vrdma_reg_dm_mr,
	.reg_user_mr = vrdma_ib_reg_user_mr,
	.rereg_user_mr = vrdma_rereg_user_mr,
	.req_notify_cq = vrdma_req_notify_cq,
	.VRDMA_RESIZE_CQ_OP = vrdma_ib_resize_cq,

	INIT_RDMA_OBJ_SIZE(ib_ah, vrdma_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, vrdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vrdma_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vrdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vrdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vrdma_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vrdma_ucontext, ibuc),
	INIT_RDMA_OBJ_SIZE(ib_xrcd, vrdma_xrcd, ibxrcd),
};

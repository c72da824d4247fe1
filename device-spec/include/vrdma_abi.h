/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * vrdma device ABI, version 1.
 *
 * This header is normative together with device-spec/virtio-rdma.md; section
 * numbers in comments refer to that document. The Rust mirror lives in
 * device-spec/src/lib.rs and tests/abi_agreement.rs proves both agree.
 *
 * All multi-byte fields are little-endian. Every structure has explicit
 * padding so that its layout is identical for every C and Rust compiler.
 */
#ifndef VRDMA_ABI_H
#define VRDMA_ABI_H

#include <linux/types.h>

/* §1 Device identification */
#define VIRTIO_ID_RDMA			42
#define VRDMA_ABI_VERSION		1

/* §2 Feature bits (device-specific bits 0..23) */
#define VIRTIO_RDMA_F_ODP		0 /* explicit on-demand paging MRs */
#define VIRTIO_RDMA_F_ODP_IMPLICIT	1 /* implicit (whole address space) ODP MRs */
#define VIRTIO_RDMA_F_ETH		2 /* integrated Ethernet port queues 4 and 5 */

/* §3 Virtqueues */
#define VRDMA_VQ_CONTROL		0
#define VRDMA_VQ_EVENT			1
#define VRDMA_VQ_DOORBELL		2
#define VRDMA_VQ_PAGEREQ		3
#define VRDMA_VQ_ETH_RX			4
#define VRDMA_VQ_ETH_TX			5
#define VRDMA_NUM_VQS			6

/* §2.2 atomic_cap values (same meaning as IB_ATOMIC_*) */
#define VRDMA_ATOMIC_NONE		0
#define VRDMA_ATOMIC_HCA		1
#define VRDMA_ATOMIC_GLOB		2

/* §2.2 odp_caps.general */
#define VRDMA_ODP_SUPPORT		(1U << 0)
#define VRDMA_ODP_SUPPORT_IMPLICIT	(1U << 1)

/* §2.2 odp per-transport caps (same bit values as IB_ODP_SUPPORT_*) */
#define VRDMA_ODP_SEND			(1U << 0)
#define VRDMA_ODP_RECV			(1U << 1)
#define VRDMA_ODP_WRITE			(1U << 2)
#define VRDMA_ODP_READ			(1U << 3)
#define VRDMA_ODP_ATOMIC		(1U << 4)
#define VRDMA_ODP_SRQ_RECV		(1U << 5)

/* §2.2 odp_chunk_shift: the range a device may offer */
#define VRDMA_ODP_CHUNK_SHIFT_MIN	12
#define VRDMA_ODP_CHUNK_SHIFT_MAX	30

/* §2.2 device_caps: IBTA 1.5 remote operations the device executes */
#define VRDMA_DEVCAP_ATOMIC_WRITE	(1U << 0) /* RC ATOMIC WRITE */
#define VRDMA_DEVCAP_FLUSH_GLOBAL	(1U << 1) /* RC FLUSH, global visibility */
#define VRDMA_DEVCAP_SRQ_RESIZE		(1U << 2) /* MODIFY_SRQ with MAX_WR, §11.7 */
#define VRDMA_DEVCAP_CQ_MODERATION	(1U << 3) /* MODIFY_CQ, §5.5 */
#define VRDMA_DEVCAP_XRC		(1U << 4) /* XRC domains, SRQs, QPs, §13.7 */

/* §2.2 port_state values (same as IB_PORT_*) */
#define VRDMA_PORT_DOWN			1
#define VRDMA_PORT_ACTIVE		4

/* §2.2 Device configuration space: 256 bytes, read-only to the driver. */
struct vrdma_config {
	__u8	mac[6];			/* integrated Ethernet port MAC */
	__le16	mtu;			/* Ethernet MTU (IP MTU), e.g. 1500 */
	__le32	max_pd;
	__le32	max_qp;
	__le32	max_cq;
	__le32	max_srq;
	__le32	max_mr;
	__le32	max_ah;
	__le32	max_mw;			/* 0: memory windows not supported (§12.8) */
	__le32	max_qp_wr;		/* per SQ/RQ depth limit */
	__le32	max_srq_wr;
	__le32	max_cqe;
	__le32	max_send_sge;
	__le32	max_recv_sge;
	__le32	max_srq_sge;
	__le32	max_inline_data;
	__le32	max_qp_rd_atom;		/* max_rd_atomic per QP */
	__le32	max_qp_init_rd_atom;	/* max_dest_rd_atomic per QP */
	__le32	max_fast_reg_page_list_len;
	__le32	max_gid;		/* GID table entries */
	__le32	max_msg_sz;
	__le32	atomic_cap;		/* VRDMA_ATOMIC_* */
	__le32	odp_general_caps;	/* VRDMA_ODP_SUPPORT* */
	__le32	odp_rc_caps;		/* VRDMA_ODP_{SEND,...} */
	__le32	odp_uc_caps;
	__le32	odp_ud_caps;
	__le32	odp_chunk_shift;	/* log2 of the ODP chunk, 21 = 2 MiB */
	__le32	port_state;		/* VRDMA_PORT_* */
	__le32	vendor_id;
	__le32	vendor_part_id;
	__le32	hw_ver;
	__le32	device_caps;		/* VRDMA_DEVCAP_* */
	__le64	max_mr_size;
	__le64	page_size_cap;		/* bitmap of supported MR page sizes */
	__le64	node_guid;
	__le64	fw_ver;
	__le32	max_mcast_grp;		/* 0: UD multicast not supported */
	__le32	max_mcast_qp_attach;	/* QPs per multicast group */
	__u8	reserved[88];
};

/* §4 Rings in guest memory (SQ, RQ, SRQ, CQ) */
#define VRDMA_PAGE_SHIFT		12
#define VRDMA_PAGE_SIZE			(1U << VRDMA_PAGE_SHIFT)

/*
 * Page 0 of every ring is its control page; entries start at page 1. Entry
 * sizes are powers of two between 32 and 4096 bytes so an entry never
 * crosses a page. Indices are free-running 32-bit counters; the slot of
 * index i is i & (depth - 1); depth is a power of two.
 */
struct vrdma_ring_ctrl {
	__le32	producer;		/* SQ/RQ/SRQ: driver writes; CQ: device */
	__u8	pad0[60];
	__le32	consumer;		/* SQ/RQ/SRQ: device writes; CQ: driver */
	__u8	pad1[60];
	__le32	cq_arm;			/* CQ only: VRDMA_CQ_ARM_*, see §5.3 */
	__le32	error;			/* device sets VRDMA_RING_ERR_* and stops */
	__u8	pad2[56];
};

#define VRDMA_CQ_ARM_NONE		0
#define VRDMA_CQ_ARM_NEXT		1
#define VRDMA_CQ_ARM_SOLICITED		2

#define VRDMA_RING_ERR_NONE		0
#define VRDMA_RING_ERR_OVERFLOW		1 /* CQ overflow */
#define VRDMA_RING_ERR_INDEX		2 /* producer - consumer > depth */
#define VRDMA_RING_ERR_ACCESS		3 /* ring page not in guest memory */

/* §6 Work requests */
struct vrdma_sge {
	__le64	addr;
	__le32	length;
	__le32	lkey;
};

/* Send opcodes (§6.1) */
#define VRDMA_WR_RDMA_WRITE		0
#define VRDMA_WR_RDMA_WRITE_WITH_IMM	1
#define VRDMA_WR_SEND			2
#define VRDMA_WR_SEND_WITH_IMM		3
#define VRDMA_WR_RDMA_READ		4
#define VRDMA_WR_ATOMIC_CMP_AND_SWP	5
#define VRDMA_WR_ATOMIC_FETCH_AND_ADD	6
#define VRDMA_WR_LOCAL_INV		7
#define VRDMA_WR_REG_MR			8
#define VRDMA_WR_SEND_WITH_INV		9
#define VRDMA_WR_ATOMIC_WRITE		10	/* RC, VRDMA_DEVCAP_ATOMIC_WRITE */
#define VRDMA_WR_FLUSH			11	/* RC, VRDMA_DEVCAP_FLUSH_GLOBAL */
#define VRDMA_WR_BIND_MW		12	/* RC, UC; max_mw > 0 (§12.8) */

/* Send flags (§6.1) */
#define VRDMA_SEND_SIGNALED		(1U << 0)
#define VRDMA_SEND_SOLICITED		(1U << 1)
#define VRDMA_SEND_INLINE		(1U << 2)
#define VRDMA_SEND_FENCE		(1U << 3)

struct vrdma_wqe_rdma {
	__le64	remote_addr;
	__le32	rkey;
	__le32	reserved;
};

struct vrdma_wqe_atomic {
	__le64	remote_addr;
	__le32	rkey;
	__le32	reserved;
	__le64	compare_add;
	__le64	swap;
};

/* ATOMIC WRITE: data is stored at remote_addr byte for byte (memory order). */
struct vrdma_wqe_atomic_write {
	__le64	remote_addr;		/* 8-byte aligned */
	__le32	rkey;
	__le32	reserved;
	__u8	data[8];
};

/* FLUSH placement types and selectivity levels (IBTA 1.5 FETH) */
#define VRDMA_FLUSH_GLOBAL		(1U << 0)
#define VRDMA_FLUSH_PERSISTENT		(1U << 1)
#define VRDMA_FLUSH_RANGE		0	/* remote_addr, length */
#define VRDMA_FLUSH_MR			1	/* the whole MR of rkey */

struct vrdma_wqe_flush {
	__le64	remote_addr;
	__le32	rkey;
	__u8	placement;		/* VRDMA_FLUSH_GLOBAL / _PERSISTENT */
	__u8	selectivity;		/* VRDMA_FLUSH_RANGE / _MR */
	__u8	reserved[2];
	__le64	length;			/* VRDMA_FLUSH_RANGE only */
};

struct vrdma_wqe_ud {
	__le32	ah_index;		/* from VRDMA_CMD_CREATE_AH */
	__le32	remote_qpn;
	__le32	remote_qkey;
	__le32	reserved;
};

/* Fast registration: the page list is an array of __le64 guest physical
 * addresses at page_list_addr (guest physical), page_list_len entries.
 */
struct vrdma_wqe_reg {
	__le64	iova;
	__le64	length;
	__le32	key;			/* new lkey/rkey; index bits must match */
	__le32	access;			/* VRDMA_ACCESS_* */
	__le32	page_list_len;
	__le32	page_shift;
	__le64	page_list_addr;
};

/* Memory window bind (§12.8), both window types. */
struct vrdma_wqe_bind_mw {
	__le64	addr;			/* first byte of the window, MR iova space */
	__le64	length;			/* 0: unbind (type 1 only) */
	__le32	mw_key;			/* the window's current rkey */
	__le32	new_key;		/* its rkey after the bind; index bits must match */
	__le32	mr_key;			/* lkey of the MR to bind to */
	__le32	access;			/* VRDMA_ACCESS_REMOTE_*, ZERO_BASED */
	__le32	reserved[2];
};

/*
 * Send WQE (§6.1): 64-byte header, then num_sge vrdma_sge entries, or
 * inline_len bytes of inline data when VRDMA_SEND_INLINE is set. The slot
 * size is 1 << sq_wqe_shift chosen at QP creation.
 */
struct vrdma_send_wqe {
	__le64	wr_id;
	__u8	opcode;			/* VRDMA_WR_* */
	__u8	flags;			/* VRDMA_SEND_* */
	__u8	num_sge;
	__u8	reserved0;
	__le32	ex;			/* imm_data (big-endian as on the wire) or rkey to invalidate */
	__le32	inline_len;
	__le32	xrc_srqn;		/* XRC_INI: remote XRC SRQ (XRCETH), else 0 */
	union {
		struct vrdma_wqe_rdma	rdma;
		struct vrdma_wqe_atomic	atomic;
		struct vrdma_wqe_atomic_write atomic_write;
		struct vrdma_wqe_flush	flush;
		struct vrdma_wqe_ud	ud;
		struct vrdma_wqe_reg	reg;
		struct vrdma_wqe_bind_mw bind_mw;
		__u8			raw[40];
	} wr;
};

/* Receive WQE (§6.2): 16-byte header then num_sge vrdma_sge entries. */
struct vrdma_recv_wqe {
	__le64	wr_id;
	__le32	num_sge;
	__le32	reserved;
};

/* §7 Completion queue entries: 64 bytes */
#define VRDMA_WC_SEND			0
#define VRDMA_WC_RDMA_WRITE		1
#define VRDMA_WC_RDMA_READ		2
#define VRDMA_WC_COMP_SWAP		3
#define VRDMA_WC_FETCH_ADD		4
#define VRDMA_WC_BIND_MW		5
#define VRDMA_WC_LOCAL_INV		6
#define VRDMA_WC_REG_MR			8
#define VRDMA_WC_ATOMIC_WRITE		9
#define VRDMA_WC_FLUSH			10
#define VRDMA_WC_RECV			128
#define VRDMA_WC_RECV_RDMA_WITH_IMM	129

/* Completion status: numerically equal to enum ib_wc_status */
#define VRDMA_WC_SUCCESS		0
#define VRDMA_WC_LOC_LEN_ERR		1
#define VRDMA_WC_LOC_QP_OP_ERR		2
#define VRDMA_WC_LOC_EEC_OP_ERR		3
#define VRDMA_WC_LOC_PROT_ERR		4
#define VRDMA_WC_WR_FLUSH_ERR		5
#define VRDMA_WC_MW_BIND_ERR		6
#define VRDMA_WC_BAD_RESP_ERR		7
#define VRDMA_WC_LOC_ACCESS_ERR		8
#define VRDMA_WC_REM_INV_REQ_ERR	9
#define VRDMA_WC_REM_ACCESS_ERR		10
#define VRDMA_WC_REM_OP_ERR		11
#define VRDMA_WC_RETRY_EXC_ERR		12
#define VRDMA_WC_RNR_RETRY_EXC_ERR	13
#define VRDMA_WC_LOC_RDD_VIOL_ERR	14
#define VRDMA_WC_REM_INV_RD_REQ_ERR	15
#define VRDMA_WC_REM_ABORT_ERR		16
#define VRDMA_WC_INV_EECN_ERR		17
#define VRDMA_WC_INV_EEC_STATE_ERR	18
#define VRDMA_WC_FATAL_ERR		19
#define VRDMA_WC_RESP_TIMEOUT_ERR	20
#define VRDMA_WC_GENERAL_ERR		21

/* CQE flags */
#define VRDMA_WC_F_GRH			(1U << 0)
#define VRDMA_WC_F_IMM			(1U << 1)
#define VRDMA_WC_F_INV			(1U << 2)

/* Network header type of a UD/GSI receive (same as enum rdma_network_type) */
#define VRDMA_NETWORK_ROCE_V1		1
#define VRDMA_NETWORK_IPV4		2
#define VRDMA_NETWORK_IPV6		3

struct vrdma_cqe {
	__le64	wr_id;
	__le32	qpn;
	__u8	opcode;			/* VRDMA_WC_* */
	__u8	status;			/* VRDMA_WC_SUCCESS... */
	__u8	flags;			/* VRDMA_WC_F_* */
	__u8	network_hdr_type;	/* VRDMA_NETWORK_*, UD/GSI receives */
	__le32	byte_len;
	__le32	ex;			/* imm_data (wire order) or invalidated rkey */
	__le32	src_qp;
	__le16	pkey_index;
	__u8	sl;
	__u8	reserved0;
	__le32	vendor_err;
	__u8	smac[6];
	__le16	vlan_id;
	__u8	reserved1[20];
};

/* §8 Doorbells: records carried by the doorbell virtqueue */
#define VRDMA_DB_SQ			1
#define VRDMA_DB_RQ			2
#define VRDMA_DB_SRQ			3
#define VRDMA_DB_CQ_ARM			4

struct vrdma_doorbell {
	__le32	type;			/* VRDMA_DB_* */
	__le32	id;			/* qpn, srqn or cqn */
};

/* §9 Events: 16-byte records written to event virtqueue buffers */
#define VRDMA_EV_CQ_COMP		1	/* id = cqn */
#define VRDMA_EV_CQ_ERR			2	/* id = cqn */
#define VRDMA_EV_QP_FATAL		3	/* id = qpn */
#define VRDMA_EV_QP_REQ_ERR		4
#define VRDMA_EV_QP_ACCESS_ERR		5
#define VRDMA_EV_COMM_EST		6
#define VRDMA_EV_SQ_DRAINED		7
#define VRDMA_EV_QP_LAST_WQE_REACHED	8
#define VRDMA_EV_SRQ_LIMIT_REACHED	9	/* id = srqn */
#define VRDMA_EV_SRQ_ERR		10
#define VRDMA_EV_PORT_ACTIVE		11	/* id = port (1) */
#define VRDMA_EV_PORT_ERR		12
#define VRDMA_EV_DEVICE_FATAL		13

struct vrdma_event {
	__le32	type;			/* VRDMA_EV_* */
	__le32	id;
	__le32	info;			/* event-specific, e.g. a WC status */
	__le32	reserved;
};

/* §10 ODP page requests: device -> driver through the pagereq virtqueue */
#define VRDMA_PAGEREQ_FAULT		1	/* translate a chunk */
#define VRDMA_PAGEREQ_RECLAIM		2	/* device dropped a chunk */

#define VRDMA_PAGEREQ_F_WRITE		(1U << 0)

struct vrdma_page_req {
	__le32	type;			/* VRDMA_PAGEREQ_* */
	__le32	req_id;			/* echoed by VRDMA_CMD_ODP_PAGE_RESP */
	__le32	mr_key;			/* lkey of the MR */
	__le32	flags;			/* VRDMA_PAGEREQ_F_* */
	__le64	iova;			/* chunk-aligned (implicit) or MR-clipped */
	__le64	length;
};

/* §11 Control commands */
#define VRDMA_CMD_QUERY_DEVICE		1
#define VRDMA_CMD_QUERY_PORT		2
#define VRDMA_CMD_ADD_GID		3
#define VRDMA_CMD_DEL_GID		4
#define VRDMA_CMD_CREATE_PD		5
#define VRDMA_CMD_DESTROY_PD		6
#define VRDMA_CMD_CREATE_CQ		7
#define VRDMA_CMD_DESTROY_CQ		8
#define VRDMA_CMD_RESIZE_CQ		9
#define VRDMA_CMD_CREATE_QP		10
#define VRDMA_CMD_MODIFY_QP		11
#define VRDMA_CMD_QUERY_QP		12
#define VRDMA_CMD_DESTROY_QP		13
#define VRDMA_CMD_CREATE_SRQ		14
#define VRDMA_CMD_MODIFY_SRQ		15
#define VRDMA_CMD_QUERY_SRQ		16
#define VRDMA_CMD_DESTROY_SRQ		17
#define VRDMA_CMD_CREATE_AH		18
#define VRDMA_CMD_DESTROY_AH		19
#define VRDMA_CMD_REG_MR		20	/* page-list MR */
#define VRDMA_CMD_REG_DMA_MR		21
#define VRDMA_CMD_ALLOC_FAST_REG_MR	22
#define VRDMA_CMD_REG_ODP_MR		23	/* explicit ODP */
#define VRDMA_CMD_REG_IMPLICIT_MR	24	/* implicit ODP */
#define VRDMA_CMD_DEREG_MR		25
#define VRDMA_CMD_ADVISE_MR		26
#define VRDMA_CMD_ODP_PAGE_RESP		27
#define VRDMA_CMD_ODP_INVALIDATE	28
#define VRDMA_CMD_REREG_MR		29	/* page-list MR, same key */
#define VRDMA_CMD_ALLOC_MW		30	/* memory window (§12.8) */
#define VRDMA_CMD_DEALLOC_MW		31
#define VRDMA_CMD_ATTACH_MCAST		40	/* UD QP joins a multicast GID */
#define VRDMA_CMD_DETACH_MCAST		41
#define VRDMA_CMD_QUERY_STATS		32	/* port or QP counters */
#define VRDMA_CMD_MODIFY_CQ		33	/* CQ moderation */
#define VRDMA_CMD_ALLOC_XRCD		34	/* XRC domain (§13.7) */
#define VRDMA_CMD_DEALLOC_XRCD		35

/*
 * Size limits of one control chain (§11.1): a trailing page list holds at
 * most VRDMA_CMD_MAX_PAGES entries (64 MiB), the readable part is at most
 * VRDMA_CMD_MAX_LEN bytes (4 KiB for header and request, then the largest
 * page list), and a chain has at most VRDMA_CMD_MAX_DESCS descriptors
 * (enough for that page list split at every 4 KiB page).
 */
#define VRDMA_CMD_MAX_PAGES		(1U << 23)
#define VRDMA_CMD_MAX_LEN		(4096U + 8U * VRDMA_CMD_MAX_PAGES)
#define VRDMA_CMD_MAX_DESCS		16448

/* Command status (§11.1), mapped by the driver to the errno in brackets */
#define VRDMA_STATUS_OK			0
#define VRDMA_STATUS_INVALID		1	/* [EINVAL] malformed or bad attribute */
#define VRDMA_STATUS_NOT_SUPPORTED	2	/* [EOPNOTSUPP] */
#define VRDMA_STATUS_NO_RESOURCES	3	/* [ENOMEM] a limit reached */
#define VRDMA_STATUS_NOT_FOUND		4	/* [ENOENT] unknown handle */
#define VRDMA_STATUS_BUSY		5	/* [EBUSY] object still in use */
#define VRDMA_STATUS_BAD_STATE		6	/* [EINVAL] illegal QP transition */
#define VRDMA_STATUS_ACCESS		7	/* [EACCES] access flags not allowed */
#define VRDMA_STATUS_BAD_ADDRESS	8	/* [EFAULT] page outside guest memory */
#define VRDMA_STATUS_NEEDS_RESET	9	/* [EIO] device broken, reset it */

/*
 * A command is one descriptor chain: device-readable part = vrdma_cmd_hdr,
 * the request struct, then any trailing array (page lists); device-writable
 * part = vrdma_cmd_resp_hdr then the response struct.
 */
struct vrdma_cmd_hdr {
	__le16	opcode;			/* VRDMA_CMD_* */
	__le16	flags;			/* must be 0 */
	__le32	reserved;
};

struct vrdma_cmd_resp_hdr {
	__le32	status;			/* VRDMA_STATUS_* */
	__le32	reserved;
};

/* QUERY_PORT */
struct vrdma_cmd_query_port {
	__le32	port;			/* must be 1 */
	__le32	reserved;
};

struct vrdma_resp_query_port {
	__le32	state;			/* VRDMA_PORT_* */
	__le32	max_mtu;		/* IB MTU enum 1..5 */
	__le32	active_mtu;
	__le32	gid_tbl_len;
	__le32	max_msg_sz;
	__le32	phys_state;		/* 5 = LinkUp, 3 = Disabled */
	__le32	active_speed;		/* IB_SPEED_* */
	__le32	active_width;		/* IB_WIDTH_* */
};

/* QUERY_DEVICE returns struct vrdma_config as its response body. */

/* ADD_GID / DEL_GID */
#define VRDMA_GID_TYPE_ROCE_V1		1
#define VRDMA_GID_TYPE_ROCE_V2		2

struct vrdma_cmd_gid {
	__le32	index;
	__le32	type;			/* VRDMA_GID_TYPE_*, ignored by DEL_GID */
	__u8	gid[16];
};

/* CREATE_PD / DESTROY_PD and all single-handle commands */
struct vrdma_handle {
	__le32	handle;			/* pdn, cqn, qpn, srqn, xrcdn, ah index or lkey */
	__le32	reserved;
};

/* CREATE_CQ / RESIZE_CQ: trailing __le64 page list (control page first). */
struct vrdma_cmd_create_cq {
	__le32	cqn;			/* RESIZE_CQ only; 0 for CREATE */
	__le32	depth;			/* power of two, entries */
	__le32	npages;			/* trailing page list length */
	__le32	reserved;
};

/* Response of CREATE_CQ: vrdma_handle (cqn). RESIZE_CQ: vrdma_handle with
 * the number of unpolled CQEs copied to the start of the new ring.
 */

/* QP types */
#define VRDMA_QPT_RC			2
#define VRDMA_QPT_UC			3
#define VRDMA_QPT_UD			4
#define VRDMA_QPT_GSI			1
#define VRDMA_QPT_XRC_INI		9	/* XRC initiator: SQ only (§13.7) */
#define VRDMA_QPT_XRC_TGT		10	/* XRC target: no rings (§13.7) */

#define VRDMA_NO_SRQ			0xffffffffU

/*
 * CREATE_QP: trailing page list = SQ pages then RQ pages (RQ absent with SRQ,
 * XRC_INI and XRC_TGT; SQ absent with XRC_TGT).
 */
struct vrdma_cmd_create_qp {
	__le32	pdn;
	__le32	qp_type;		/* VRDMA_QPT_* */
	__le32	send_cqn;
	__le32	recv_cqn;
	__le32	srqn;			/* VRDMA_NO_SRQ when none */
	__le32	sq_depth;		/* power of two */
	__le32	rq_depth;		/* power of two, 0 with an SRQ */
	__u8	sq_wqe_shift;		/* log2 of SQ slot size */
	__u8	rq_wqe_shift;		/* log2 of RQ slot size */
	__u8	sq_sig_all;
	__u8	reserved0;
	__le32	max_send_sge;
	__le32	max_recv_sge;
	__le32	max_inline_data;
	__le32	sq_npages;
	__le32	rq_npages;
	__le32	xrcdn;			/* XRC_TGT: its XRC domain, else 0 */
};

struct vrdma_resp_create_qp {
	__le32	qpn;
	__le32	reserved;
};

/* Address vector (QP primary path and AHs) */
struct vrdma_av {
	__u8	dgid[16];
	__le32	flow_label;
	__u8	sgid_index;
	__u8	hop_limit;
	__u8	traffic_class;
	__u8	sl;
	__u8	dmac[6];
	__le16	vlan_id;		/* 0xffff: untagged */
	__le32	reserved;
};

/* QP states (same as enum ib_qp_state) */
#define VRDMA_QPS_RESET			0
#define VRDMA_QPS_INIT			1
#define VRDMA_QPS_RTR			2
#define VRDMA_QPS_RTS			3
#define VRDMA_QPS_SQD			4
#define VRDMA_QPS_SQE			5
#define VRDMA_QPS_ERR			6

/* Attribute mask bits (same as enum ib_qp_attr_mask) */
#define VRDMA_QP_STATE			(1U << 0)
#define VRDMA_QP_CUR_STATE		(1U << 1)
#define VRDMA_QP_EN_SQD_ASYNC_NOTIFY	(1U << 2)
#define VRDMA_QP_ACCESS_FLAGS		(1U << 3)
#define VRDMA_QP_PKEY_INDEX		(1U << 4)
#define VRDMA_QP_PORT			(1U << 5)
#define VRDMA_QP_QKEY			(1U << 6)
#define VRDMA_QP_AV			(1U << 7)
#define VRDMA_QP_PATH_MTU		(1U << 8)
#define VRDMA_QP_TIMEOUT		(1U << 9)
#define VRDMA_QP_RETRY_CNT		(1U << 10)
#define VRDMA_QP_RNR_RETRY		(1U << 11)
#define VRDMA_QP_RQ_PSN			(1U << 12)
#define VRDMA_QP_MAX_QP_RD_ATOMIC	(1U << 13)
#define VRDMA_QP_ALT_PATH		(1U << 14)
#define VRDMA_QP_MIN_RNR_TIMER		(1U << 15)
#define VRDMA_QP_SQ_PSN			(1U << 16)
#define VRDMA_QP_MAX_DEST_RD_ATOMIC	(1U << 17)
#define VRDMA_QP_PATH_MIG_STATE		(1U << 18)
#define VRDMA_QP_CAP			(1U << 19)
#define VRDMA_QP_DEST_QPN		(1U << 20)

/* Access flags (same as enum ib_access_flags, low bits) */
#define VRDMA_ACCESS_LOCAL_WRITE	(1U << 0)
#define VRDMA_ACCESS_REMOTE_WRITE	(1U << 1)
#define VRDMA_ACCESS_REMOTE_READ	(1U << 2)
#define VRDMA_ACCESS_REMOTE_ATOMIC	(1U << 3)
#define VRDMA_ACCESS_MW_BIND		(1U << 4)
#define VRDMA_ACCESS_ZERO_BASED		(1U << 5)
#define VRDMA_ACCESS_ON_DEMAND		(1U << 6)
#define VRDMA_ACCESS_FLUSH_GLOBAL	(1U << 8)
#define VRDMA_ACCESS_FLUSH_PERSISTENT	(1U << 9)
/* The bits vrdma_qp_attr.qp_access_flags may hold (§13.4 rule 4) */
#define VRDMA_QP_ACCESS_ALLOWED \
	(VRDMA_ACCESS_LOCAL_WRITE | VRDMA_ACCESS_REMOTE_WRITE | \
	 VRDMA_ACCESS_REMOTE_READ | VRDMA_ACCESS_REMOTE_ATOMIC | \
	 VRDMA_ACCESS_FLUSH_GLOBAL | VRDMA_ACCESS_FLUSH_PERSISTENT)

struct vrdma_qp_attr {
	__le32	qp_state;
	__le32	cur_qp_state;
	__le32	path_mtu;		/* IB MTU enum: 1=256 ... 5=4096 */
	__le32	qkey;
	__le32	rq_psn;
	__le32	sq_psn;
	__le32	dest_qp_num;
	__le32	qp_access_flags;	/* VRDMA_ACCESS_REMOTE_* */
	__le16	pkey_index;
	__u8	en_sqd_async_notify;
	__u8	sq_draining;
	__u8	max_rd_atomic;
	__u8	max_dest_rd_atomic;
	__u8	min_rnr_timer;
	__u8	timeout;
	__u8	retry_cnt;
	__u8	rnr_retry;
	__u8	port_num;
	__u8	reserved0;
	__le32	max_send_wr;
	__le32	max_recv_wr;
	__le32	max_send_sge;
	__le32	max_recv_sge;
	__le32	max_inline_data;
	__le32	reserved1;
	struct vrdma_av av;
};

struct vrdma_cmd_modify_qp {
	__le32	qpn;
	__le32	attr_mask;		/* VRDMA_QP_* */
	struct vrdma_qp_attr attr;
};

/* QUERY_QP: request vrdma_handle, response vrdma_qp_attr. */

/* SRQ types (same values as enum ib_srq_type) */
#define VRDMA_SRQT_BASIC		0
#define VRDMA_SRQT_XRC			1	/* VRDMA_DEVCAP_XRC (§13.7) */

/* CREATE_SRQ: trailing page list of the SRQ ring. */
struct vrdma_cmd_create_srq {
	__le32	pdn;
	__le32	depth;			/* power of two */
	__u8	wqe_shift;
	__u8	srq_type;		/* VRDMA_SRQT_* */
	__u8	reserved0[2];
	__le32	max_sge;
	__le32	srq_limit;
	__le32	npages;
	__le32	xrcdn;			/* XRC: its XRC domain, else 0 */
	__le32	cqn;			/* XRC: CQ of its receive completions, else 0 */
};

#define VRDMA_SRQ_MAX_WR		(1U << 0)
#define VRDMA_SRQ_LIMIT			(1U << 1)

/* MODIFY_SRQ: with VRDMA_SRQ_MAX_WR the new ring's page list follows. */
struct vrdma_cmd_modify_srq {
	__le32	srqn;
	__le32	attr_mask;		/* VRDMA_SRQ_* */
	__le32	max_wr;			/* MAX_WR: new depth, power of two */
	__le32	srq_limit;
	__le32	npages;			/* MAX_WR: trailing page list length, else 0 */
	__le32	reserved;
};

struct vrdma_resp_query_srq {
	__le32	max_wr;
	__le32	max_sge;
	__le32	srq_limit;
	__le32	reserved;
};

/* CREATE_AH: response vrdma_handle (ah index) */
struct vrdma_cmd_create_ah {
	__le32	pdn;
	__le32	reserved;
	struct vrdma_av av;
};

/* REG_MR: trailing __le64 page list, npages entries of 1 << page_shift bytes.
 * The first page may start at offset iova & ((1 << page_shift) - 1).
 */
struct vrdma_cmd_reg_mr {
	__le32	pdn;
	__le32	access;			/* VRDMA_ACCESS_* */
	__le64	iova;
	__le64	length;
	__le32	page_shift;
	__le32	npages;			/* REG_MR; max_num_sg for ALLOC_FAST_REG_MR */
};

/* ATTACH_MCAST / DETACH_MCAST (§15.8) */
struct vrdma_cmd_mcast {
	__le32	qpn;
	__le32	reserved;
	__u8	gid[16];		/* multicast GID */
};

/* BTH destination QP of multicast datagrams (IBTA 10.5) */
#define VRDMA_MCAST_QPN			0xffffff

/* REREG_MR: followed by npages __le64 page addresses, as REG_MR */
struct vrdma_cmd_rereg_mr {
	__le32	key;			/* the MR's current key */
	__le32	pdn;
	__le32	access;			/* VRDMA_ACCESS_* */
	__le32	page_shift;
	__le64	iova;
	__le64	length;
	__le32	npages;
	__le32	reserved;
};

struct vrdma_resp_reg_mr {
	__le32	lkey;
	__le32	rkey;
};

/* ALLOC_MW (§12.8); the response is a vrdma_handle with the rkey */
#define VRDMA_MW_TYPE_1			1
#define VRDMA_MW_TYPE_2			2	/* IBTA type 2B */

struct vrdma_cmd_alloc_mw {
	__le32	pdn;
	__le32	type;			/* VRDMA_MW_TYPE_* */
};

/* ADVISE_MR */
#define VRDMA_ADVISE_PREFETCH		0
#define VRDMA_ADVISE_PREFETCH_WRITE	1
#define VRDMA_ADVISE_PREFETCH_NO_FAULT	2
#define VRDMA_ADVISE_F_FLUSH		(1U << 0) /* complete only when resident */

struct vrdma_cmd_advise_mr {
	__le32	lkey;
	__le32	advice;			/* VRDMA_ADVISE_* */
	__le32	flags;			/* VRDMA_ADVISE_F_* */
	__le32	reserved;
	__le64	iova;
	__le64	length;
};

/* ODP_PAGE_RESP: trailing __le64 guest physical page addresses. */
#define VRDMA_ODP_RESP_F_WRITABLE	(1U << 0)

struct vrdma_cmd_odp_page_resp {
	__le32	req_id;
	__le32	mr_key;
	__le32	status;			/* VRDMA_STATUS_OK, ACCESS or BAD_ADDRESS */
	__le32	flags;			/* VRDMA_ODP_RESP_F_* */
	__le64	iova;			/* page-aligned start covered */
	__le32	npages;			/* 4 KiB pages that follow */
	__le32	reserved;
};

/* ODP_INVALIDATE: completes when no access to the range is in flight. */
struct vrdma_cmd_odp_invalidate {
	__le32	mr_key;
	__le32	reserved;
	__le64	iova;
	__le64	length;
};

/* MODIFY_CQ (§5.5, §11.6) */
struct vrdma_cmd_modify_cq {
	__le32	cqn;
	__le16	cq_count;		/* CQEs; < 2 or period 0: off */
	__le16	cq_period;		/* microseconds */
};

/* QUERY_STATS (§11.9): response vrdma_stats. */
struct vrdma_cmd_query_stats {
	__le32	qpn;			/* 0: the port */
	__le32	flags;			/* must be 0 */
};

struct vrdma_stats {
	__le64	tx_packets;
	__le64	tx_bytes;
	__le64	rx_packets;
	__le64	rx_bytes;
	__le64	retransmits;
	__le64	timeouts;
	__le64	rnr_naks_rx;
	__le64	rnr_naks_tx;
	__le64	seq_naks_rx;
	__le64	seq_naks_tx;
	__le64	icrc_errors;		/* port only */
	__le64	rx_dropped;		/* port only */
	__le64	odp_faults;		/* port only */
	__le64	reserved[3];
};

/* MR keys (§12.1): key = (index << 8) | variant */
#define VRDMA_KEY_INDEX(key)		((key) >> 8)
#define VRDMA_KEY_VARIANT(key)		((key) & 0xff)

/* Special QP numbers */
#define VRDMA_GSI_QPN			1
#define VRDMA_FIRST_QPN			16
/* The GSI QP's Q_Key (§13.6, IBTA 13.4.6.1) */
#define VRDMA_GSI_QKEY			0x80010000U

/* vrdma_av.vlan_id / vrdma_cqe.vlan_id of an untagged frame (§11.5, §7) */
#define VRDMA_VLAN_NONE			0xffff

#endif /* VRDMA_ABI_H */

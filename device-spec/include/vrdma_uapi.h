/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause) */
/*
 * vrdma user-space ABI between vrdma.ko and libvrdma (the rdma-core
 * provider): the udata of the uverbs commands. It is guest-internal; the
 * device ABI is vrdma_abi.h. Rings returned here are mmapped with the
 * offsets given by the kernel (rdma_user_mmap_entry) and have the layout of
 * device-spec §4: page 0 = struct vrdma_ring_ctrl, entries from page 1.
 */
#ifndef VRDMA_UAPI_H
#define VRDMA_UAPI_H

#include <linux/types.h>

#define VRDMA_UVERBS_ABI_VERSION	1

struct vrdma_alloc_ucontext_resp {
	__u32	abi_version;		/* VRDMA_UVERBS_ABI_VERSION */
	__u32	max_inline_data;
	__u32	max_send_sge;
	__u32	max_recv_sge;
};

struct vrdma_create_cq_resp {
	__u32	cqn;
	__u32	depth;			/* entries, power of two */
	__aligned_u64	mmap_offset;
	__aligned_u64	mmap_size;	/* control page + entry pages */
};

/* RESIZE_CQ: unpolled CQEs were moved to the start of the new ring. */
struct vrdma_resize_cq_resp {
	__u32	depth;
	__u32	reserved;
	__aligned_u64	mmap_offset;
	__aligned_u64	mmap_size;
};

struct vrdma_create_qp_resp {
	__u32	qpn;
	__u32	sq_depth;
	__u32	rq_depth;		/* 0 when the QP uses an SRQ */
	__u8	sq_wqe_shift;
	__u8	rq_wqe_shift;
	__u16	reserved;
	__aligned_u64	sq_mmap_offset;
	__aligned_u64	sq_mmap_size;
	__aligned_u64	rq_mmap_offset;
	__aligned_u64	rq_mmap_size;
};

struct vrdma_create_srq_resp {
	__u32	srqn;
	__u32	depth;
	__u8	wqe_shift;
	__u8	reserved[7];
	__aligned_u64	mmap_offset;
	__aligned_u64	mmap_size;
};

/*
 * modify_srq with IB_SRQ_MAX_WR moves the SRQ to a new ring (device-spec
 * §11.7). The uverbs MODIFY_SRQ command has no response, so the provider
 * passes the address of a struct vrdma_modify_srq_resp that the kernel
 * fills in with the new ring's mapping (as rxe does for its SRQ resize).
 */
struct vrdma_modify_srq_cmd {
	__aligned_u64	resp_addr;	/* user address of vrdma_modify_srq_resp */
};

struct vrdma_modify_srq_resp {
	__u32	depth;
	__u32	reserved;
	__aligned_u64	mmap_offset;
	__aligned_u64	mmap_size;
};

struct vrdma_create_ah_resp {
	__u32	ah_index;		/* goes into vrdma_wqe_ud.ah_index */
	__u32	reserved;
};

/*
 * Driver attributes of uverbs ioctl methods (their IDs are in the driver
 * namespace, 1 << UVERBS_ID_NS_SHIFT upwards; these methods carry no udata).
 *
 * UVERBS_METHOD_DM_ALLOC: the kernel answers the mmap offset (u64) of the
 * device memory's pages. The provider maps PAGE_ALIGN(length) bytes there.
 */
#define VRDMA_UAPI_ATTR_ALLOC_DM_MMAP_OFFSET	(1U << 12)
/*
 * UVERBS_METHOD_QUERY_CONTEXT: the kernel answers the context's
 * struct vrdma_alloc_ucontext_resp again, for a context imported from a
 * shared command fd (ibv_import_device(3)).
 */
#define VRDMA_UAPI_ATTR_QUERY_CONTEXT_RESP	(1U << 12)
/*
 * The driver's method VRDMA_UAPI_METHOD_PD_QUERY of UVERBS_OBJECT_PD: takes
 * a PD handle of the context (ibv_import_pd(3) checks the handle with it)
 * and answers the PD's number (u32).
 */
enum vrdma_uapi_pd_methods {	/* an enum: the kernel macros paste the name */
	VRDMA_UAPI_METHOD_PD_QUERY = (1U << 12),
};

enum vrdma_uapi_query_pd_attrs {
	VRDMA_UAPI_ATTR_QUERY_PD_HANDLE = (1U << 12),
	VRDMA_UAPI_ATTR_QUERY_PD_RESP_PDN,
};

/*
 * The driver's method VRDMA_UAPI_METHOD_DM_QUERY of UVERBS_OBJECT_DM, for
 * ibv_import_dm(3): takes a DM handle of the context and answers the mmap
 * offset (u64) and the length (u64) of that device memory.
 */
enum vrdma_uapi_dm_methods {
	VRDMA_UAPI_METHOD_DM_QUERY = (1U << 12),
};

enum vrdma_uapi_query_dm_attrs {
	VRDMA_UAPI_ATTR_QUERY_DM_HANDLE = (1U << 12),
	VRDMA_UAPI_ATTR_QUERY_DM_RESP_MMAP_OFFSET,
	VRDMA_UAPI_ATTR_QUERY_DM_RESP_LENGTH,
};

/*
 * Device memory is accessed by ibv_memcpy_to_dm / _from_dm in units of
 * 4 bytes: offset and length multiples of this.
 */
#define VRDMA_DM_ACCESS_ALIGN	4

#endif /* VRDMA_UAPI_H */

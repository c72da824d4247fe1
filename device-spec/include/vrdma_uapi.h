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

#endif /* VRDMA_UAPI_H */

/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * libvrdma: inline helpers for the rings shared with the vrdma device.
 *
 * Ring layout and ownership are device-spec §4: page 0 is struct
 * vrdma_ring_ctrl, entries start at page 1, indices are free-running u32.
 * SQ/RQ/SRQ: we own `producer`, the device owns `consumer`.
 * CQ: the device owns `producer`, we own `consumer` and store `cq_arm`.
 *
 * The "device" is another process (vrdma-backend) sharing guest memory, so
 * every index published to it is a release store after the entry stores,
 * and every index read from it is an acquire load before the entry loads.
 *
 * This header depends only on libc, <infiniband/verbs.h> and the spec
 * headers so that tests/ring_test.c can exercise it without a device.
 */
#ifndef VRDMA_RING_H
#define VRDMA_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <endian.h>

#include <infiniband/verbs.h>

#include "vrdma_abi.h"

struct vrdma_ring {
	void			*map;		/* mmap base = control page */
	size_t			map_size;
	struct vrdma_ring_ctrl	*ctrl;
	uint8_t			*entries;	/* map + VRDMA_PAGE_SIZE */
	uint32_t		depth;		/* power of two */
	uint32_t		shift;		/* log2 of the entry size */
	/*
	 * Our side's index: the producer of SQ/RQ/SRQ, the consumer of a CQ.
	 * It mirrors the field we own in the control page.
	 */
	uint32_t		head;
};

typedef _Atomic(uint32_t) vrdma_atomic_u32;

static inline uint32_t vrdma_load_acquire(const __le32 *p)
{
	return le32toh(atomic_load_explicit((vrdma_atomic_u32 *)p,
					    memory_order_acquire));
}

static inline void vrdma_store_release(__le32 *p, uint32_t v)
{
	atomic_store_explicit((vrdma_atomic_u32 *)p, htole32(v),
			      memory_order_release);
}

static inline bool vrdma_is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/*
 * Validate what the kernel told us about a ring against the mapping size:
 * a ring whose entries do not fit the mapping is refused instead of being
 * trusted (§4: npages = 1 + ceil(depth * entry_size / 4096)).
 */
static inline int vrdma_ring_init(struct vrdma_ring *r, void *map,
				  size_t map_size, uint32_t depth,
				  uint32_t shift, uint32_t min_shift)
{
	uint64_t need;

	if (!vrdma_is_pow2(depth) || shift < min_shift ||
	    shift > VRDMA_PAGE_SHIFT)
		return -1;
	need = VRDMA_PAGE_SIZE + ((uint64_t)depth << shift);
	if (map_size < need)
		return -1;

	r->map = map;
	r->map_size = map_size;
	r->ctrl = map;
	r->entries = (uint8_t *)map + VRDMA_PAGE_SIZE;
	r->depth = depth;
	r->shift = shift;
	r->head = 0;
	return 0;
}

static inline void *vrdma_ring_slot(const struct vrdma_ring *r, uint32_t idx)
{
	return r->entries + ((size_t)(idx & (r->depth - 1)) << r->shift);
}

/* Work queues (SQ, RQ, SRQ) ----------------------------------------------- */

/* Re-read our producer from the control page (after reset/creation). */
static inline void vrdma_wq_sync(struct vrdma_ring *r)
{
	r->head = le32toh(atomic_load_explicit(
		(vrdma_atomic_u32 *)&r->ctrl->producer, memory_order_relaxed));
}

/*
 * Free slots, judged against the consumer index the device writes. A
 * consumer that claims more was retired than we produced is nonsense from
 * the device: treat the ring as full rather than overwrite live entries.
 */
static inline uint32_t vrdma_wq_free(const struct vrdma_ring *r)
{
	uint32_t used = r->head - vrdma_load_acquire(&r->ctrl->consumer);

	return used > r->depth ? 0 : r->depth - used;
}

/* Publish entries [old producer, head): stores before the producer store. */
static inline void vrdma_wq_publish(struct vrdma_ring *r)
{
	vrdma_store_release(&r->ctrl->producer, r->head);
}

/* Completion queues ------------------------------------------------------- */

static inline void vrdma_cq_sync(struct vrdma_ring *r)
{
	r->head = le32toh(atomic_load_explicit(
		(vrdma_atomic_u32 *)&r->ctrl->consumer, memory_order_relaxed));
}

/*
 * The next unread CQE, or NULL when the ring is empty. The acquire load of
 * the device's producer orders the CQE loads after it (§4).
 */
static inline const struct vrdma_cqe *vrdma_cq_peek(const struct vrdma_ring *r)
{
	uint32_t avail = vrdma_load_acquire(&r->ctrl->producer) - r->head;

	if (!avail || avail > r->depth)
		return NULL;
	return vrdma_ring_slot(r, r->head);
}

static inline void vrdma_cq_publish(struct vrdma_ring *r)
{
	vrdma_store_release(&r->ctrl->consumer, r->head);
}

/*
 * §5.3: arming is a store into the control page. The device writes a CQE,
 * advances producer, then (full fence) exchanges cq_arm. We store cq_arm
 * and then read producer when the application polls again; without a full
 * fence between our store and that load both sides could miss each other
 * (store->load reordering), losing the event.
 */
static inline void vrdma_cq_arm(struct vrdma_ring *r, bool solicited)
{
	atomic_store_explicit((vrdma_atomic_u32 *)&r->ctrl->cq_arm,
			      htole32(solicited ? VRDMA_CQ_ARM_SOLICITED :
						  VRDMA_CQ_ARM_NEXT),
			      memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
}

static inline uint32_t vrdma_ring_error(const struct vrdma_ring *r)
{
	return vrdma_load_acquire(&r->ctrl->error);
}

/* CQE -> ibv_wc (§7) ------------------------------------------------------ */

static inline enum ibv_wc_opcode vrdma_wc_opcode(uint8_t op)
{
	switch (op) {
	case VRDMA_WC_SEND:
		return IBV_WC_SEND;
	case VRDMA_WC_RDMA_WRITE:
		return IBV_WC_RDMA_WRITE;
	case VRDMA_WC_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case VRDMA_WC_COMP_SWAP:
		return IBV_WC_COMP_SWAP;
	case VRDMA_WC_FETCH_ADD:
		return IBV_WC_FETCH_ADD;
	case VRDMA_WC_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case VRDMA_WC_BIND_MW:
		return IBV_WC_BIND_MW;
	case VRDMA_WC_ATOMIC_WRITE:
		return IBV_WC_ATOMIC_WRITE;
	case VRDMA_WC_FLUSH:
		return IBV_WC_FLUSH;
	case VRDMA_WC_RECV:
		return IBV_WC_RECV;
	case VRDMA_WC_RECV_RDMA_WITH_IMM:
		return IBV_WC_RECV_RDMA_WITH_IMM;
	default:
		/* REG_MR is kernel-only; anything else is undefined */
		return IBV_WC_SEND;
	}
}

static inline enum ibv_wc_status vrdma_wc_status(uint8_t status)
{
	/* §7: numerically equal to ib_wc_status, which ibv_wc_status mirrors */
	if (status > VRDMA_WC_GENERAL_ERR)
		return IBV_WC_GENERAL_ERR;
	return (enum ibv_wc_status)status;
}

static inline unsigned int vrdma_wc_flags(uint8_t flags)
{
	unsigned int wc_flags = 0;

	if (flags & VRDMA_WC_F_GRH)
		wc_flags |= IBV_WC_GRH;
	if (flags & VRDMA_WC_F_IMM)
		wc_flags |= IBV_WC_WITH_IMM;
	if (flags & VRDMA_WC_F_INV)
		wc_flags |= IBV_WC_WITH_INV;
	return wc_flags;
}

/*
 * `ex` carries imm_data in wire order (ibv_wc.imm_data is network order:
 * copy the bytes as they are) or the invalidated rkey (little-endian).
 */
static inline uint32_t vrdma_cqe_ex(const struct vrdma_cqe *cqe)
{
	uint32_t raw;

	memcpy(&raw, &cqe->ex, sizeof(raw));
	if (cqe->flags & VRDMA_WC_F_INV)
		return le32toh(raw);
	return raw;
}

/*
 * For RoCE v2 UD receives, verbs consumers read the frame's L3 header type
 * from wc.sl, as mlx5 reports it (bit 3: UDP present; bits 2:0: 1 = IPv6,
 * 2 = IPv4); UCX's UD transport uses it to find the destination GID in the
 * GRH area. SL has no other meaning on RoCE v2 receives.
 */
#define VRDMA_WC_SL_ROCE_UDP		0x8
#define VRDMA_WC_SL_ROCE_IPV6		0x1
#define VRDMA_WC_SL_ROCE_IPV4		0x2

static inline uint8_t vrdma_cqe_sl(const struct vrdma_cqe *cqe)
{
	switch (cqe->network_hdr_type) {
	case VRDMA_NETWORK_IPV4:
		return VRDMA_WC_SL_ROCE_UDP | VRDMA_WC_SL_ROCE_IPV4;
	case VRDMA_NETWORK_IPV6:
		return VRDMA_WC_SL_ROCE_UDP | VRDMA_WC_SL_ROCE_IPV6;
	default:
		return cqe->sl;
	}
}

static inline void vrdma_cqe_to_wc(const struct vrdma_cqe *cqe,
				   struct ibv_wc *wc)
{
	uint32_t ex = vrdma_cqe_ex(cqe);

	wc->wr_id = le64toh(cqe->wr_id);
	wc->status = vrdma_wc_status(cqe->status);
	wc->opcode = vrdma_wc_opcode(cqe->opcode);
	wc->vendor_err = le32toh(cqe->vendor_err);
	wc->byte_len = le32toh(cqe->byte_len);
	memcpy(&wc->imm_data, &ex, sizeof(ex));
	wc->qp_num = le32toh(cqe->qpn);
	wc->src_qp = le32toh(cqe->src_qp);
	wc->wc_flags = vrdma_wc_flags(cqe->flags);
	wc->pkey_index = le16toh(cqe->pkey_index);
	wc->slid = 0;
	wc->sl = vrdma_cqe_sl(cqe);
	wc->dlid_path_bits = 0;
}

#endif /* VRDMA_RING_H */

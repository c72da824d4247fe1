/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * libvrdma: rdma-core provider for the vrdma virtio RDMA device.
 *
 * Object layout of the provider and the uverbs command wrappers carrying
 * the udata of device-spec/include/vrdma_uapi.h.
 */
#ifndef VRDMA_H
#define VRDMA_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/driver.h>
#include <infiniband/kern-abi.h>
#include <rdma/ib_user_ioctl_cmds.h>

#include "vrdma_abi.h"
#include "vrdma_uapi.h"
#include "vrdma_ring.h"

/*
 * The vrdma udata structs are not part of rdma-core's kernel-headers, so
 * there is no generated tagless copy of them: their fields are reached
 * through `drv_payload` of the DECLARE_DRV_CMD wrappers.
 */
#define _STRUCT_vrdma_alloc_ucontext_resp struct {}
#define _STRUCT_vrdma_create_cq_resp struct {}
#define _STRUCT_vrdma_resize_cq_resp struct {}
#define _STRUCT_vrdma_create_qp_resp struct {}
#define _STRUCT_vrdma_create_srq_resp struct {}
#define _STRUCT_vrdma_create_ah_resp struct {}
#define _STRUCT_vrdma_modify_srq_cmd struct {}

DECLARE_DRV_CMD(uvrdma_alloc_ucontext, IB_USER_VERBS_CMD_GET_CONTEXT,
		empty, vrdma_alloc_ucontext_resp);
DECLARE_DRV_CMD(uvrdma_create_cq, IB_USER_VERBS_CMD_CREATE_CQ,
		empty, vrdma_create_cq_resp);
DECLARE_DRV_CMD(uvrdma_create_cq_ex, IB_USER_VERBS_EX_CMD_CREATE_CQ,
		empty, vrdma_create_cq_resp);
DECLARE_DRV_CMD(uvrdma_resize_cq, IB_USER_VERBS_CMD_RESIZE_CQ,
		empty, vrdma_resize_cq_resp);
DECLARE_DRV_CMD(uvrdma_create_qp_ex, IB_USER_VERBS_EX_CMD_CREATE_QP,
		empty, vrdma_create_qp_resp);
DECLARE_DRV_CMD(uvrdma_create_srq, IB_USER_VERBS_CMD_CREATE_SRQ,
		empty, vrdma_create_srq_resp);
DECLARE_DRV_CMD(uvrdma_create_xsrq, IB_USER_VERBS_CMD_CREATE_XSRQ,
		empty, vrdma_create_srq_resp);
DECLARE_DRV_CMD(uvrdma_create_ah, IB_USER_VERBS_CMD_CREATE_AH,
		empty, vrdma_create_ah_resp);
DECLARE_DRV_CMD(uvrdma_modify_srq, IB_USER_VERBS_CMD_MODIFY_SRQ,
		vrdma_modify_srq_cmd, empty);

/* Fixed parts of the entries (§6). */
#define VRDMA_SEND_WQE_HDR	sizeof(struct vrdma_send_wqe)	/* 64 */
#define VRDMA_RECV_WQE_HDR	sizeof(struct vrdma_recv_wqe)	/* 16 */
#define VRDMA_SQ_MIN_SHIFT	6
#define VRDMA_RQ_MIN_SHIFT	5
#define VRDMA_CQE_SHIFT		6
/* The shifts restate entry sizes of vrdma_abi.h (§5, §6): tie them to it. */
static_assert(sizeof(struct vrdma_cqe) == 1 << VRDMA_CQE_SHIFT, "CQE size");
static_assert(VRDMA_SEND_WQE_HDR == 1 << VRDMA_SQ_MIN_SHIFT, "send WQE size");
static_assert(VRDMA_RECV_WQE_HDR + sizeof(struct vrdma_sge) == 1 << VRDMA_RQ_MIN_SHIFT,
	      "receive WQE size");

struct vrdma_device {
	struct verbs_device	ibv_dev;
};

/*
 * A spinlock the provider elides for the objects of a thread domain
 * (ibv_alloc_td(3)): the application promises that one thread at a time
 * uses them, so the lock would only cost atomics.
 */
struct vrdma_lock {
	pthread_spinlock_t	lock;
	bool			need;
};

static inline void vrdma_lock_init(struct vrdma_lock *l, bool need)
{
	l->need = need;
	pthread_spin_init(&l->lock, PTHREAD_PROCESS_PRIVATE);
}

static inline void vrdma_lock(struct vrdma_lock *l)
{
	if (l->need)
		pthread_spin_lock(&l->lock);
}

static inline void vrdma_unlock(struct vrdma_lock *l)
{
	if (l->need)
		pthread_spin_unlock(&l->lock);
}

static inline void vrdma_lock_destroy(struct vrdma_lock *l)
{
	pthread_spin_destroy(&l->lock);
}

/* A thread domain exists only in the provider: the device has no such object. */
struct vrdma_td {
	struct ibv_td		ibv_td;
	atomic_int		refs;	/* parent domains using it */
};

/*
 * A PD, or a parent domain (ibv_alloc_parent_domain(3)) when
 * protection_domain is set. A parent domain exists only in the provider:
 * its ibv_pd.handle is the kernel handle of its protection domain, so every
 * uverbs command that takes it (MR, MW, AH, QP, SRQ) uses that PD.
 * Its allocators (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) are accepted and
 * never called: every ring is memory the kernel allocates and the provider
 * mmaps (device-spec §4.1), and the provider allocates nothing else that
 * the device reads.
 */
struct vrdma_pd {
	struct ibv_pd		ibv_pd;
	atomic_int		refs;	/* parent domains on this PD */
	struct vrdma_pd		*protection_domain;
	struct vrdma_td		*td;
};

struct vrdma_context {
	struct verbs_context	ibv_ctx;
	uint32_t		max_inline_data;
	uint32_t		max_send_sge;
	uint32_t		max_recv_sge;
};

struct vrdma_cq {
	struct verbs_cq		vcq;
	struct vrdma_lock	lock;
	struct vrdma_ring	ring;
	uint32_t		cqn;
	/* extended polling: the CQE between start_poll and end_poll */
	const struct vrdma_cqe	*cur;
};

/* A receive queue: the RQ of a QP or an SRQ. */
struct vrdma_rq {
	struct vrdma_lock	lock;
	struct vrdma_ring	ring;
	uint32_t		max_sge;
};

struct vrdma_sq {
	struct vrdma_lock	lock;
	struct vrdma_ring	ring;
	uint32_t		max_sge;
	uint32_t		max_inline;
};

struct vrdma_qp {
	struct verbs_qp		vqp;
	uint32_t		qpn;
	bool			sq_sig_all;
	struct vrdma_sq		sq;
	struct vrdma_rq		rq;	/* ring.map == NULL with an SRQ */

	/* ibv_wr_* state between wr_start and wr_complete/wr_abort */
	struct vrdma_send_wqe	*wr_cur;	/* WQE being built */
	uint32_t		wr_start_head;
	int			wr_err;
};

struct vrdma_srq {
	struct verbs_srq	vsrq;
	uint32_t		srqn;
	struct vrdma_rq		rq;
};

struct vrdma_dm {
	struct verbs_dm		vdm;
	void			*map;		/* the kernel's pages */
	size_t			map_size;
	uint64_t		length;
};

struct vrdma_ah {
	struct ibv_ah		ibv_ah;
	uint32_t		ah_index;
};

static inline struct vrdma_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vrdma_context, ibv_ctx.context);
}

static inline struct vrdma_pd *to_vpd(struct ibv_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibv_pd);
}

/* Objects created on a parent domain with a thread domain need no locks. */
static inline bool vrdma_pd_single_threaded(struct ibv_pd *ibpd)
{
	return ibpd && to_vpd(ibpd)->td;
}

static inline struct vrdma_cq *to_vcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, vcq.cq);
}

static inline struct vrdma_cq *ex_to_vcq(struct ibv_cq_ex *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, vcq.cq_ex);
}

static inline struct vrdma_qp *to_vqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, vqp.qp);
}

static inline struct vrdma_qp *ex_to_vqp(struct ibv_qp_ex *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, vqp.qp_ex);
}

static inline struct vrdma_srq *to_vsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, vsrq.srq);
}

static inline struct vrdma_dm *to_vdm(struct ibv_dm *ibdm)
{
	return container_of(ibdm, struct vrdma_dm, vdm.dm);
}

static inline struct vrdma_ah *to_vah(struct ibv_ah *ibah)
{
	return container_of(ibah, struct vrdma_ah, ibv_ah);
}

/* Map a ring the kernel handed out (rdma_user_mmap_entry offset). */
int vrdma_map_ring(struct ibv_context *ctx, struct vrdma_ring *r,
		   uint64_t offset, uint64_t size, uint32_t depth,
		   uint32_t shift, uint32_t min_shift);
void vrdma_unmap_ring(struct vrdma_ring *r);

/* vrdma.c */
int vrdma_dealloc_pd(struct ibv_pd *ibpd);
struct ibv_td *vrdma_alloc_td(struct ibv_context *ctx,
			      struct ibv_td_init_attr *attr);
int vrdma_dealloc_td(struct ibv_td *ibtd);
struct ibv_pd *
vrdma_alloc_parent_domain(struct ibv_context *ctx,
			  struct ibv_parent_domain_init_attr *attr);

/* vrdma_dm.c */
struct ibv_dm *vrdma_alloc_dm(struct ibv_context *ctx,
			      struct ibv_alloc_dm_attr *attr);
int vrdma_free_dm(struct ibv_dm *ibdm);
struct ibv_mr *vrdma_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *ibdm,
			       uint64_t dm_offset, size_t length,
			       unsigned int access);
struct ibv_pd *vrdma_import_pd(struct ibv_context *ctx, uint32_t pd_handle);
void vrdma_unimport_pd(struct ibv_pd *ibpd);
struct ibv_mr *vrdma_import_mr(struct ibv_pd *pd, uint32_t mr_handle);
void vrdma_unimport_mr(struct ibv_mr *mr);
struct ibv_dm *vrdma_import_dm(struct ibv_context *ctx, uint32_t dm_handle);
void vrdma_unimport_dm(struct ibv_dm *ibdm);

/* vrdma_cq.c */
struct ibv_cq *vrdma_create_cq(struct ibv_context *ctx, int cqe,
			       struct ibv_comp_channel *channel,
			       int comp_vector);
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *ctx,
				     struct ibv_cq_init_attr_ex *attr);
int vrdma_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc);
int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
int vrdma_modify_cq(struct ibv_cq *ibcq, struct ibv_modify_cq_attr *attr);
int vrdma_resize_cq(struct ibv_cq *ibcq, int cqe);
void vrdma_cq_clean(struct vrdma_cq *cq, uint32_t qpn);
int vrdma_destroy_cq(struct ibv_cq *ibcq);

/* vrdma_qp.c */
struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd,
			       struct ibv_qp_init_attr *attr);
struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *ctx,
				  struct ibv_qp_init_attr_ex *attr);
int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		   int attr_mask, struct ibv_qp_init_attr *init_attr);
int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		    int attr_mask);
int vrdma_destroy_qp(struct ibv_qp *ibqp);
int vrdma_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *mw,
		  struct ibv_mw_bind *mw_bind);
int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		    struct ibv_send_wr **bad_wr);
int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad_wr);

/* vrdma_srq.c */
struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd,
				 struct ibv_srq_init_attr *attr);
int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		     int attr_mask);
int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr);
int vrdma_destroy_srq(struct ibv_srq *ibsrq);
struct ibv_srq *vrdma_create_srq_ex(struct ibv_context *ctx,
				    struct ibv_srq_init_attr_ex *attr);
int vrdma_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num);
struct ibv_xrcd *vrdma_open_xrcd(struct ibv_context *ctx,
				 struct ibv_xrcd_init_attr *attr);
int vrdma_close_xrcd(struct ibv_xrcd *ibxrcd);
struct ibv_qp *vrdma_open_qp(struct ibv_context *ctx,
			     struct ibv_qp_open_attr *attr);
int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad_wr);
int vrdma_post_one_recv(struct vrdma_rq *rq, const struct ibv_recv_wr *wr);

#endif /* VRDMA_H */

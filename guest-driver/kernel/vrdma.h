/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vrdma: virtio RDMA (RoCEv2) guest driver.
 *
 * Section numbers (§n) refer to device-spec/virtio-rdma.md; the binary
 * layouts are in device-spec/include/vrdma_abi.h.
 */
#ifndef VRDMA_H
#define VRDMA_H

#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/refcount.h>
#include <linux/spinlock.h>
#include <linux/u64_stats_sync.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma_abi.h"
#include "vrdma_uapi.h"

#define DRV_NAME		"vrdma"

/* How long a control command may take before the device is declared dead. */
#define VRDMA_CMD_TIMEOUT_MS	10000

#define VRDMA_NUM_EVENT_BUFS	256
#define VRDMA_NUM_PAGEREQ_BUFS	64
/* Ordered page request queues; a chunk always uses the same one. */
#define VRDMA_ODP_NR_WQ		4

#define VRDMA_SQ_MIN_SHIFT	6	/* 64-byte send WQE slots at least */
#define VRDMA_RQ_MIN_SHIFT	5	/* 32-byte receive WQE slots at least */
#define VRDMA_MAX_WQE_SHIFT	12
#define VRDMA_CQE_SHIFT		6	/* 64-byte CQEs */
/* The shifts restate entry sizes of vrdma_abi.h (§5, §6): tie them to it. */
static_assert(sizeof(struct vrdma_cqe) == 1 << VRDMA_CQE_SHIFT);
static_assert(sizeof(struct vrdma_send_wqe) == 1 << VRDMA_SQ_MIN_SHIFT);
static_assert(sizeof(struct vrdma_recv_wqe) + sizeof(struct vrdma_sge) ==
	      1 << VRDMA_RQ_MIN_SHIFT);
#define VRDMA_GRH_BYTES		40

struct vrdma_eth;

/*
 * A ring in guest memory (§4): page 0 is the control page, entries follow.
 * The pages are allocated one by one so that large rings never need
 * physically contiguous memory; vmap gives the kernel a linear view and
 * user space maps the same pages.
 */
struct vrdma_ring {
	struct page **pages;
	dma_addr_t *dma;
	u32 npages;
	u32 depth;		/* entries, power of two */
	u32 entry_shift;	/* log2 of the entry size */
	void *va;		/* vmap of all pages */
	struct vrdma_ring_ctrl *ctrl;
	void *entries;
};

/* An mmap cookie handed to user space for one ring. */
struct vrdma_mmap_entry {
	struct rdma_user_mmap_entry rdma;
	struct page **pages;
	u32 npages;
};

struct vrdma_ucontext {
	struct ib_ucontext ibuc;
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 pdn;
};

/* XRC domain (§13.7) */
struct vrdma_xrcd {
	struct ib_xrcd ibxrcd;
	u32 xrcdn;
};

struct vrdma_ah {
	struct ib_ah ibah;
	u32 ah_index;
};

struct vrdma_cq {
	struct ib_cq ibcq;
	u32 cqn;
	bool user;
	bool resizing;
	spinlock_t lock;		/* consumer index, ring swap */
	struct mutex resize_mutex;	/* one RESIZE_CQ at a time */
	struct vrdma_ring ring;
	struct rdma_user_mmap_entry *mmap;
	refcount_t refs;		/* event dispatch vs. destroy */
	struct completion free;
};

struct vrdma_srq {
	struct ib_srq ibsrq;
	u32 srqn;
	bool user;
	u32 max_sge;
	spinlock_t lock;		/* producer index, ring, resizing */
	bool resizing;			/* MODIFY_SRQ with MAX_WR outstanding */
	struct mutex resize_mutex;	/* one resize at a time */
	struct vrdma_ring ring;
	struct rdma_user_mmap_entry *mmap;
	refcount_t refs;
	struct completion free;
};

/* §11.9 counters of struct vrdma_stats: all, and those a QP has */
#define VRDMA_NR_STATS		13
#define VRDMA_NR_QP_STATS	10

struct vrdma_qp {
	struct ib_qp ibqp;
	u32 qpn;
	bool user;
	u8 sq_sig_all;
	bool in_error;			/* QP is in the ERROR state */
	u32 max_send_sge;
	u32 max_recv_sge;
	u32 max_inline;
	spinlock_t sq_lock;		/* SQ producer index */
	spinlock_t rq_lock;		/* RQ producer index */
	struct vrdma_ring sq;
	struct vrdma_ring rq;		/* depth 0 with an SRQ */
	struct rdma_user_mmap_entry *sq_mmap;
	struct rdma_user_mmap_entry *rq_mmap;
	refcount_t refs;
	struct completion free;
	/* bound to an rdma_counter (vrdma_stats.c), under its lock */
	struct list_head ctr_node;
	u64 ctr_base[VRDMA_NR_QP_STATS];
};

struct vrdma_mr {
	struct ib_mr ibmr;
	struct vrdma_dev *dev;
	struct ib_umem *umem;
	struct vrdma_dm *dm;		/* an MR over device memory */
	int access;			/* IB_ACCESS_* of a user MR, for rereg */
	/* fast registration page list (alloc_mr + map_mr_sg) */
	__le64 *pl;
	dma_addr_t pl_dma;
	u32 pl_max;
	u32 npages;
	/* on-demand paging (vrdma_odp.c) */
	bool odp;
	bool implicit;
	u64 odp_iova;			/* iova of umem start (explicit) */
	struct xarray children;		/* implicit: chunk index -> umem_odp */
	struct xarray fault_rr;		/* chunk index -> next segment to answer */
	refcount_t refs;		/* page request workers vs. dereg */
	struct completion free;
};

/*
 * Device memory (ibv_alloc_dm): zeroed guest pages of the driver, mapped
 * into the process; MRs over them are page-list MRs with iova 0.
 */
struct vrdma_dm {
	struct ib_dm ibdm;
	struct vrdma_ring mem;		/* pages and dma only: no ring in them */
	struct rdma_user_mmap_entry *mmap;
	bool unsettled;			/* an MR of it may still be in the device */
};

/* All device memory of one device together (ib_device_attr.max_dm_size). */
#define VRDMA_DM_MAX_SIZE	(256 * 1024)

/* A memory window (§12.8): the device holds its state, the rkey is ibmw.rkey. */
struct vrdma_mw {
	struct ib_mw ibmw;
};

struct vrdma_dev {
	struct ib_device ib;
	struct virtio_device *vdev;
	struct device *dma_dev;		/* the virtio PCI function */
	struct vrdma_config cfg;	/* little-endian as read */
	bool has_odp;
	bool has_odp_implicit;

	struct virtqueue *vqs[VRDMA_NUM_VQS];

	/* control queue (§11) */
	spinlock_t ctrl_lock;
	wait_queue_head_t ctrl_wait;	/* room in the control queue */
	bool broken;

	/* memory the device may still access, freed after a reset (§14.1) */
	spinlock_t quarantine_lock;
	struct list_head quarantine;

	/* doorbell queue (§8) */
	spinlock_t db_lock;

	/* event queue (§9) */
	spinlock_t ev_lock;
	struct vrdma_event *ev_bufs;

	/* page request queue (§10) */
	spinlock_t pr_lock;
	struct vrdma_page_req *pr_bufs;
	struct workqueue_struct *odp_wq[VRDMA_ODP_NR_WQ];

	struct xarray cqs;
	struct xarray qps;
	struct xarray srqs;
	struct xarray odp_mrs;		/* key index -> ODP MR */
	atomic64_t dm_bytes;		/* device memory allocated, in pages */

	/* hardware counters (vrdma_stats.c) */
	struct xarray counters;		/* rdma_counter id -> vrdma_counter */
	struct mutex ctr_lock;		/* ctr_attributed */
	u64 ctr_attributed[VRDMA_NR_QP_STATS];

	struct work_struct config_work;
	struct work_struct fatal_work;	/* reports the device dead, once */
	bool recovering;		/* a reset and re-probe is queued */
	u32 port_state;

	struct net_device *netdev;
	struct vrdma_eth *eth;
	bool ib_registered;
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vrdma_dev, ib);
}

static inline struct ib_ucontext *vrdma_uctx(struct ib_udata *udata)
{
	return &rdma_udata_to_drv_context(udata, struct vrdma_ucontext,
					  ibuc)->ibuc;
}

static inline struct vrdma_pd *to_vpd(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct vrdma_pd, ibpd);
}

static inline struct vrdma_xrcd *to_vxrcd(struct ib_xrcd *ibxrcd)
{
	return container_of(ibxrcd, struct vrdma_xrcd, ibxrcd);
}

static inline struct vrdma_ah *to_vah(struct ib_ah *ibah)
{
	return container_of(ibah, struct vrdma_ah, ibah);
}

static inline struct vrdma_cq *to_vcq(struct ib_cq *ibcq)
{
	return container_of(ibcq, struct vrdma_cq, ibcq);
}

static inline struct vrdma_srq *to_vsrq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct vrdma_srq, ibsrq);
}

static inline struct vrdma_qp *to_vqp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct vrdma_qp, ibqp);
}

static inline struct vrdma_mr *to_vmr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct vrdma_mr, ibmr);
}

static inline struct vrdma_mmap_entry *
to_vmmap(struct rdma_user_mmap_entry *e)
{
	return container_of(e, struct vrdma_mmap_entry, rdma);
}

#define VCFG(dev, f)	le32_to_cpu((dev)->cfg.f)
#define VCFG64(dev, f)	le64_to_cpu((dev)->cfg.f)

static inline void *vrdma_ring_entry(struct vrdma_ring *r, u32 idx)
{
	return r->entries + ((size_t)(idx & (r->depth - 1)) << r->entry_shift);
}

/* vrdma_cmd.c */
int vrdma_cmd(struct vrdma_dev *dev, u16 opcode, const void *req,
	      size_t req_len, const void *tail, size_t tail_len, void *resp,
	      size_t resp_len);
int vrdma_cmd_atomic(struct vrdma_dev *dev, u16 opcode, const void *req,
		     size_t req_len, void *resp, size_t resp_len);
void vrdma_ctrl_done(struct virtqueue *vq);
void vrdma_cmd_drain(struct vrdma_dev *dev);
int vrdma_doorbell(struct vrdma_dev *dev, u32 type, u32 id);
void vrdma_db_done(struct virtqueue *vq);
void vrdma_db_drain(struct vrdma_dev *dev);
int vrdma_status_to_errno(u32 status);
void vrdma_quarantine_ring(struct vrdma_dev *dev, struct vrdma_ring *r);
void vrdma_quarantine_buf(struct vrdma_dev *dev, void *buf);
void vrdma_quarantine_umem(struct vrdma_dev *dev, struct ib_umem *umem);
void vrdma_quarantine_coherent(struct vrdma_dev *dev, void *cpu,
			       dma_addr_t dma, size_t size);
void vrdma_quarantine_release(struct vrdma_dev *dev);
void vrdma_cmd_tail_free(struct vrdma_dev *dev, void *tail, int err);

/*
 * A command that timed out may have been executed, or may still be: the
 * memory it references stays the device's until a reset (§14.1).
 */
static inline bool vrdma_cmd_unsettled(int err)
{
	return err == -ETIMEDOUT;
}

/*
 * The result of a DESTROY_xx or DEREG_MR: true if the device no longer
 * accesses the object's memory (§16: once such a command completes;
 * NOT_FOUND: it never had it). Any other outcome (an error status, a
 * timeout, a broken device that was not sent the command) leaves the
 * object in the device until it is reset.
 */
static inline bool vrdma_released(int err)
{
	return !err || err == -ENOENT;
}

/* vrdma_ring.c */
int vrdma_pages_alloc(struct vrdma_dev *dev, struct vrdma_ring *r, u32 npages);
int vrdma_ring_alloc(struct vrdma_dev *dev, struct vrdma_ring *r, u32 depth,
		     u32 entry_shift);
void vrdma_ring_free(struct vrdma_dev *dev, struct vrdma_ring *r);
void vrdma_ring_retire(struct vrdma_dev *dev, struct vrdma_ring *r,
		       bool released);
__le64 *vrdma_ring_page_list(struct vrdma_ring *r);
struct rdma_user_mmap_entry *vrdma_ring_mmap_entry(struct ib_ucontext *uctx,
						   struct vrdma_ring *r,
						   u64 *offset, u64 *size);
int vrdma_mmap(struct ib_ucontext *uctx, struct vm_area_struct *vma);
void vrdma_mmap_free(struct rdma_user_mmap_entry *entry);

/* vrdma_event.c */
int vrdma_event_init(struct vrdma_dev *dev);
void vrdma_event_cleanup(struct vrdma_dev *dev);
void vrdma_event_done(struct virtqueue *vq);
void vrdma_port_event(struct vrdma_dev *dev, bool active);
void vrdma_config_work(struct work_struct *work);
void vrdma_mark_broken(struct vrdma_dev *dev);
void vrdma_fatal_work(struct work_struct *work);

/* vrdma_main.c */
void vrdma_recover(struct vrdma_dev *dev);

/* vrdma_netdev.c */
int vrdma_eth_init(struct vrdma_dev *dev);
void vrdma_eth_cleanup(struct vrdma_dev *dev);
void vrdma_eth_free(struct vrdma_dev *dev);
void vrdma_eth_rx_done(struct virtqueue *vq);
void vrdma_eth_tx_done(struct virtqueue *vq);
void vrdma_eth_carrier(struct vrdma_dev *dev, bool up);

/* vrdma_verbs.c */
void vrdma_fill_ucontext_resp(struct vrdma_dev *dev,
			      struct vrdma_alloc_ucontext_resp *resp);
extern const struct ib_device_ops vrdma_dev_ops;
int vrdma_query_device(struct ib_device *ibdev, struct ib_device_attr *attr,
		       struct ib_udata *udata);

/* vrdma_pd.c */
int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
int vrdma_alloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata);
int vrdma_dealloc_xrcd(struct ib_xrcd *ibxrcd, struct ib_udata *udata);

/* vrdma_ah.c */
void vrdma_fill_av(struct vrdma_av *av, const struct rdma_ah_attr *attr);
int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init,
		    struct ib_udata *udata);
int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags);
int vrdma_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid);
int vrdma_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid);

/* vrdma_cq.c */
int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);
int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		    struct ib_udata *udata);
int vrdma_modify_cq(struct ib_cq *ibcq, u16 cq_count, u16 cq_period);
int vrdma_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata);
int vrdma_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc);
int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);
struct vrdma_cq *vrdma_cq_get(struct vrdma_dev *dev, u32 cqn);
void vrdma_cq_put(struct vrdma_cq *cq);

/* vrdma_qp.c */
int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		    struct ib_udata *udata);
int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		    struct ib_udata *udata);
int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		   struct ib_qp_init_attr *init);
int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);
void vrdma_drain_sq(struct ib_qp *ibqp);
void vrdma_drain_rq(struct ib_qp *ibqp);
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		    const struct ib_send_wr **bad_wr);
int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		    const struct ib_recv_wr **bad_wr);
int vrdma_post_recv_ring(struct vrdma_ring *r, const struct ib_recv_wr **wr,
			 u32 max_sge, int *posted);
struct vrdma_qp *vrdma_qp_get(struct vrdma_dev *dev, u32 qpn);
void vrdma_qp_put(struct vrdma_qp *qp);

/* vrdma_srq.c */
int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		     struct ib_udata *udata);
int vrdma_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		     enum ib_srq_attr_mask mask, struct ib_udata *udata);
int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);
int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			const struct ib_recv_wr **bad_wr);
struct vrdma_srq *vrdma_srq_get(struct vrdma_dev *dev, u32 srqn);
void vrdma_srq_put(struct vrdma_srq *srq);

/* vrdma_dm.c */
extern const struct uapi_definition vrdma_uapi_defs[];
struct ib_dm *vrdma_alloc_dm(struct ib_device *ibdev,
			     struct ib_ucontext *uctx,
			     struct ib_dm_alloc_attr *attr,
			     struct uverbs_attr_bundle *attrs);
int vrdma_dealloc_dm(struct ib_dm *ibdm, struct uverbs_attr_bundle *attrs);
struct ib_mr *vrdma_reg_dm_mr(struct ib_pd *ibpd, struct ib_dm *ibdm,
			      struct ib_dm_mr_attr *attr,
			      struct uverbs_attr_bundle *attrs);
int vrdma_query_ucontext(struct ib_ucontext *uctx,
			 struct uverbs_attr_bundle *attrs);

/* vrdma_mr.c */
struct vrdma_mr *vrdma_mr_new(struct vrdma_dev *dev);
void vrdma_mr_set_keys(struct vrdma_mr *mr,
		       const struct vrdma_resp_reg_mr *resp);
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access);
struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				u64 virt_addr, int access,
				struct ib_udata *udata);
struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			     u32 max_num_sg);
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		    unsigned int *sg_offset);
int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);
int vrdma_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int vrdma_dealloc_mw(struct ib_mw *ibmw);
struct ib_mr *vrdma_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start,
				  u64 length, u64 virt_addr, int access,
				  struct ib_pd *ibpd, struct ib_udata *udata);
int vrdma_advise_mr(struct ib_pd *ibpd, enum ib_uverbs_advise_mr_advice advice,
		    u32 flags, struct ib_sge *sg_list, u32 num_sge,
		    struct uverbs_attr_bundle *attrs);
u32 vrdma_access(int ib_access);

/* vrdma_odp.c */
struct ib_mr *vrdma_reg_odp_mr(struct vrdma_pd *pd, u64 start, u64 length,
			       u64 virt_addr, int access);
void vrdma_odp_unpublish(struct vrdma_mr *mr);
void vrdma_odp_dereg(struct vrdma_mr *mr);
struct vrdma_mr *vrdma_odp_mr_get(struct vrdma_dev *dev, u32 key);
void vrdma_odp_mr_put(struct vrdma_mr *mr);
void vrdma_pagereq_done(struct virtqueue *vq);
int vrdma_odp_wq_init(struct vrdma_dev *dev);
void vrdma_odp_wq_destroy(struct vrdma_dev *dev);
int vrdma_pagereq_init(struct vrdma_dev *dev);
void vrdma_pagereq_cleanup(struct vrdma_dev *dev);

/* vrdma_stats.c */
struct rdma_hw_stats *vrdma_alloc_hw_port_stats(struct ib_device *ibdev,
						u32 port_num);
struct rdma_hw_stats *vrdma_alloc_hw_device_stats(struct ib_device *ibdev);
int vrdma_get_hw_stats(struct ib_device *ibdev, struct rdma_hw_stats *stats,
		       u32 port_num, int index);
struct rdma_hw_stats *vrdma_counter_alloc_stats(struct rdma_counter *counter);
int vrdma_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp);
int vrdma_counter_unbind_qp(struct ib_qp *ibqp);
int vrdma_counter_update_stats(struct rdma_counter *counter);
int vrdma_counter_dealloc(struct rdma_counter *counter);

/* After the prototypes: its ib_device_ops adapters call them. */
#include "vrdma_compat.h"

#endif /* VRDMA_H */

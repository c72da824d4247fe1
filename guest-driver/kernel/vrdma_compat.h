/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What differs between the kernels vrdma.ko is built for: Debian's 6.1
 * (bookworm), 6.12 (trixie) and 7.3 (trixie-backports). Only this file
 * tests LINUX_VERSION_CODE; the rest of the driver calls the one name each
 * helper here gives it. A kernel that lacks an operation does not get it
 * advertised (ATOMIC WRITE and FLUSH before 6.2).
 */
#ifndef VRDMA_COMPAT_H
#define VRDMA_COMPAT_H

#include <linux/version.h>
#include <linux/hmm.h>
#include <linux/pci-p2pdma.h>
#include <linux/virtio_config.h>
#include <rdma/ib_umem_odp.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "vrdma_abi.h"

/*
 * virtio_find_vqs() takes an array of struct virtqueue_info since 6.11;
 * before, it took parallel arrays of callbacks and names.
 */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 11, 0)
struct virtqueue_info {
	const char *name;	/* NULL: the queue is not set up */
	vq_callback_t *callback;
	bool ctx;
};

#define VRDMA_COMPAT_MAX_VQS	8

static inline int vrdma_virtio_find_vqs(struct virtio_device *vdev,
					unsigned int nvqs,
					struct virtqueue *vqs[],
					struct virtqueue_info info[])
{
	vq_callback_t *callbacks[VRDMA_COMPAT_MAX_VQS];
	const char *names[VRDMA_COMPAT_MAX_VQS];
	unsigned int i;

	if (WARN_ON(nvqs > VRDMA_COMPAT_MAX_VQS))
		return -EINVAL;
	for (i = 0; i < nvqs; i++) {
		callbacks[i] = info[i].callback;
		names[i] = info[i].name;
	}
	return virtio_find_vqs(vdev, nvqs, vqs, callbacks, names, NULL);
}
#else
static inline int vrdma_virtio_find_vqs(struct virtio_device *vdev,
					unsigned int nvqs,
					struct virtqueue *vqs[],
					struct virtqueue_info info[])
{
	return virtio_find_vqs(vdev, nvqs, vqs, info, NULL);
}
#endif

/*
 * IBTA 1.5 ATOMIC WRITE and FLUSH (§2.2 device_caps): ib_core has them
 * since 6.2. Before, the device's VRDMA_DEVCAP_ATOMIC_WRITE and
 * VRDMA_DEVCAP_FLUSH_GLOBAL are not reported, and ib_uverbs refuses the
 * IB_ACCESS_FLUSH_* bits, so no MR asks the device for them either.
 */
static inline u64 vrdma_ibta15_cap_flags(u32 device_caps)
{
	u64 flags = 0;

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
	if (device_caps & VRDMA_DEVCAP_ATOMIC_WRITE)
		flags |= IB_DEVICE_ATOMIC_WRITE;
	if (device_caps & VRDMA_DEVCAP_FLUSH_GLOBAL)
		flags |= IB_DEVICE_FLUSH_GLOBAL;
#endif
	return flags;
}

/*
 * The work completion opcode of VRDMA_WC_ATOMIC_WRITE / VRDMA_WC_FLUSH.
 * Kernel QPs never post either (vrdma_qp.c refuses them), so a kernel CQ
 * sees them only from a device that breaks §7; before 6.2 such a
 * completion is reported with the opcode of its wire answer's class:
 * an ATOMIC WRITE is a write, a FLUSH is answered like an RDMA READ.
 */
static inline enum ib_wc_opcode vrdma_ibta15_wc_opcode(u8 opcode)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
	return opcode == VRDMA_WC_FLUSH ? IB_WC_FLUSH : IB_WC_ATOMIC_WRITE;
#else
	return opcode == VRDMA_WC_FLUSH ? IB_WC_RDMA_READ : IB_WC_RDMA_WRITE;
#endif
}

/*
 * ib_device_ops entries whose signature changed: the ops table points at
 * vrdma_ib_<op>(), which calls the driver's vrdma_<op>() (vrdma.h).
 *
 * create_cq gets the uverbs attribute bundle since 6.10 (the driver's
 * udata is in it), the udata alone before.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
static inline int vrdma_ib_create_cq(struct ib_cq *ibcq,
				     const struct ib_cq_init_attr *attr,
				     struct uverbs_attr_bundle *attrs)
{
	return vrdma_create_cq(ibcq, attr, attrs ? &attrs->driver_udata : NULL);
}
#else
static inline int vrdma_ib_create_cq(struct ib_cq *ibcq,
				     const struct ib_cq_init_attr *attr,
				     struct ib_udata *udata)
{
	return vrdma_create_cq(ibcq, attr, udata);
}
#endif

/* counter_bind_qp and counter_unbind_qp get the port since 6.15 (one here). */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 15, 0)
static inline int vrdma_ib_counter_bind_qp(struct rdma_counter *counter,
					   struct ib_qp *ibqp, u32 port)
{
	return vrdma_counter_bind_qp(counter, ibqp);
}

static inline int vrdma_ib_counter_unbind_qp(struct ib_qp *ibqp, u32 port)
{
	return vrdma_counter_unbind_qp(ibqp);
}
#else
static inline int vrdma_ib_counter_bind_qp(struct rdma_counter *counter,
					   struct ib_qp *ibqp)
{
	return vrdma_counter_bind_qp(counter, ibqp);
}

static inline int vrdma_ib_counter_unbind_qp(struct ib_qp *ibqp)
{
	return vrdma_counter_unbind_qp(ibqp);
}
#endif

/*
 * reg_user_mr gets a DMA handle (TPH steering hints) since 6.17; vrdma
 * has none to offer, so an MR that asks for one is refused, as rxe does.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
static inline struct ib_mr *vrdma_ib_reg_user_mr(struct ib_pd *ibpd,
						 u64 start, u64 length,
						 u64 virt_addr, int access,
						 struct ib_dmah *dmah,
						 struct ib_udata *udata)
{
	if (dmah)
		return ERR_PTR(-EOPNOTSUPP);
	return vrdma_reg_user_mr(ibpd, start, length, virt_addr, access, udata);
}
#else
static inline struct ib_mr *vrdma_ib_reg_user_mr(struct ib_pd *ibpd,
						 u64 start, u64 length,
						 u64 virt_addr, int access,
						 struct ib_udata *udata)
{
	return vrdma_reg_user_mr(ibpd, start, length, virt_addr, access, udata);
}
#endif

/*
 * Linux 7.1 (the rdma tree of spring 2026) renamed resize_cq to
 * resize_user_cq with an unsigned CQE count, and replaced ib_umem_get()
 * by ib_umem_get_va(). 6.12 has the old names and 7.3 the new ones; the
 * releases in between are not built here. The ops table names the member
 * through VRDMA_RESIZE_CQ_OP.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(7, 1, 0)
#define VRDMA_RESIZE_CQ_OP	resize_user_cq

static inline int vrdma_ib_resize_cq(struct ib_cq *ibcq, unsigned int cqe,
				     struct ib_udata *udata)
{
	if (cqe > INT_MAX)
		return -EINVAL;
	return vrdma_resize_cq(ibcq, cqe, udata);
}

static inline struct ib_umem *vrdma_umem_get(struct ib_device *ibdev,
					     unsigned long addr, size_t size,
					     int access)
{
	return ib_umem_get_va(ibdev, addr, size, access);
}
#else
#define VRDMA_RESIZE_CQ_OP	resize_cq

static inline int vrdma_ib_resize_cq(struct ib_cq *ibcq, int cqe,
				     struct ib_udata *udata)
{
	return vrdma_resize_cq(ibcq, cqe, udata);
}

static inline struct ib_umem *vrdma_umem_get(struct ib_device *ibdev,
					     unsigned long addr, size_t size,
					     int access)
{
	return ib_umem_get(ibdev, addr, size, access);
}
#endif

/*
 * ODP (§14): until 6.15, ib_umem_odp_map_dma_and_lock() faults the pages
 * in and maps them for DMA, keeping each address with its access bits
 * (ODP_*_ALLOWED_BIT) in odp->dma_list. Since 6.16 (struct hmm_dma_map)
 * it only faults them in, records them in odp->map.pfn_list with
 * HMM_PFN_WRITE, and the driver maps each page with hmm_dma_map_pfn();
 * ib_umem_odp_unmap_dma_pages() undoes either.
 */
static inline u64 vrdma_odp_access_mask(bool write)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 16, 0)
	return write ? HMM_PFN_WRITE : 0;
#else
	return ODP_READ_ALLOWED_BIT | (write ? ODP_WRITE_ALLOWED_BIT : 0);
#endif
}

/*
 * The DMA address of umem page @idx after ib_umem_odp_map_dma_and_lock()
 * faulted it in (umem_mutex held), and whether the device may write it.
 */
static inline int vrdma_odp_page_dma(struct ib_umem_odp *odp, size_t idx,
				     dma_addr_t *dma, bool *writable)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 16, 0)
	struct ib_device *ibdev = odp->umem.ibdev;
	struct pci_p2pdma_map_state p2pdma_state = {};
	unsigned long pfn = odp->map.pfn_list[idx];
	dma_addr_t d;

	if (!(pfn & HMM_PFN_VALID))
		return -EFAULT;
	d = hmm_dma_map_pfn(ibdev->dma_device, &odp->map, idx, &p2pdma_state);
	if (ib_dma_mapping_error(ibdev, d))
		return -EFAULT;
	/* npages counts mapped pages, as ib_umem_odp_unmap_dma_pages() does */
	if (!(pfn & HMM_PFN_DMA_MAPPED))
		odp->npages++;
	*dma = d;
	*writable = pfn & HMM_PFN_WRITE;
#else
	dma_addr_t d = odp->dma_list[idx];

	*dma = d & ODP_DMA_ADDR_MASK;
	*writable = d & ODP_WRITE_ALLOWED_BIT;
#endif
	return 0;
}

#endif /* VRDMA_COMPAT_H */

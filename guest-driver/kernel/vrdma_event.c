// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma event queue (§9): CQ completions, affiliated async events and
 * port events. Handlers run in the virtqueue interrupt.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>

#include "vrdma.h"

static int vrdma_event_post(struct vrdma_dev *dev, struct vrdma_event *ev)
{
	struct scatterlist sg;

	sg_init_one(&sg, ev, sizeof(*ev));
	return virtqueue_add_inbuf(dev->vqs[VRDMA_VQ_EVENT], &sg, 1, ev,
				   GFP_ATOMIC);
}

void vrdma_port_event(struct vrdma_dev *dev, bool active)
{
	u32 state = active ? VRDMA_PORT_ACTIVE : VRDMA_PORT_DOWN;
	struct ib_event ev = {};

	u32 old = xchg(&dev->port_state, state);

	vrdma_eth_carrier(dev, active);
	if (old == state || !READ_ONCE(dev->ib_registered))
		return;
	ev.device = &dev->ib;
	ev.element.port_num = 1;
	ev.event = active ? IB_EVENT_PORT_ACTIVE : IB_EVENT_PORT_ERR;
	ib_dispatch_event(&ev);
}

/*
 * The device can no longer be used (it reported a fatal error, or stopped
 * answering commands). Every later command fails with -EIO at once; users
 * learn it once, from a port that goes down and IB_EVENT_DEVICE_FATAL. The
 * events are sent from a work item: callers may hold locks, and
 * ib_dispatch_event() may sleep.
 */
void vrdma_mark_broken(struct vrdma_dev *dev)
{
	if (!xchg(&dev->broken, true))
		schedule_work(&dev->fatal_work);
}

void vrdma_fatal_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev,
					     fatal_work);
	struct ib_event ev = {};

	vrdma_port_event(dev, false);
	if (!READ_ONCE(dev->ib_registered))
		return;
	ev.device = &dev->ib;
	ev.element.port_num = 1;
	ev.event = IB_EVENT_DEVICE_FATAL;
	ib_dispatch_event(&ev);
}

void vrdma_config_work(struct work_struct *work)
{
	struct vrdma_dev *dev = container_of(work, struct vrdma_dev,
					     config_work);
	u32 state;

	/* §2.4: e.g. a restarted backend that has none of our objects. */
	if (dev->vdev->config->get_status(dev->vdev) &
	    VIRTIO_CONFIG_S_NEEDS_RESET) {
		dev_err(&dev->vdev->dev, "device needs a reset\n");
		vrdma_recover(dev);
		return;
	}
	virtio_cread_le(dev->vdev, struct vrdma_config, port_state, &state);
	vrdma_port_event(dev, state == VRDMA_PORT_ACTIVE);
}

static void vrdma_cq_event(struct vrdma_dev *dev, u32 type, u32 cqn)
{
	struct vrdma_cq *cq = vrdma_cq_get(dev, cqn);
	struct ib_event ev = {};

	if (!cq) {
		dev_dbg(&dev->vdev->dev, "event %u for unknown CQ %u\n", type,
			cqn);
		return;
	}
	if (type == VRDMA_EV_CQ_COMP) {
		if (cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	} else if (cq->ibcq.event_handler) {
		ev.device = &dev->ib;
		ev.element.cq = &cq->ibcq;
		ev.event = IB_EVENT_CQ_ERR;
		cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
	}
	vrdma_cq_put(cq);
}

static void vrdma_qp_event(struct vrdma_dev *dev, u32 type, u32 qpn)
{
	struct vrdma_qp *qp = vrdma_qp_get(dev, qpn);
	struct ib_event ev = {};

	if (!qp) {
		dev_dbg(&dev->vdev->dev, "event %u for unknown QP %u\n", type,
			qpn);
		return;
	}
	switch (type) {
	case VRDMA_EV_QP_FATAL:
	case VRDMA_EV_QP_REQ_ERR:
	case VRDMA_EV_QP_ACCESS_ERR:
		/* The device moved the QP to ERROR (§13). */
		WRITE_ONCE(qp->in_error, true);
		break;
	default:
		break;
	}
	switch (type) {
	case VRDMA_EV_QP_FATAL:
		ev.event = IB_EVENT_QP_FATAL;
		break;
	case VRDMA_EV_QP_REQ_ERR:
		ev.event = IB_EVENT_QP_REQ_ERR;
		break;
	case VRDMA_EV_QP_ACCESS_ERR:
		ev.event = IB_EVENT_QP_ACCESS_ERR;
		break;
	case VRDMA_EV_COMM_EST:
		ev.event = IB_EVENT_COMM_EST;
		break;
	case VRDMA_EV_SQ_DRAINED:
		ev.event = IB_EVENT_SQ_DRAINED;
		break;
	default:
		ev.event = IB_EVENT_QP_LAST_WQE_REACHED;
		break;
	}
	if (qp->ibqp.event_handler) {
		ev.device = &dev->ib;
		ev.element.qp = &qp->ibqp;
		qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
	}
	vrdma_qp_put(qp);
}

static void vrdma_srq_event(struct vrdma_dev *dev, u32 type, u32 srqn)
{
	struct vrdma_srq *srq = vrdma_srq_get(dev, srqn);
	struct ib_event ev = {};

	if (!srq)
		return;
	if (srq->ibsrq.event_handler) {
		ev.device = &dev->ib;
		ev.element.srq = &srq->ibsrq;
		ev.event = type == VRDMA_EV_SRQ_LIMIT_REACHED ?
			   IB_EVENT_SRQ_LIMIT_REACHED : IB_EVENT_SRQ_ERR;
		srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
	}
	vrdma_srq_put(srq);
}

static void vrdma_handle_event(struct vrdma_dev *dev,
			       const struct vrdma_event *e)
{
	u32 type = le32_to_cpu(e->type);
	u32 id = le32_to_cpu(e->id);

	dev_dbg(&dev->vdev->dev, "event %u id %u info %u\n", type, id,
		le32_to_cpu(e->info));
	switch (type) {
	case VRDMA_EV_CQ_COMP:
	case VRDMA_EV_CQ_ERR:
		vrdma_cq_event(dev, type, id);
		break;
	case VRDMA_EV_QP_FATAL:
	case VRDMA_EV_QP_REQ_ERR:
	case VRDMA_EV_QP_ACCESS_ERR:
	case VRDMA_EV_COMM_EST:
	case VRDMA_EV_SQ_DRAINED:
	case VRDMA_EV_QP_LAST_WQE_REACHED:
		vrdma_qp_event(dev, type, id);
		break;
	case VRDMA_EV_SRQ_LIMIT_REACHED:
	case VRDMA_EV_SRQ_ERR:
		vrdma_srq_event(dev, type, id);
		break;
	case VRDMA_EV_PORT_ACTIVE:
	case VRDMA_EV_PORT_ERR:
		vrdma_port_event(dev, type == VRDMA_EV_PORT_ACTIVE);
		break;
	case VRDMA_EV_DEVICE_FATAL:
		dev_err(&dev->vdev->dev, "device reported a fatal error\n");
		vrdma_recover(dev);
		break;
	default:
		dev_warn_ratelimited(&dev->vdev->dev, "unknown event %u\n",
				     type);
		break;
	}
}

void vrdma_event_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_event *ev;
	unsigned long flags;
	unsigned int len;
	bool posted = false;

	spin_lock_irqsave(&dev->ev_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		while ((ev = virtqueue_get_buf(vq, &len))) {
			if (len >= sizeof(*ev))
				vrdma_handle_event(dev, ev);
			memset(ev, 0, sizeof(*ev));
			if (!vrdma_event_post(dev, ev))
				posted = true;
		}
	} while (!virtqueue_enable_cb(vq));
	if (posted)
		virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->ev_lock, flags);
}

/* Call after virtio_device_ready(). */
int vrdma_event_init(struct vrdma_dev *dev)
{
	unsigned long flags;
	int i, err = 0;

	dev->ev_bufs = kcalloc(VRDMA_NUM_EVENT_BUFS, sizeof(*dev->ev_bufs),
			       GFP_KERNEL);
	if (!dev->ev_bufs)
		return -ENOMEM;
	spin_lock_irqsave(&dev->ev_lock, flags);
	for (i = 0; i < VRDMA_NUM_EVENT_BUFS; i++) {
		err = vrdma_event_post(dev, &dev->ev_bufs[i]);
		if (err)
			break;
	}
	virtqueue_kick(dev->vqs[VRDMA_VQ_EVENT]);
	spin_unlock_irqrestore(&dev->ev_lock, flags);
	/* A queue smaller than our buffer count is fine. */
	return i ? 0 : err;
}

/* Call after the device was reset. */
void vrdma_event_cleanup(struct vrdma_dev *dev)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_EVENT];

	if (!dev->ev_bufs)
		return;
	while (virtqueue_detach_unused_buf(vq))
		;
	kfree(dev->ev_bufs);
	dev->ev_bufs = NULL;
}

// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma: virtio driver for the virtio RDMA device (ID 42): feature
 * negotiation, configuration, the six virtqueues (§3), probe and remove,
 * and registration of the RDMA device vrdma%d on top of the integrated
 * Ethernet port eth%d.
 */
#include <linux/module.h>
#include <linux/ratelimit.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>

#include "vrdma.h"

/* Linux 6.12's virtio_ids.h stops before 42; vrdma_abi.h defines it. */
#ifndef VIRTIO_ID_RDMA
#define VIRTIO_ID_RDMA 42
#endif

static struct virtio_driver vrdma_driver;

/*
 * Recovery (§2.4): the device asked for a reset (DEVICE_NEEDS_RESET,
 * VRDMA_EV_DEVICE_FATAL, a NEEDS_RESET command status). Users have heard
 * IB_EVENT_DEVICE_FATAL; then the driver is unbound and bound again, as a
 * module reload would: remove unregisters the RDMA device (user contexts are
 * disassociated, ib_core clients remove theirs), resets the device and frees
 * what it held; probe sets the device up afresh and registers it again.
 * A command timeout does not recover: a device that does not answer may be
 * gone, and asks for the reset itself when it is back.
 *
 * The work belongs to the module, not to the vrdma_dev it replaces: remove
 * cannot wait for it. A device that keeps failing is left broken.
 */
static struct workqueue_struct *vrdma_recover_wq;
static DEFINE_RATELIMIT_STATE(vrdma_recover_rs, 60 * HZ, 5);

struct vrdma_recovery {
	struct work_struct work;
	struct virtio_device *vdev;
};

static void vrdma_recover_work(struct work_struct *work)
{
	struct vrdma_recovery *r = container_of(work, struct vrdma_recovery,
						work);
	struct device *d = &r->vdev->dev;
	struct vrdma_dev *dev;
	ktime_t t0 = ktime_get();
	bool bound;
	int err;

	device_lock(d);
	dev = d->driver == &vrdma_driver.driver ? r->vdev->priv : NULL;
	/* IB_EVENT_DEVICE_FATAL goes out while the device is registered. */
	if (dev)
		flush_work(&dev->fatal_work);
	device_unlock(d);
	if (!dev)
		goto out;	/* unbound meanwhile */

	dev_warn(d, "resetting the device and probing it again\n");
	err = device_reprobe(d);
	device_lock(d);
	bound = d->driver == &vrdma_driver.driver;
	device_unlock(d);
	if (err || !bound)
		dev_err(d, "recovery failed (%d): the device is left unbound\n",
			err);
	else
		dev_info(d, "recovered in %lld ms\n",
			 ktime_ms_delta(ktime_get(), t0));
out:
	put_device(d);
	kfree(r);
}

/* Any context. Marks the device broken at once; recovers from a work item. */
void vrdma_recover(struct vrdma_dev *dev)
{
	struct vrdma_recovery *r;

	vrdma_mark_broken(dev);
	if (xchg(&dev->recovering, true))
		return;
	if (!__ratelimit(&vrdma_recover_rs)) {
		dev_err(&dev->vdev->dev,
			"too many recoveries: the device stays broken\n");
		return;
	}
	/* No allocator splat: the message below says what failing costs. */
	r = kzalloc(sizeof(*r), GFP_ATOMIC | __GFP_NOWARN);
	if (!r) {
		dev_err(&dev->vdev->dev,
			"no memory to recover: the device stays broken\n");
		return;
	}
	INIT_WORK(&r->work, vrdma_recover_work);
	r->vdev = dev->vdev;
	get_device(&dev->vdev->dev);
	queue_work(vrdma_recover_wq, &r->work);
}

static void vrdma_config_changed(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	/* May run in interrupt context: read the config from a work item. */
	schedule_work(&dev->config_work);
}

static int vrdma_find_vqs(struct vrdma_dev *dev)
{
	bool eth = virtio_has_feature(dev->vdev, VIRTIO_RDMA_F_ETH);
	struct virtqueue_info info[VRDMA_NUM_VQS] = {
		[VRDMA_VQ_CONTROL] = { "control", vrdma_ctrl_done },
		[VRDMA_VQ_EVENT] = { "event", vrdma_event_done },
		[VRDMA_VQ_DOORBELL] = { "doorbell", vrdma_db_done },
		[VRDMA_VQ_PAGEREQ] = { "pagereq", vrdma_pagereq_done },
		[VRDMA_VQ_ETH_RX] = { eth ? "eth-rx" : NULL,
				      vrdma_eth_rx_done },
		[VRDMA_VQ_ETH_TX] = { eth ? "eth-tx" : NULL,
				      vrdma_eth_tx_done },
	};

	return vrdma_virtio_find_vqs(dev->vdev, VRDMA_NUM_VQS, dev->vqs, info);
}

/* A round trip through the control queue before anything else. */
static int vrdma_check_device(struct vrdma_dev *dev)
{
	struct vrdma_config *q;
	int err;

	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!q)
		return -ENOMEM;
	err = vrdma_cmd(dev, VRDMA_CMD_QUERY_DEVICE, NULL, 0, NULL, 0, q,
			sizeof(*q));
	if (err == -EIO || err == -ETIMEDOUT) {
		/* No answer at all: the control queue does not work. */
		dev_err(&dev->vdev->dev, "QUERY_DEVICE failed: %d\n", err);
	} else if (err) {
		/* It answered; the config space is what counts (§2.2). */
		dev_warn(&dev->vdev->dev, "QUERY_DEVICE: %d\n", err);
		err = 0;
	} else if (memcmp(q, &dev->cfg, offsetof(struct vrdma_config, port_state)))
		dev_warn(&dev->vdev->dev,
			 "QUERY_DEVICE differs from the config space; using the config space\n");
	kfree(q);
	return err;
}

static void vrdma_ib_init(struct vrdma_dev *dev)
{
	struct ib_device *ib = &dev->ib;

	ib->node_type = RDMA_NODE_IB_CA;
	ib->phys_port_cnt = 1;
	ib->num_comp_vectors = 1;
	ib->node_guid = cpu_to_be64(VCFG64(dev, node_guid));
	strscpy(ib->node_desc, "vrdma virtio RDMA", sizeof(ib->node_desc));
	ib->dev.parent = &dev->vdev->dev;
	/* User space rings the SQ doorbell with a post_send of no WRs (§8). */
	ib->uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_POST_SEND);
	ib_set_device_ops(ib, &vrdma_dev_ops);
	/* uverbs attributes of DM_ALLOC and QUERY_CONTEXT (vrdma_dm.c) */
	ib->driver_def = vrdma_uapi_defs;
}

/* Reset the device and free everything it could still have used. */
static void vrdma_reset(struct vrdma_dev *dev)
{
	virtio_reset_device(dev->vdev);
	virtio_synchronize_cbs(dev->vdev);
	vrdma_cmd_drain(dev);
	vrdma_odp_wq_destroy(dev);
	/* After the ODP workers: they may quarantine a page list. */
	vrdma_quarantine_release(dev);
	vrdma_db_drain(dev);
	vrdma_event_cleanup(dev);
	vrdma_pagereq_cleanup(dev);
	vrdma_eth_free(dev);
	dev->vdev->config->del_vqs(dev->vdev);
}

static int vrdma_probe(struct virtio_device *vdev)
{
	struct vrdma_dev *dev;
	int err;

	if (!virtio_has_feature(vdev, VIRTIO_RDMA_F_ETH)) {
		dev_err(&vdev->dev, "device lacks the Ethernet port feature\n");
		return -ENODEV;
	}
	if (!vdev->dev.parent) {
		dev_err(&vdev->dev, "no transport device for DMA\n");
		return -ENODEV;
	}

	dev = ib_alloc_device(vrdma_dev, ib);
	if (!dev)
		return -ENOMEM;
	dev->vdev = vdev;
	/* The PCI function: DMA addresses are guest physical (no IOMMU). */
	dev->dma_dev = vdev->dev.parent;
	vdev->priv = dev;
	spin_lock_init(&dev->ctrl_lock);
	init_waitqueue_head(&dev->ctrl_wait);
	spin_lock_init(&dev->quarantine_lock);
	INIT_LIST_HEAD(&dev->quarantine);
	spin_lock_init(&dev->db_lock);
	spin_lock_init(&dev->ev_lock);
	spin_lock_init(&dev->pr_lock);
	xa_init_flags(&dev->cqs, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->qps, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->srqs, XA_FLAGS_LOCK_IRQ);
	xa_init(&dev->odp_mrs);
	xa_init_flags(&dev->counters, XA_FLAGS_ALLOC1);
	mutex_init(&dev->ctr_lock);
	INIT_WORK(&dev->config_work, vrdma_config_work);
	INIT_WORK(&dev->fatal_work, vrdma_fatal_work);
	dev->port_state = VRDMA_PORT_DOWN;

	virtio_cread_bytes(vdev, 0, &dev->cfg, sizeof(dev->cfg));
	dev->has_odp = virtio_has_feature(vdev, VIRTIO_RDMA_F_ODP) &&
		       (VCFG(dev, odp_general_caps) & VRDMA_ODP_SUPPORT);
	dev->has_odp_implicit = dev->has_odp &&
		virtio_has_feature(vdev, VIRTIO_RDMA_F_ODP_IMPLICIT) &&
		(VCFG(dev, odp_general_caps) & VRDMA_ODP_SUPPORT_IMPLICIT);

	err = vrdma_find_vqs(dev);
	if (err) {
		dev_err(&vdev->dev, "cannot set up virtqueues: %d\n", err);
		goto err_dealloc;
	}
	err = vrdma_odp_wq_init(dev);
	if (err)
		goto err_del_vqs;

	virtio_device_ready(vdev);

	err = vrdma_event_init(dev);
	if (err)
		goto err_reset;
	err = vrdma_pagereq_init(dev);
	if (err)
		goto err_reset;

	err = vrdma_check_device(dev);
	if (err)
		goto err_reset;

	err = vrdma_eth_init(dev);
	if (err) {
		dev_err(&vdev->dev, "cannot register the Ethernet port: %d\n",
			err);
		goto err_reset;
	}
	/* The config work syncs the carrier; the IB port is not yet there. */
	schedule_work(&dev->config_work);

	vrdma_ib_init(dev);
	err = ib_device_set_netdev(&dev->ib, dev->netdev, 1);
	if (err)
		goto err_eth;
	err = ib_register_device(&dev->ib, "vrdma%d", dev->dma_dev);
	if (err) {
		dev_err(&vdev->dev, "cannot register the RDMA device: %d\n",
			err);
		goto err_netdev;
	}
	WRITE_ONCE(dev->ib_registered, true);
	/* A port change that raced with registration. */
	schedule_work(&dev->config_work);

	dev_info(&vdev->dev,
		 "%s on %s, mac %pM mtu %u, port %s, odp %s%s, max qp %u cq %u mr %u\n",
		 dev_name(&dev->ib.dev), netdev_name(dev->netdev),
		 dev->netdev->dev_addr, dev->netdev->mtu,
		 dev->port_state == VRDMA_PORT_ACTIVE ? "active" : "down",
		 dev->has_odp ? "yes" : "no",
		 dev->has_odp_implicit ? " (implicit)" : "",
		 VCFG(dev, max_qp), VCFG(dev, max_cq), VCFG(dev, max_mr));
	return 0;

err_netdev:
	ib_device_set_netdev(&dev->ib, NULL, 1);
err_eth:
	vrdma_eth_cleanup(dev);
err_reset:
	cancel_work_sync(&dev->config_work);
	cancel_work_sync(&dev->fatal_work);
	vrdma_reset(dev);
	goto err_dealloc;
err_del_vqs:
	vdev->config->del_vqs(vdev);
err_dealloc:
	vdev->priv = NULL;
	ib_dealloc_device(&dev->ib);
	return err;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	/*
	 * Destroys every object, disassociating user contexts still open in
	 * other processes; commands keep working until it returns.
	 */
	WRITE_ONCE(dev->ib_registered, false);
	ib_unregister_device(&dev->ib);
	cancel_work_sync(&dev->config_work);
	cancel_work_sync(&dev->fatal_work);
	vrdma_eth_cleanup(dev);
	vrdma_reset(dev);
	vdev->priv = NULL;
	ib_dealloc_device(&dev->ib);
	dev_info(&vdev->dev, "removed\n");
}

static int vrdma_validate(struct virtio_device *vdev)
{
	if (!virtio_has_feature(vdev, VIRTIO_F_VERSION_1)) {
		dev_err(&vdev->dev, "needs a VIRTIO 1.x device\n");
		return -EINVAL;
	}
	return 0;
}

static const unsigned int vrdma_features[] = {
	VIRTIO_RDMA_F_ODP,
	VIRTIO_RDMA_F_ODP_IMPLICIT,
	VIRTIO_RDMA_F_ETH,
};

static const struct virtio_device_id vrdma_id_table[] = {
	{ VIRTIO_ID_RDMA, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vrdma_id_table);

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.id_table = vrdma_id_table,
	.feature_table = vrdma_features,
	.feature_table_size = ARRAY_SIZE(vrdma_features),
	.validate = vrdma_validate,
	.probe = vrdma_probe,
	.remove = vrdma_remove,
	.config_changed = vrdma_config_changed,
};

static int __init vrdma_init(void)
{
	int err;

	vrdma_recover_wq = alloc_workqueue("vrdma_recover", WQ_UNBOUND, 0);
	if (!vrdma_recover_wq)
		return -ENOMEM;
	err = register_virtio_driver(&vrdma_driver);
	if (err)
		destroy_workqueue(vrdma_recover_wq);
	return err;
}

static void __exit vrdma_exit(void)
{
	unregister_virtio_driver(&vrdma_driver);
	/* Queued recoveries find the device unbound and only drop it. */
	destroy_workqueue(vrdma_recover_wq);
}

module_init(vrdma_init);
module_exit(vrdma_exit);

MODULE_DESCRIPTION("virtio RDMA (RoCEv2) device driver");
MODULE_LICENSE("GPL");

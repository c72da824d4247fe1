// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma integrated Ethernet port: eth rx/tx virtqueues 4 and 5 carry raw
 * Ethernet frames, without a virtio-net header. RoCEv2 traffic for the
 * port's GIDs never shows up here; the device routes it to the RDMA engine.
 */
#include <linux/etherdevice.h>
#include <linux/ethtool.h>
#include <linux/if_vlan.h>
#include <linux/scatterlist.h>
#include <linux/virtio_config.h>

#include "vrdma.h"

#define VRDMA_ETH_NAPI_WEIGHT	64

struct vrdma_eth {
	struct vrdma_dev *dev;
	struct net_device *netdev;
	struct napi_struct napi;
	spinlock_t tx_lock;		/* tx virtqueue */
	unsigned int rx_buf_len;
	bool registered;
};

static struct virtqueue *rx_vq(struct vrdma_eth *eth)
{
	return eth->dev->vqs[VRDMA_VQ_ETH_RX];
}

static struct virtqueue *tx_vq(struct vrdma_eth *eth)
{
	return eth->dev->vqs[VRDMA_VQ_ETH_TX];
}

/* Called from NAPI or with NAPI disabled: never concurrently. */
static void vrdma_eth_rx_fill(struct vrdma_eth *eth, gfp_t gfp)
{
	struct virtqueue *vq = rx_vq(eth);
	struct scatterlist sg;
	struct sk_buff *skb;
	bool added = false;

	while (vq->num_free) {
		skb = __netdev_alloc_skb_ip_align(eth->netdev, eth->rx_buf_len,
						  gfp);
		if (!skb)
			break;
		sg_init_one(&sg, skb->data, eth->rx_buf_len);
		if (virtqueue_add_inbuf(vq, &sg, 1, skb, gfp)) {
			dev_kfree_skb_any(skb);
			break;
		}
		added = true;
	}
	if (added)
		virtqueue_kick(vq);
}

static int vrdma_eth_poll(struct napi_struct *napi, int budget)
{
	struct vrdma_eth *eth = container_of(napi, struct vrdma_eth, napi);
	struct net_device *netdev = eth->netdev;
	struct virtqueue *vq = rx_vq(eth);
	struct sk_buff *skb;
	unsigned int len;
	int done = 0;

	while (done < budget && (skb = virtqueue_get_buf(vq, &len))) {
		done++;
		if (len < ETH_HLEN || len > eth->rx_buf_len) {
			DEV_STATS_INC(netdev, rx_length_errors);
			dev_kfree_skb_any(skb);
			continue;
		}
		skb_put(skb, len);
		skb->protocol = eth_type_trans(skb, netdev);
		DEV_STATS_INC(netdev, rx_packets);
		DEV_STATS_ADD(netdev, rx_bytes, len);
		napi_gro_receive(napi, skb);
	}
	vrdma_eth_rx_fill(eth, GFP_ATOMIC);

	if (done < budget && napi_complete_done(napi, done)) {
		if (!virtqueue_enable_cb(vq) && napi_schedule_prep(napi)) {
			virtqueue_disable_cb(vq);
			__napi_schedule(napi);
		}
	}
	return done;
}

void vrdma_eth_rx_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;

	if (!dev->eth)
		return;
	virtqueue_disable_cb(vq);
	napi_schedule(&dev->eth->napi);
}

/* Called with tx_lock held. */
static void vrdma_eth_tx_reap(struct vrdma_eth *eth)
{
	struct sk_buff *skb;
	unsigned int len;

	while ((skb = virtqueue_get_buf(tx_vq(eth), &len))) {
		DEV_STATS_INC(eth->netdev, tx_packets);
		DEV_STATS_ADD(eth->netdev, tx_bytes, skb->len);
		dev_consume_skb_any(skb);
	}
}

void vrdma_eth_tx_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	struct vrdma_eth *eth = dev->eth;
	unsigned long flags;

	if (!eth)
		return;
	spin_lock_irqsave(&eth->tx_lock, flags);
	vrdma_eth_tx_reap(eth);
	if (netif_queue_stopped(eth->netdev) && vq->num_free)
		netif_wake_queue(eth->netdev);
	spin_unlock_irqrestore(&eth->tx_lock, flags);
}

static netdev_tx_t vrdma_eth_xmit(struct sk_buff *skb,
				  struct net_device *netdev)
{
	struct vrdma_eth *eth = netdev_priv(netdev);
	struct virtqueue *vq = tx_vq(eth);
	struct scatterlist sg;
	unsigned long flags;
	int err;

	if (skb_linearize(skb)) {
		DEV_STATS_INC(netdev, tx_dropped);
		dev_kfree_skb_any(skb);
		return NETDEV_TX_OK;
	}
	/* eth_skb_pad() frees the skb when it fails. */
	if (eth_skb_pad(skb)) {
		DEV_STATS_INC(netdev, tx_dropped);
		return NETDEV_TX_OK;
	}
	sg_init_one(&sg, skb->data, skb->len);
	skb_tx_timestamp(skb);

	spin_lock_irqsave(&eth->tx_lock, flags);
	vrdma_eth_tx_reap(eth);
	err = virtqueue_add_outbuf(vq, &sg, 1, skb, GFP_ATOMIC);
	if (err) {
		netif_stop_queue(netdev);
		spin_unlock_irqrestore(&eth->tx_lock, flags);
		DEV_STATS_INC(netdev, tx_dropped);
		dev_kfree_skb_any(skb);
		return NETDEV_TX_OK;
	}
	virtqueue_kick(vq);
	if (!vq->num_free)
		netif_stop_queue(netdev);
	spin_unlock_irqrestore(&eth->tx_lock, flags);
	return NETDEV_TX_OK;
}

static int vrdma_eth_open(struct net_device *netdev)
{
	struct vrdma_eth *eth = netdev_priv(netdev);

	vrdma_eth_rx_fill(eth, GFP_KERNEL);
	napi_enable(&eth->napi);
	/* Frames that arrived while the port was down. */
	napi_schedule(&eth->napi);
	netif_start_queue(netdev);
	return 0;
}

static int vrdma_eth_stop(struct net_device *netdev)
{
	struct vrdma_eth *eth = netdev_priv(netdev);

	netif_stop_queue(netdev);
	napi_disable(&eth->napi);
	return 0;
}

static const struct net_device_ops vrdma_eth_ops = {
	.ndo_open = vrdma_eth_open,
	.ndo_stop = vrdma_eth_stop,
	.ndo_start_xmit = vrdma_eth_xmit,
	.ndo_validate_addr = eth_validate_addr,
};

static void vrdma_eth_get_drvinfo(struct net_device *netdev,
				  struct ethtool_drvinfo *info)
{
	struct vrdma_eth *eth = netdev_priv(netdev);

	strscpy(info->driver, DRV_NAME, sizeof(info->driver));
	strscpy(info->bus_info, dev_name(eth->dev->dma_dev),
		sizeof(info->bus_info));
	snprintf(info->fw_version, sizeof(info->fw_version), "%llu",
		 VCFG64(eth->dev, fw_ver));
}

static int vrdma_eth_get_link_ksettings(struct net_device *netdev,
					struct ethtool_link_ksettings *cmd)
{
	ethtool_link_ksettings_zero_link_mode(cmd, supported);
	ethtool_link_ksettings_zero_link_mode(cmd, advertising);
	cmd->base.speed = netif_carrier_ok(netdev) ? SPEED_10000 :
						     SPEED_UNKNOWN;
	cmd->base.duplex = netif_carrier_ok(netdev) ? DUPLEX_FULL :
						      DUPLEX_UNKNOWN;
	cmd->base.port = PORT_OTHER;
	cmd->base.autoneg = AUTONEG_DISABLE;
	return 0;
}

static const char vrdma_eth_stat_names[][ETH_GSTRING_LEN] = {
	"rx_packets", "rx_bytes", "rx_length_errors",
	"tx_packets", "tx_bytes", "tx_dropped",
};

static int vrdma_eth_get_sset_count(struct net_device *netdev, int sset)
{
	return sset == ETH_SS_STATS ? ARRAY_SIZE(vrdma_eth_stat_names) :
				      -EOPNOTSUPP;
}

static void vrdma_eth_get_strings(struct net_device *netdev, u32 sset,
				  u8 *data)
{
	if (sset == ETH_SS_STATS)
		memcpy(data, vrdma_eth_stat_names,
		       sizeof(vrdma_eth_stat_names));
}

static void vrdma_eth_get_stats(struct net_device *netdev,
				struct ethtool_stats *stats, u64 *data)
{
	struct rtnl_link_stats64 s;

	dev_get_stats(netdev, &s);
	data[0] = s.rx_packets;
	data[1] = s.rx_bytes;
	data[2] = s.rx_length_errors;
	data[3] = s.tx_packets;
	data[4] = s.tx_bytes;
	data[5] = s.tx_dropped;
}

static const struct ethtool_ops vrdma_eth_ethtool_ops = {
	.get_drvinfo = vrdma_eth_get_drvinfo,
	.get_link = ethtool_op_get_link,
	.get_link_ksettings = vrdma_eth_get_link_ksettings,
	.get_sset_count = vrdma_eth_get_sset_count,
	.get_strings = vrdma_eth_get_strings,
	.get_ethtool_stats = vrdma_eth_get_stats,
};

void vrdma_eth_carrier(struct vrdma_dev *dev, bool up)
{
	if (!dev->netdev)
		return;
	if (up)
		netif_carrier_on(dev->netdev);
	else
		netif_carrier_off(dev->netdev);
}

/* Allocate and register eth%d. Call after virtio_device_ready(). */
int vrdma_eth_init(struct vrdma_dev *dev)
{
	struct net_device *netdev;
	struct vrdma_eth *eth;
	unsigned int mtu;
	int err;

	netdev = alloc_etherdev(sizeof(*eth));
	if (!netdev)
		return -ENOMEM;
	SET_NETDEV_DEV(netdev, &dev->vdev->dev);
	eth = netdev_priv(netdev);
	eth->dev = dev;
	eth->netdev = netdev;
	spin_lock_init(&eth->tx_lock);

	mtu = le16_to_cpu(dev->cfg.mtu);
	if (mtu < ETH_MIN_MTU || mtu > 9000)
		mtu = ETH_DATA_LEN;
	netdev->mtu = mtu;
	netdev->min_mtu = ETH_MIN_MTU;
	netdev->max_mtu = mtu;
	eth->rx_buf_len = mtu + ETH_HLEN + VLAN_HLEN;
	netdev->netdev_ops = &vrdma_eth_ops;
	netdev->ethtool_ops = &vrdma_eth_ethtool_ops;
	if (is_valid_ether_addr(dev->cfg.mac))
		eth_hw_addr_set(netdev, dev->cfg.mac);
	else
		eth_hw_addr_random(netdev);
	netif_napi_add_weight(netdev, &eth->napi, vrdma_eth_poll,
			      VRDMA_ETH_NAPI_WEIGHT);
	netif_carrier_off(netdev);

	dev->netdev = netdev;
	dev->eth = eth;
	vrdma_eth_rx_fill(eth, GFP_KERNEL);

	/* On failure the caller resets the device and calls vrdma_eth_free(). */
	err = register_netdev(netdev);
	if (err)
		return err;
	eth->registered = true;
	return 0;
}

/* Stop the port; the buffers stay with the device until it is reset. */
void vrdma_eth_cleanup(struct vrdma_dev *dev)
{
	struct vrdma_eth *eth = dev->eth;

	if (!eth || !eth->registered)
		return;
	unregister_netdev(eth->netdev);
	eth->registered = false;
}

/* After the device reset: free the skbs it held, then the netdev. */
void vrdma_eth_free(struct vrdma_dev *dev)
{
	struct vrdma_eth *eth = dev->eth;
	struct sk_buff *skb;

	while ((skb = virtqueue_detach_unused_buf(dev->vqs[VRDMA_VQ_ETH_RX])))
		dev_kfree_skb_any(skb);
	while ((skb = virtqueue_detach_unused_buf(dev->vqs[VRDMA_VQ_ETH_TX])))
		dev_kfree_skb_any(skb);
	if (!eth)
		return;
	dev->eth = NULL;
	dev->netdev = NULL;
	netif_napi_del(&eth->napi);
	free_netdev(eth->netdev);
}

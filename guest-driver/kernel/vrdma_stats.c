// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma hardware counters (device-spec §11.9): the port's and the device's
 * hw_counters, and per-QP counters bound with `rdma statistic qp set/bind`.
 *
 * The device counts per QP from creation and, for the port, over every QP
 * it has had. ib_core shows a port counter as the port's own value plus
 * every bound counter (running and deallocated), the model of hardware
 * where a bound QP stops counting in the port's default set. The device
 * has no such sets, so the port value reported here is the device's total
 * minus what the counters have reported so far (@ctr_attributed), and a
 * counter's value is what its QPs counted while bound: @retired for the QPs
 * already unbound, plus each bound QP's counters minus their value at bind
 * time (@ctr_base).
 */
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_counter.h>

#include "vrdma.h"

/* The order of struct vrdma_stats; the QP counters are the first ones. */
static const struct rdma_stat_desc vrdma_stat_descs[VRDMA_NR_STATS] = {
	{ .name = "sent_pkts" },
	{ .name = "sent_bytes" },
	{ .name = "rcvd_pkts" },
	{ .name = "rcvd_bytes" },
	{ .name = "retransmits" },
	{ .name = "local_ack_timeouts" },
	{ .name = "rcvd_rnr_naks" },
	{ .name = "sent_rnr_naks" },
	{ .name = "rcvd_seq_naks" },
	{ .name = "sent_seq_naks" },
	{ .name = "rcvd_icrc_err" },
	{ .name = "rcvd_dropped" },
	{ .name = "odp_faults" },
};

struct vrdma_counter {
	u64 retired[VRDMA_NR_QP_STATS];	/* QPs unbound since */
	u64 reported[VRDMA_NR_QP_STATS];	/* last value given to ib_core */
	struct list_head qps;		/* vrdma_qp.ctr_node, under counter->lock */
};

static int vrdma_query_stats(struct vrdma_dev *dev, u32 qpn,
			     u64 v[VRDMA_NR_STATS])
{
	struct vrdma_cmd_query_stats req = { .qpn = cpu_to_le32(qpn) };
	struct vrdma_stats resp;
	const __le64 *f = (const __le64 *)&resp;
	int err, i;

	BUILD_BUG_ON(sizeof(resp) < VRDMA_NR_STATS * sizeof(__le64));
	BUILD_BUG_ON(offsetof(struct vrdma_stats, odp_faults) !=
		     (VRDMA_NR_STATS - 1) * sizeof(__le64));
	err = vrdma_cmd(dev, VRDMA_CMD_QUERY_STATS, &req, sizeof(req), NULL, 0,
			&resp, sizeof(resp));
	if (err)
		return err;
	for (i = 0; i < VRDMA_NR_STATS; i++)
		v[i] = le64_to_cpu(f[i]);
	return 0;
}

struct rdma_hw_stats *vrdma_alloc_hw_port_stats(struct ib_device *ibdev,
						u32 port_num)
{
	return rdma_alloc_hw_stats_struct(vrdma_stat_descs, VRDMA_NR_STATS,
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

struct rdma_hw_stats *vrdma_alloc_hw_device_stats(struct ib_device *ibdev)
{
	return rdma_alloc_hw_stats_struct(vrdma_stat_descs, VRDMA_NR_STATS,
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

/* port_num 0: the device (its totals as they are); 1: the port. */
int vrdma_get_hw_stats(struct ib_device *ibdev, struct rdma_hw_stats *stats,
		       u32 port_num, int index)
{
	struct vrdma_dev *dev = to_vdev(ibdev);
	u64 v[VRDMA_NR_STATS];
	int err, i;

	err = vrdma_query_stats(dev, 0, v);
	if (err)
		return err;
	if (port_num) {
		mutex_lock(&dev->ctr_lock);
		for (i = 0; i < VRDMA_NR_QP_STATS; i++)
			v[i] -= min(v[i], dev->ctr_attributed[i]);
		mutex_unlock(&dev->ctr_lock);
	}
	for (i = 0; i < VRDMA_NR_STATS; i++)
		stats->value[i] = v[i];
	return VRDMA_NR_STATS;
}

struct rdma_hw_stats *vrdma_counter_alloc_stats(struct rdma_counter *counter)
{
	return rdma_alloc_hw_stats_struct(vrdma_stat_descs, VRDMA_NR_QP_STATS,
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

static struct vrdma_counter *vrdma_counter(struct rdma_counter *counter)
{
	return xa_load(&to_vdev(counter->device)->counters, counter->id);
}

/* ib_core calls the counter ops below with counter->lock held. */
int vrdma_counter_bind_qp(struct rdma_counter *counter, struct ib_qp *ibqp)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_counter *c;
	u64 v[VRDMA_NR_STATS];
	u32 id;
	int err;

	err = vrdma_query_stats(dev, qp->qpn, v);
	if (err)
		return err;
	if (!counter->id) {
		/* The driver names a counter when its first QP is bound. */
		c = kzalloc(sizeof(*c), GFP_KERNEL);
		if (!c)
			return -ENOMEM;
		INIT_LIST_HEAD(&c->qps);
		err = xa_alloc(&dev->counters, &id, c, xa_limit_31b,
			       GFP_KERNEL);
		if (err) {
			kfree(c);
			return err;
		}
		counter->id = id;
	} else {
		c = vrdma_counter(counter);
		if (!c)
			return -EINVAL;
	}
	memcpy(qp->ctr_base, v, sizeof(qp->ctr_base));
	list_add_tail(&qp->ctr_node, &c->qps);
	ibqp->counter = counter;
	return 0;
}

int vrdma_counter_unbind_qp(struct ib_qp *ibqp)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_counter *c;
	u64 v[VRDMA_NR_STATS];
	int i;

	if (!ibqp->counter)
		return -EINVAL;
	c = vrdma_counter(ibqp->counter);
	/* A device that cannot answer any more: keep what was seen. */
	if (vrdma_query_stats(dev, qp->qpn, v))
		memcpy(v, qp->ctr_base, sizeof(qp->ctr_base));
	if (c) {
		for (i = 0; i < VRDMA_NR_QP_STATS; i++)
			c->retired[i] += v[i] - qp->ctr_base[i];
		list_del_init(&qp->ctr_node);
	}
	ibqp->counter = NULL;
	return 0;
}

int vrdma_counter_update_stats(struct rdma_counter *counter)
{
	struct vrdma_dev *dev = to_vdev(counter->device);
	struct vrdma_counter *c = vrdma_counter(counter);
	u64 sum[VRDMA_NR_QP_STATS], v[VRDMA_NR_STATS];
	struct vrdma_qp *qp;
	int i;

	if (!c)
		return -EINVAL;
	memcpy(sum, c->retired, sizeof(sum));
	list_for_each_entry(qp, &c->qps, ctr_node) {
		if (vrdma_query_stats(dev, qp->qpn, v))
			continue;
		for (i = 0; i < VRDMA_NR_QP_STATS; i++)
			sum[i] += v[i] - qp->ctr_base[i];
	}
	mutex_lock(&dev->ctr_lock);
	for (i = 0; i < VRDMA_NR_QP_STATS; i++) {
		dev->ctr_attributed[i] += sum[i] - c->reported[i];
		c->reported[i] = sum[i];
		counter->stats->value[i] = sum[i];
	}
	mutex_unlock(&dev->ctr_lock);
	return 0;
}

/*
 * ib_core has read the counter a last time and moved its value into the
 * port's history, so @ctr_attributed keeps it.
 */
int vrdma_counter_dealloc(struct rdma_counter *counter)
{
	struct vrdma_dev *dev = to_vdev(counter->device);

	if (!counter->id)
		return 0;
	kfree(xa_erase(&dev->counters, counter->id));
	return 0;
}

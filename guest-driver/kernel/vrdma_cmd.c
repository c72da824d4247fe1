// SPDX-License-Identifier: GPL-2.0
/*
 * vrdma control queue (§11) and doorbell queue (§8).
 *
 * One command is one descriptor chain: the readable part is the command
 * header, the request and an optional trailing array (page lists); the
 * writable part is the response header and the response. The device may
 * complete commands out of order, so each chain's token is its context.
 *
 * A context whose response never arrives is abandoned, never freed while
 * the device may still write into it: it is freed when the device returns
 * it late, or when the queue is drained after a reset. The same holds for
 * everything else a timed-out command references (trailing page lists, the
 * rings and pages they describe) and for objects the device was not made
 * to release: they go to the quarantine below (§14.1).
 */
#include <linux/dma-mapping.h>
#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/moduleparam.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ring.h>

#include "vrdma.h"

#define VRDMA_CMD_MAX_BODY	256
#define VRDMA_DB_TIMEOUT_MS	1000

/*
 * Tests shorten it to reach the timeout rules of §14.1 against a device
 * that answers late; read once per command.
 */
static unsigned int cmd_timeout_ms = VRDMA_CMD_TIMEOUT_MS;
module_param(cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms,
		 "ms a control command may take before the device is declared broken (default 10000, at least 100)");

static unsigned int vrdma_cmd_timeout_ms(void)
{
	return max(READ_ONCE(cmd_timeout_ms), 100U);
}

struct vrdma_cmd_ctx {
	struct {
		struct vrdma_cmd_hdr hdr;
		u8 body[VRDMA_CMD_MAX_BODY];
	} in;
	struct {
		struct vrdma_cmd_resp_hdr hdr;
		u8 body[VRDMA_CMD_MAX_BODY];
	} out;
	struct completion done;
	unsigned int len;	/* bytes the device wrote */
	bool finished;		/* protected by ctrl_lock */
	bool abandoned;		/* protected by ctrl_lock */
	bool polled;		/* atomic caller polls, no completion */
};

int vrdma_status_to_errno(u32 status)
{
	switch (status) {
	case VRDMA_STATUS_OK:
		return 0;
	case VRDMA_STATUS_INVALID:
	case VRDMA_STATUS_BAD_STATE:
		return -EINVAL;
	case VRDMA_STATUS_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case VRDMA_STATUS_NO_RESOURCES:
		return -ENOMEM;
	case VRDMA_STATUS_NOT_FOUND:
		return -ENOENT;
	case VRDMA_STATUS_BUSY:
		return -EBUSY;
	case VRDMA_STATUS_ACCESS:
		return -EACCES;
	case VRDMA_STATUS_BAD_ADDRESS:
		return -EFAULT;
	case VRDMA_STATUS_NEEDS_RESET:
	default:
		return -EIO;
	}
}

/*
 * The quarantine: memory the device may still read or write, because the
 * command that handed it over timed out (it may be executed late) or the
 * object using it could not be destroyed (the device is broken, §14.1).
 * The device has no bounds on when it would touch it, so it is freed only
 * after the device is reset (§2.3); until then it is kept, not reused.
 */
enum vrdma_quarantine_kind {
	VRDMA_Q_RING,
	VRDMA_Q_BUF,
	VRDMA_Q_UMEM,
	VRDMA_Q_COHERENT,
};

struct vrdma_quarantined {
	struct list_head node;
	enum vrdma_quarantine_kind kind;
	union {
		struct vrdma_ring ring;
		void *buf;
		struct ib_umem *umem;
		struct {
			void *cpu;
			dma_addr_t dma;
			size_t size;
		} coh;
	};
};

static struct vrdma_quarantined *
vrdma_quarantine_new(struct vrdma_dev *dev, enum vrdma_quarantine_kind k)
{
	struct vrdma_quarantined *q = kzalloc(sizeof(*q), GFP_KERNEL);

	if (!q)
		/* Then it is leaked for good, which is still safe. */
		dev_warn_ratelimited(&dev->vdev->dev,
				     "no memory to track quarantined memory\n");
	else
		q->kind = k;
	return q;
}

static void vrdma_quarantine_add(struct vrdma_dev *dev,
				 struct vrdma_quarantined *q)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->quarantine_lock, flags);
	list_add_tail(&q->node, &dev->quarantine);
	spin_unlock_irqrestore(&dev->quarantine_lock, flags);
}

/* Keep the pages of @r; @r is cleared. */
void vrdma_quarantine_ring(struct vrdma_dev *dev, struct vrdma_ring *r)
{
	struct vrdma_quarantined *q;

	if (!r->npages)
		return;
	q = vrdma_quarantine_new(dev, VRDMA_Q_RING);
	if (q) {
		q->ring = *r;
		vrdma_quarantine_add(dev, q);
	}
	memset(r, 0, sizeof(*r));
}

/* Keep a kvmalloc'ed buffer (a command's page list). */
void vrdma_quarantine_buf(struct vrdma_dev *dev, void *buf)
{
	struct vrdma_quarantined *q;

	if (!buf)
		return;
	q = vrdma_quarantine_new(dev, VRDMA_Q_BUF);
	if (q) {
		q->buf = buf;
		vrdma_quarantine_add(dev, q);
	}
}

/* Keep the pinned pages of an MR. */
void vrdma_quarantine_umem(struct vrdma_dev *dev, struct ib_umem *umem)
{
	struct vrdma_quarantined *q;

	if (!umem)
		return;
	q = vrdma_quarantine_new(dev, VRDMA_Q_UMEM);
	if (q) {
		q->umem = umem;
		vrdma_quarantine_add(dev, q);
	}
}

/* Keep a dma_alloc_coherent() buffer (a fast-registration page list). */
void vrdma_quarantine_coherent(struct vrdma_dev *dev, void *cpu,
			       dma_addr_t dma, size_t size)
{
	struct vrdma_quarantined *q;

	if (!cpu)
		return;
	q = vrdma_quarantine_new(dev, VRDMA_Q_COHERENT);
	if (q) {
		q->coh.cpu = cpu;
		q->coh.dma = dma;
		q->coh.size = size;
		vrdma_quarantine_add(dev, q);
	}
}

/* Only after the device was reset: it no longer accesses any of it. */
void vrdma_quarantine_release(struct vrdma_dev *dev)
{
	struct vrdma_quarantined *q, *tmp;
	unsigned long flags;
	LIST_HEAD(list);

	spin_lock_irqsave(&dev->quarantine_lock, flags);
	list_splice_init(&dev->quarantine, &list);
	spin_unlock_irqrestore(&dev->quarantine_lock, flags);

	list_for_each_entry_safe(q, tmp, &list, node) {
		switch (q->kind) {
		case VRDMA_Q_RING:
			vrdma_ring_free(dev, &q->ring);
			break;
		case VRDMA_Q_BUF:
			kvfree(q->buf);
			break;
		case VRDMA_Q_UMEM:
			ib_umem_release(q->umem);
			break;
		case VRDMA_Q_COHERENT:
			dma_free_coherent(dev->dma_dev, q->coh.size, q->coh.cpu,
					  q->coh.dma);
			break;
		}
		kfree(q);
	}
}

/*
 * Free the kvmalloc'ed trailing array of a command that returned @err:
 * after a timeout the device may still read it, and a page list read from
 * reused memory would point the device at arbitrary guest pages.
 */
void vrdma_cmd_tail_free(struct vrdma_dev *dev, void *tail, int err)
{
	if (vrdma_cmd_unsettled(err))
		vrdma_quarantine_buf(dev, tail);
	else
		kvfree(tail);
}

/* Called with ctrl_lock held for every chain the device returns. */
static void vrdma_cmd_finish(struct vrdma_cmd_ctx *ctx, unsigned int len)
{
	ctx->len = len;
	ctx->finished = true;
	if (ctx->abandoned)
		kfree(ctx);
	else if (!ctx->polled)
		complete(&ctx->done);
}

static void vrdma_ctrl_reap(struct vrdma_dev *dev)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_CONTROL];
	struct vrdma_cmd_ctx *ctx;
	unsigned int len;

	while ((ctx = virtqueue_get_buf(vq, &len)))
		vrdma_cmd_finish(ctx, len);
}

void vrdma_ctrl_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	unsigned long flags;

	spin_lock_irqsave(&dev->ctrl_lock, flags);
	do {
		virtqueue_disable_cb(vq);
		vrdma_ctrl_reap(dev);
	} while (!virtqueue_enable_cb(vq));
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	wake_up(&dev->ctrl_wait);
}

/*
 * Fill @sgl with the pages of a trailing buffer. kmalloc memory is one
 * entry; vmalloc memory is split at page boundaries.
 */
static int vrdma_tail_sg(struct scatterlist *sgl, unsigned int max,
			 const void *buf, size_t len)
{
	unsigned int n = 0;

	if (!is_vmalloc_addr(buf)) {
		sg_set_buf(&sgl[0], buf, len);
		return 1;
	}
	while (len) {
		size_t off = offset_in_page(buf);
		size_t chunk = min_t(size_t, len, PAGE_SIZE - off);

		if (n == max)
			return -EINVAL;
		sg_set_page(&sgl[n++], vmalloc_to_page(buf), chunk, off);
		buf += chunk;
		len -= chunk;
	}
	return n;
}

static unsigned int vrdma_tail_nents(const void *buf, size_t len)
{
	if (!len)
		return 0;
	if (!is_vmalloc_addr(buf))
		return 1;
	return DIV_ROUND_UP(offset_in_page(buf) + len, PAGE_SIZE);
}

static struct vrdma_cmd_ctx *vrdma_cmd_ctx_new(u16 opcode, const void *req,
					       size_t req_len, gfp_t gfp)
{
	struct vrdma_cmd_ctx *ctx;

	ctx = kzalloc(sizeof(*ctx), gfp);
	if (!ctx)
		return NULL;
	ctx->in.hdr.opcode = cpu_to_le16(opcode);
	if (req_len)
		memcpy(ctx->in.body, req, req_len);
	init_completion(&ctx->done);
	return ctx;
}

static int vrdma_cmd_result(struct vrdma_dev *dev, struct vrdma_cmd_ctx *ctx,
			    u16 opcode, void *resp, size_t resp_len)
{
	u32 status;

	if (ctx->len < sizeof(ctx->out.hdr)) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "command %u: short response (%u bytes)\n",
				    opcode, ctx->len);
		return -EIO;
	}
	status = le32_to_cpu(ctx->out.hdr.status);
	if (status != VRDMA_STATUS_OK) {
		if (status == VRDMA_STATUS_NEEDS_RESET)
			vrdma_recover(dev);
		dev_dbg(&dev->vdev->dev, "command %u: status %u\n", opcode,
			status);
		return vrdma_status_to_errno(status);
	}
	if (ctx->len < sizeof(ctx->out.hdr) + resp_len) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "command %u: response %u bytes, want %zu\n",
				    opcode, ctx->len,
				    sizeof(ctx->out.hdr) + resp_len);
		return -EIO;
	}
	if (resp_len)
		memcpy(resp, ctx->out.body, resp_len);
	return 0;
}

static void vrdma_cmd_timed_out(struct vrdma_dev *dev, u16 opcode,
				unsigned int timeout_ms)
{
	if (!READ_ONCE(dev->broken))
		dev_err(&dev->vdev->dev,
			"command %u timed out after %u ms, device marked broken\n",
			opcode, timeout_ms);
	vrdma_mark_broken(dev);
}

/**
 * vrdma_cmd - post one control command and wait for its response
 * @dev: the device
 * @opcode: VRDMA_CMD_*
 * @req: request structure, copied
 * @req_len: its size
 * @tail: optional trailing array (page list), read by the device
 * @tail_len: its size in bytes
 * @resp: response structure
 * @resp_len: its size
 *
 * Sleeps. Returns 0, the errno of a VRDMA_STATUS_*, -EIO when the device
 * is broken, or -ETIMEDOUT (and the device is then marked broken).
 */
int vrdma_cmd(struct vrdma_dev *dev, u16 opcode, const void *req,
	      size_t req_len, const void *tail, size_t tail_len, void *resp,
	      size_t resp_len)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_CONTROL];
	unsigned int ntail = vrdma_tail_nents(tail, tail_len);
	struct scatterlist *sgs[2], *sgl;
	unsigned int timeout_ms = vrdma_cmd_timeout_ms();
	struct vrdma_cmd_ctx *ctx;
	unsigned long deadline, flags;
	int err, n;

	might_sleep();
	if (WARN_ON(req_len > VRDMA_CMD_MAX_BODY ||
		    resp_len > VRDMA_CMD_MAX_BODY))
		return -EINVAL;
	if (READ_ONCE(dev->broken))
		return -EIO;

	ctx = vrdma_cmd_ctx_new(opcode, req, req_len, GFP_KERNEL);
	if (!ctx)
		return -ENOMEM;
	sgl = kmalloc_array(ntail + 2, sizeof(*sgl), GFP_KERNEL);
	if (!sgl) {
		kfree(ctx);
		return -ENOMEM;
	}
	sg_init_table(sgl, ntail + 1);
	sg_set_buf(&sgl[0], &ctx->in, sizeof(ctx->in.hdr) + req_len);
	if (ntail) {
		n = vrdma_tail_sg(&sgl[1], ntail, tail, tail_len);
		if (n < 0) {
			err = n;
			goto out_free;
		}
	}
	sg_init_one(&sgl[ntail + 1], &ctx->out,
		    sizeof(ctx->out.hdr) + resp_len);
	sgs[0] = &sgl[0];
	sgs[1] = &sgl[ntail + 1];
	/* Without indirect descriptors a chain must fit the ring. */
	if (!virtio_has_feature(dev->vdev, VIRTIO_RING_F_INDIRECT_DESC) &&
	    ntail + 2 > virtqueue_get_vring_size(vq)) {
		err = -E2BIG;
		goto out_free;
	}

	deadline = jiffies + msecs_to_jiffies(timeout_ms);
	spin_lock_irqsave(&dev->ctrl_lock, flags);
	for (;;) {
		if (READ_ONCE(dev->broken)) {
			err = -EIO;
			break;
		}
		err = virtqueue_add_sgs(vq, sgs, 1, 1, ctx, GFP_ATOMIC);
		if (err != -ENOSPC)
			break;
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
		if (time_after(jiffies, deadline)) {
			vrdma_cmd_timed_out(dev, opcode, timeout_ms);
			err = -ETIMEDOUT;
			goto out_free;
		}
		wait_event_timeout(dev->ctrl_wait,
				   READ_ONCE(vq->num_free) > ntail + 1 ||
				   READ_ONCE(dev->broken), HZ / 10);
		spin_lock_irqsave(&dev->ctrl_lock, flags);
	}
	if (err) {
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
		goto out_free;
	}
	virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	kfree(sgl);
	sgl = NULL;

	if (!wait_for_completion_timeout(&ctx->done,
					 msecs_to_jiffies(timeout_ms))) {
		spin_lock_irqsave(&dev->ctrl_lock, flags);
		if (!ctx->finished) {
			ctx->abandoned = true;
			spin_unlock_irqrestore(&dev->ctrl_lock, flags);
			vrdma_cmd_timed_out(dev, opcode, timeout_ms);
			return -ETIMEDOUT;
		}
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	}
	err = vrdma_cmd_result(dev, ctx, opcode, resp, resp_len);
out_free:
	kfree(sgl);
	kfree(ctx);
	return err;
}

/**
 * vrdma_cmd_atomic - post a small command from atomic context
 * @dev: the device
 * @opcode: VRDMA_CMD_*
 * @req: request structure, copied
 * @req_len: its size
 * @resp: response structure
 * @resp_len: its size
 *
 * Used by create_ah/destroy_ah without RDMA_CREATE_AH_SLEEPABLE: the
 * control queue is polled with the lock held and interrupts off until the
 * response arrives or the timeout marks the device broken.
 */
int vrdma_cmd_atomic(struct vrdma_dev *dev, u16 opcode, const void *req,
		     size_t req_len, void *resp, size_t resp_len)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_CONTROL];
	struct scatterlist in, out, *sgs[2] = { &in, &out };
	unsigned int timeout_ms = vrdma_cmd_timeout_ms();
	struct vrdma_cmd_ctx *ctx;
	unsigned long flags;
	ktime_t deadline;
	int err;

	if (WARN_ON(req_len > VRDMA_CMD_MAX_BODY ||
		    resp_len > VRDMA_CMD_MAX_BODY))
		return -EINVAL;
	if (READ_ONCE(dev->broken))
		return -EIO;

	ctx = vrdma_cmd_ctx_new(opcode, req, req_len, GFP_ATOMIC);
	if (!ctx)
		return -ENOMEM;
	ctx->polled = true;
	sg_init_one(&in, &ctx->in, sizeof(ctx->in.hdr) + req_len);
	sg_init_one(&out, &ctx->out, sizeof(ctx->out.hdr) + resp_len);

	deadline = ktime_add_ms(ktime_get(), timeout_ms);
	spin_lock_irqsave(&dev->ctrl_lock, flags);
	for (;;) {
		err = virtqueue_add_sgs(vq, sgs, 1, 1, ctx, GFP_ATOMIC);
		if (err != -ENOSPC)
			break;
		vrdma_ctrl_reap(dev);
		if (ktime_after(ktime_get(), deadline))
			break;
		udelay(5);	/* atomic context: no sleeping */
	}
	if (err) {
		spin_unlock_irqrestore(&dev->ctrl_lock, flags);
		kfree(ctx);
		if (err == -ENOSPC) {
			vrdma_cmd_timed_out(dev, opcode, timeout_ms);
			err = -ETIMEDOUT;
		}
		return err;
	}
	virtqueue_kick(vq);
	while (!ctx->finished) {
		vrdma_ctrl_reap(dev);
		if (ctx->finished)
			break;
		if (ktime_after(ktime_get(), deadline) ||
		    virtqueue_is_broken(vq)) {
			ctx->abandoned = true;
			spin_unlock_irqrestore(&dev->ctrl_lock, flags);
			wake_up(&dev->ctrl_wait);
			vrdma_cmd_timed_out(dev, opcode, timeout_ms);
			return -ETIMEDOUT;
		}
		udelay(2);
	}
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	/* Other commands may have completed while we polled. */
	wake_up(&dev->ctrl_wait);

	err = vrdma_cmd_result(dev, ctx, opcode, resp, resp_len);
	kfree(ctx);
	return err;
}

/* After a device reset: free what the device will never return. */
void vrdma_cmd_drain(struct vrdma_dev *dev)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_CONTROL];
	struct vrdma_cmd_ctx *ctx;
	unsigned long flags;

	WRITE_ONCE(dev->broken, true);
	spin_lock_irqsave(&dev->ctrl_lock, flags);
	vrdma_ctrl_reap(dev);
	while ((ctx = virtqueue_detach_unused_buf(vq)))
		vrdma_cmd_finish(ctx, 0);
	spin_unlock_irqrestore(&dev->ctrl_lock, flags);
	wake_up(&dev->ctrl_wait);
}

static void vrdma_db_reap(struct virtqueue *vq)
{
	unsigned int len;
	void *db;

	while ((db = virtqueue_get_buf(vq, &len)))
		kfree(db);
}

void vrdma_db_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;
	unsigned long flags;

	spin_lock_irqsave(&dev->db_lock, flags);
	vrdma_db_reap(vq);
	spin_unlock_irqrestore(&dev->db_lock, flags);
}

/**
 * vrdma_doorbell - add one doorbell record to the doorbell queue (§8)
 * @dev: the device
 * @type: VRDMA_DB_*
 * @id: QPN, SRQN or CQN
 *
 * Callable from any context. The record buffer is freed when the device
 * returns it.
 */
int vrdma_doorbell(struct vrdma_dev *dev, u32 type, u32 id)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_DOORBELL];
	struct vrdma_doorbell *db;
	struct scatterlist sg;
	unsigned long flags;
	ktime_t deadline;
	int err;

	if (READ_ONCE(dev->broken))
		return -EIO;
	db = kmalloc(sizeof(*db), GFP_ATOMIC);
	if (!db)
		return -ENOMEM;
	db->type = cpu_to_le32(type);
	db->id = cpu_to_le32(id);
	sg_init_one(&sg, db, sizeof(*db));

	deadline = ktime_add_ms(ktime_get(), VRDMA_DB_TIMEOUT_MS);
	spin_lock_irqsave(&dev->db_lock, flags);
	for (;;) {
		vrdma_db_reap(vq);
		err = virtqueue_add_outbuf(vq, &sg, 1, db, GFP_ATOMIC);
		if (err != -ENOSPC || ktime_after(ktime_get(), deadline))
			break;
		udelay(5);
	}
	if (!err)
		virtqueue_kick(vq);
	spin_unlock_irqrestore(&dev->db_lock, flags);
	if (err) {
		kfree(db);
		dev_err_ratelimited(&dev->vdev->dev,
				    "doorbell %u/%u dropped: %d\n", type, id,
				    err);
		return err == -ENOSPC ? -EBUSY : err;
	}
	return 0;
}

void vrdma_db_drain(struct vrdma_dev *dev)
{
	struct virtqueue *vq = dev->vqs[VRDMA_VQ_DOORBELL];
	unsigned long flags;
	void *db;

	spin_lock_irqsave(&dev->db_lock, flags);
	vrdma_db_reap(vq);
	while ((db = virtqueue_detach_unused_buf(vq)))
		kfree(db);
	spin_unlock_irqrestore(&dev->db_lock, flags);
}

// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * CQ moderation (device-spec §5.5) through ibv_modify_cq, in one guest: an
 * RC QP connected to itself writes into its own MR, its CQ has a completion
 * channel. pyverbs has no modify_cq, so this is C; the VM scenario builds it
 * on the host against the rdma-core tree of guest-driver/provider/build.sh.
 *
 *   cq_moderation DEV GID_INDEX
 *
 * Prints, and exits 0 only if all hold:
 *   "plain: event after N us"         no moderation: one CQE signals
 *   "count: held 3, event after the 4th"  count 4: three CQEs do not signal
 *   "period: event after N us"        count 1000, period 60 ms: N >= 55000
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "self_rc.h"

#define PERIOD_US 60000

static struct ibv_context *ctx;
static struct ibv_comp_channel *ch;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[4096];

static long long now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

static void post_write(void)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 2048,
			     .rkey = mr->rkey },
	};
	struct ibv_send_wr *bad;

	if (ibv_post_send(qp, &wr, &bad))
		die("post_send");
}

/* Poll (without events) until @n successful CQEs arrived. */
static void wait_cqes(int n)
{
	long long end = now_us() + 10000000;
	struct ibv_wc wc;

	while (n > 0) {
		int r = ibv_poll_cq(cq, 1, &wc);

		if (r < 0 || (r == 1 && wc.status != IBV_WC_SUCCESS)) {
			fprintf(stderr, "poll_cq: %d status %d\n", r, wc.status);
			exit(2);
		}
		n -= r;
		if (now_us() > end) {
			fprintf(stderr, "CQEs missing\n");
			exit(2);
		}
	}
}

/* 1 if a completion event arrives within @ms (and consume it). */
static int event_within(int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct ibv_cq *ecq;
	void *ectx;

	if (poll(&p, 1, ms) <= 0)
		return 0;
	if (ibv_get_cq_event(ch, &ecq, &ectx))
		die("get_cq_event");
	ibv_ack_cq_events(ecq, 1);
	return 1;
}

static void moderate(int count, int period)
{
	struct ibv_modify_cq_attr m = {
		.attr_mask = IBV_CQ_ATTR_MODERATE,
		.moderate = { .cq_count = count, .cq_period = period },
	};
	int r = ibv_modify_cq(cq, &m);

	if (r) {
		fprintf(stderr, "modify_cq: %s\n", strerror(r));
		exit(2);
	}
}

static void arm(void)
{
	if (ibv_req_notify_cq(cq, 0))
		die("req_notify_cq");
}

int main(int argc, char **argv)
{
	struct ibv_qp_init_attr qa = {};
	struct ibv_pd *pd;
	long long t;
	int i, ok = 1;

	if (argc != 3) {
		fprintf(stderr, "usage: %s DEV GID_INDEX\n", argv[0]);
		return 2;
	}
	ctx = open_device_named(argv[1]);
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	if (!pd || !ch)
		die("pd/channel");
	cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE);
	if (!cq || !mr)
		die("cq/mr");
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 32;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &qa);
	if (!qp)
		die("create_qp");
	connect_self(ctx, qp, atoi(argv[2]));

	/* No moderation: the first CQE signals. */
	arm();
	t = now_us();
	post_write();
	if (!event_within(5000)) {
		printf("plain: no event\n");
		return 1;
	}
	printf("plain: event after %lld us\n", now_us() - t);
	wait_cqes(1);

	/*
	 * Count 4, period 65.535 ms: three CQEs are held. An attempt where
	 * the three took longer than 40 ms says nothing (the period may have
	 * fired): try again.
	 */
	moderate(4, 65535);
	for (i = 0; i < 5; i++) {
		arm();
		t = now_us();
		post_write();
		post_write();
		post_write();
		wait_cqes(3);
		if (now_us() - t > 40000) {
			event_within(1000);
			continue;
		}
		if (event_within(0)) {
			printf("count: event before the 4th CQE\n");
			return 1;
		}
		post_write();
		wait_cqes(1);
		if (!event_within(5000)) {
			printf("count: no event after the 4th CQE\n");
			return 1;
		}
		printf("count: held 3, event after the 4th\n");
		break;
	}
	if (i == 5) {
		printf("count: inconclusive (CQEs too slow)\n");
		ok = 0;
	}

	/* Count 1000, period 60 ms: one CQE signals when the period ends. */
	moderate(1000, PERIOD_US);
	arm();
	t = now_us();
	post_write();
	if (!event_within(5000)) {
		printf("period: no event\n");
		return 1;
	}
	t = now_us() - t;
	printf("period: event after %lld us\n", t);
	wait_cqes(1);
	if (t < PERIOD_US - 5000)
		ok = 0;

	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return ok ? 0 : 1;
}

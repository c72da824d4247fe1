// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * Thread domains and parent domains (libvrdma, provider README) in one
 * guest: an RC QP connected to itself, created on a parent domain with a
 * thread domain, so libvrdma takes no SQ/RQ lock for it, and an extended
 * CQ on the same parent domain, so it takes no CQ lock either. pyverbs has
 * no ibv_alloc_td, so this is C; the VM scenario builds it on the host
 * against the rdma-core tree of guest-driver/provider/build.sh.
 *
 *   thread_domain DEV GID_INDEX
 *
 * Prints, and exits 0 only if all hold:
 *   "busy: pd EBUSY, td EBUSY"   the PD and the TD stay while the parent
 *                                domain uses them
 *   "traffic: N sends, N writes" every SEND arrived in the posted receive
 *                                buffer and every RDMA WRITE in the MR,
 *                                completions polled with ibv_start_poll
 *   "teardown: ok"               parent domain, then TD and PD, go
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "self_rc.h"

#define ITERS 200
#define MSG 256

enum { SEEN_SEND = 1, SEEN_WRITE = 2, SEEN_RECV = 4, SEEN_OTHER = 8 };

static struct ibv_context *ctx;
static struct ibv_cq_ex *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[4 * 4096];

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

/* Poll @n successful completions with the extended API; returns the opcodes seen. */
static unsigned int wait_cqes(int n)
{
	struct ibv_poll_cq_attr pa = {};
	long long end = now_ms() + 10000;
	unsigned int seen = 0;

	while (n > 0) {
		int r = ibv_start_poll(cq, &pa);

		if (r == ENOENT) {
			if (now_ms() > end) {
				fprintf(stderr, "CQEs missing\n");
				exit(2);
			}
			continue;
		}
		if (r)
			die("start_poll");
		do {
			if (cq->status != IBV_WC_SUCCESS) {
				fprintf(stderr, "wr %llu: status %d\n",
					(unsigned long long)cq->wr_id,
					cq->status);
				exit(2);
			}
			switch (ibv_wc_read_opcode(cq)) {
			case IBV_WC_SEND:
				seen |= SEEN_SEND;
				break;
			case IBV_WC_RDMA_WRITE:
				seen |= SEEN_WRITE;
				break;
			case IBV_WC_RECV:
				seen |= SEEN_RECV;
				break;
			default:
				seen |= SEEN_OTHER;
			}
			n--;
		} while (n > 0 && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	return seen;
}

static void post(enum ibv_wr_opcode op, size_t src, size_t dst)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)buf + src, .length = MSG, .lkey = mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = op, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + dst,
			     .rkey = mr->rkey },
	};
	struct ibv_send_wr *bad;

	if (ibv_post_send(qp, &wr, &bad))
		die("post_send");
}

static void post_recv(size_t dst)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)buf + dst, .length = MSG, .lkey = mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	if (ibv_post_recv(qp, &wr, &bad))
		die("post_recv");
}

int main(int argc, char **argv)
{
	struct ibv_parent_domain_init_attr pa = {};
	struct ibv_cq_init_attr_ex ca = {};
	struct ibv_td_init_attr ta = {};
	struct ibv_qp_init_attr qa = {};
	struct ibv_pd *pd, *parent;
	struct ibv_td *td;
	int i, n, ok = 1;

	if (argc != 3) {
		fprintf(stderr, "usage: %s DEV GID_INDEX\n", argv[0]);
		return 2;
	}
	ctx = open_device_named(argv[1]);
	pd = ibv_alloc_pd(ctx);
	td = ibv_alloc_td(ctx, &ta);
	if (!pd || !td)
		die("pd/td");
	pa.pd = pd;
	pa.td = td;
	parent = ibv_alloc_parent_domain(ctx, &pa);
	if (!parent)
		die("alloc_parent_domain");

	n = ibv_dealloc_pd(pd);
	i = ibv_dealloc_td(td);
	printf("busy: pd %s, td %s\n", n == EBUSY ? "EBUSY" : strerror(n),
	       i == EBUSY ? "EBUSY" : strerror(i));
	if (n != EBUSY || i != EBUSY)
		return 1;

	ca.cqe = 64;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	ca.parent_domain = parent;
	cq = ibv_create_cq_ex(ctx, &ca);
	mr = ibv_reg_mr(parent, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE);
	if (!cq || !mr)
		die("cq/mr on the parent domain");
	qa.send_cq = ibv_cq_ex_to_cq(cq);
	qa.recv_cq = ibv_cq_ex_to_cq(cq);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 32;
	qa.cap.max_recv_wr = 32;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qp = ibv_create_qp(parent, &qa);
	if (!qp)
		die("create_qp on the parent domain");
	connect_self(ctx, qp, atoi(argv[2]));

	/* buf: [0, 4K) source, [4K, 8K) receive target, [8K, 12K) write target */
	for (i = 0; i < ITERS; i++) {
		unsigned int seen;

		memset(buf, 'a' + i % 26, MSG);
		post_recv(4096);
		post(IBV_WR_SEND, 0, 0);
		post(IBV_WR_RDMA_WRITE, 0, 8192);
		seen = wait_cqes(3);
		if (seen != (SEEN_SEND | SEEN_WRITE | SEEN_RECV) ||
		    memcmp(buf, buf + 4096, MSG) || memcmp(buf, buf + 8192, MSG)) {
			printf("traffic: iteration %d wrong (opcodes %#x)\n",
			       i, seen);
			ok = 0;
			break;
		}
	}
	if (ok)
		printf("traffic: %d sends, %d writes\n", ITERS, ITERS);

	if (ibv_destroy_qp(qp) || ibv_dereg_mr(mr) ||
	    ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) ||
	    ibv_dealloc_pd(parent) || ibv_dealloc_td(td) ||
	    ibv_dealloc_pd(pd)) {
		printf("teardown: failed\n");
		return 1;
	}
	printf("teardown: ok\n");
	ibv_close_device(ctx);
	return ok ? 0 : 1;
}

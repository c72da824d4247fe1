// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * libvrdma data-path test without a device.
 *
 * A memfd plays the uverbs fd: the provider mmaps its rings from it and
 * "rings doorbells" by write()ing post_send commands to it, which land at
 * STUB_DB_OFF so the test can count and decode them. The test reads and
 * writes the same memfd as the device would (device-spec §4, §6, §7).
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ccan/array_size.h>

#include "vrdma.h"
#include "stubs.h"

static int failures;

#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n",         \
				__FILE__, __LINE__, #cond);                  \
			failures++;                                          \
		}                                                            \
	} while (0)

static int memfd;
static uint8_t *dev;	/* the device's view of the memfd */
static struct ibv_context ctx;
static struct vrdma_pd vpd;	/* a PD as vrdma_alloc_pd makes it */

static struct vrdma_ring_ctrl *ctrl_at(size_t off)
{
	return (struct vrdma_ring_ctrl *)(dev + off);
}

static void *entry_at(size_t off, uint32_t idx, unsigned int shift)
{
	return dev + off + VRDMA_PAGE_SIZE +
	       ((size_t)(idx & (STUB_DEPTH - 1)) << shift);
}

static long doorbells(void)
{
	return (lseek(memfd, 0, SEEK_CUR) - STUB_DB_OFF) /
	       (long)sizeof(struct ibv_post_send);
}

static void reset_rings(void)
{
	memset(dev, 0, STUB_FILE_SIZE);
	lseek(memfd, STUB_DB_OFF, SEEK_SET);
}

static void setup(void)
{
	memfd = memfd_create("vrdma-test", 0);
	assert(memfd >= 0);
	assert(ftruncate(memfd, STUB_FILE_SIZE) == 0);
	dev = mmap(NULL, STUB_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
		   memfd, 0);
	assert(dev != MAP_FAILED);
	ctx.cmd_fd = memfd;
	vpd.ibv_pd.context = &ctx;
	reset_rings();
}

static struct ibv_qp *make_qp(enum ibv_qp_type type, uint64_t send_ops,
			      struct ibv_srq *srq)
{
	struct ibv_qp_init_attr_ex attr = {
		.qp_type = type,
		.srq = srq,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = &vpd.ibv_pd,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8,
			 .max_send_sge = 4, .max_recv_sge = 3,
			 .max_inline_data = 64 },
	};

	if (send_ops) {
		attr.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		attr.send_ops_flags = send_ops;
	}
	return vrdma_create_qp_ex(&ctx, &attr);
}

static void test_registration(void)
{
	/* PROVIDER_DRIVER's constructor registered our ops */
	CHECK(stub.registered != NULL);
}

static void test_qp_create_rejects(void)
{
	struct ibv_qp_init_attr_ex attr = {
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD |
			     IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = &vpd.ibv_pd,
	};
	static const uint64_t bad_ops[] = {
		IBV_QP_EX_WITH_TSO,
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(bad_ops); i++) {
		attr.send_ops_flags = IBV_QP_EX_WITH_SEND | bad_ops[i];
		errno = 0;
		CHECK(!vrdma_create_qp_ex(&ctx, &attr));
		CHECK(errno == EOPNOTSUPP);
	}

	/* RDMA READ, ATOMIC WRITE, FLUSH on UC, RDMA WRITE on UD: not offered */
	attr.qp_type = IBV_QPT_UC;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ;
	CHECK(!vrdma_create_qp_ex(&ctx, &attr) && errno == EOPNOTSUPP);
	attr.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE;
	CHECK(!vrdma_create_qp_ex(&ctx, &attr) && errno == EOPNOTSUPP);
	attr.send_ops_flags = IBV_QP_EX_WITH_FLUSH;
	CHECK(!vrdma_create_qp_ex(&ctx, &attr) && errno == EOPNOTSUPP);
	attr.qp_type = IBV_QPT_UD;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	CHECK(!vrdma_create_qp_ex(&ctx, &attr) && errno == EOPNOTSUPP);

	attr.qp_type = IBV_QPT_RAW_PACKET;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND;
	CHECK(!vrdma_create_qp_ex(&ctx, &attr) && errno == EOPNOTSUPP);

	attr.qp_type = IBV_QPT_RC;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	attr.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	CHECK(!vrdma_create_qp_ex(&ctx, &attr) && errno == EOPNOTSUPP);
}

static void test_post_send(void)
{
	struct ibv_qp *qp = make_qp(IBV_QPT_RC, 0, NULL);
	struct vrdma_ring_ctrl *sq = ctrl_at(STUB_SQ_OFF);
	struct ibv_sge sge[5] = {
		{ .addr = 0x1000, .length = 16, .lkey = 0x101 },
		{ .addr = 0x2000, .length = 32, .lkey = 0x102 },
		{ .addr = 0x3000, .length = 48, .lkey = 0x103 },
		{ .addr = 0x4000, .length = 64, .lkey = 0x104 },
		{ .addr = 0x5000, .length = 80, .lkey = 0x105 },
	};
	struct ibv_send_wr wr[3] = {}, *bad = NULL;
	struct ibv_post_send db;
	struct vrdma_send_wqe *w;
	struct vrdma_sge *s;
	int i;

	CHECK(qp != NULL);
	if (!qp)
		return;

	wr[0].wr_id = 0xa0;
	wr[0].opcode = IBV_WR_SEND_WITH_IMM;
	wr[0].send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
	wr[0].imm_data = htobe32(0x11223344);
	wr[0].sg_list = sge;
	wr[0].num_sge = 2;
	wr[0].next = &wr[1];
	wr[1].wr_id = 0xa1;
	wr[1].opcode = IBV_WR_RDMA_WRITE;
	wr[1].wr.rdma.remote_addr = 0xdead0000;
	wr[1].wr.rdma.rkey = 0x4242;
	wr[1].sg_list = sge;
	wr[1].num_sge = 4;
	wr[1].next = &wr[2];
	wr[2].wr_id = 0xa2;
	wr[2].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr[2].send_flags = IBV_SEND_FENCE;
	wr[2].wr.atomic.remote_addr = 0xbeef0;
	wr[2].wr.atomic.rkey = 0x77;
	wr[2].wr.atomic.compare_add = 5;
	wr[2].wr.atomic.swap = 6;
	wr[2].sg_list = sge;
	wr[2].num_sge = 1;

	CHECK(vrdma_post_send(qp, wr, &bad) == 0);
	CHECK(le32toh(sq->producer) == 3);
	CHECK(doorbells() == 1);	/* one doorbell for three WQEs */

	w = entry_at(STUB_SQ_OFF, 0, STUB_SQ_SHIFT);
	CHECK(le64toh(w->wr_id) == 0xa0);
	CHECK(w->opcode == VRDMA_WR_SEND_WITH_IMM);
	CHECK(w->flags == (VRDMA_SEND_SIGNALED | VRDMA_SEND_SOLICITED));
	CHECK(w->num_sge == 2);
	/* imm travels in wire order: the bytes 11 22 33 44 as they are */
	CHECK(((uint8_t *)&w->ex)[0] == 0x11 && ((uint8_t *)&w->ex)[3] == 0x44);
	s = (struct vrdma_sge *)(w + 1);
	CHECK(le64toh(s[1].addr) == 0x2000 && le32toh(s[1].length) == 32 &&
	      le32toh(s[1].lkey) == 0x102);

	w = entry_at(STUB_SQ_OFF, 1, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_RDMA_WRITE && w->num_sge == 4);
	CHECK(w->flags == 0);
	CHECK(le64toh(w->wr.rdma.remote_addr) == 0xdead0000);
	CHECK(le32toh(w->wr.rdma.rkey) == 0x4242);

	w = entry_at(STUB_SQ_OFF, 2, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_ATOMIC_CMP_AND_SWP);
	CHECK(w->flags == VRDMA_SEND_FENCE);
	CHECK(le64toh(w->wr.atomic.compare_add) == 5 &&
	      le64toh(w->wr.atomic.swap) == 6 &&
	      le32toh(w->wr.atomic.rkey) == 0x77);

	/* the doorbell is a zero-WR post_send command for this QP */
	CHECK(pread(memfd, &db, sizeof(db), STUB_DB_OFF) == sizeof(db));
	CHECK(db.hdr.command == IB_USER_VERBS_CMD_POST_SEND);
	CHECK(db.hdr.in_words == sizeof(db) / 4);
	CHECK(db.qp_handle == STUB_QP_HANDLE && db.wr_count == 0 &&
	      db.sge_count == 0);

	/* validation: too many SGEs -> EINVAL, bad_wr set, nothing posted */
	wr[0].num_sge = 5;
	wr[0].next = NULL;
	bad = NULL;
	CHECK(vrdma_post_send(qp, wr, &bad) == EINVAL && bad == &wr[0]);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	/* unknown opcodes, READ with inline */
	wr[0].num_sge = 1;
	wr[0].opcode = IBV_WR_TSO;
	CHECK(vrdma_post_send(qp, wr, &bad) == EINVAL && bad == &wr[0]);
	wr[0].opcode = IBV_WR_BIND_MW;	/* no window */
	CHECK(vrdma_post_send(qp, wr, &bad) == EINVAL);
	wr[0].opcode = IBV_WR_RDMA_READ;
	wr[0].send_flags = IBV_SEND_INLINE;
	CHECK(vrdma_post_send(qp, wr, &bad) == EINVAL);
	CHECK(doorbells() == 1);

	/* inline: payload copied behind the header; > max_inline -> EINVAL */
	{
		char payload[64];
		struct ibv_sge isge[2] = {
			{ .addr = (uintptr_t)payload, .length = 40 },
			{ .addr = (uintptr_t)payload + 40, .length = 24 },
		};

		for (i = 0; i < 64; i++)
			payload[i] = i;
		wr[0].opcode = IBV_WR_SEND;
		wr[0].send_flags = IBV_SEND_INLINE;
		wr[0].sg_list = isge;
		wr[0].num_sge = 2;
		CHECK(vrdma_post_send(qp, wr, &bad) == 0);
		w = entry_at(STUB_SQ_OFF, 3, STUB_SQ_SHIFT);
		CHECK(w->flags == VRDMA_SEND_INLINE && w->num_sge == 0);
		CHECK(le32toh(w->inline_len) == 64);
		CHECK(memcmp(w + 1, payload, 64) == 0);
		CHECK(doorbells() == 2);

		isge[1].length = 25;
		CHECK(vrdma_post_send(qp, wr, &bad) == EINVAL);
		CHECK(le32toh(sq->producer) == 4);
	}

	/* fullness: 4 in flight, device consumed none: 4 fit, 5th ENOMEM */
	{
		struct ibv_send_wr many[5] = {};

		for (i = 0; i < 5; i++) {
			many[i].opcode = IBV_WR_SEND;
			many[i].next = i < 4 ? &many[i + 1] : NULL;
		}
		bad = NULL;
		CHECK(vrdma_post_send(qp, many, &bad) == ENOMEM);
		CHECK(bad == &many[4]);
		CHECK(le32toh(sq->producer) == 8);
		CHECK(doorbells() == 3);	/* the 4 posted are rung */

		/* device retires 2 (writes consumer): two more fit */
		sq->consumer = htole32(2);
		many[1].next = NULL;
		CHECK(vrdma_post_send(qp, many, &bad) == 0);
		CHECK(le32toh(sq->producer) == 10);

		/* a consumer beyond the producer is nonsense: treat as full */
		sq->consumer = htole32(50);
		many[0].next = NULL;
		CHECK(vrdma_post_send(qp, many, &bad) == ENOMEM);
	}

	/* modify to RESET: the producer is re-read from the control page */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
		struct ibv_send_wr one = { .opcode = IBV_WR_SEND };

		struct ibv_recv_wr rone = {}, *rbad = NULL;
		long db0 = doorbells();

		memset(sq, 0, sizeof(*sq));
		CHECK(vrdma_modify_qp(qp, &a, IBV_QP_STATE) == 0);
		CHECK(stub.modify_calls == 1);
		/* libibverbs records the new state; RESET takes no work */
		qp->state = IBV_QPS_RESET;
		bad = NULL;
		CHECK(vrdma_post_send(qp, &one, &bad) == EINVAL && bad == &one);
		CHECK(vrdma_post_recv(qp, &rone, &rbad) == EINVAL && rbad == &rone);
		qp->state = IBV_QPS_RTR;	/* RQ yes, SQ not yet */
		CHECK(vrdma_post_send(qp, &one, &bad) == EINVAL);
		CHECK(vrdma_post_recv(qp, &rone, &rbad) == 0);
		CHECK(doorbells() == db0 && le32toh(sq->producer) == 0);
		qp->state = IBV_QPS_RTS;
		CHECK(vrdma_post_send(qp, &one, &bad) == 0);
		CHECK(le32toh(sq->producer) == 1);
	}

	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
}

/* LOCAL_INV, BIND_MW (post_send, ibv_bind_mw, ibv_wr_*) build §6.1 WQEs. */
static void test_memory_windows(void)
{
	struct ibv_qp *qp = make_qp(IBV_QPT_RC, IBV_QP_EX_WITH_LOCAL_INV |
				    IBV_QP_EX_WITH_BIND_MW, NULL);
	struct vrdma_ring_ctrl *sq = ctrl_at(STUB_SQ_OFF);
	struct ibv_mr mr = { .lkey = 0x3301, .pd = &vpd.ibv_pd };
	struct ibv_mw mw2 = { .rkey = 0x1207, .pd = &vpd.ibv_pd,
			      .type = IBV_MW_TYPE_2 };
	struct ibv_mw mw1 = { .rkey = 0x14ff, .pd = &vpd.ibv_pd,
			      .type = IBV_MW_TYPE_1 };
	struct ibv_sge sge = { .addr = 0x1000, .length = 8, .lkey = 1 };
	struct ibv_send_wr wr[2] = {}, *bad = NULL;
	struct ibv_mw_bind bind = {
		.wr_id = 0xb1,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = &mr, .addr = 0x7000, .length = 0x2000,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
						  IBV_ACCESS_LOCAL_WRITE },
	};
	struct ibv_mw_bind_info bi = bind.bind_info;
	struct vrdma_send_wqe *w;
	struct ibv_qp_ex *qpx;

	CHECK(qp != NULL);
	if (!qp)
		return;
	wr[0].wr_id = 0xa0;
	wr[0].opcode = IBV_WR_LOCAL_INV;
	wr[0].invalidate_rkey = 0x5511;
	wr[0].sg_list = &sge;
	wr[0].num_sge = 1;		/* ignored: no SGEs on a local op */
	wr[0].next = &wr[1];
	wr[1].wr_id = 0xa1;
	wr[1].opcode = IBV_WR_BIND_MW;
	wr[1].send_flags = IBV_SEND_SIGNALED;
	wr[1].bind_mw.mw = &mw2;
	wr[1].bind_mw.rkey = ibv_inc_rkey(mw2.rkey);
	wr[1].bind_mw.bind_info = bi;
	wr[1].bind_mw.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
	CHECK(vrdma_post_send(qp, wr, &bad) == 0);
	CHECK(le32toh(sq->producer) == 2 && doorbells() == 1);
	w = entry_at(STUB_SQ_OFF, 0, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_LOCAL_INV && le32toh(w->ex) == 0x5511);
	CHECK(w->num_sge == 0);
	w = entry_at(STUB_SQ_OFF, 1, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_BIND_MW && w->num_sge == 0 &&
	      w->flags == VRDMA_SEND_SIGNALED);
	CHECK(le32toh(w->wr.bind_mw.mw_key) == 0x1207 &&
	      le32toh(w->wr.bind_mw.new_key) == 0x1208 &&
	      le32toh(w->wr.bind_mw.mr_key) == 0x3301);
	CHECK(le64toh(w->wr.bind_mw.addr) == 0x7000 &&
	      le64toh(w->wr.bind_mw.length) == 0x2000);
	CHECK(le32toh(w->wr.bind_mw.access) ==
	      (VRDMA_ACCESS_REMOTE_WRITE | VRDMA_ACCESS_LOCAL_WRITE |
	       VRDMA_ACCESS_ZERO_BASED));
	CHECK(mw2.rkey == 0x1208);	/* the next bind names it by this */

	/* ibv_bind_mw: type 1 only; the rkey's key byte wraps */
	CHECK(vrdma_bind_mw(qp, &mw2, &bind) == EINVAL);
	CHECK(vrdma_bind_mw(qp, &mw1, &bind) == 0);
	CHECK(mw1.rkey == 0x1400 && le32toh(sq->producer) == 3);
	w = entry_at(STUB_SQ_OFF, 2, STUB_SQ_SHIFT);
	CHECK(le64toh(w->wr_id) == 0xb1 && w->opcode == VRDMA_WR_BIND_MW);
	CHECK(le32toh(w->wr.bind_mw.mw_key) == 0x14ff &&
	      le32toh(w->wr.bind_mw.new_key) == 0x1400);
	bind.bind_info.mr = NULL;	/* unbind needs no MR, but no range */
	CHECK(vrdma_bind_mw(qp, &mw1, &bind) == EINVAL);
	bind.bind_info.addr = bind.bind_info.length = 0;
	CHECK(vrdma_bind_mw(qp, &mw1, &bind) == 0);
	w = entry_at(STUB_SQ_OFF, 3, STUB_SQ_SHIFT);
	CHECK(le32toh(w->wr.bind_mw.mr_key) == 0 &&
	      le64toh(w->wr.bind_mw.length) == 0);

	/* the ibv_wr_* builders */
	qpx = ibv_qp_to_qp_ex(qp);
	CHECK(qpx && qpx->wr_local_inv && qpx->wr_bind_mw);
	if (qpx) {
		ibv_wr_start(qpx);
		qpx->wr_id = 0xc0;
		qpx->wr_flags = 0;
		ibv_wr_local_inv(qpx, 0x6601);
		qpx->wr_id = 0xc1;
		ibv_wr_bind_mw(qpx, &mw2, ibv_inc_rkey(mw2.rkey), &bi);
		CHECK(ibv_wr_complete(qpx) == 0);
		CHECK(le32toh(sq->producer) == 6);
		w = entry_at(STUB_SQ_OFF, 4, STUB_SQ_SHIFT);
		CHECK(w->opcode == VRDMA_WR_LOCAL_INV &&
		      le32toh(w->ex) == 0x6601);
		w = entry_at(STUB_SQ_OFF, 5, STUB_SQ_SHIFT);
		CHECK(w->opcode == VRDMA_WR_BIND_MW &&
		      le32toh(w->wr.bind_mw.mw_key) == 0x1208 &&
		      le32toh(w->wr.bind_mw.new_key) == 0x1209);
	}

	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();

	/* UD has no windows */
	qp = make_qp(IBV_QPT_UD, 0, NULL);
	CHECK(qp != NULL);
	if (!qp)
		return;
	wr[1].next = NULL;
	CHECK(vrdma_post_send(qp, &wr[1], &bad) == EINVAL);
	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
}

static void test_post_recv(void)
{
	struct ibv_qp *qp = make_qp(IBV_QPT_UC, 0, NULL);
	struct vrdma_ring_ctrl *rq = ctrl_at(STUB_RQ_OFF);
	struct ibv_sge sge[4] = {
		{ .addr = 0x9000, .length = 100, .lkey = 9 },
	};
	struct ibv_recv_wr wr[9] = {}, *bad = NULL;
	struct vrdma_recv_wqe *w;
	struct vrdma_sge *s;
	int i;

	CHECK(qp != NULL);
	if (!qp)
		return;

	for (i = 0; i < 9; i++) {
		wr[i].wr_id = 0x100 + i;
		wr[i].sg_list = sge;
		wr[i].num_sge = 1;
		wr[i].next = i < 8 ? &wr[i + 1] : NULL;
	}
	CHECK(vrdma_post_recv(qp, wr, &bad) == ENOMEM);
	CHECK(bad == &wr[8]);
	CHECK(le32toh(rq->producer) == 8);
	CHECK(doorbells() == 0);	/* post_recv never rings */

	w = entry_at(STUB_RQ_OFF, 5, STUB_RQ_SHIFT);
	s = (struct vrdma_sge *)(w + 1);
	CHECK(le64toh(w->wr_id) == 0x105 && le32toh(w->num_sge) == 1);
	CHECK(le64toh(s->addr) == 0x9000 && le32toh(s->length) == 100);

	/* too many SGEs for the QP (3) */
	rq->consumer = htole32(8);
	wr[0].num_sge = 4;
	wr[0].next = NULL;
	CHECK(vrdma_post_recv(qp, wr, &bad) == EINVAL && bad == &wr[0]);
	CHECK(le32toh(rq->producer) == 8);

	/* UC: RDMA READ and atomics are rejected per WR */
	{
		struct ibv_send_wr swr = { .opcode = IBV_WR_RDMA_READ };
		struct ibv_send_wr *sbad;

		CHECK(vrdma_post_send(qp, &swr, &sbad) == EINVAL);
		swr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		CHECK(vrdma_post_send(qp, &swr, &sbad) == EINVAL);
		swr.opcode = IBV_WR_SEND_WITH_INV;
		CHECK(vrdma_post_send(qp, &swr, &sbad) == EINVAL);
	}

	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
}

static void test_ud(void)
{
	struct ibv_qp *qp = make_qp(IBV_QPT_UD, IBV_QP_EX_WITH_SEND, NULL);
	struct vrdma_ah ah = { .ah_index = 0x33 };
	struct ibv_send_wr wr = {}, *bad;
	struct vrdma_send_wqe *w;
	struct ibv_qp_ex *qpx;

	CHECK(qp != NULL);
	if (!qp)
		return;

	wr.opcode = IBV_WR_SEND;
	wr.wr.ud.remote_qpn = 0x1234;
	wr.wr.ud.remote_qkey = 0x11111111;
	CHECK(vrdma_post_send(qp, &wr, &bad) == EINVAL);	/* no AH */
	wr.wr.ud.ah = &ah.ibv_ah;
	CHECK(vrdma_post_send(qp, &wr, &bad) == 0);
	w = entry_at(STUB_SQ_OFF, 0, STUB_SQ_SHIFT);
	CHECK(le32toh(w->wr.ud.ah_index) == 0x33);
	CHECK(le32toh(w->wr.ud.remote_qpn) == 0x1234);
	CHECK(le32toh(w->wr.ud.remote_qkey) == 0x11111111);
	wr.opcode = IBV_WR_RDMA_WRITE;
	CHECK(vrdma_post_send(qp, &wr, &bad) == EINVAL);

	/* the same through ibv_wr_* */
	qpx = ibv_qp_to_qp_ex(qp);
	CHECK(qpx != NULL);
	if (qpx) {
		ibv_wr_start(qpx);
		qpx->wr_id = 0x77;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qpx);
		ibv_wr_set_ud_addr(qpx, &ah.ibv_ah, 0x99, 0x22);
		ibv_wr_set_sge(qpx, 5, 0x6000, 10);
		CHECK(ibv_wr_complete(qpx) == 0);
		w = entry_at(STUB_SQ_OFF, 1, STUB_SQ_SHIFT);
		CHECK(le64toh(w->wr_id) == 0x77 && w->opcode == VRDMA_WR_SEND);
		CHECK(w->flags == VRDMA_SEND_SIGNALED && w->num_sge == 1);
		CHECK(le32toh(w->wr.ud.remote_qpn) == 0x99 &&
		      le32toh(w->wr.ud.ah_index) == 0x33);
	}
	CHECK(doorbells() == 2);
	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
}

static void test_wr_api(void)
{
	struct ibv_qp *qp = make_qp(IBV_QPT_RC,
				    IBV_QP_EX_WITH_SEND |
				    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				    IBV_QP_EX_WITH_RDMA_READ |
				    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				    IBV_QP_EX_WITH_SEND_WITH_INV, NULL);
	struct vrdma_ring_ctrl *sq = ctrl_at(STUB_SQ_OFF);
	struct ibv_sge list[5] = {};
	struct vrdma_send_wqe *w;
	struct ibv_qp_ex *qpx;
	char data[8] = "abcdefg";

	CHECK(qp != NULL);
	if (!qp)
		return;
	qpx = ibv_qp_to_qp_ex(qp);
	CHECK(qpx && qpx->wr_send && qpx->wr_rdma_read &&
	      qpx->wr_atomic_fetch_add && qpx->wr_send_inv);
	/* not requested -> not installed */
	CHECK(qpx && !qpx->wr_rdma_write && !qpx->wr_local_inv &&
	      !qpx->wr_bind_mw);
	if (!qpx)
		return;

	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	qpx->wr_flags = 0;
	ibv_wr_rdma_write_imm(qpx, 0x10, 0x20, htobe32(0xcafe));
	ibv_wr_set_inline_data(qpx, data, sizeof(data));
	qpx->wr_id = 2;
	ibv_wr_atomic_fetch_add(qpx, 0x11, 0x40, 9);
	ibv_wr_set_sge(qpx, 1, 0x50, 8);
	qpx->wr_id = 3;
	ibv_wr_send_inv(qpx, 0xabcd);
	ibv_wr_set_sge_list(qpx, 2, list);
	CHECK(ibv_wr_complete(qpx) == 0);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	w = entry_at(STUB_SQ_OFF, 0, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_RDMA_WRITE_WITH_IMM);
	CHECK(w->flags == VRDMA_SEND_INLINE && le32toh(w->inline_len) == 8);
	CHECK(memcmp(w + 1, data, 8) == 0);
	CHECK(((uint8_t *)&w->ex)[2] == 0xca && ((uint8_t *)&w->ex)[3] == 0xfe);
	w = entry_at(STUB_SQ_OFF, 1, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_ATOMIC_FETCH_AND_ADD &&
	      le64toh(w->wr.atomic.compare_add) == 9 && w->num_sge == 1);
	w = entry_at(STUB_SQ_OFF, 2, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_SEND_WITH_INV && le32toh(w->ex) == 0xabcd &&
	      w->num_sge == 2);

	/* an error anywhere in the batch: nothing posted, no doorbell */
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, 1, 2, 3);
	ibv_wr_send(qpx);
	ibv_wr_set_sge_list(qpx, 5, list);	/* max_send_sge is 4 */
	CHECK(ibv_wr_complete(qpx) == EINVAL);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	/* inline into an atomic is refused */
	ibv_wr_start(qpx);
	ibv_wr_atomic_fetch_add(qpx, 1, 2, 3);
	ibv_wr_set_inline_data(qpx, data, 8);
	CHECK(ibv_wr_complete(qpx) == EINVAL);

	/* abort discards */
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, 1, 2, 3);
	ibv_wr_abort(qpx);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	/* overflowing the SQ inside a batch -> ENOMEM, nothing posted */
	ibv_wr_start(qpx);
	for (int i = 0; i < 6; i++) {
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, 1, 2, 3);
	}
	CHECK(ibv_wr_complete(qpx) == ENOMEM);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	/* wr_complete in a state that takes no sends: EINVAL, nothing posted */
	qp->state = IBV_QPS_INIT;
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, 1, 2, 3);
	CHECK(ibv_wr_complete(qpx) == EINVAL);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);
	qp->state = IBV_QPS_RTS;

	/* an empty batch posts nothing and makes no system call */
	ibv_wr_start(qpx);
	CHECK(ibv_wr_complete(qpx) == 0);
	CHECK(doorbells() == 1);

	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
}

/* IBTA 1.5 ATOMIC WRITE and FLUSH through ibv_wr_* (device-spec §6.1) */
static void test_wr_atomic_write_flush(void)
{
	struct ibv_qp *qp = make_qp(IBV_QPT_RC,
				    IBV_QP_EX_WITH_ATOMIC_WRITE |
				    IBV_QP_EX_WITH_FLUSH, NULL);
	struct vrdma_ring_ctrl *sq = ctrl_at(STUB_SQ_OFF);
	static const uint8_t val[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	struct vrdma_send_wqe *w;
	struct ibv_qp_ex *qpx;

	CHECK(qp != NULL);
	if (!qp)
		return;
	qpx = ibv_qp_to_qp_ex(qp);
	CHECK(qpx && qpx->wr_atomic_write && qpx->wr_flush && !qpx->wr_send);
	if (!qpx)
		return;

	ibv_wr_start(qpx);
	qpx->wr_id = 0x77;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
	ibv_wr_atomic_write(qpx, 0x1234, 0x1000, val);
	qpx->wr_id = 0x78;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_flush(qpx, 0x5678, 0x2000, 4096, IBV_FLUSH_GLOBAL,
		     IBV_FLUSH_RANGE);
	qpx->wr_id = 0x79;
	ibv_wr_flush(qpx, 0x5678, 0, 0, IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT,
		     IBV_FLUSH_MR);
	CHECK(ibv_wr_complete(qpx) == 0);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	w = entry_at(STUB_SQ_OFF, 0, STUB_SQ_SHIFT);
	CHECK(le64toh(w->wr_id) == 0x77 && w->opcode == VRDMA_WR_ATOMIC_WRITE);
	CHECK(w->flags == (VRDMA_SEND_SIGNALED | VRDMA_SEND_FENCE));
	CHECK(w->num_sge == 0 && w->inline_len == 0);
	CHECK(le64toh(w->wr.atomic_write.remote_addr) == 0x1000 &&
	      le32toh(w->wr.atomic_write.rkey) == 0x1234);
	/* the bytes as given, at wr + 16 (Appendix A) */
	CHECK(memcmp(w->wr.atomic_write.data, val, 8) == 0);
	CHECK(memcmp((uint8_t *)w + 24 + 16, val, 8) == 0);

	w = entry_at(STUB_SQ_OFF, 1, STUB_SQ_SHIFT);
	CHECK(le64toh(w->wr_id) == 0x78 && w->opcode == VRDMA_WR_FLUSH);
	CHECK(w->num_sge == 0 && w->flags == VRDMA_SEND_SIGNALED);
	CHECK(le64toh(w->wr.flush.remote_addr) == 0x2000 &&
	      le32toh(w->wr.flush.rkey) == 0x5678 &&
	      le64toh(w->wr.flush.length) == 4096);
	CHECK(w->wr.flush.placement == VRDMA_FLUSH_GLOBAL &&
	      w->wr.flush.selectivity == VRDMA_FLUSH_RANGE);
	/* placement at wr + 12, selectivity at wr + 13 */
	CHECK(((uint8_t *)w)[24 + 12] == 1 && ((uint8_t *)w)[24 + 13] == 0);

	w = entry_at(STUB_SQ_OFF, 2, STUB_SQ_SHIFT);
	CHECK(w->opcode == VRDMA_WR_FLUSH &&
	      w->wr.flush.placement ==
		(VRDMA_FLUSH_GLOBAL | VRDMA_FLUSH_PERSISTENT) &&
	      w->wr.flush.selectivity == VRDMA_FLUSH_MR);

	/* no inline data and no SGEs for either */
	ibv_wr_start(qpx);
	ibv_wr_atomic_write(qpx, 1, 8, val);
	ibv_wr_set_inline_data(qpx, (void *)val, 8);
	CHECK(ibv_wr_complete(qpx) == EINVAL);
	CHECK(le32toh(sq->producer) == 3 && doorbells() == 1);

	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
}

static void device_cqe(uint32_t idx, uint64_t wr_id, uint8_t op,
		       uint8_t status, uint8_t flags, uint32_t ex)
{
	struct vrdma_cqe *c = entry_at(STUB_CQ_OFF, idx, VRDMA_CQE_SHIFT);

	memset(c, 0, sizeof(*c));
	c->wr_id = htole64(wr_id);
	c->opcode = op;
	c->status = status;
	c->flags = flags;
	c->qpn = htole32(STUB_QPN);
	c->byte_len = htole32(1000 + idx);
	c->ex = ex;
	c->src_qp = htole32(0x4321);
	c->pkey_index = htole16(0);
	c->sl = 3;
	c->vendor_err = htole32(status ? 0x55 : 0);
}

static struct vrdma_cqe *entry_cqe(uint32_t idx)
{
	return entry_at(STUB_CQ_OFF, idx, VRDMA_CQE_SHIFT);
}

static void test_cq(void)
{
	struct vrdma_ring_ctrl *cc = ctrl_at(STUB_CQ_OFF);
	struct ibv_cq *cq = vrdma_create_cq(&ctx, 8, NULL, 0);
	struct ibv_wc wc[4];
	uint32_t imm_wire;
	uint8_t imm_bytes[4] = { 0xde, 0xad, 0xbe, 0xef };

	CHECK(cq != NULL);
	if (!cq)
		return;

	CHECK(vrdma_poll_cq(cq, 4, wc) == 0);

	memcpy(&imm_wire, imm_bytes, 4);
	device_cqe(0, 0x10, VRDMA_WC_RECV_RDMA_WITH_IMM, VRDMA_WC_SUCCESS,
		   VRDMA_WC_F_IMM, imm_wire);
	device_cqe(1, 0x11, VRDMA_WC_RECV, VRDMA_WC_SUCCESS,
		   VRDMA_WC_F_INV | VRDMA_WC_F_GRH, htole32(0x5566));
	device_cqe(2, 0x12, VRDMA_WC_RDMA_READ, VRDMA_WC_REM_ACCESS_ERR, 0, 0);
	/* not yet published by the device: invisible */
	CHECK(vrdma_poll_cq(cq, 4, wc) == 0);
	cc->producer = htole32(3);

	CHECK(vrdma_poll_cq(cq, 2, wc) == 2);
	CHECK(le32toh(cc->consumer) == 2);
	CHECK(wc[0].wr_id == 0x10 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK(wc[0].wc_flags == IBV_WC_WITH_IMM);
	CHECK(be32toh(wc[0].imm_data) == 0xdeadbeef);
	CHECK(wc[0].byte_len == 1000 && wc[0].qp_num == STUB_QPN);
	CHECK(wc[0].src_qp == 0x4321 && wc[0].sl == 3);
	CHECK(wc[1].opcode == IBV_WC_RECV);
	CHECK(wc[1].wc_flags == (IBV_WC_WITH_INV | IBV_WC_GRH));
	CHECK(wc[1].invalidated_rkey == 0x5566);
	/* not RoCE v2 UD: the device's sl as it is */
	CHECK(wc[1].sl == 3);

	CHECK(vrdma_poll_cq(cq, 4, wc) == 1);
	CHECK(wc[0].status == IBV_WC_REM_ACCESS_ERR &&
	      wc[0].vendor_err == 0x55 && wc[0].opcode == IBV_WC_RDMA_READ);
	CHECK(le32toh(cc->consumer) == 3);

	/* UD receives report the frame's L3 type in sl, as mlx5 does */
	device_cqe(3, 0x13, VRDMA_WC_RECV, VRDMA_WC_SUCCESS, VRDMA_WC_F_GRH, 0);
	entry_cqe(3)->network_hdr_type = VRDMA_NETWORK_IPV4;
	device_cqe(4, 0x14, VRDMA_WC_RECV, VRDMA_WC_SUCCESS, VRDMA_WC_F_GRH, 0);
	entry_cqe(4)->network_hdr_type = VRDMA_NETWORK_IPV6;
	cc->producer = htole32(5);
	CHECK(vrdma_poll_cq(cq, 4, wc) == 2);
	CHECK(wc[0].wr_id == 0x13 && wc[0].sl == 0xa);
	CHECK(wc[1].wr_id == 0x14 && wc[1].sl == 0x9);
	CHECK(le32toh(cc->consumer) == 5);

	/* a device producer more than depth ahead is ignored, not read */
	cc->producer = htole32(5 + 100);
	CHECK(vrdma_poll_cq(cq, 4, wc) == 0);
	cc->producer = htole32(5);

	/* arming is a store in the control page, no system call */
	CHECK(vrdma_req_notify_cq(cq, 0) == 0);
	CHECK(le32toh(cc->cq_arm) == VRDMA_CQ_ARM_NEXT);
	CHECK(vrdma_req_notify_cq(cq, 1) == 0);
	CHECK(le32toh(cc->cq_arm) == VRDMA_CQ_ARM_SOLICITED);
	CHECK(doorbells() == 0);

	/* overflow reported by the device: drained CQ polls as an error */
	cc->error = htole32(VRDMA_RING_ERR_OVERFLOW);
	CHECK(vrdma_poll_cq(cq, 4, wc) == -1);
	cc->error = 0;

	/* resize: continue from the consumer in the new ring */
	{
		struct vrdma_ring_ctrl *nc = ctrl_at(STUB_CQ2_OFF);
		struct vrdma_cqe *c = (void *)(dev + STUB_CQ2_OFF +
					       VRDMA_PAGE_SIZE);

		/* same depth: no new ring, polling continues on the old */
		CHECK(vrdma_resize_cq(cq, STUB_DEPTH) == 0);
		device_cqe(5, 0x98, VRDMA_WC_SEND, VRDMA_WC_SUCCESS, 0, 0);
		cc->producer = htole32(6);
		CHECK(vrdma_poll_cq(cq, 4, wc) == 1 && wc[0].wr_id == 0x98);

		nc->consumer = 0;
		c->wr_id = htole64(0x99);
		nc->producer = htole32(1);
		CHECK(vrdma_resize_cq(cq, 16) == 0);
		CHECK(vrdma_poll_cq(cq, 4, wc) == 1 && wc[0].wr_id == 0x99);
		CHECK(le32toh(nc->consumer) == 1);
	}
	/* modify_cq: count and period reach the kernel command as given */
	{
		struct ibv_modify_cq_attr ma = {
			.attr_mask = IBV_CQ_ATTR_MODERATE,
			.moderate = { .cq_count = 16, .cq_period = 50 },
		};

		CHECK(vrdma_modify_cq(cq, &ma) == 0);
		CHECK(stub_modify_cq_attr.moderate.cq_count == 16 &&
		      stub_modify_cq_attr.moderate.cq_period == 50);
	}
	CHECK(vrdma_destroy_cq(cq) == 0);
	reset_rings();
}

/* modify to RESET drops that QP's unread CQEs, keeps the others in order */
static void test_cq_clean(void)
{
	static const uint32_t qpns[] = { 7, 9, 7, 7, 9, 8 };
	struct vrdma_ring_ctrl *cc = ctrl_at(STUB_CQ_OFF);
	uint32_t start = STUB_DEPTH - 2;	/* the kept CQEs wrap the ring */
	struct ibv_wc wc[8];
	struct ibv_cq *cq;
	uint32_t i;

	cc->consumer = htole32(start);
	cc->producer = htole32(start);
	cq = vrdma_create_cq(&ctx, 8, NULL, 0);
	CHECK(cq != NULL);
	if (!cq)
		return;
	for (i = 0; i < 6; i++) {
		struct vrdma_cqe *c = entry_at(STUB_CQ_OFF, start + i,
					       VRDMA_CQE_SHIFT);

		device_cqe(start + i, 0x100 + i, VRDMA_WC_SEND,
			   VRDMA_WC_SUCCESS, 0, 0);
		c->qpn = htole32(qpns[i]);
	}
	cc->producer = htole32(start + 6);

	CHECK(vrdma_poll_cq(cq, 1, wc) == 1 && wc[0].wr_id == 0x100);
	vrdma_cq_clean(to_vcq(cq), 7);
	CHECK(le32toh(cc->consumer) == start + 3);
	CHECK(vrdma_poll_cq(cq, 8, wc) == 3);
	CHECK(wc[0].wr_id == 0x101 && wc[0].qp_num == 9);
	CHECK(wc[1].wr_id == 0x104 && wc[1].qp_num == 9);
	CHECK(wc[2].wr_id == 0x105 && wc[2].qp_num == 8);
	CHECK(le32toh(cc->consumer) == start + 6);

	/* nothing to drop, or an empty CQ: the consumer stays */
	vrdma_cq_clean(to_vcq(cq), 9);
	CHECK(le32toh(cc->consumer) == start + 6);
	CHECK(vrdma_destroy_cq(cq) == 0);
	reset_rings();
}

static void test_cq_ex(void)
{
	struct vrdma_ring_ctrl *cc = ctrl_at(STUB_CQ_OFF);
	struct ibv_cq_init_attr_ex attr = {
		.cqe = 8,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
	};
	struct ibv_poll_cq_attr pattr = {};
	struct ibv_cq_ex *cq;
	uint32_t i;
	int ret;

	attr.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	CHECK(!vrdma_create_cq_ex(&ctx, &attr) && errno == EOPNOTSUPP);
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	attr.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	CHECK(!vrdma_create_cq_ex(&ctx, &attr) && errno == EOPNOTSUPP);
	attr.comp_mask = 0;

	cq = vrdma_create_cq_ex(&ctx, &attr);
	CHECK(cq != NULL);
	if (!cq)
		return;

	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);	/* no end_poll */

	for (i = 0; i < 3; i++)
		device_cqe(i, 0x20 + i, VRDMA_WC_SEND, VRDMA_WC_SUCCESS, 0, 0);
	device_cqe(1, 0x21, VRDMA_WC_RECV, VRDMA_WC_SUCCESS, VRDMA_WC_F_IMM,
		   htobe32(7));
	cc->producer = htole32(3);

	i = 0;
	for (ret = ibv_start_poll(cq, &pattr); !ret; ret = ibv_next_poll(cq)) {
		CHECK(cq->wr_id == 0x20 + i && cq->status == IBV_WC_SUCCESS);
		CHECK(ibv_wc_read_byte_len(cq) == 1000 + i);
		CHECK(ibv_wc_read_qp_num(cq) == STUB_QPN);
		CHECK(ibv_wc_read_src_qp(cq) == 0x4321);
		CHECK(ibv_wc_read_sl(cq) == 3);
		if (i == 1) {
			CHECK(ibv_wc_read_opcode(cq) == IBV_WC_RECV);
			CHECK(ibv_wc_read_wc_flags(cq) == IBV_WC_WITH_IMM);
			CHECK(be32toh(ibv_wc_read_imm_data(cq)) == 7);
		}
		i++;
	}
	CHECK(ret == ENOENT && i == 3);
	ibv_end_poll(cq);
	CHECK(le32toh(cc->consumer) == 3);
	CHECK(ibv_start_poll(cq, &pattr) == ENOENT);

	/* classic polling works on an extended CQ too */
	device_cqe(3, 0x30, VRDMA_WC_SEND, VRDMA_WC_SUCCESS, 0, 0);
	cc->producer = htole32(4);
	{
		struct ibv_wc wc;

		CHECK(vrdma_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc) == 1 &&
		      wc.wr_id == 0x30);
	}

	/* ATOMIC WRITE and FLUSH completions, both polling paths */
	device_cqe(4, 0x40, VRDMA_WC_ATOMIC_WRITE, VRDMA_WC_SUCCESS, 0, 0);
	device_cqe(5, 0x41, VRDMA_WC_FLUSH, VRDMA_WC_SUCCESS, 0, 0);
	cc->producer = htole32(6);
	CHECK(ibv_start_poll(cq, &pattr) == 0 && cq->wr_id == 0x40 &&
	      ibv_wc_read_opcode(cq) == IBV_WC_ATOMIC_WRITE);
	CHECK(ibv_next_poll(cq) == 0 && cq->wr_id == 0x41 &&
	      ibv_wc_read_opcode(cq) == IBV_WC_FLUSH);
	ibv_end_poll(cq);
	device_cqe(6, 0x42, VRDMA_WC_FLUSH, VRDMA_WC_SUCCESS, 0, 0);
	device_cqe(7, 0x43, VRDMA_WC_ATOMIC_WRITE, VRDMA_WC_REM_ACCESS_ERR, 0,
		   0);
	cc->producer = htole32(8);
	{
		struct ibv_wc wc[2];

		CHECK(vrdma_poll_cq(ibv_cq_ex_to_cq(cq), 2, wc) == 2);
		CHECK(wc[0].wr_id == 0x42 && wc[0].opcode == IBV_WC_FLUSH);
		CHECK(wc[1].wr_id == 0x43 &&
		      wc[1].status == IBV_WC_REM_ACCESS_ERR);
	}
	CHECK(vrdma_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	reset_rings();
}

/*
 * Thread and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)):
 * a parent domain carries its PD's kernel handle, objects of a thread
 * domain take no locks, and the domains are refcounted.
 */
static void test_parent_domain(void)
{
	struct ibv_td_init_attr td_attr = {};
	struct ibv_parent_domain_init_attr pattr = { .pd = &vpd.ibv_pd };
	struct ibv_cq_init_attr_ex cattr = {
		.cqe = 8,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
	};
	struct ibv_pd *plain_parent, *td_parent;
	struct ibv_qp_init_attr_ex qattr = {
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8,
			 .max_send_sge = 4, .max_recv_sge = 3 },
	};
	struct ibv_cq_ex *cq;
	struct ibv_td *td;
	struct ibv_qp *qp;

	vpd.ibv_pd.handle = 0x77;
	td_attr.comp_mask = 1;
	CHECK(!vrdma_alloc_td(&ctx, &td_attr) && errno == EOPNOTSUPP);
	td_attr.comp_mask = 0;
	td = vrdma_alloc_td(&ctx, &td_attr);
	CHECK(td != NULL);
	if (!td)
		return;

	plain_parent = vrdma_alloc_parent_domain(&ctx, &pattr);
	CHECK(plain_parent && plain_parent->handle == 0x77 &&
	      plain_parent->context == &ctx);
	/* a parent domain of a parent domain is not a thing */
	pattr.pd = plain_parent;
	CHECK(!vrdma_alloc_parent_domain(&ctx, &pattr) && errno == EINVAL);
	pattr.pd = &vpd.ibv_pd;
	pattr.td = td;
	pattr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			  IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	td_parent = vrdma_alloc_parent_domain(&ctx, &pattr);
	CHECK(td_parent && td_parent->handle == 0x77);
	if (!plain_parent || !td_parent)
		return;

	/* the PD and the TD stay while a parent domain uses them */
	CHECK(vrdma_dealloc_pd(&vpd.ibv_pd) == EBUSY);
	CHECK(vrdma_dealloc_td(td) == EBUSY);

	/* QPs: locked on a PD and a plain parent domain, not on a TD's */
	qattr.pd = &vpd.ibv_pd;
	qp = vrdma_create_qp_ex(&ctx, &qattr);
	CHECK(qp && to_vqp(qp)->sq.lock.need && to_vqp(qp)->rq.lock.need);
	if (qp)
		CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
	qattr.pd = plain_parent;
	qp = vrdma_create_qp_ex(&ctx, &qattr);
	CHECK(qp && to_vqp(qp)->sq.lock.need && to_vqp(qp)->rq.lock.need);
	if (qp)
		CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();
	qattr.pd = td_parent;
	qp = vrdma_create_qp_ex(&ctx, &qattr);
	CHECK(qp && !to_vqp(qp)->sq.lock.need && !to_vqp(qp)->rq.lock.need);
	if (qp) {
		struct ibv_recv_wr wr = { .wr_id = 1 };
		struct ibv_recv_wr *bad;

		/* unlocked paths still post */
		CHECK(vrdma_post_recv(qp, &wr, &bad) == 0);
		CHECK(vrdma_destroy_qp(qp) == 0);
	}
	reset_rings();

	/* CQs on a parent domain: it must be one; a TD's is unlocked */
	cattr.parent_domain = &vpd.ibv_pd;
	CHECK(!vrdma_create_cq_ex(&ctx, &cattr) && errno == EINVAL);
	cattr.parent_domain = plain_parent;
	cq = vrdma_create_cq_ex(&ctx, &cattr);
	CHECK(cq && ex_to_vcq(cq)->lock.need);
	if (cq)
		CHECK(vrdma_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	reset_rings();
	cattr.parent_domain = td_parent;
	cq = vrdma_create_cq_ex(&ctx, &cattr);
	CHECK(cq && !ex_to_vcq(cq)->lock.need);
	if (cq)
		CHECK(vrdma_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	reset_rings();
	cattr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	cattr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	cq = vrdma_create_cq_ex(&ctx, &cattr);
	CHECK(cq && !ex_to_vcq(cq)->lock.need);
	if (cq)
		CHECK(vrdma_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
	reset_rings();

	/* parent domains go without a kernel command, then PD and TD are free */
	CHECK(vrdma_dealloc_pd(td_parent) == 0);
	CHECK(vrdma_dealloc_pd(plain_parent) == 0);
	CHECK(atomic_load(&vpd.refs) == 0);
	CHECK(vrdma_dealloc_td(td) == 0);
	vpd.ibv_pd.handle = 0;
}

/*
 * Device memory: the mapping of the kernel's pages (here the memfd at
 * offset 0) is what ibv_memcpy_to_dm / _from_dm copy to and from, in 4-byte
 * units and inside the DM only.
 */
static void test_dm(void)
{
	struct ibv_alloc_dm_attr attr = { .length = 100 };
	uint8_t in[100], out[100];
	struct ibv_dm *dm;

	attr.comp_mask = 1;
	CHECK(!vrdma_alloc_dm(&ctx, &attr) && errno == EINVAL);
	attr.comp_mask = 0;
	dm = vrdma_alloc_dm(&ctx, &attr);
	CHECK(dm != NULL);
	if (!dm)
		return;
	memset(in, 0xab, sizeof(in));
	CHECK(ibv_memcpy_to_dm(dm, 4, in, 96) == 0);
	CHECK(dev[3] == 0 && dev[4] == 0xab && dev[99] == 0xab);
	dev[8] = 0x5c;
	CHECK(ibv_memcpy_from_dm(out, dm, 8, 4) == 0 && out[0] == 0x5c &&
	      out[3] == 0xab);
	/* unaligned offset or length, or beyond the DM's 100 bytes */
	CHECK(ibv_memcpy_to_dm(dm, 1, in, 4) == EINVAL);
	CHECK(ibv_memcpy_to_dm(dm, 0, in, 6) == EINVAL);
	CHECK(ibv_memcpy_to_dm(dm, 100, in, 4) == EINVAL);
	CHECK(ibv_memcpy_from_dm(out, dm, 0, 104) == EINVAL);
	CHECK(ibv_memcpy_from_dm(out, dm, UINT64_MAX - 3, 4) == EINVAL);
	CHECK(dev[100] == 0);
	CHECK(vrdma_free_dm(dm) == 0);
	reset_rings();
}

static void test_srq(void)
{
	struct ibv_srq_init_attr attr = { .attr = { .max_wr = 8,
						    .max_sge = 2 } };
	struct vrdma_ring_ctrl *sc = ctrl_at(STUB_SRQ_OFF);
	struct ibv_sge sge[3] = {};
	struct ibv_recv_wr wr = { .wr_id = 5, .sg_list = sge, .num_sge = 2 };
	struct ibv_recv_wr *bad;
	struct ibv_srq_attr mod = { .max_wr = 16, .srq_limit = 2 };
	struct ibv_srq *srq = vrdma_create_srq(&vpd.ibv_pd, &attr);
	struct ibv_qp *qp;
	struct vrdma_recv_wqe *w;

	CHECK(srq != NULL);
	if (!srq)
		return;
	CHECK(vrdma_post_srq_recv(srq, &wr, &bad) == 0);
	CHECK(le32toh(sc->producer) == 1);
	w = entry_at(STUB_SRQ_OFF, 0, STUB_RQ_SHIFT);
	CHECK(le64toh(w->wr_id) == 5 && le32toh(w->num_sge) == 2);
	wr.num_sge = 3;
	CHECK(vrdma_post_srq_recv(srq, &wr, &bad) == EINVAL && bad == &wr);

	CHECK(vrdma_modify_srq(srq, &mod, IBV_SRQ_LIMIT) == 0);

	/*
	 * resize: the device copied the posted WQE to slot 0 of the new ring
	 * and set its producer to 1; posting continues there.
	 */
	{
		struct vrdma_ring_ctrl *nc = ctrl_at(STUB_CQ2_OFF);

		nc->producer = htole32(1);
		nc->consumer = 0;
		CHECK(vrdma_modify_srq(srq, &mod, IBV_SRQ_MAX_WR) == 0);
		CHECK(to_vsrq(srq)->rq.ring.depth == 2 * STUB_DEPTH);
		wr.num_sge = 2;
		wr.wr_id = 6;
		CHECK(vrdma_post_srq_recv(srq, &wr, &bad) == 0);
		CHECK(le32toh(nc->producer) == 2);
		CHECK(le32toh(sc->producer) == 1);
		w = entry_at(STUB_CQ2_OFF, 1, STUB_RQ_SHIFT);
		CHECK(le64toh(w->wr_id) == 6 && le32toh(w->num_sge) == 2);
	}

	/* a QP on the SRQ has no RQ: post_recv on it is EINVAL */
	qp = make_qp(IBV_QPT_RC, 0, srq);
	CHECK(qp != NULL);
	if (qp) {
		wr.num_sge = 1;
		CHECK(vrdma_post_recv(qp, &wr, &bad) == EINVAL);
		CHECK(vrdma_destroy_qp(qp) == 0);
	}
	CHECK(doorbells() == 0);
	CHECK(vrdma_destroy_srq(srq) == 0);
	reset_rings();
}

/*
 * XRC (§13.7): an XRC_SEND QP has only an SQ and puts the remote SRQ number
 * in every WQE (both posting APIs); an XRC_RECV QP has no rings at all; an
 * XRC SRQ answers ibv_get_srq_num.
 */
static void test_xrc(void)
{
	struct ibv_xrcd_init_attr xattr = { .comp_mask = IBV_XRCD_INIT_ATTR_FD,
					    .fd = -1 };
	struct ibv_xrcd *xrcd = vrdma_open_xrcd(&ctx, &xattr);
	struct ibv_srq_init_attr_ex sattr = {
		.attr = { .max_wr = 8, .max_sge = 2 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
			     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC,
		.pd = &vpd.ibv_pd,
		.xrcd = xrcd,
		.cq = (struct ibv_cq *)1,
	};
	struct ibv_qp_init_attr_ex rattr = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD,
		.xrcd = xrcd,
	};
	struct ibv_qp_open_attr oattr = {
		.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
			     IBV_QP_OPEN_ATTR_TYPE,
		.qp_num = 99,
		.xrcd = xrcd,
		.qp_type = IBV_QPT_XRC_RECV,
	};
	struct vrdma_ring_ctrl *sq = ctrl_at(STUB_SQ_OFF);
	struct ibv_sge sge = { .addr = 0x100, .length = 8, .lkey = 1 };
	struct ibv_send_wr wr = { .wr_id = 1, .opcode = IBV_WR_SEND,
				  .sg_list = &sge, .num_sge = 1 };
	struct ibv_send_wr *bad;
	struct vrdma_send_wqe *w;
	struct ibv_qp *qp, *tgt, *opened;
	struct ibv_qp_ex *qpx;
	struct ibv_srq *srq;
	uint32_t num = 0;

	CHECK(xrcd != NULL);
	srq = vrdma_create_srq_ex(&ctx, &sattr);
	CHECK(srq != NULL);
	if (srq) {
		CHECK(vrdma_get_srq_num(srq, &num) == 0 &&
		      num == STUB_XRC_SRQN);
		CHECK(vrdma_destroy_srq(srq) == 0);
	}
	/* An XRC SRQ without its CQ is refused before the kernel sees it. */
	sattr.comp_mask &= ~IBV_SRQ_INIT_ATTR_CQ;
	CHECK(vrdma_create_srq_ex(&ctx, &sattr) == NULL && errno == EINVAL);

	qp = make_qp(IBV_QPT_XRC_SEND, IBV_QP_EX_WITH_SEND, NULL);
	CHECK(qp != NULL);
	if (!qp)
		return;
	CHECK(to_vqp(qp)->rq.ring.map == NULL);
	wr.qp_type.xrc.remote_srqn = 0xabcdef;
	CHECK(vrdma_post_send(qp, &wr, &bad) == 0);
	w = entry_at(STUB_SQ_OFF, 0, STUB_SQ_SHIFT);
	CHECK(le32toh(w->xrc_srqn) == 0xabcdef && w->opcode == VRDMA_WR_SEND);
	/* no XRC opcode for ATOMIC WRITE / FLUSH / BIND_MW */
	wr.opcode = IBV_WR_BIND_MW;
	CHECK(vrdma_post_send(qp, &wr, &bad) == EINVAL);
	qpx = ibv_qp_to_qp_ex(qp);
	CHECK(qpx && qpx->wr_set_xrc_srqn);
	if (qpx) {
		ibv_wr_start(qpx);
		qpx->wr_id = 2;
		ibv_wr_send(qpx);
		ibv_wr_set_xrc_srqn(qpx, 77);
		ibv_wr_set_sge(qpx, 1, 0x200, 4);
		CHECK(ibv_wr_complete(qpx) == 0);
		w = entry_at(STUB_SQ_OFF, 1, STUB_SQ_SHIFT);
		CHECK(le64toh(w->wr_id) == 2 && le32toh(w->xrc_srqn) == 77);
	}
	CHECK(le32toh(sq->producer) == 2 && doorbells() == 2);
	CHECK(vrdma_destroy_qp(qp) == 0);
	reset_rings();

	/* The target: nothing mapped, nothing to post. */
	tgt = vrdma_create_qp_ex(&ctx, &rattr);
	CHECK(tgt != NULL);
	if (tgt) {
		wr.opcode = IBV_WR_SEND;
		CHECK(to_vqp(tgt)->sq.ring.map == NULL);
		CHECK(vrdma_post_send(tgt, &wr, &bad) == EINVAL && bad == &wr);
		CHECK(vrdma_destroy_qp(tgt) == 0);
	}
	rattr.comp_mask = 0;
	CHECK(vrdma_create_qp_ex(&ctx, &rattr) == NULL);
	opened = vrdma_open_qp(&ctx, &oattr);
	CHECK(opened != NULL && opened->qp_num == 99);
	if (opened)
		CHECK(vrdma_destroy_qp(opened) == 0);
	CHECK(doorbells() == 0);
	if (xrcd)
		CHECK(vrdma_close_xrcd(xrcd) == 0);
	reset_rings();
}

static void test_ring_init_rejects(void)
{
	struct vrdma_ring r;
	static uint8_t buf[2 * VRDMA_PAGE_SIZE];

	CHECK(vrdma_ring_init(&r, buf, sizeof(buf), 6, 6, 6) != 0);
	CHECK(vrdma_ring_init(&r, buf, sizeof(buf), 64, 7, 6) != 0);
	CHECK(vrdma_ring_init(&r, buf, sizeof(buf), 64, 5, 6) != 0);
	CHECK(vrdma_ring_init(&r, buf, sizeof(buf), 1, 13, 6) != 0);
	CHECK(vrdma_ring_init(&r, buf, sizeof(buf), 64, 6, 6) == 0);
	CHECK(vrdma_wc_status(200) == IBV_WC_GENERAL_ERR);
	CHECK(vrdma_wc_status(VRDMA_WC_RNR_RETRY_EXC_ERR) ==
	      IBV_WC_RNR_RETRY_EXC_ERR);
}

/*
 * Index wrap-around and cross-thread ordering: a "device" thread produces
 * CQEs with a release store of producer starting near 2^32, the provider
 * polls them; every CQE must arrive once, in order, intact.
 */
#define STRESS_N 200000

static void *device_thread(void *arg)
{
	struct vrdma_ring_ctrl *cc = ctrl_at(STUB_CQ_OFF);
	uint32_t base = 0xfffffff0u, i;

	for (i = 0; i < STRESS_N; i++) {
		uint32_t idx = base + i;
		struct vrdma_cqe *c;

		while (idx - vrdma_load_acquire(&cc->consumer) >= STUB_DEPTH)
			;
		c = entry_at(STUB_CQ_OFF, idx, VRDMA_CQE_SHIFT);
		c->wr_id = htole64(i);
		c->byte_len = htole32(i ^ 0x5a5a5a5a);
		c->status = 0;
		vrdma_store_release(&cc->producer, idx + 1);
	}
	return NULL;
}

static void test_stress(void)
{
	struct vrdma_ring_ctrl *cc = ctrl_at(STUB_CQ_OFF);
	struct ibv_cq *cq;
	struct ibv_wc wc[3];
	pthread_t th;
	uint32_t next = 0;
	int n, i, bad = 0;

	cc->producer = htole32(0xfffffff0u);
	cc->consumer = htole32(0xfffffff0u);
	cq = vrdma_create_cq(&ctx, 8, NULL, 0);
	CHECK(cq != NULL);
	if (!cq)
		return;
	pthread_create(&th, NULL, device_thread, NULL);
	while (next < STRESS_N) {
		n = vrdma_poll_cq(cq, 3, wc);
		for (i = 0; i < n; i++, next++)
			if (wc[i].wr_id != next ||
			    wc[i].byte_len != (next ^ 0x5a5a5a5a))
				bad++;
	}
	pthread_join(th, NULL);
	CHECK(bad == 0);
	CHECK(le32toh(cc->consumer) == 0xfffffff0u + STRESS_N);
	CHECK(vrdma_destroy_cq(cq) == 0);
	reset_rings();
}

int main(void)
{
	setup();
	test_registration();
	test_ring_init_rejects();
	test_qp_create_rejects();
	test_post_send();
	test_memory_windows();
	test_post_recv();
	test_ud();
	test_wr_api();
	test_wr_atomic_write_flush();
	test_cq();
	test_cq_clean();
	test_cq_ex();
	test_parent_domain();
	test_dm();
	test_srq();
	test_xrc();
	test_stress();

	if (failures) {
		fprintf(stderr, "provider_test: %d check(s) FAILED\n",
			failures);
		return 1;
	}
	printf("provider_test: all checks passed\n");
	return 0;
}

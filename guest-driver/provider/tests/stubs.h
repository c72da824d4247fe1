/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
#ifndef VRDMA_TEST_STUBS_H
#define VRDMA_TEST_STUBS_H

#define STUB_QP_HANDLE	0x55
#define STUB_QPN	17
#define STUB_DEPTH	8
#define STUB_SQ_SHIFT	7	/* 128-byte slots: header + 4 SGEs or 64 B */
#define STUB_RQ_SHIFT	6	/* 64-byte slots: header + 3 SGEs */
#define STUB_RING_SIZE	8192
#define STUB_SQ_OFF	0
#define STUB_RQ_OFF	8192
#define STUB_CQ_OFF	16384
#define STUB_SRQ_OFF	24576
#define STUB_CQ2_OFF	32768
#define STUB_FILE_SIZE	65536
#define STUB_DB_OFF	(1 << 20)	/* doorbell writes land here */
#define STUB_XRC_SRQN	0x1234

struct stub_state {
	int modify_calls;
	int modify_ex_calls;
	int modify_ret;
	const void *registered;
};

extern struct stub_state stub;
extern struct ibv_modify_cq_attr stub_modify_cq_attr;

#endif

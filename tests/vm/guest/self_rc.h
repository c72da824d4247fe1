/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * Shared by the guest C helpers of the VM scenarios (built on the host by
 * build_guest_c() in tests/vm/scenarios/async_events.py, which finds this
 * header next to the .c file): failing loudly, opening a device by name,
 * and an RC QP connected to itself through a RoCEv2 GID, so one guest can
 * exercise a verb alone.
 */
#ifndef VRDMA_TEST_SELF_RC_H
#define VRDMA_TEST_SELF_RC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

/* Print @what with errno and exit 2: the scenario reads 2 as "setup broke". */
static inline void die(const char *what)
{
	perror(what);
	exit(2);
}

/* The opened device named @name (exits through die() if there is none). */
static inline struct ibv_context *open_device_named(const char *name)
{
	struct ibv_context *c = NULL;
	struct ibv_device **l;
	int i, n;

	l = ibv_get_device_list(&n);
	for (i = 0; l && i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), name))
			c = ibv_open_device(l[i]);
	/* An opened context outlives the list (ibv_get_device_list(3)). */
	if (l)
		ibv_free_device_list(l);
	if (!c)
		die("open_device");
	return c;
}

/*
 * Take @qp (RC, on port 1 of @ctx) through INIT, RTR and RTS with itself as
 * the destination, addressed by GID index @gidx; local and remote write
 * allowed, PSNs 0, 1024-byte MTU, IBTA default retry counts.
 */
static inline void connect_self(struct ibv_context *ctx, struct ibv_qp *qp,
				int gidx)
{
	struct ibv_qp_attr a = {};
	union ibv_gid gid;

	if (ibv_query_gid(ctx, 1, gidx, &gid))
		die("query_gid");
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			  IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify RTS");
}

#endif

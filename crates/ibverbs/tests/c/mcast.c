/* UD multicast through the verbs: ibv_attach_mcast / ibv_detach_mcast.
 * Run by tests/mcast.rs, which starts two receiver processes on the same
 * device address and then senders, and steps them by lines on stdin/out.
 *
 *   mcast recv     attach 3 UD QPs (Q_Key 0x11111111) and one with Q_Key
 *                  0x22222222 to 230.1.2.3; "ready"; expect 3 datagrams on
 *                  each of the 3 and only the 4th datagram on the odd one;
 *                  detach QP 0; "detached"; expect 1 more datagram on QPs
 *                  1 and 2 and none on QP 0; "done".
 *   mcast send P   phase 1: 3 datagrams with Q_Key 0x11111111, then one
 *                  with 0x22222222; phase 2: one more; all to QPN 0xFFFFFF.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define LEN 64
#define GOOD 0x11111111u
#define ODD 0x22222222u
#define NQ 4 /* 3 good + 1 odd */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid group;

static void payload(uint8_t *p, int seq)
{
	for (int i = 0; i < LEN; i++)
		p[i] = (uint8_t)(seq * 31 + i);
}

static struct ibv_qp *ud_qp(struct ibv_cq *cq, uint32_t qkey)
{
	struct ibv_qp_init_attr ia = {0};
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = 8;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "create_qp");
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = qkey;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_QKEY),
	      "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	return qp;
}

/* Poll one completion (spinning: the test bounds the time). */
static struct ibv_wc wait1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int r;
	while ((r = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	CHECK(r == 1, "poll_cq");
	CHECK(wc.status == IBV_WC_SUCCESS, "completion %s",
	      ibv_wc_status_str(wc.status));
	return wc;
}

static int empty(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	return ibv_poll_cq(cq, 1, &wc) == 0;
}

static void expect(struct ibv_cq *cq, uint8_t *buf, int seq)
{
	struct ibv_wc wc = wait1(cq);
	CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == 40 + LEN &&
		      (wc.wc_flags & IBV_WC_GRH),
	      "receive completion: opcode %d len %u flags %#x", wc.opcode,
	      wc.byte_len, wc.wc_flags);
	uint8_t *p = buf + wc.wr_id * (40 + LEN);
	/* Over IPv4 the 40 bytes hold the IPv4 header in their last 20 (as
	 * on rxe): its destination is the group. */
	CHECK(!memcmp(p + 36, group.raw + 12, 4),
	      "the header's destination is not the group");
	uint8_t want[LEN];
	payload(want, seq);
	CHECK(!memcmp(p + 40, want, LEN), "datagram %d's bytes differ", seq);
}

static void recv_one(struct ibv_qp *qp, struct ibv_mr *mr, uint8_t *buf,
		     uint64_t slot)
{
	struct ibv_sge s = {(uintptr_t)(buf + slot * (40 + LEN)), 40 + LEN,
			    mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &s, .num_sge = 1},
			   *bad;
	CHECK(!ibv_post_recv(qp, &wr, &bad), "post_recv");
}

static void line(const char *want)
{
	char got[64];
	CHECK(fgets(got, sizeof(got), stdin) && !strncmp(got, want, strlen(want)),
	      "expected '%s' on stdin", want);
}

static int receiver(void)
{
	struct ibv_device_attr da;
	CHECK(!ibv_query_device(ctx, &da), "query_device");
	CHECK(da.max_mcast_grp > 0 && da.max_mcast_qp_attach >= NQ &&
		      da.max_total_mcast_qp_attach >= da.max_mcast_grp,
	      "multicast limits %d %d %d", da.max_mcast_grp,
	      da.max_mcast_qp_attach, da.max_total_mcast_qp_attach);
	static uint8_t buf[NQ * 8 * (40 + LEN)];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_cq *cq[NQ];
	struct ibv_qp *qp[NQ];
	for (int q = 0; q < NQ; q++) {
		cq[q] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
		CHECK(cq[q], "create_cq");
		qp[q] = ud_qp(cq[q], q < 3 ? GOOD : ODD);
		for (int k = 0; k < 8; k++)
			recv_one(qp[q], mr, buf, q * 8 + k);
		CHECK(!ibv_attach_mcast(qp[q], &group, 0), "attach_mcast");
	}
	/* Attaching twice is a no-op (as on rxe). */
	CHECK(!ibv_attach_mcast(qp[0], &group, 0), "second attach");
	/* Misuse. */
	union ibv_gid uni = {0};
	uni.raw[10] = uni.raw[11] = 0xff;
	uni.raw[12] = 127;
	uni.raw[15] = 1;
	CHECK(ibv_attach_mcast(qp[0], &uni, 0) == EINVAL,
	      "attach to a unicast GID");
	struct ibv_qp_init_attr ia = {0};
	ia.send_cq = ia.recv_cq = cq[0];
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	struct ibv_qp *rc = ibv_create_qp(pd, &ia);
	CHECK(rc, "create rc");
	CHECK(ibv_attach_mcast(rc, &group, 0) == EINVAL, "attach an RC QP");
	CHECK(ibv_detach_mcast(rc, &group, 0) == EINVAL,
	      "detach a QP never attached");
	CHECK(!ibv_destroy_qp(rc), "destroy rc");
	say("ready");

	for (int seq = 0; seq < 3; seq++)
		for (int q = 0; q < 3; q++)
			expect(cq[q], buf, seq);
	expect(cq[3], buf, 3);
	/* Everything sent before the odd QP's datagram has been delivered. */
	for (int q = 0; q < 3; q++)
		CHECK(empty(cq[q]), "QP %d got a datagram with another Q_Key", q);
	CHECK(empty(cq[3]), "the odd QP got more than its datagram");

	CHECK(!ibv_detach_mcast(qp[0], &group, 0), "detach_mcast");
	CHECK(ibv_detach_mcast(qp[0], &group, 0) == EINVAL, "second detach");
	say("detached");
	for (int q = 1; q < 3; q++)
		expect(cq[q], buf, 4);
	CHECK(empty(cq[0]), "a detached QP got a datagram");
	/* Destroying attached QPs detaches them. */
	for (int q = 0; q < NQ; q++) {
		CHECK(!ibv_destroy_qp(qp[q]), "destroy_qp");
		CHECK(!ibv_destroy_cq(cq[q]), "destroy_cq");
	}
	CHECK(!ibv_dereg_mr(mr), "dereg");
	say("done");
	return 0;
}

static void send_one(struct ibv_qp *qp, struct ibv_ah *ah, struct ibv_mr *mr,
		     uint8_t *buf, struct ibv_cq *cq, int seq, uint32_t qkey)
{
	payload(buf, seq);
	struct ibv_sge s = {(uintptr_t)buf, LEN, mr->lkey};
	struct ibv_send_wr wr = {.wr_id = seq,
				 .sg_list = &s,
				 .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xffffff;
	wr.wr.ud.remote_qkey = qkey;
	CHECK(!ibv_post_send(qp, &wr, &bad), "post_send");
	wait1(cq);
}

static int sender(int phase)
{
	static uint8_t buf[LEN];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "create_cq");
	struct ibv_qp *qp = ud_qp(cq, GOOD);
	struct ibv_ah_attr aa = {0};
	aa.is_global = 1;
	aa.grh.dgid = group;
	aa.grh.hop_limit = 1;
	aa.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "create_ah");
	if (phase == 1) {
		for (int seq = 0; seq < 3; seq++)
			send_one(qp, ah, mr, buf, cq, seq, GOOD);
		send_one(qp, ah, mr, buf, cq, 3, ODD);
	} else {
		send_one(qp, ah, mr, buf, cq, 4, GOOD);
	}
	say("sent");
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc >= 2, "usage: mcast recv | mcast send PHASE");
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	group.raw[10] = group.raw[11] = 0xff;
	inet_pton(AF_INET, "230.1.2.3", &group.raw[12]);
	if (!strcmp(argv[1], "recv"))
		return receiver();
	CHECK(argc == 3, "send needs a phase");
	return sender(atoi(argv[2]));
}

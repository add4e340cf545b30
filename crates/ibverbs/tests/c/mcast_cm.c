/* Multicast through rdma_cm: rdma_join_multicast / rdma_join_multicast_ex /
 * rdma_leave_multicast. Run by tests/mcast.rs (two receiver processes and
 * senders on 127.0.0.1, stepped by lines on stdin/stdout).
 *
 *   mcast_cm recv    two UD IDs join 230.1.2.6 (one with
 *                    rdma_join_multicast, one with _ex, FULLMEMBER); check
 *                    MULTICAST_JOIN's parameters; "ready"; one datagram on
 *                    each, exact; ID 0 leaves; "left"; one more datagram on
 *                    ID 1 and none on ID 0; "done".
 *   mcast_cm send N  joins send-only, sends datagram N-1 with the address
 *                    handle, QPN and Q_Key of its MULTICAST_JOIN; "sent".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define LEN 48
#define GROUP "230.1.2.6"

struct node {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t buf[40 + LEN];
	struct ibv_ah_attr ah_attr;
	uint32_t qpn, qkey;
};

static struct rdma_event_channel *ch;
static struct sockaddr_in group, local;

static struct rdma_cm_event *next(enum rdma_cm_event_type want,
				  struct rdma_cm_id *id)
{
	struct rdma_cm_event *ev;
	CHECK(!rdma_get_cm_event(ch, &ev), "get_cm_event");
	CHECK(ev->event == want && ev->id == id && ev->status == 0,
	      "event %s status %d, wanted %s", rdma_event_str(ev->event),
	      ev->status, rdma_event_str(want));
	return ev;
}

static void payload(uint8_t *p, int seq)
{
	for (int i = 0; i < LEN; i++)
		p[i] = (uint8_t)(seq * 17 + i * 3);
}

static void setup(struct node *n)
{
	CHECK(!rdma_create_id(ch, &n->id, n, RDMA_PS_UDP), "create_id");
	CHECK(!rdma_resolve_addr(n->id, (struct sockaddr *)&local,
				 (struct sockaddr *)&group, 2000),
	      "resolve_addr");
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ADDR_RESOLVED, n->id));
	n->pd = ibv_alloc_pd(n->id->verbs);
	n->cq = ibv_create_cq(n->id->verbs, 8, NULL, NULL, 0);
	CHECK(n->pd && n->cq, "pd/cq");
	struct ibv_qp_init_attr ia = {0};
	ia.send_cq = ia.recv_cq = n->cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	CHECK(!rdma_create_qp(n->id, n->pd, &ia), "create_qp");
	n->mr = ibv_reg_mr(n->pd, n->buf, sizeof(n->buf),
			   IBV_ACCESS_LOCAL_WRITE);
	CHECK(n->mr, "reg_mr");
}

/* The join's event: checked, and its address handle kept. */
static void joined(struct node *n, void *context)
{
	struct rdma_cm_event *ev = next(RDMA_CM_EVENT_MULTICAST_JOIN, n->id);
	struct rdma_ud_param *u = &ev->param.ud;
	uint8_t mgid[16] = {0};
	mgid[10] = mgid[11] = 0xff;
	memcpy(&mgid[12], &group.sin_addr, 4);
	CHECK(u->qp_num == 0xffffff && u->qkey == RDMA_UDP_QKEY &&
		      u->private_data == context && u->ah_attr.is_global &&
		      !memcmp(u->ah_attr.grh.dgid.raw, mgid, 16),
	      "MULTICAST_JOIN: qpn %#x qkey %#x context %p global %d",
	      u->qp_num, u->qkey, u->private_data, u->ah_attr.is_global);
	n->ah_attr = u->ah_attr;
	n->qpn = u->qp_num;
	n->qkey = u->qkey;
	rdma_ack_cm_event(ev);
}

static void post_recv(struct node *n)
{
	struct ibv_sge s = {(uintptr_t)n->buf, sizeof(n->buf), n->mr->lkey};
	struct ibv_recv_wr wr = {.sg_list = &s, .num_sge = 1}, *bad;
	CHECK(!ibv_post_recv(n->id->qp, &wr, &bad), "post_recv");
}

static void expect(struct node *n, int seq)
{
	struct ibv_wc wc;
	int r;
	while ((r = ibv_poll_cq(n->cq, 1, &wc)) == 0)
		;
	CHECK(r == 1 && wc.status == IBV_WC_SUCCESS &&
		      wc.byte_len == 40 + LEN,
	      "receive: %d %s len %u", r, ibv_wc_status_str(wc.status),
	      wc.byte_len);
	uint8_t want[LEN];
	payload(want, seq);
	CHECK(!memcmp(n->buf + 40, want, LEN), "datagram %d's bytes differ",
	      seq);
}

static int receiver(void)
{
	static struct node n[2];
	for (int k = 0; k < 2; k++) {
		setup(&n[k]);
		post_recv(&n[k]);
	}
	CHECK(!rdma_join_multicast(n[0].id, (struct sockaddr *)&group,
				   (void *)0x5150),
	      "join_multicast");
	joined(&n[0], (void *)0x5150);
	struct rdma_cm_join_mc_attr_ex a = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS |
			     RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER,
		.addr = (struct sockaddr *)&group};
	CHECK(!rdma_join_multicast_ex(n[1].id, &a, (void *)0x6160),
	      "join_multicast_ex");
	joined(&n[1], (void *)0x6160);

	/* Misuse. */
	struct sockaddr_in other = group;
	inet_pton(AF_INET, "230.9.9.9", &other.sin_addr);
	errno = 0;
	CHECK(rdma_leave_multicast(n[0].id, (struct sockaddr *)&other) == -1 &&
		      errno == EADDRNOTAVAIL,
	      "leave a group never joined");
	a.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
	errno = 0;
	CHECK(rdma_join_multicast_ex(n[1].id, &a, NULL) == -1 &&
		      errno == EINVAL,
	      "join_ex with reserved flags");
	a.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
	a.comp_mask |= RDMA_CM_JOIN_MC_ATTR_RESERVED;
	errno = 0;
	CHECK(rdma_join_multicast_ex(n[1].id, &a, NULL) == -1 &&
		      errno == EOPNOTSUPP,
	      "join_ex with a reserved comp_mask bit");
	errno = 0;
	CHECK(rdma_join_multicast(n[1].id, (struct sockaddr *)&local, NULL) ==
			      -1 &&
		      errno == EINVAL,
	      "join a unicast address");
	say("ready");

	for (int k = 0; k < 2; k++)
		expect(&n[k], 0);
	post_recv(&n[0]);
	post_recv(&n[1]);
	CHECK(!rdma_leave_multicast(n[0].id, (struct sockaddr *)&group),
	      "leave_multicast");
	errno = 0;
	CHECK(rdma_leave_multicast(n[0].id, (struct sockaddr *)&group) == -1 &&
		      errno == EADDRNOTAVAIL,
	      "second leave");
	say("left");
	expect(&n[1], 1);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(n[0].cq, 1, &wc) == 0,
	      "an ID that left its group still got its datagram");
	CHECK(!rdma_leave_multicast(n[1].id, (struct sockaddr *)&group),
	      "leave_multicast");
	for (int k = 0; k < 2; k++) {
		rdma_destroy_qp(n[k].id);
		CHECK(!ibv_dereg_mr(n[k].mr), "dereg");
		CHECK(!ibv_destroy_cq(n[k].cq), "destroy_cq");
		CHECK(!rdma_destroy_id(n[k].id), "destroy_id");
		CHECK(!ibv_dealloc_pd(n[k].pd), "dealloc_pd");
	}
	say("done");
	return 0;
}

static int sender(int seq)
{
	static struct node n;
	setup(&n);
	struct rdma_cm_join_mc_attr_ex a = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS |
			     RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
		.addr = (struct sockaddr *)&group};
	CHECK(!rdma_join_multicast_ex(n.id, &a, NULL), "join send-only");
	joined(&n, NULL);
	struct ibv_ah *ah = ibv_create_ah(n.pd, &n.ah_attr);
	CHECK(ah, "create_ah");
	payload(n.buf, seq);
	struct ibv_sge s = {(uintptr_t)n.buf, LEN, n.mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &s,
				 .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = n.qpn;
	wr.wr.ud.remote_qkey = n.qkey;
	CHECK(!ibv_post_send(n.id->qp, &wr, &bad), "post_send");
	struct ibv_wc wc;
	int r;
	while ((r = ibv_poll_cq(n.cq, 1, &wc)) == 0)
		;
	CHECK(r == 1 && wc.status == IBV_WC_SUCCESS, "send completion");
	CHECK(!rdma_leave_multicast(n.id, (struct sockaddr *)&group), "leave");
	CHECK(!ibv_destroy_ah(ah), "destroy_ah");
	rdma_destroy_qp(n.id);
	say("sent");
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc >= 2, "usage: mcast_cm recv | mcast_cm send N");
	ch = rdma_create_event_channel();
	CHECK(ch, "create_event_channel");
	group.sin_family = local.sin_family = AF_INET;
	inet_pton(AF_INET, GROUP, &group.sin_addr);
	inet_pton(AF_INET, "127.0.0.1", &local.sin_addr);
	if (!strcmp(argv[1], "recv"))
		return receiver();
	CHECK(argc == 3, "send needs N");
	return sender(atoi(argv[2]) - 1);
}

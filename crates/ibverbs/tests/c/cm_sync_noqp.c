/* A synchronous rdma_cm client (rdma_create_id with no event channel) that
 * connects an ID without a QP, as librdmacm allows: rdma_connect returns 0
 * with CONNECT_RESPONSE in id->event, the application moves its own QP
 * (rdma_init_qp_attr) and calls rdma_establish. Run by tests/rdmacm.rs.
 *
 *   cm_sync_noqp server PORT   listens on 127.0.0.1:PORT (an event
 *                              channel), accepts one connection with an ID
 *                              QP; "listening", "established",
 *                              "disconnected".
 *   cm_sync_noqp client PORT   the synchronous client; "connected".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static struct sockaddr_in addr(int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	return a;
}

static struct rdma_cm_event *next(struct rdma_event_channel *ch,
				  enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	CHECK(!rdma_get_cm_event(ch, &ev), "get_cm_event");
	CHECK(ev->event == want && ev->status == 0,
	      "event %s status %d, wanted %s", rdma_event_str(ev->event),
	      ev->status, rdma_event_str(want));
	return ev;
}

static void server(int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid, *cid;
	struct sockaddr_in a = addr(port);
	struct ibv_qp_init_attr qa;
	struct rdma_cm_event *ev;
	CHECK(ch, "create_event_channel");
	CHECK(!rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP), "create_id");
	CHECK(!rdma_bind_addr(lid, (struct sockaddr *)&a), "bind");
	CHECK(!rdma_listen(lid, 4), "listen");
	say("listening");
	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	cid = ev->id;
	CHECK(!rdma_ack_cm_event(ev), "ack");
	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	CHECK(!rdma_create_qp(cid, NULL, &qa), "create_qp");
	CHECK(!rdma_accept(cid, NULL), "accept");
	CHECK(!rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED)), "ack");
	say("established");
	CHECK(!rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_DISCONNECTED)), "ack");
	say("disconnected");
	rdma_disconnect(cid);
	rdma_destroy_qp(cid);
	CHECK(!rdma_destroy_id(cid), "destroy_id");
	CHECK(!rdma_destroy_id(lid), "destroy_id");
	rdma_destroy_event_channel(ch);
}

static void move(struct rdma_cm_id *id, struct ibv_qp *qp,
		 enum ibv_qp_state s)
{
	struct ibv_qp_attr qa;
	int mask;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = s;
	CHECK(!rdma_init_qp_attr(id, &qa, &mask), "init_qp_attr %d", s);
	/* The kernel's cm_init_qp_rtr_attr: an RC responder's RNR NAK timer
	 * is code 0 (655.36 ms), so a sender that finds no receive posted
	 * waits that long per RNR retry, as against rxe and every RNIC. */
	if (s == IBV_QPS_RTR)
		CHECK((mask & IBV_QP_MIN_RNR_TIMER) && qa.min_rnr_timer == 0,
		      "RTR attributes: mask %#x, min_rnr_timer %u (the kernel's rdma_cm gives 0)",
		      mask, qa.min_rnr_timer);
	CHECK(!ibv_modify_qp(qp, &qa, mask), "modify_qp to %d", s);
}

static void client(int port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in a = addr(port);
	struct rdma_conn_param p;
	struct ibv_qp_init_attr qa;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int ret;
	CHECK(!rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP), "create_id");
	CHECK(!rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000),
	      "resolve_addr");
	CHECK(!rdma_resolve_route(id, 2000), "resolve_route");
	CHECK(id->verbs, "no verbs context after resolve_route");
	pd = ibv_alloc_pd(id->verbs);
	cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	CHECK(pd && cq, "pd, cq");
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &qa);
	CHECK(qp, "create_qp");
	memset(&p, 0, sizeof(p));
	p.qp_num = qp->qp_num;
	p.responder_resources = p.initiator_depth = 1;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	ret = rdma_connect(id, &p);
	CHECK(ret == 0, "rdma_connect of an ID without a QP returned %d", ret);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_CONNECT_RESPONSE,
	      "id->event %s, wanted CONNECT_RESPONSE",
	      id->event ? rdma_event_str(id->event->event) : "NULL");
	move(id, qp, IBV_QPS_INIT);
	move(id, qp, IBV_QPS_RTR);
	move(id, qp, IBV_QPS_RTS);
	CHECK(!rdma_establish(id), "establish");
	say("connected");
	CHECK(!rdma_disconnect(id), "disconnect");
	CHECK(!ibv_destroy_qp(qp), "destroy_qp");
	CHECK(!ibv_destroy_cq(cq), "destroy_cq");
	CHECK(!ibv_dealloc_pd(pd), "dealloc_pd");
	CHECK(!rdma_destroy_id(id), "destroy_id");
}

int main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: cm_sync_noqp server|client PORT");
	if (!strcmp(argv[1], "server"))
		server(atoi(argv[2]));
	else
		client(atoi(argv[2]));
	return 0;
}

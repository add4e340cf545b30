/* ibv_import_device / ibv_import_pd / ibv_import_mr on softrdma: a context
 * imported from a dup of cmd_fd shares the original's objects; a QP of the
 * imported context receives an RDMA WRITE and a SEND through the imported
 * region's keys; errors name bad handles and foreign descriptors; a
 * cmd_fd passed to another process (exec'd with it) fails with EOPNOTSUPP.
 * Run by tests/import.rs. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define N 4096

static void to_rts(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS),
	      "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER),
	      "RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC),
	      "RTS");
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {0};
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "create_qp");
	return qp;
}

static void poll_n(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc;
	while (n > 0) {
		int r = ibv_poll_cq(cq, 1, &wc);
		CHECK(r >= 0, "poll_cq");
		if (r == 0)
			continue;
		CHECK(wc.status == IBV_WC_SUCCESS, "completion %s",
		      ibv_wc_status_str(wc.status));
		n--;
	}
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "child")) {
		int fd = atoi(argv[2]);
		errno = 0;
		struct ibv_context *c = ibv_import_device(fd);
		CHECK(!c && errno == EOPNOTSUPP,
		      "import of another process's cmd_fd gave %p", (void *)c);
		printf("child: EOPNOTSUPP\n");
		return 0;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	static uint8_t buf[N], src[N];
	for (int i = 0; i < N; i++)
		src[i] = (uint8_t)(i * 7 + 3);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, N,
				       IBV_ACCESS_LOCAL_WRITE |
					       IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_mr *smr = ibv_reg_mr(pd, src, N, IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr, "reg_mr src");

	int fd = dup(ctx->cmd_fd);
	CHECK(fd >= 0, "dup");
	struct ibv_context *ictx = ibv_import_device(fd);
	CHECK(ictx && ictx != ctx && ictx->cmd_fd == fd, "import_device");
	CHECK(ictx->device == ctx->device, "imported context's device");
	struct ibv_pd *ipd = ibv_import_pd(ictx, pd->handle);
	CHECK(ipd && ipd != pd && ipd->handle == pd->handle &&
		      ipd->context == ictx,
	      "import_pd");
	struct ibv_mr *imr = ibv_import_mr(ipd, mr->handle);
	CHECK(imr && imr->lkey == mr->lkey && imr->rkey == mr->rkey &&
		      imr->length == N && imr->addr == NULL &&
		      imr->pd == ipd && imr->context == ictx &&
		      imr->handle == mr->handle,
	      "import_mr");

	/* Misuse. */
	errno = 0;
	CHECK(!ibv_import_pd(ictx, pd->handle + 1000) && errno == EINVAL,
	      "import_pd of an unknown handle");
	errno = 0;
	CHECK(!ibv_import_mr(ipd, mr->handle ^ 0x5a5a5a) && errno == EINVAL,
	      "import_mr of an unknown handle");
	CHECK(ibv_dereg_mr(imr) == EINVAL, "dereg_mr of an imported MR");
	int p[2];
	CHECK(!pipe(p), "pipe");
	errno = 0;
	CHECK(!ibv_import_device(p[0]) && errno == EINVAL,
	      "import_device of a pipe");
	close(p[0]);
	close(p[1]);
	errno = 0;
	CHECK(!ibv_import_device(-1) && errno == EBADF, "import_device(-1)");

	/* Traffic: QP a on the original, QP b on the imported context. */
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "query_gid");
	struct ibv_cq *cqa = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_cq *cqb = ibv_create_cq(ictx, 8, NULL, NULL, 0);
	CHECK(cqa && cqb, "create_cq");
	struct ibv_qp *a = rc_qp(pd, cqa), *b = rc_qp(ipd, cqb);
	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);

	struct ibv_sge rs = {(uintptr_t)(buf + N / 2), N / 2, imr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 9, .sg_list = &rs, .num_sge = 1},
			   *rbad;
	CHECK(!ibv_post_recv(b, &rwr, &rbad), "post_recv");
	struct ibv_sge ws = {(uintptr_t)src, N / 2, smr->lkey};
	struct ibv_sge ss = {(uintptr_t)(src + N / 2), N / 2, smr->lkey};
	struct ibv_send_wr send = {.wr_id = 2,
				   .sg_list = &ss,
				   .num_sge = 1,
				   .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr write = {.wr_id = 1,
				    .next = &send,
				    .sg_list = &ws,
				    .num_sge = 1,
				    .opcode = IBV_WR_RDMA_WRITE,
				    .send_flags = IBV_SEND_SIGNALED};
	write.wr.rdma.remote_addr = (uintptr_t)buf;
	write.wr.rdma.rkey = imr->rkey;
	struct ibv_send_wr *sbad;
	CHECK(!ibv_post_send(a, &write, &sbad), "post_send");
	poll_n(cqa, 2);
	poll_n(cqb, 1);
	CHECK(!memcmp(buf, src, N), "the region's bytes differ from what was sent");
	printf("traffic: %d bytes exact\n", N);
	fflush(stdout);

	/* Another process gets the descriptor (inherited across exec). */
	int xfd = dup(ctx->cmd_fd);
	CHECK(xfd >= 0, "dup");
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		char n[16];
		snprintf(n, sizeof(n), "%d", xfd);
		execl("/proc/self/exe", argv[0], "child", n, (char *)NULL);
		_exit(127);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
		      WEXITSTATUS(st) == 0,
	      "child status %d", st);
	close(xfd);

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy_qp");
	CHECK(!ibv_destroy_cq(cqa) && !ibv_destroy_cq(cqb), "destroy_cq");
	ibv_unimport_mr(imr);
	ibv_unimport_pd(ipd);
	CHECK(!ibv_close_device(ictx), "close imported");
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF,
	      "closing the imported context closes its cmd_fd");
	/* The original still works after the import is gone. */
	CHECK(!ibv_dereg_mr(smr) && !ibv_dereg_mr(mr), "dereg_mr");
	CHECK(!ibv_dealloc_pd(pd), "dealloc_pd");
	CHECK(!ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	printf("import: ok\n");
	return 0;
}

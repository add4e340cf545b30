/* udp_pingpong: the kernel's floor under a UDP write_lat on this host.
 *
 * Two processes on loopback, each pinned to its own core, ping-pong one
 * datagram over non-blocking sockets, busy-polling the receive as sockperf
 * does. No RDMA, no library: only system calls, in one of two shapes:
 *
 *   plain     sendto/recvfrom of 16 bytes, one socket a side: what
 *             `sockperf pp --nonblocked` measures (the peers' UDP row).
 *   softrdma  the calls softrdma's UDP engine makes for an 8-byte RDMA
 *             WRITE: sendmsg of one 40-byte datagram gathered from three
 *             iovecs (28 bytes of headers, the payload, the 4-byte ICRC)
 *             from a send socket of its own (a QP's source port) to the
 *             receive socket; a recvmsg after an empty poll and a
 *             recvmmsg of up to 32 entries after one that found
 *             datagrams, with the receive socket's options (UDP_GRO,
 *             IP_RECVTOS, IP_RECVTTL, SO_RXQ_OVFL: their
 *             control messages, the sender's address).
 *   softrdma-rc
 *             the same for an RC WRITE: each side's datagram also carries
 *             the ACK of the one it answers, as softrdma's engine sends
 *             them in a ping-pong (the reply first, its ACK behind it,
 *             one `sendmsg` with UDP_SEGMENT 40: a 40-byte WRITE and a
 *             20-byte ACK — BTH, AETH, ICRC), received as one GRO entry.
 *             What any RoCEv2 RC engine on these sockets must do per
 *             one-way of `perf write_lat`: an ACK per WRITE is IBA's, and
 *             sent alone it would cost a second system call.
 *
 * Whatever softrdma does on top (headers, ICRC, queues, completions, an
 * RC ACK) comes on top of the `softrdma` figure. (A leaner engine could
 * make cheaper calls: `sendmsg` of one buffer, a `recvmsg` with only the
 * control messages it needs. This measures the calls softrdma makes.)
 *
 *   cc -O2 -o udp_pingpong scripts/floor/udp_pingpong.c
 *   ./udp_pingpong plain|softrdma|softrdma-rc [ITERS] [CPU_A CPU_B] [PORT]
 *
 * Prints the median and mean one-way time (half the round trip) in µs.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

#define BATCH 32

static int soft, rc;

static int udp_socket(int port, int rx) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0), one = 1;
    if (s < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(s, (void *)&a, sizeof a) != 0) die("bind");
    if (soft && rx) {
        setsockopt(s, SOL_UDP, UDP_GRO, &one, sizeof one);
        setsockopt(s, IPPROTO_IP, IP_RECVTOS, &one, sizeof one);
        setsockopt(s, IPPROTO_IP, IP_RECVTTL, &one, sizeof one);
        setsockopt(s, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof one);
    }
    return s;
}

static char bufs[BATCH][2048], cms[BATCH][128];
static struct sockaddr_in names[BATCH];
static struct iovec riov[BATCH];
static struct mmsghdr rmsg[BATCH];

/* Bytes the receives took so far (the `soft` shapes). */
static long got;

/* One receive, non-blocking: the datagrams it took. As softrdma's ring:
 * the headers the kernel wrote into (the entries the last call filled) are
 * set up again before the next call, and only those; after a call that
 * found nothing, one recvmsg, after one that found datagrams, a recvmmsg
 * of the whole batch. */
static int dirty = BATCH, idle = 1;
static int receive(int s) {
    if (!soft) {
        int n = recvfrom(s, bufs[0], sizeof bufs[0], MSG_DONTWAIT, 0, 0);
        return n > 0 ? 1 : 0;
    }
    for (int k = 0; k < dirty; k++) {
        riov[k] = (struct iovec){bufs[k], sizeof bufs[k]};
        rmsg[k].msg_hdr = (struct msghdr){.msg_name = &names[k], .msg_namelen = sizeof names[k],
                                          .msg_iov = &riov[k], .msg_iovlen = 1,
                                          .msg_control = cms[k], .msg_controllen = sizeof cms[k]};
    }
    ssize_t one = 0;
    int n = idle ? ((one = recvmsg(s, &rmsg[0].msg_hdr, MSG_DONTWAIT)) >= 0 ? 1 : -1)
                 : recvmmsg(s, rmsg, BATCH, MSG_DONTWAIT, 0);
    if (idle && n == 1) rmsg[0].msg_len = one;
    for (int k = 0; k < n; k++) got += rmsg[k].msg_len;
    dirty = n > 0 ? n : (errno == EAGAIN ? 0 : BATCH);
    idle = n <= 0;
    return n > 0 ? n : 0;
}

static void send_one(int s, struct mmsghdr *m, char *plain, size_t len, struct sockaddr_in *to) {
    /* softrdma sends a flush of one message with sendmsg. */
    ssize_t r = soft ? sendmsg(s, &m->msg_hdr, 0) : sendto(s, plain, len, 0, (void *)to, sizeof *to);
    if (r < 0) die("send");
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "plain") && strcmp(argv[1], "softrdma") &&
                     strcmp(argv[1], "softrdma-rc"))) {
        fprintf(stderr, "usage: %s plain|softrdma|softrdma-rc [ITERS] [CPU_A CPU_B] [PORT]\n",
                argv[0]);
        return 2;
    }
    rc = strcmp(argv[1], "softrdma-rc") == 0;
    soft = rc || strcmp(argv[1], "softrdma") == 0;
    int iters = argc > 2 ? atoi(argv[2]) : 200000;
    int cpu[2] = {argc > 4 ? atoi(argv[3]) : 0, argc > 4 ? atoi(argv[4]) : 1};
    int base = argc > 5 ? atoi(argv[5]) : 27400 + getpid() % 1000 * 4;
    if (iters < 1000) iters = 1000;
    int warm = iters / 10;
    /* Every socket exists before the fork: the first datagram has a
     * receiver. A lost datagram (none should be, on loopback) ends the
     * run by the alarm rather than hanging it. */
    int rxs[2] = {udp_socket(base, 1), udp_socket(base + 1, 1)};
    int txs[2] = {soft ? udp_socket(base + 2, 0) : rxs[0], soft ? udp_socket(base + 3, 0) : rxs[1]};
    pid_t child = fork();
    if (child < 0) die("fork");
    int me = child == 0; /* 0: the client, which times; 1: the echo side */
    alarm(120);
    /* The echo side ends with the client, whatever ends the client. */
    if (me && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1)) return 1;
    pin(cpu[me]);
    int rx = rxs[me], tx = txs[me];
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(base + !me),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char head[28] = {0}, payload[8] = {0}, icrc[4] = {0}, plain[16] = {0};
    char ack[16] = {0}, ack_icrc[4] = {0};
    /* The WRITE (headers, payload, ICRC) and, for RC, its ACK behind it. */
    struct iovec tiov[5] = {{head, sizeof head}, {payload, sizeof payload}, {icrc, sizeof icrc},
                            {ack, sizeof ack}, {ack_icrc, sizeof ack_icrc}};
    struct mmsghdr tmsg = {.msg_hdr = {.msg_name = &to, .msg_namelen = sizeof to,
                                       .msg_iov = tiov, .msg_iovlen = rc ? 5 : 3}};
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } seg = {0};
    if (rc) {
        tmsg.msg_hdr.msg_control = seg.buf;
        tmsg.msg_hdr.msg_controllen = sizeof seg.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&tmsg.msg_hdr);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t size = sizeof head + sizeof payload + sizeof icrc;
        memcpy(CMSG_DATA(c), &size, sizeof size);
    }
    double *rtt = me ? 0 : malloc(sizeof(double) * iters);
    for (int i = 0; i < warm + iters; i++) {
        double t0 = now();
        if (!me) send_one(tx, &tmsg, plain, sizeof plain, &to);
        /* A whole message: for RC the WRITE and its ACK (one GRO entry
         * on loopback; two datagrams, were GRO to leave them apart). */
        long want = got + (rc ? 60 : soft ? 40 : 0);
        while (!receive(rx) || got < want) {
        }
        if (me) send_one(tx, &tmsg, plain, sizeof plain, &to);
        else if (i >= warm) rtt[i - warm] = now() - t0;
    }
    if (me) return 0;
    int status;
    waitpid(child, &status, 0);
    double sum = 0;
    for (int i = 0; i < iters; i++) sum += rtt[i];
    qsort(rtt, iters, sizeof *rtt, cmp);
    printf("%s one-way p50 %.3f us avg %.3f us (%d round trips)\n", argv[1],
           rtt[iters / 2] / 2 * 1e6, sum / iters / 2 * 1e6, iters);
    return 0;
}

/* udp_stream: the kernel's floor under a UDP write_bw on this host.
 *
 * Two processes on loopback, each pinned to its own core, move BYTES one
 * way the way softrdma's UDP engine moves a stream of RDMA WRITEs, with
 * no RDMA work at all: only the system calls and the kernel's copies.
 *
 *   sender    GSO trains of RoCEv2-sized datagrams (4 112 bytes: a BTH,
 *             4 096 bytes of payload, the ICRC; 15 to a train, the most a
 *             train of 4 112-byte segments holds) by sendmsg with
 *             UDP_SEGMENT, from a socket of its own, at most WINDOW bytes
 *             unacknowledged (softrdma's per-destination budget on this
 *             host: 4 MiB); it reads acknowledgments without blocking
 *             between trains and blocks on them when the window is full.
 *   receiver  blocking recvmmsg of up to 8 GRO entries of 64 KiB on a
 *             socket with UDP_GRO, and a 16-byte acknowledgment of the
 *             bytes so far after every 64 KiB that arrives (RC's ACK
 *             coalescing, about one per 64 KiB message).
 *
 * Both sockets have softrdma's 8 MiB buffers. Whatever a RoCEv2 engine
 * does on top — headers, the ICRC of every packet on both sides, the
 * copy of the payload from the receive buffer into the region, queues
 * and completions — comes on top of these figures: its bandwidth is at
 * most this one, its CPU per GB at least this one.
 *
 *   cc -O2 -o udp_stream scripts/floor/udp_stream.c
 *   ./udp_stream [MIB] [CPU_A CPU_B] [PORT]
 *
 * Prints GB/s (payload of the datagrams, 4 112 bytes each) and the CPU
 * both processes spent (user + system, their own rusage) per GB.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

#define SEG 4112
#define TRAIN 15
#ifndef WINDOW
#define WINDOW (4u << 20)
#endif
#ifndef ACK_EVERY
#define ACK_EVERY 65536
#endif
#define BUF (8 << 20)
#define RX_ENTRIES 8
#define RX_LEN 65536

static double cpu_self(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
           u.ru_stime.tv_usec * 1e-6;
}

static int sock(int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0), v = BUF;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (fd < 0)
        die("socket");
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)))
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)))
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)))
        die("bind");
    return fd;
}

static void to(int fd, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
        die("connect");
}

/* The receiver: count bytes, acknowledge every ACK_EVERY; report its CPU
 * through `out`. */
static void receiver(uint64_t total, int port, int out) {
    static char bufs[RX_ENTRIES][RX_LEN];
    struct mmsghdr m[RX_ENTRIES];
    struct iovec v[RX_ENTRIES];
    int fd = sock(port), on = 1;
    uint64_t got = 0, acked = 0;
    double cpu;
    if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof(on)))
        die("UDP_GRO");
    to(fd, port + 1);
    if (write(out, "r", 1) != 1)
        die("ready");
    while (got < total) {
        int n;
        for (int i = 0; i < RX_ENTRIES; i++) {
            v[i].iov_base = bufs[i];
            v[i].iov_len = RX_LEN;
            memset(&m[i], 0, sizeof(m[i]));
            m[i].msg_hdr.msg_iov = &v[i];
            m[i].msg_hdr.msg_iovlen = 1;
        }
        n = recvmmsg(fd, m, RX_ENTRIES, MSG_WAITFORONE, NULL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("recvmmsg");
        }
        for (int i = 0; i < n; i++)
            got += m[i].msg_len;
        if (got - acked >= ACK_EVERY || got >= total) {
            char ack[16] = {0};
            memcpy(ack, &got, 8);
            if (send(fd, ack, sizeof(ack), 0) < 0)
                die("send ack");
            acked = got;
        }
    }
    cpu = cpu_self();
    if (write(out, &cpu, sizeof(cpu)) != sizeof(cpu))
        die("report");
}

int main(int argc, char **argv) {
    uint64_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 4096;
    int ca = argc > 3 ? atoi(argv[2]) : 0, cb = argc > 3 ? atoi(argv[3]) : 1;
    int port = argc > 4 ? atoi(argv[4]) : 47910;
    uint64_t trains = (mib << 20) / ((uint64_t)SEG * TRAIN) + 1;
    uint64_t total = trains * SEG * TRAIN, sent = 0, acked = 0;
    static char train[SEG * TRAIN];
    char cbuf[CMSG_SPACE(sizeof(uint16_t))];
    int p[2], fd;
    double t0, t1, rcpu, scpu;
    pid_t child;
    char c;
    if (pipe(p))
        die("pipe");
    child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(120);
        pin(cb);
        close(p[0]);
        receiver(total, port, p[1]);
        _exit(0);
    }
    alarm(120);
    pin(ca);
    close(p[1]);
    if (read(p[0], &c, 1) != 1)
        die("receiver start");
    fd = sock(port + 1);
    to(fd, port);
    memset(train, 0x5a, sizeof(train));
    t0 = now();
    while (acked < total) {
        char ack[16];
        if (sent < total && sent - acked + SEG * TRAIN <= WINDOW) {
            struct iovec v = {train, sizeof(train)};
            struct msghdr h = {.msg_iov = &v, .msg_iovlen = 1,
                               .msg_control = cbuf,
                               .msg_controllen = sizeof(cbuf)};
            struct cmsghdr *cm = CMSG_FIRSTHDR(&h);
            cm->cmsg_level = IPPROTO_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            *(uint16_t *)CMSG_DATA(cm) = SEG;
            if (sendmsg(fd, &h, 0) < 0)
                die("sendmsg");
            sent += sizeof(train);
            /* Acknowledgments that came meanwhile, without waiting. */
            while (recv(fd, ack, sizeof(ack), MSG_DONTWAIT) == sizeof(ack)) {
                uint64_t a;
                memcpy(&a, ack, 8);
                if (a > acked)
                    acked = a;
            }
        } else {
            uint64_t a;
            if (recv(fd, ack, sizeof(ack), 0) != sizeof(ack))
                die("recv ack");
            memcpy(&a, ack, 8);
            if (a > acked)
                acked = a;
        }
    }
    t1 = now();
    scpu = cpu_self();
    if (read(p[0], &rcpu, sizeof(rcpu)) != sizeof(rcpu))
        die("receiver report");
    waitpid(child, NULL, 0);
    printf("udp_stream: %.0f MB in %.3f s: %.3f GB/s, CPU %.3f s/GB "
           "(sender %.3f, receiver %.3f)\n",
           total / 1e6, t1 - t0, total / (t1 - t0) / 1e9,
           (scpu + rcpu) / (total / 1e9), scpu / (total / 1e9),
           rcpu / (total / 1e9));
    return 0;
}

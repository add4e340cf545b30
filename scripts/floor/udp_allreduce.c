/* udp_allreduce: the kernel's floor under a two-rank AllReduce over UDP on
 * this host.
 *
 * Two processes on loopback, each pinned to its own core (as `mpirun -np 2
 * --bind-to core` pins the ranks), AllReduce float sums of SIZE bytes the
 * way softrdma's collectives do over its UDP engine with recursive doubling
 * — each rank sends its whole buffer to the other in chunks of 128 KiB and
 * reduces what arrives with its own — with no RDMA work at all:
 *
 *   send     a chunk as GSO trains of RoCEv2-sized datagrams (a 16-byte
 *            header and 4 096 bytes of payload, gathered from two iovecs
 *            as a RoCEv2 engine gathers a header and a region's bytes; 15
 *            to a train) by one sendmsg per train with UDP_SEGMENT;
 *   receive  non-blocking recvmmsg of GRO entries of 64 KiB (a spinning
 *            rank, as the collective spins), until the chunk is in;
 *   reduce   each datagram's payload straight from the receive buffer
 *            with the rank's own data into the result (no copy into a
 *            region first, no ICRC, no acknowledgment, no flag: a RoCEv2
 *            engine does all of those on top).
 *
 * Ranks go chunk by chunk in lock step (send chunk k, take the peer's chunk
 * k), so at most two chunks wait in a socket: nothing is lost on loopback
 * with the 8 MiB buffers softrdma's engine sets. A datagram lost anyway
 * stalls the run, which `alarm` ends with an error.
 *
 *   cc -O3 -march=native -o udp_allreduce scripts/floor/udp_allreduce.c
 *
 * (-O3 -march=native: the reduction loop vectorised, as softrdma's is.)
 *   ./udp_allreduce [CPU_A CPU_B] [PORT]
 *
 * Prints, per size from 4 KiB to 64 MiB (×4), the time per call (the
 * slower rank's mean) and busbw (= algbw for two ranks), in
 * nccl-tests' sense, as rows "SIZE US GBPS".
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

#define HDR 16
#define PAY 4096
#define SEG (HDR + PAY)
#define TRAIN 15
#define CHUNK (128 << 10)
#define BUF (8 << 20)
#define RX_ENTRIES 8
#define RX_LEN 65536
#define MAX_SIZE (64u << 20)

static int sock(int port, int peer) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0), v = BUF, on = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (fd < 0)
        die("socket");
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)))
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)))
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
    if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof(on)))
        die("UDP_GRO");
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)))
        die("bind");
    a.sin_port = htons(peer);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
        die("connect");
    return fd;
}

/* Send bytes [off, off + len) of `s` as trains of SEG-byte datagrams, each
 * a header naming its offset and up to PAY bytes of payload. */
static void send_chunk(int fd, const char *s, uint32_t off, uint32_t len) {
    static char hdr[TRAIN][HDR];
    struct iovec v[2 * TRAIN];
    char cbuf[CMSG_SPACE(sizeof(uint16_t))];
    uint32_t end = off + len;
    while (off < end) {
        int k = 0;
        uint32_t bytes = 0;
        for (; k < TRAIN && off < end; k++) {
            uint32_t n = end - off < PAY ? end - off : PAY;
            memcpy(hdr[k], &off, 4);
            v[2 * k].iov_base = hdr[k];
            v[2 * k].iov_len = HDR;
            v[2 * k + 1].iov_base = (char *)s + off;
            v[2 * k + 1].iov_len = n;
            off += n;
            bytes += HDR + n;
            if (n < PAY) {
                k++;
                break;
            }
        }
        struct msghdr h = {.msg_iov = v, .msg_iovlen = 2 * k};
        if (k > 1) {
            h.msg_control = cbuf;
            h.msg_controllen = sizeof(cbuf);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&h);
            cm->cmsg_level = IPPROTO_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            *(uint16_t *)CMSG_DATA(cm) = SEG;
        }
        if (sendmsg(fd, &h, 0) != (ssize_t)bytes)
            die("sendmsg");
    }
}

/* Take the peer's datagrams until `len` more payload bytes are in,
 * reducing each with `s` into `d`. A GRO entry may run on into the peer's
 * next chunk (it merges whatever datagrams of one size arrive together),
 * so what is counted is the running total. */
static void recv_reduce(int fd, const float *s, float *d, uint32_t len) {
    static char bufs[RX_ENTRIES][RX_LEN];
    static uint64_t got, want;
    struct mmsghdr m[RX_ENTRIES];
    struct iovec v[RX_ENTRIES];
    want += len;
    while (got < want) {
        for (int i = 0; i < RX_ENTRIES; i++) {
            v[i].iov_base = bufs[i];
            v[i].iov_len = RX_LEN;
            memset(&m[i], 0, sizeof(m[i]));
            m[i].msg_hdr.msg_iov = &v[i];
            m[i].msg_hdr.msg_iovlen = 1;
        }
        int n = recvmmsg(fd, m, RX_ENTRIES, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            die("recvmmsg");
        }
        for (int i = 0; i < n; i++) {
            /* A GRO entry: datagrams of SEG bytes, the last maybe shorter. */
            const char *p = bufs[i], *e = bufs[i] + m[i].msg_len;
            while (p + HDR < e) {
                uint32_t off, pay = e - p - HDR < PAY ? e - p - HDR : PAY;
                memcpy(&off, p, 4);
                const float *a = s + off / 4, *b = (const float *)(p + HDR);
                float *o = d + off / 4;
                for (uint32_t j = 0; j < pay / 4; j++)
                    o[j] = a[j] + b[j];
                got += pay;
                p += HDR + pay;
            }
        }
    }
}

static void rank(int fd, int cpu, int report) {
    float *s = aligned_alloc(4096, MAX_SIZE), *d = aligned_alloc(4096, MAX_SIZE);
    if (!s || !d)
        die("aligned_alloc");
    pin(cpu);
    for (uint32_t i = 0; i < MAX_SIZE / 4; i++)
        s[i] = (float)(i % 1024), d[i] = 0;
    for (uint32_t size = 4096; size <= MAX_SIZE; size *= 4) {
        /* About 0.3 s per size (as the peers' mpi_allreduce), at least 5. */
        int iters = (int)(0.3 / (size / 1.5e9 + 20e-6)), warm = 5;
        if (iters < 5)
            iters = 5;
        double t0 = 0;
        for (int it = -warm; it < iters; it++) {
            if (it == 0)
                t0 = now();
            for (uint32_t off = 0; off < size; off += CHUNK) {
                uint32_t len = size - off < CHUNK ? size - off : CHUNK;
                send_chunk(fd, (const char *)s, off, len);
                recv_reduce(fd, s, d, len);
            }
        }
        double us = (now() - t0) / iters * 1e6;
        /* Check one element: s + s of the peer (the same values). */
        if (d[(size / 4) - 1] != 2 * s[(size / 4) - 1]) {
            fprintf(stderr, "udp_allreduce: wrong sum at %u bytes\n", size);
            exit(1);
        }
        if (write(report, &us, sizeof(us)) != sizeof(us))
            die("report");
    }
}

int main(int argc, char **argv) {
    int ca = argc > 2 ? atoi(argv[1]) : 0, cb = argc > 2 ? atoi(argv[2]) : 1;
    int port = argc > 3 ? atoi(argv[3]) : 47930;
    int p0[2], p1[2];
    pid_t child;
    if (pipe(p0) || pipe(p1))
        die("pipe");
    /* Both sockets exist before either rank sends. */
    int fd0 = sock(port, port + 1), fd1 = sock(port + 1, port);
    alarm(120);
    child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(fd0);
        rank(fd1, cb, p1[1]);
        _exit(0);
    }
    close(fd1);
    rank(fd0, ca, p0[1]);
    for (uint32_t size = 4096; size <= MAX_SIZE; size *= 4) {
        double a, b;
        if (read(p0[0], &a, sizeof(a)) != sizeof(a) || read(p1[0], &b, sizeof(b)) != sizeof(b))
            die("results");
        double us = a > b ? a : b;
        printf("%u %.2f %.3f\n", size, us, size / us / 1e3);
    }
    int st;
    waitpid(child, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

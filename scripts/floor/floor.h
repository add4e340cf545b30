/* What the UDP floor programs of this directory share: the socket options
 * older headers lack, and a few helpers. Each program is built alone
 * (`cc -O2 scripts/floor/NAME.c`); this header is found beside it. */
#ifndef SOFTRDMA_FLOOR_H
#define SOFTRDMA_FLOOR_H

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

static void die(const char *what) { perror(what); exit(2); }

/* Seconds on the monotonic clock. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Run the calling process on `cpu` alone. */
static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof(s), &s))
        die("sched_setaffinity");
}

#endif

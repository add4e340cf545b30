/* two_line_pingpong: the floor under a shared-memory write_lat. Two
 * processes share a memfd; each spins (with one `pause` per look) on a byte
 * of its own and, when it sees the next count there, stores the count into
 * the other's byte, a page away. No library, no completion: what is left
 * is the two cache lines crossing between the cores, which every one-sided
 * ping-pong (UCX's put_lat, perftest's ib_write_lat, softrdma's perf
 * write_lat) pays under its own work.
 *
 *   cc -O2 -o two_line_pingpong scripts/floor/two_line_pingpong.c
 *   ./two_line_pingpong            # prints the mean one-way time in ns
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int iters = 1000000;
    const int pause = !(argc > 1 && strcmp(argv[1], "nopause") == 0);
    int fd = memfd_create("two_line_pingpong", 0);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0) { perror("memfd"); return 1; }
    char *m = mmap(0, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    volatile char *a = m + 64, *b = m + 64 + 4096;   /* each side's own byte */
    pid_t p = fork();
    if (p < 0) { perror("fork"); return 1; }
    if (p == 0) {
        for (int i = 1; i <= iters; i++) {
            while (*b != (char)i)
                if (pause) __builtin_ia32_pause();
            *a = (char)i;
        }
        _exit(0);
    }
    double t0 = now();
    for (int i = 1; i <= iters; i++) {
        *b = (char)i;
        while (*a != (char)i)
            if (pause) __builtin_ia32_pause();
    }
    double t = now() - t0;
    waitpid(p, 0, 0);
    printf("one-way %.1f ns (%s)\n", t / iters / 2 * 1e9, pause ? "pause" : "nopause");
    return 0;
}

/* allreduce_check: MPI_Allreduce(SUM) on int32 buffers whose every element
 * differs by index and rank; every element of every result is checked.
 * Sizes from 4 KiB to 16 MiB cross UCX's eager and rendezvous protocols.
 * Prints "ok <bytes>" per size (rank 0); a wrong element ends the job with
 * its index and value (exit 1 through MPI_Abort). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t sizes[] = {4096, 65536, 1 << 20, 16 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t bytes = sizes[i], count = bytes / sizeof(int32_t);
        int32_t *in = malloc(bytes), *out = malloc(bytes);
        if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 2);
        for (int round = 0; round < 3; round++) {
            /* element k of rank r: k * (r + 1) + r + round, so the sum is
               k * n(n+1)/2 + n(n-1)/2 + n * round */
            for (size_t k = 0; k < count; k++) in[k] = (int32_t)(k * (rank + 1) + rank + round);
            MPI_Allreduce(in, out, (int)count, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
            for (size_t k = 0; k < count; k++) {
                int32_t want = (int32_t)(k * (n * (n + 1) / 2) + n * (n - 1) / 2 + n * round);
                if (out[k] != want) {
                    fprintf(stderr, "rank %d: %zu bytes, round %d: element %zu is %d, want %d\n",
                            rank, bytes, round, k, out[k], want);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
        }
        if (rank == 0) printf("ok %zu\n", bytes);
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}

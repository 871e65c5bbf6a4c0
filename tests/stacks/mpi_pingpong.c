/* Rank 0 exchanges and checks messages of 1 B to 4 MiB (every power of two) with every other
 * rank in turn (so with one rank per host, every host pair 0-k is exercised), then times a
 * 1 MiB ping-pong with rank 1. Rank 0 sends a pattern derived from the size and the round; the
 * peer checks every byte and answers with the pattern's complement, which rank 0 checks. Any
 * mismatch is reported with its offset and exits 1. Output (rank 0):
 *   peer P size N ok     one line per peer and size
 *   checked K sizes with P peers      when all passed
 *   pingpong 1048576 B: R round trips, T us per round trip, B MB/s   (2 x size x R / T)
 * Usage: mpi_pingpong [ROUNDS]   (default 50 timed round trips of 1 MiB) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZE (4u << 20)

static unsigned char pattern(size_t i, size_t size, int round)
{
    return (unsigned char)((i * 131u + size * 7u + (unsigned)round * 29u) & 0xff);
}

static int check(const unsigned char *buf, size_t size, int round, int complement, int rank)
{
    for (size_t i = 0; i < size; i++) {
        unsigned char want = pattern(i, size, round);
        if (complement)
            want = (unsigned char)~want;
        if (buf[i] != want) {
            fprintf(stderr, "rank %d: size %zu round %d: byte %zu is 0x%02x, want 0x%02x\n",
                    rank, size, round, i, buf[i], want);
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    int rank, nranks, rounds = argc > 1 ? atoi(argv[1]) : 50;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks < 2) {
        fprintf(stderr, "run with 2 or more ranks (got %d)\n", nranks);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned char *buf = malloc(MAX_SIZE);
    if (!buf)
        MPI_Abort(MPI_COMM_WORLD, 2);
    int sizes = 0, ok = 1;
    for (int peer = 1; peer < nranks && ok; peer++) {
        sizes = 0;
        for (size_t size = 1; size <= MAX_SIZE && ok; size *= 2, sizes++) {
            for (int round = 0; round < 3 && ok; round++) {
                if (rank == 0) {
                    for (size_t i = 0; i < size; i++)
                        buf[i] = pattern(i, size, round);
                    MPI_Send(buf, (int)size, MPI_BYTE, peer, round, MPI_COMM_WORLD);
                    memset(buf, 0, size);
                    MPI_Recv(buf, (int)size, MPI_BYTE, peer, round, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
                    ok = check(buf, size, round, 1, rank);
                } else if (rank == peer) {
                    memset(buf, 0, size);
                    MPI_Recv(buf, (int)size, MPI_BYTE, 0, round, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
                    ok = check(buf, size, round, 0, rank);
                    for (size_t i = 0; i < size; i++)
                        buf[i] = (unsigned char)~buf[i];
                    MPI_Send(buf, (int)size, MPI_BYTE, 0, round, MPI_COMM_WORLD);
                }
            }
            MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
            if (rank == 0 && ok)
                printf("peer %d size %zu ok\n", peer, size);
        }
    }
    if (!ok) {
        if (rank == 0)
            printf("FAILED\n");
        MPI_Finalize();
        return 1;
    }
    if (rank == 0)
        printf("checked %d sizes with %d peers\n", sizes, nranks - 1);

    const int size = 1 << 20;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int r = 0; r < rounds; r++) {
        if (rank == 0) {
            MPI_Send(buf, size, MPI_BYTE, 1, 99, MPI_COMM_WORLD);
            MPI_Recv(buf, size, MPI_BYTE, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, size, MPI_BYTE, 0, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, size, MPI_BYTE, 0, 99, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    if (rank == 0)
        printf("pingpong %d B: %d round trips, %.1f us per round trip, %.1f MB/s\n", size,
               rounds, t / rounds * 1e6, 2.0 * size * rounds / t / 1e6);
    fflush(stdout);
    free(buf);
    MPI_Finalize();
    return 0;
}

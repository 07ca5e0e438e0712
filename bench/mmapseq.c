/* mmapseq: sequential write then read of a MAP_SHARED file mapping, one 8-byte store / load per
 * 64 bytes, msync at the end of the write pass. The kernel side of bench/run-pagecache.sh.
 * usage: mmapseq FILE SIZE_MIB  -> "write MiB/s read MiB/s" */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: mmapseq FILE SIZE_MIB\n"); return 2; }
    size_t len = (size_t)atol(argv[2]) << 20;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, len)) { perror(argv[1]); return 1; }
    uint64_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    double t0 = now();
    for (size_t i = 0; i < len / 8; i += 8) p[i] = i;
    msync(p, len, MS_SYNC);
    double t1 = now();
    munmap(p, len);
    posix_fadvise(fd, 0, len, POSIX_FADV_DONTNEED);
    p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    uint64_t bad = 0;
    double t2 = now();
    for (size_t i = 0; i < len / 8; i += 8) bad += p[i] != i;
    double t3 = now();
    printf("write %.0f MiB/s read %.0f MiB/s bad %lu\n", (len >> 20) / (t1 - t0), (len >> 20) / (t3 - t2), (unsigned long)bad);
    unlink(argv[1]);
    return bad != 0;
}

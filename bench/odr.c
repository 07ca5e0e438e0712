/* odr: O_DIRECT sequential read of FILE in BS_KIB calls into a 64 MiB buffer of 4 KiB pages
 * (HUGE 0) or transparent huge pages (HUGE 1). usage: odr FILE BS_KIB HUGE -> MiB/s.
 * Drop caches first: echo 3 > /proc/sys/vm/drop_caches. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
int main(int c, char **v) {
    size_t bs = atol(v[2]) << 10; int huge = atoi(v[3]);
    int fd = open(v[1], O_RDONLY | O_DIRECT);
    size_t len = 64 << 20;
    char *b = mmap(NULL, len + (2<<20), PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    b = (char *)(((unsigned long)b + (2<<20) - 1) & ~((2UL<<20)-1));
    if (huge) madvise(b, len, MADV_HUGEPAGE);
    for (size_t i = 0; i < len; i += 4096) b[i] = 1;
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t off = 0, tot = 0; ssize_t n;
    while ((n = pread(fd, b + (off % len), bs, off)) > 0) { off += n; tot += n; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = t1.tv_sec - t0.tv_sec + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("bs %zuK huge %d: %.0f MiB/s\n", bs >> 10, huge, tot / s / 1048576);
}

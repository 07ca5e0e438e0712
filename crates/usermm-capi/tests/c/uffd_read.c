/* read(2) into memory from usermm_mmap's default manager (USERMM_* variables): fresh pages
 * and pages swapped out. With the uffd-open policy every front end shares (full mode where
 * the process may open it), the kernel faults them in like any access; prints "read ok". */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <usermm.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: uffd_read FILE\n");
        return 2;
    }
    const size_t len = 64 << 20, chunk = 1 << 20;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 2;
    }
    uint8_t *p = usermm_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "usermm_mmap: %s (%s)\n", strerror(errno), usermm_last_error());
        return 1;
    }
    /* Fresh, never touched: read(2) into the second half. */
    for (size_t off = len / 2; off < len; off += chunk) {
        ssize_t n = pread(fd, p + off, chunk, 0);
        if (n != (ssize_t)chunk) {
            fprintf(stderr, "read into fresh managed memory at %zu: %s\n", off, n < 0 ? strerror(errno) : "short");
            return 1;
        }
    }
    /* Touch the first half, then the second again (4x the 16 MiB budget in all): the first
     * half is swapped out; read(2) into it. */
    for (size_t off = 0; off < len / 2; off += 4096) p[off] = 1;
    for (size_t off = len / 2; off < len; off += 4096) p[off] ^= 0;
    for (size_t off = 0; off < len / 2; off += chunk) {
        ssize_t n = pread(fd, p + off, chunk, 0);
        if (n != (ssize_t)chunk) {
            fprintf(stderr, "read into swapped-out managed memory at %zu: %s\n", off, n < 0 ? strerror(errno) : "short");
            return 1;
        }
    }
    for (size_t i = 0; i < len; i += 4093)
        if (p[i] != (uint8_t)((i % chunk) * 7)) {
            fprintf(stderr, "byte %zu is %u, expected %u\n", i, p[i], (uint8_t)((i % chunk) * 7));
            return 1;
        }
    printf("read ok\n");
    return 0;
}

/*
 * mmapcheck.c: mmap-family semantics a program sees under `usermm run` (checked against what
 * the kernel would do, or the documented refusal): partial munmap, mremap shrink / grow /
 * move, MAP_FIXED over served memory, mprotect, madvise, read(2)/write(2) on served memory,
 * MAP_SHARED and small mappings left to the kernel. Prints failures and "N passed, M failed".
 *
 *   mmapcheck
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int passed, failed;
#define CHECK(c, ...) do { if (c) passed++; else { failed++; printf("FAIL line %d: %s: ", __LINE__, #c); printf(__VA_ARGS__); printf("\n"); } } while (0)
#define RW (PROT_READ | PROT_WRITE)
#define PA (MAP_PRIVATE | MAP_ANONYMOUS)
#define MB (1 << 20)

static void fill(char *p, size_t len, int seed) { for (size_t i = 0; i < len; i += 4096) p[i] = (char)(seed + i / 4096); }
static int same(char *p, size_t len, int seed) { for (size_t i = 0; i < len; i += 4096) if (p[i] != (char)(seed + i / 4096)) return 0; return 1; }

int main(void) {
    /* Partial munmap: the rest stays. */
    char *p = mmap(NULL, 64 * MB, RW, PA, -1, 0);
    CHECK(p != MAP_FAILED, "mmap 64 MiB: %s", strerror(errno));
    fill(p, 64 * MB, 1);
    CHECK(munmap(p + 16 * MB, 16 * MB) == 0, "partial munmap: %s", strerror(errno));
    CHECK(same(p, 16 * MB, 1) && same(p + 32 * MB, 32 * MB, 1 + 32 * MB / 4096), "rest kept");

    /* MAP_FIXED anonymous over served memory: fresh zeros, neighbours kept. */
    CHECK(mmap(p + 4 * MB, 4 * MB, RW, PA | MAP_FIXED, -1, 0) == p + 4 * MB, "MAP_FIXED over served memory");
    CHECK(p[4 * MB] == 0 && p[8 * MB - 1] == 0 && p[4 * MB - 4096] == (char)(1 + 4 * MB / 4096 - 1), "MAP_FIXED zeros");
    CHECK(mmap(p, 4096, RW, PA | MAP_FIXED_NOREPLACE, -1, 0) == MAP_FAILED && errno == EEXIST, "NOREPLACE: %s", strerror(errno));
    int fd = open("/proc/self/exe", O_RDONLY);
    CHECK(mmap(p, 4096, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED && errno == EINVAL,
          "file MAP_FIXED over served memory refused: %s", strerror(errno));
    CHECK(p[0] == (char)1, "refused MAP_FIXED left memory alone");

    /* mprotect: read-write is fine, anything else on served memory is refused. */
    CHECK(mprotect(p, 4 * MB, RW) == 0, "mprotect RW");
    CHECK(mprotect(p, 4 * MB, PROT_READ) == -1 && errno == EACCES, "mprotect READ refused: %s", strerror(errno));

    /* madvise: DONTNEED zeroes, hints succeed, unknown fails. */
    CHECK(madvise(p + 32 * MB, 4 * MB, MADV_DONTNEED) == 0 && p[32 * MB] == 0 && p[36 * MB] != 0, "MADV_DONTNEED");
    CHECK(madvise(p, 4 * MB, MADV_HUGEPAGE) == 0 && madvise(p, 4 * MB, MADV_SEQUENTIAL) == 0, "hints");
    CHECK(madvise(p, 4 * MB, MADV_REMOVE) == -1 && errno == EINVAL, "MADV_REMOVE: %s", strerror(errno));
    CHECK(mlock(p, 4096) == -1 && errno == EAGAIN, "mlock refused: %s", strerror(errno));

    /* Kernel-mode access: read(2) into and write(2) from served memory that is not resident. */
    char *big = mmap(NULL, 96 * MB, RW, PA, -1, 0);
    fill(big, 96 * MB, 7);
    int pf[2];
    CHECK(pipe(pf) == 0, "pipe");
    CHECK(write(pf[1], big + 1 * MB, 4096) == 4096, "write(2) from served memory: %s", strerror(errno));
    CHECK(read(pf[0], p + 40 * MB, 4096) == 4096, "read(2) into served memory: %s", strerror(errno));
    CHECK(memcmp(p + 40 * MB, big + 1 * MB, 4096) == 0, "pipe round trip");
    CHECK(read(fd, big + 50 * MB, 4096) == 4096 && memcmp(big + 50 * MB, "\177ELF", 4) == 0, "read(2) of a file");
    close(fd);

    /* mremap: shrink in place, grow only with MREMAP_MAYMOVE (contents move), FIXED refused. */
    CHECK(mremap(p + 32 * MB, 32 * MB, 16 * MB, 0) == p + 32 * MB, "shrink");
    CHECK(mremap(p, 16 * MB, 32 * MB, 0) == MAP_FAILED && errno == ENOMEM, "grow without MAYMOVE: %s", strerror(errno));
    char *q = mremap(big, 96 * MB, 128 * MB, MREMAP_MAYMOVE);
    CHECK(q != MAP_FAILED, "grow with MAYMOVE: %s", strerror(errno));
    CHECK(q == MAP_FAILED || (same(q, 50 * MB, 7) && q[128 * MB - 1] == 0), "contents moved");
    CHECK(mremap(q, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, p + 60 * MB) == MAP_FAILED && errno == EINVAL,
          "MREMAP_FIXED refused: %s", strerror(errno));

    /* Small (served too: every anonymous mapping is) and shared mappings (the kernel's). */
    char *s = mmap(NULL, 8 * MB, RW, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(s != MAP_FAILED, "MAP_SHARED: %s", strerror(errno));
    s[0] = 5;
    char *small = mmap(NULL, 64 * 1024, RW, PA, -1, 0);
    small[0] = 6;
    char *small2 = mremap(small, 64 * 1024, 128 * 1024, MREMAP_MAYMOVE);
    CHECK(small2 != MAP_FAILED && small2[0] == 6, "kernel mremap");
    CHECK(munmap(s, 8 * MB) == 0 && munmap(small2, 128 * 1024) == 0, "kernel munmap");

    /* munmap spanning served and unserved memory, and of everything. */
    CHECK(munmap(q, 128 * MB) == 0 && munmap(p, 64 * MB) == 0, "munmap all: %s", strerror(errno));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

/*
 * capi_test.c: tests of the C API, compiled with gcc and run by tests/c.rs.
 *
 *   capi_test big       usermm_mmap 4x the default manager's budget (USERMM_BUDGET), write a
 *                       pattern, read it back, check the counters and the peak resident memory
 *                       (also run with USERMM_SET=fault_path=sigbus)
 *   capi_test bad       bad input to every call: NULL pointers, zero lengths, unaligned
 *                       addresses, unknown flags, MAP_SHARED, fds, MAP_FIXED, unknown names
 *   capi_test handle    the handle API: create, map, discard, vmstat, unmap, destroy
 *   capi_test badenv    run with USERMM_BUDGET=256Q: usermm_mmap fails with EINVAL and the
 *                       message names the variable and the value
 *   capi_test swapopts  usermm_config's swap_encrypt and swap_keep: a named swap file holds
 *                       the plain pages or none of them, and survives usermm_destroy or not
 *   capi_test group     usermm_group_create and usermm_config.group: two managers, one budget
 *
 * Prints one line per check and "N passed, M failed"; exits 1 if any check failed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "usermm.h"

static int passed, failed;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (cond) {                                                              \
            passed++;                                                            \
        } else {                                                                 \
            failed++;                                                            \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
            printf(__VA_ARGS__);                                                 \
            printf(" (last error: %s)\n", usermm_last_error());                  \
        }                                                                        \
    } while (0)

#define RW (PROT_READ | PROT_WRITE)
#define PA (MAP_PRIVATE | MAP_ANONYMOUS)

static uint64_t pattern(size_t i) { return (i * 0x9e3779b97f4a7c15ull) ^ 0x5555aaaa5555aaaaull; }

static uint64_t stat_of(usermm_mm *mm, const char *name) {
    uint64_t v = UINT64_MAX;
    int rc = usermm_vmstat_get(mm, name, &v);
    CHECK(rc == USERMM_OK, "usermm_vmstat_get(%s) = %d", name, rc);
    return v;
}

/* Expects usermm_mmap(...) to fail with `want` and the last error to contain `word`. */
static void expect_mmap_fail(void *addr, size_t len, int prot, int flags, int fd, off_t off, int want,
                             const char *word, const char *what) {
    errno = 0;
    void *p = usermm_mmap(addr, len, prot, flags, fd, off);
    int e = errno;
    CHECK(p == MAP_FAILED, "%s: mapped at %p", what, p);
    CHECK(e == want, "%s: errno %d (%s), want %d (%s)", what, e, strerror(e), want, strerror(want));
    CHECK(strstr(usermm_last_error(), word) != NULL, "%s: message lacks \"%s\"", what, word);
}

static void test_big(void) {
    usermm_mm *mm = usermm_default();
    CHECK(mm != NULL, "usermm_default");
    if (!mm) return;
    uint64_t budget = stat_of(mm, "budget_bytes");
    size_t len = 4 * budget;
    uint64_t *p = usermm_mmap(NULL, len, RW, PA, -1, 0);
    CHECK(p != MAP_FAILED, "usermm_mmap of %zu bytes: %s", len, strerror(errno));
    if (p == MAP_FAILED) return;
    CHECK(((uintptr_t)p & 4095) == 0, "address %p not page aligned", (void *)p);
    size_t n = len / 8, bad = 0;
    for (size_t i = 0; i < n; i++) p[i] = pattern(i);
    for (size_t i = 0; i < n; i++) bad += p[i] != pattern(i);
    CHECK(bad == 0, "%zu of %zu words wrong after the first read-back", bad, n);
    /* Second pass backwards: everything comes back from swap in the other order. */
    bad = 0;
    for (size_t i = n; i-- > 0;) bad += p[i] != pattern(i);
    CHECK(bad == 0, "%zu words wrong after the backward read-back", bad);
    usermm_vmstat_t st;
    memset(&st, 0xff, sizeof st);
    CHECK(usermm_vmstat(mm, &st, sizeof st) == USERMM_OK, "usermm_vmstat");
    CHECK(st.budget_bytes == budget, "budget %" PRIu64, st.budget_bytes);
    CHECK(st.pswpout * 4096 >= len - budget, "pswpout %" PRIu64 " pages for %zu bytes", st.pswpout, len);
    CHECK(st.pswpin > 0, "pswpin %" PRIu64, st.pswpin);
    CHECK(st.peak_resident_bytes <= budget, "peak resident %" PRIu64 " > budget %" PRIu64,
          st.peak_resident_bytes, budget);
    CHECK(st.nr_regions == 1, "nr_regions %" PRIu64, st.nr_regions);
    CHECK(stat_of(mm, "pswpout") >= st.pswpout, "pswpout by name");
    /* A smaller size (an older header) gets the leading fields only. */
    usermm_vmstat_t small;
    memset(&small, 0, sizeof small);
    CHECK(usermm_vmstat(mm, &small, 16) == USERMM_OK, "usermm_vmstat with size 16");
    CHECK(small.budget_bytes == budget && small.peak_resident_bytes == 0, "size 16 fills two fields");
    CHECK(usermm_munmap(p, len) == 0, "usermm_munmap: %s", strerror(errno));
    CHECK(stat_of(mm, "nr_regions") == 0, "region left after munmap");
    CHECK(stat_of(mm, "committed_bytes") == 0, "commit left after munmap");
    printf("big: %zu MiB through a %" PRIu64 " MiB budget, pswpout %" PRIu64 " pswpin %" PRIu64
           " peak resident %" PRIu64 " MiB, fault_self_served %" PRIu64 "\n",
           len >> 20, budget >> 20, st.pswpout, st.pswpin, st.peak_resident_bytes >> 20,
           stat_of(mm, "fault_self_served"));
}

static void test_bad(void) {
    expect_mmap_fail(NULL, 0, RW, PA, -1, 0, EINVAL, "length is zero", "zero length");
    expect_mmap_fail(NULL, 4096, RW, PA, -1, 100, EINVAL, "offset", "unaligned offset");
    expect_mmap_fail(NULL, 4096, RW, PA | 0x200000, -1, 0, EINVAL, "unknown flags", "unknown flag");
    expect_mmap_fail(NULL, 4096, RW, MAP_ANONYMOUS, -1, 0, EINVAL, "MAP_PRIVATE", "no type");
    expect_mmap_fail(NULL, 4096, 0x40, PA, -1, 0, EINVAL, "protection", "unknown prot");
    expect_mmap_fail(NULL, 4096, RW, MAP_SHARED | MAP_ANONYMOUS, -1, 0, ENOTSUP, "MAP_SHARED", "shared");
    expect_mmap_fail(NULL, 4096, PROT_NONE, PA, -1, 0, ENOTSUP, "PROT_READ|PROT_WRITE", "PROT_NONE");
    expect_mmap_fail(NULL, 4096, RW, PA | MAP_HUGETLB, -1, 0, ENOTSUP, "MAP_HUGETLB", "hugetlb");
    expect_mmap_fail(NULL, 4096, RW, MAP_PRIVATE, -1, 0, EBADF, "fd -1", "file without fd");
    expect_mmap_fail(NULL, 4096, RW, MAP_PRIVATE, 12345, 0, EBADF, "12345", "closed fd");
    int devnull = open("/dev/null", O_RDWR);
    expect_mmap_fail(NULL, 4096, RW, MAP_PRIVATE, devnull, 0, ENODEV, "not a regular file", "char device");
    close(devnull);
    char tmpl[] = "/tmp/usermm-capi-test-XXXXXX";
    int fd = mkstemp(tmpl);
    unlink(tmpl);
    CHECK(fd >= 0 && ftruncate(fd, 8192) == 0, "temporary file");
    expect_mmap_fail(NULL, 4096, RW, MAP_SHARED | MAP_FIXED, fd, 0, ENOTSUP, "MAP_FIXED", "fixed file");
    expect_mmap_fail(NULL, 4096, RW, MAP_SHARED, fd, 100, EINVAL, "offset", "unaligned file offset");
    /* A regular file is served: MAP_SHARED stores reach it. */
    char *fm = usermm_mmap(NULL, 8192, RW, MAP_SHARED, fd, 0);
    CHECK(fm != MAP_FAILED, "MAP_SHARED file mapping: %s", usermm_last_error());
    if (fm != MAP_FAILED) {
        memcpy(fm + 4096, "through usermm", 15);
        CHECK(usermm_flush(usermm_default(), fm, 8192) == USERMM_OK, "flush: %s", usermm_last_error());
        char back[16] = {0};
        CHECK(pread(fd, back, 15, 4096) == 15 && !strcmp(back, "through usermm"), "file holds the store");
        CHECK(usermm_munmap(fm, 8192) == 0, "munmap file mapping");
    }
    close(fd);
    int ro = open("/etc/hostname", O_RDONLY);
    if (ro >= 0) {
        expect_mmap_fail(NULL, 4096, RW, MAP_SHARED, ro, 0, EACCES, "read-write", "shared writable on O_RDONLY");
        close(ro);
    }
    expect_mmap_fail(NULL, SIZE_MAX, RW, PA, -1, 0, ENOMEM, "too large", "huge length");
    expect_mmap_fail(NULL, (size_t)1 << 50, RW, PA, -1, 0, ENOMEM, "commit limit", "beyond commit limit");

    /* MAP_FIXED: only over usermm memory, never over anyone else's. */
    expect_mmap_fail((void *)0x10001, 4096, RW, PA | MAP_FIXED, -1, 0, EINVAL, "not page aligned",
                     "fixed unaligned");
    char *kernel = mmap(NULL, 8192, RW, PA, -1, 0);
    kernel[0] = 42;
    expect_mmap_fail(kernel, 4096, RW, PA | MAP_FIXED, -1, 0, EINVAL, "not (entirely) usermm memory",
                     "fixed over kernel memory");
    CHECK(kernel[0] == 42, "kernel memory changed by a failed MAP_FIXED");
    char *q = usermm_mmap(NULL, 64 << 10, RW, PA, -1, 0);
    CHECK(q != MAP_FAILED, "usermm_mmap 64 KiB");
    memset(q, 7, 64 << 10);
    expect_mmap_fail(q + 4096, 4096, RW, PA | MAP_FIXED_NOREPLACE, -1, 0, EEXIST, "overlaps",
                     "fixed_noreplace over usermm memory");
    CHECK(q[4096] == 7, "MAP_FIXED_NOREPLACE failure changed memory");
    CHECK(usermm_mmap(q + 4096, 8192, RW, PA | MAP_FIXED, -1, 0) == q + 4096, "MAP_FIXED over usermm memory");
    CHECK(q[4096] == 0 && q[3 * 4096 - 1] == 0 && q[4095] == 7 && q[3 * 4096] == 7,
          "MAP_FIXED replaces exactly its pages with zeros");
    expect_mmap_fail(q + 60 * 1024, 8192, RW, PA | MAP_FIXED, -1, 0, EINVAL, "not (entirely)",
                     "fixed straddling the end of usermm memory");

    /* usermm_munmap. */
    errno = 0;
    CHECK(usermm_munmap(q + 1, 4096) == -1 && errno == EINVAL, "unaligned munmap: errno %d", errno);
    CHECK(strstr(usermm_last_error(), "not page aligned") != NULL, "unaligned munmap message");
    errno = 0;
    CHECK(usermm_munmap(q, 0) == -1 && errno == EINVAL, "zero-length munmap: errno %d", errno);
    errno = 0;
    CHECK(usermm_munmap(kernel, 4096) == -1 && errno == EINVAL, "munmap of kernel memory: errno %d", errno);
    CHECK(kernel[0] == 42, "kernel memory changed by a failed usermm_munmap");
    munmap(kernel, 8192);
    /* Partial unmaps: the middle, then the rest; the region goes with its last page. */
    usermm_mm *d = usermm_default();
    uint64_t regions = stat_of(d, "nr_regions");
    CHECK(usermm_munmap(q + 16 * 1024, 16 * 1024) == 0, "partial munmap");
    CHECK(q[0] == 7 && q[32 * 1024] == 7, "partial munmap kept the rest");
    CHECK(stat_of(d, "nr_regions") == regions, "region dropped too early");
    CHECK(usermm_mmap(q + 16 * 1024, 4096, RW, PA | MAP_FIXED, -1, 0) == q + 16 * 1024,
          "MAP_FIXED into an unmapped hole");
    CHECK(usermm_munmap(q, 16 * 1024) == 0 && usermm_munmap(q + 32 * 1024, 32 * 1024) == 0, "munmap rest");
    CHECK(stat_of(d, "nr_regions") == regions, "region dropped while the re-mapped page is live");
    CHECK(usermm_munmap(q + 16 * 1024, 4096) == 0, "munmap the re-mapped page");
    CHECK(stat_of(d, "nr_regions") == regions - 1, "region not dropped with its last page");
    errno = 0;
    CHECK(usermm_munmap(q, 4096) == -1 && errno == EINVAL, "munmap after the region is gone: errno %d", errno);

    /* Handle API with NULL pointers and bad values. */
    CHECK(usermm_config_init(NULL) == USERMM_ERR_INVALID, "config_init(NULL)");
    CHECK(usermm_map_anon(NULL, 4096) == NULL, "map_anon(NULL)");
    CHECK(strstr(usermm_last_error(), "NULL") != NULL, "map_anon(NULL) message");
    CHECK(usermm_unmap(NULL, q) == USERMM_ERR_INVALID, "unmap(NULL mm)");
    CHECK(usermm_unmap(d, NULL) == USERMM_ERR_INVALID, "unmap(NULL addr)");
    CHECK(usermm_vmstat(NULL, NULL, 0) == USERMM_ERR_INVALID, "vmstat(NULL)");
    CHECK(usermm_vmstat(d, NULL, sizeof(usermm_vmstat_t)) == USERMM_ERR_INVALID, "vmstat(mm, NULL)");
    usermm_vmstat_t st;
    CHECK(usermm_vmstat(d, &st, 5) == USERMM_ERR_INVALID, "vmstat size 5");
    uint64_t v;
    CHECK(usermm_vmstat_get(d, "no_such_counter", &v) == USERMM_ERR_INVALID, "unknown counter");
    CHECK(strstr(usermm_last_error(), "no_such_counter") != NULL, "unknown counter message");
    CHECK(usermm_vmstat_get(d, NULL, &v) == USERMM_ERR_INVALID, "NULL counter name");
    CHECK(usermm_vmstat_get(d, "pswpout", NULL) == USERMM_ERR_INVALID, "NULL value");
    CHECK(usermm_destroy(NULL) == USERMM_OK, "destroy(NULL)");
    CHECK(usermm_destroy(d) == USERMM_ERR_BUSY, "destroy(default)");
    CHECK(strcmp(usermm_strerror(USERMM_ERR_NOMEM), "commit limit exceeded (budget + swap)") == 0,
          "strerror");
    CHECK(strstr(usermm_strerror(99), "unknown") != NULL, "strerror(99)");

    usermm_config cfg;
    usermm_config_init(&cfg);
    cfg.budget = 100;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "minimum") != NULL, "tiny budget");
    usermm_config_init(&cfg);
    cfg.swap_kind = 9;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "swap_kind 9") != NULL, "bad swap kind");
    usermm_config_init(&cfg);
    cfg.swap_kind = USERMM_SWAP_SPEC;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "needs the spec") != NULL,
          "spec kind without a spec");
    cfg.swap_path = "zswap+floppy";
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "\"floppy\"") != NULL,
          "bad spec named: %s", usermm_last_error());
    usermm_config_init(&cfg);
    cfg.uffd_policy = 5;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "uffd_policy 5") != NULL, "bad policy");
    usermm_config_init(&cfg);
    cfg.settings = "nosuch=old";
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "nosuch") != NULL, "bad settings");

    /* Every bad configuration: NULL, an error code, and a message naming the value. */
    struct {
        const char *what;
        uint64_t budget, swap_size;
        int swap_kind;
        const char *swap_path;
        uint32_t handler_threads;
        const char *settings;
        const char *word;
    } bad[] = {
        {"budget 0", 0, 0, USERMM_SWAP_RAM, NULL, 0, NULL, "budget of 0 bytes"},
        {"budget 2^64-1", UINT64_MAX, 0, USERMM_SWAP_NONE, NULL, 0, NULL, "maximum of 16 TiB"},
        {"handler_threads 20000", 8 << 20, 0, USERMM_SWAP_RAM, NULL, 20000, NULL,
         "handler_threads 20000"},
        {"handler_threads 2^32-1", 8 << 20, 0, USERMM_SWAP_RAM, NULL, UINT32_MAX, NULL,
         "maximum of 256"},
        {"swap_size 100", 8 << 20, 100, USERMM_SWAP_RAM, NULL, 0, NULL, "swap size 100 bytes"},
        {"file swap_size 100", 8 << 20, 100, USERMM_SWAP_FILE, NULL, 0, NULL, "swap size 100"},
        {"swap_path a directory", 8 << 20, 0, USERMM_SWAP_FILE, "/tmp", 0, NULL, "/tmp"},
        {"swap_path /proc/self/status", 8 << 20, 0, USERMM_SWAP_FILE, "/proc/self/status", 0, NULL,
         "/proc/self/status"},
        {"swap_path in a missing directory", 8 << 20, 0, USERMM_SWAP_FILE, "/nonexistent-usermm/swap", 0, NULL,
         "/nonexistent-usermm/swap"},
        {"settings without a value", 8 << 20, 0, USERMM_SWAP_RAM, NULL, 0, "laptop_mode",
         "name=value"},
        {"settings bad value", 8 << 20, 0, USERMM_SWAP_RAM, NULL, 0, "laptop_mode=maybe",
         "maybe"},
        {"settings no name", 8 << 20, 0, USERMM_SWAP_RAM, NULL, 0, "=on", "no name before"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        usermm_config_init(&cfg);
        cfg.budget = bad[i].budget;
        cfg.swap_size = bad[i].swap_size;
        cfg.swap_kind = bad[i].swap_kind;
        cfg.swap_path = bad[i].swap_path;
        cfg.handler_threads = bad[i].handler_threads;
        cfg.settings = bad[i].settings;
        usermm_mm *m = usermm_create(&cfg);
        CHECK(m == NULL, "%s: created", bad[i].what);
        if (m) {
            usermm_destroy(m);
            continue;
        }
        /* usermm_create reports through usermm_last_error; the code through a status call. */
        const char *msg = usermm_last_error();
        CHECK(strstr(msg, bad[i].word) != NULL, "%s: message lacks \"%s\": %s", bad[i].what, bad[i].word, msg);
        CHECK(strstr(msg, "Some(") == NULL && strstr(msg, " { ") == NULL, "%s: Debug text in %s", bad[i].what, msg);
    }
}

static void test_handle(void) {
    usermm_config cfg;
    CHECK(usermm_config_init(&cfg) == USERMM_OK, "config_init");
    CHECK(cfg.budget == 256 << 20 && cfg.swap_kind == USERMM_SWAP_FILE && cfg.swap_size == 0, "defaults");
    cfg.budget = 16 << 20;
    cfg.swap_kind = USERMM_SWAP_RAM;
    cfg.swap_size = 64 << 20;
    cfg.handler_threads = 2;
    cfg.settings = "laptop_mode=on";
    usermm_mm *mm = usermm_create(&cfg);
    CHECK(mm != NULL, "usermm_create");
    if (!mm) return;
    size_t len = 48 << 20;
    uint64_t *p = usermm_map_anon(mm, len);
    CHECK(p != NULL, "map_anon");
    if (!p) return;
    CHECK(usermm_map_anon(mm, 0) == NULL && strstr(usermm_last_error(), "zero") != NULL, "map_anon(0)");
    CHECK(usermm_map_anon(mm, (size_t)1 << 40) == NULL && strstr(usermm_last_error(), "commit limit"),
          "map_anon beyond commit limit");
    size_t n = len / 8, bad = 0;
    for (size_t i = 0; i < n; i++) p[i] = pattern(i);
    for (size_t i = 0; i < n; i++) bad += p[i] != pattern(i);
    CHECK(bad == 0, "%zu words wrong", bad);
    CHECK(usermm_discard(mm, p, 1 << 20) == USERMM_OK, "discard");
    CHECK(p[0] == 0 && p[(1 << 20) / 8 - 1] == 0 && p[(1 << 20) / 8] == pattern((1 << 20) / 8),
          "discard zeroes exactly its range");
    CHECK(usermm_discard(mm, (char *)p + 1, 4096) == USERMM_ERR_INVALID, "unaligned discard");
    CHECK(strstr(usermm_last_error(), "aligned") != NULL, "unaligned discard message");
    CHECK(usermm_discard(mm, p, 0) == USERMM_ERR_INVALID, "zero-length discard");
    CHECK(usermm_discard(mm, NULL, 4096) == USERMM_ERR_INVALID, "NULL discard");
    CHECK(usermm_discard(mm, p, len + 4096) == USERMM_ERR_NOT_FOUND, "discard past the end");
    CHECK(usermm_unmap(mm, (char *)p + 4096) == USERMM_ERR_NOT_FOUND, "unmap inside");
    CHECK(strstr(usermm_last_error(), "not its start") != NULL, "unmap inside message");
    CHECK(usermm_destroy(mm) == USERMM_ERR_BUSY, "destroy with a region");
    CHECK(strstr(usermm_last_error(), "1 mapped regions") != NULL, "destroy busy message");
    usermm_vmstat_t st;
    CHECK(usermm_vmstat(mm, &st, sizeof st) == USERMM_OK, "vmstat");
    CHECK(st.budget_bytes == 16 << 20 && st.swap_bytes == 64 << 20, "sizes %" PRIu64 " %" PRIu64,
          st.budget_bytes, st.swap_bytes);
    CHECK(st.pswpout > 0 && st.pgdiscard > 0 && st.peak_resident_bytes <= st.budget_bytes, "counters");
    CHECK(usermm_unmap(mm, p) == USERMM_OK, "unmap");
    CHECK(usermm_unmap(mm, p) == USERMM_ERR_NOT_FOUND, "unmap twice");

    /* File mappings: shared (reaches the file after flush/sync), private (never does). */
    char fpath[] = "/var/tmp/usermm-capi-file-XXXXXX";
    int ffd = mkstemp(fpath);
    CHECK(ffd >= 0 && ftruncate(ffd, 32 << 20) == 0, "file of 2x the budget");
    uint64_t *sh = usermm_map_file(mm, fpath, 0, 32 << 20, 1);
    CHECK(sh != NULL, "map_file shared: %s", usermm_last_error());
    uint64_t *pr = usermm_map_file(mm, fpath, 4096, 4096, 0);
    CHECK(pr != NULL, "map_file private: %s", usermm_last_error());
    if (sh && pr) {
        for (size_t i = 0; i < (32 << 20) / 8; i += 512) sh[i] = pattern(i);
        CHECK(usermm_flush(mm, sh, 32 << 20) == USERMM_OK, "flush");
        CHECK(usermm_sync(mm) == USERMM_OK, "sync");
        uint64_t w = 0;
        CHECK(pread(ffd, &w, 8, 512 * 8 * 1000) == 8 && w == pattern(512 * 1000), "file word");
        pr[0] = 7;
        CHECK(usermm_sync(mm) == USERMM_OK, "sync after a private store");
        CHECK(pread(ffd, &w, 8, 4096) == 8 && w == pattern(512), "private store stays private");
        CHECK(usermm_flush(mm, sh, (32 << 20) + 4096) == USERMM_ERR_INVALID, "flush past the end");
        CHECK(usermm_advise(mm, sh, 32 << 20, USERMM_ADVICE_RANDOM) == USERMM_OK, "advise random");
        CHECK(sh[512 * 3000] == pattern(512 * 3000), "a word after MADV_RANDOM");
        CHECK(usermm_advise(mm, sh, 32 << 20, USERMM_ADVICE_SEQUENTIAL) == USERMM_OK, "advise sequential");
        CHECK(usermm_advise(mm, sh, 1 << 20, USERMM_ADVICE_WILLNEED) == USERMM_OK, "advise willneed");
        CHECK(sh[512 * 100] == pattern(512 * 100), "a word after MADV_WILLNEED");
        CHECK(usermm_advise(mm, sh, 4096, 9) == USERMM_ERR_INVALID && strstr(usermm_last_error(), "9"),
              "unknown advice is named");
        CHECK(usermm_advise(mm, (char *)sh + 1, 4096, USERMM_ADVICE_WILLNEED) == USERMM_ERR_INVALID,
              "unaligned willneed");
        CHECK(usermm_advise(mm, sh, (32 << 20) + 4096, USERMM_ADVICE_WILLNEED) == USERMM_ERR_INVALID,
              "willneed past the end");
        CHECK(usermm_unmap(mm, sh) == USERMM_OK && usermm_unmap(mm, pr) == USERMM_OK, "unmap files");
    }
    CHECK(usermm_map_file(mm, "/nonexistent/x", 0, 4096, 1) == NULL &&
              strstr(usermm_last_error(), "/nonexistent/x") != NULL,
          "map_file of a missing file names it");
    CHECK(usermm_map_file(mm, fpath, 100, 4096, 1) == NULL && strstr(usermm_last_error(), "4096"),
          "map_file unaligned offset");
    CHECK(usermm_map_file(mm, NULL, 0, 4096, 1) == NULL, "map_file NULL path");
    CHECK(usermm_flush(mm, NULL, 4096) == USERMM_ERR_INVALID, "flush NULL");
    CHECK(usermm_sync(NULL) == USERMM_ERR_INVALID, "sync NULL manager");
    close(ffd);
    unlink(fpath);
    CHECK(usermm_destroy(mm) == USERMM_OK, "destroy");

    /* A named swap file: usermm creates it (a file it did not make is refused) and unlinks its
     * path at once, so another manager naming the path makes its own file. A kept file stays
     * at its path and serves one manager at a time. */
    char path[] = "/tmp/usermm-capi-swap-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    usermm_config_init(&cfg);
    cfg.budget = 4 << 20;
    cfg.swap_path = path;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "not a usermm swap file") != NULL &&
              strstr(usermm_last_error(), path) != NULL,
          "an existing file that usermm did not make is refused");
    unlink(path);
    usermm_config_init(&cfg);
    cfg.budget = 4 << 20;
    cfg.swap_path = path;
    usermm_mm *a = usermm_create(&cfg);
    CHECK(a != NULL, "manager on a swap file path");
    CHECK(access(path, F_OK) != 0, "the swap file's path is unlinked as soon as it is opened");
    usermm_mm *b = usermm_create(&cfg);
    CHECK(b != NULL, "a second manager naming the path makes its own file");
    CHECK(usermm_destroy(b) == USERMM_OK && usermm_destroy(a) == USERMM_OK, "destroy both");
    CHECK(access(path, F_OK) != 0, "nothing is left at the path");
    cfg.swap_keep = 1;
    a = usermm_create(&cfg);
    CHECK(a != NULL && access(path, F_OK) == 0, "a kept swap file stays at its path");
    b = usermm_create(&cfg);
    CHECK(b == NULL && strstr(usermm_last_error(), "in use by another usermm manager") != NULL,
          "second manager on the same kept swap file");
    CHECK(usermm_destroy(a) == USERMM_OK, "destroy the first");
    b = usermm_create(&cfg);
    CHECK(b != NULL, "the kept file is reused once its manager is gone");
    usermm_destroy(b);
    unlink(path);

    /* A compressed tier by spec: mixed pages through zswap over RAM. */
    usermm_config_init(&cfg);
    cfg.budget = 8 << 20;
    cfg.swap_kind = USERMM_SWAP_SPEC;
    cfg.swap_path = "zswap:pool=25%+ram";
    cfg.swap_size = 64 << 20;
    usermm_mm *z = usermm_create(&cfg);
    CHECK(z != NULL, "zswap manager: %s", usermm_last_error());
    if (!z) return;
    size_t zlen = 32 << 20, zn = zlen / 8, zbad = 0;
    uint64_t *q = usermm_map_anon(z, zlen);
    CHECK(q != NULL, "map_anon on zswap");
    if (!q) return;
    for (size_t i = 0; i < zn; i++) q[i] = (i / 512) % 2 ? pattern(i) : (i / 512) & 0xff;
    for (size_t i = 0; i < zn; i++) zbad += q[i] != ((i / 512) % 2 ? pattern(i) : (i / 512) & 0xff);
    CHECK(zbad == 0, "%zu words wrong through zswap", zbad);
    uint64_t zout = 0, zsame = 0;
    CHECK(usermm_vmstat_get(z, "zswpout", &zout) == USERMM_OK && zout > 0, "zswpout %" PRIu64, zout);
    CHECK(usermm_vmstat_get(z, "zswap_same_filled", &zsame) == USERMM_OK, "zswap_same_filled");
    CHECK(usermm_unmap(z, q) == USERMM_OK && usermm_destroy(z) == USERMM_OK, "zswap teardown");
}

/* Words stored by test_swapopts: a 40-bit tag over a 24-bit index. A random (encrypted) word
 * matches the tag with probability 2^-40. */
#define SWAP_TAG 0x5eed5eed5e000000ull
#define SWAP_TAG_MASK 0xffffffffff000000ull

/* How many 8-byte words of the file at `path` carry SWAP_TAG (-1 if it cannot be read). */
static long tagged_words(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    static uint64_t buf[1 << 17];
    long n = 0;
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < got / 8; i++) n += (buf[i] & SWAP_TAG_MASK) == SWAP_TAG;
    close(fd);
    return got < 0 ? -1 : n;
}

/* The /proc/self/fd name of this process's open swap file for `path`, which has no name: its
 * path unlinked at open ("PATH (deleted)") or never linked (made with O_TMPFILE in the path's
 * directory: "DIR/#INODE (deleted)"); 0 if there is none. */
static int unlinked_fd_of(const char *path, char *out, size_t outlen) {
    char want[PATH_MAX + 16], dirpfx[PATH_MAX + 16], link[PATH_MAX + 16];
    snprintf(want, sizeof want, "%s (deleted)", path);
    snprintf(dirpfx, sizeof dirpfx, "%s", path);
    char *slash = strrchr(dirpfx, '/');
    if (slash) slash[1] = '#', slash[2] = 0;
    else snprintf(dirpfx, sizeof dirpfx, "./#");
    const char *del = " (deleted)";
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        char name[64 + 256];
        snprintf(name, sizeof name, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(name, link, sizeof link - 1);
        if (n < 0) continue;
        link[n] = 0;
        size_t ln = strlen(link), dl = strlen(del);
        int nameless = !strncmp(link, dirpfx, strlen(dirpfx)) && ln > dl && !strcmp(link + ln - dl, del);
        if (!strcmp(link, want) || nameless) {
            snprintf(out, outlen, "%s", name);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* One manager on a named swap file with swap_encrypt = `enc` and swap_keep = `keep`: 16 MiB
 * through a 4 MiB budget. Returns how many plain pattern words the swap file held while the
 * pages were swapped out (-1 on a failed step); `kept` says whether the file outlived the
 * manager. */
static long swap_file_run(const char *path, int enc, int keep, int *kept) {
    usermm_config cfg;
    usermm_config_init(&cfg);
    cfg.budget = 4 << 20;
    cfg.swap_kind = USERMM_SWAP_FILE;
    cfg.swap_path = path;
    cfg.swap_size = 64 << 20;
    cfg.swap_encrypt = enc;
    cfg.swap_keep = keep;
    usermm_mm *mm = usermm_create(&cfg);
    CHECK(mm != NULL, "create on %s (encrypt %d, keep %d)", path, enc, keep);
    if (!mm) return -1;
    size_t len = 16 << 20, n = len / 8, bad = 0;
    uint64_t *p = usermm_map_anon(mm, len);
    CHECK(p != NULL, "map_anon");
    if (!p) return -1;
    for (size_t i = 0; i < n; i++) p[i] = SWAP_TAG | (i & 0xffffff);
    for (size_t i = 0; i < n; i++) bad += p[i] != (SWAP_TAG | (i & 0xffffff));
    CHECK(bad == 0, "%zu words wrong through a swap file with encrypt %d", bad, enc);
    CHECK(stat_of(mm, "pswpout") * 4096 >= len / 2, "pages went to the swap file (encrypt %d)", enc);
    long words;
    if (keep) {
        words = tagged_words(path);
    } else {
        /* Not kept: the path is gone while the manager lives (nothing survives a SIGKILL);
         * the file is read through the manager's descriptor. */
        char fdname[64 + 256];
        CHECK(access(path, F_OK) != 0, "swap_keep=0: %s unlinked as soon as it is opened", path);
        CHECK(unlinked_fd_of(path, fdname, sizeof fdname), "an open descriptor of unlinked %s", path);
        words = tagged_words(fdname);
    }
    CHECK(words >= 0, "reading swap file %s: %s", path, strerror(errno));
    CHECK(usermm_unmap(mm, p) == USERMM_OK && usermm_destroy(mm) == USERMM_OK, "teardown");
    *kept = access(path, F_OK) == 0;
    return words;
}

static void test_swapopts(void) {
    char path[] = "/var/tmp/usermm-capi-swapopts-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    unlink(path); /* a new path: usermm creates the file */
    int kept = 0;

    usermm_config cfg;
    usermm_config_init(&cfg);
    CHECK(cfg.swap_encrypt == 0 && cfg.swap_keep == 0, "defaults: encrypt %d keep %d", cfg.swap_encrypt,
          cfg.swap_keep);

    /* Plain and kept: the file holds the pages as they were and stays after destroy. */
    long plain = swap_file_run(path, 0, 1, &kept);
    CHECK(plain > 1000, "an unencrypted swap file holds the plain pages: %ld tagged words", plain);
    CHECK(kept, "swap_keep=1: %s stays after usermm_destroy", path);
    long left = tagged_words(path);
    CHECK(left > 0, "the kept file still holds the pages: %ld", left);

    /* Encrypted, reusing the kept file (usermm recognises its own header), and kept again: not
     * one plain word reaches the disk, during the run or after it. */
    long enc = swap_file_run(path, 1, 1, &kept);
    CHECK(enc == 0, "swap_encrypt=1: %ld plain words on disk", enc);
    CHECK(kept, "swap_keep=1 with encryption: the file stays");
    left = tagged_words(path);
    CHECK(left == 0, "the kept encrypted file holds no plain word: %ld", left);

    /* Not kept (the default): unlinked at once, gone with its manager. */
    enc = swap_file_run(path, 1, 0, &kept);
    CHECK(enc == 0, "swap_encrypt=1, not kept: %ld plain words on disk", enc);
    CHECK(!kept, "swap_keep=0: %s not on disk after usermm_destroy", path);
    unlink(path);

    /* Flags are 0 or 1; anything else is named. */
    usermm_config_init(&cfg);
    cfg.budget = 4 << 20;
    cfg.swap_kind = USERMM_SWAP_RAM;
    cfg.swap_encrypt = 2;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "swap_encrypt 2") != NULL,
          "swap_encrypt 2 refused: %s", usermm_last_error());
    usermm_config_init(&cfg);
    cfg.budget = 4 << 20;
    cfg.swap_kind = USERMM_SWAP_RAM;
    cfg.swap_keep = -1;
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "swap_keep -1") != NULL,
          "swap_keep -1 refused: %s", usermm_last_error());
    printf("swapopts: plain %ld tagged words, encrypted 0\n", plain);
}

static void test_group(void) {
    char path[] = "/tmp/usermm-capi-group-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    unlink(path);
    CHECK(usermm_group_create(path, 16 << 20) == USERMM_OK, "group_create: %s", usermm_last_error());
    CHECK(usermm_group_create(path, 16 << 20) == USERMM_ERR_INVALID && strstr(usermm_last_error(), path),
          "a second create names the path: %s", usermm_last_error());
    CHECK(usermm_group_create(NULL, 16 << 20) == USERMM_ERR_INVALID, "NULL path refused");
    usermm_config cfg;
    usermm_config_init(&cfg);
    CHECK(cfg.group == NULL, "no group by default");
    cfg.budget = 16 << 20;
    cfg.swap_kind = USERMM_SWAP_RAM;
    cfg.swap_size = 256 << 20;
    cfg.group = path;
    usermm_mm *a = usermm_create(&cfg), *b = usermm_create(&cfg);
    CHECK(a && b, "two managers join the group: %s", usermm_last_error());
    if (!a || !b) return;
    size_t len = 48 << 20, n = len / 8, bad = 0;
    uint64_t *p = usermm_map_anon(a, len), *q = usermm_map_anon(b, len);
    CHECK(p && q, "map_anon in both");
    if (!p || !q) return;
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n; i++) p[i] = pattern(i);
        for (size_t i = 0; i < n; i++) q[i] = ~pattern(i);
    }
    for (size_t i = 0; i < n; i++) bad += (p[i] != pattern(i)) + (q[i] != ~pattern(i));
    CHECK(bad == 0, "%zu words wrong", bad);
    uint64_t ra = 0, rb = 0, pa = 0, pb = 0;
    usermm_vmstat_get(a, "resident_bytes", &ra);
    usermm_vmstat_get(b, "resident_bytes", &rb);
    usermm_vmstat_get(a, "peak_resident_bytes", &pa);
    usermm_vmstat_get(b, "peak_resident_bytes", &pb);
    CHECK(ra + rb <= 16 << 20, "together within the one budget: %" PRIu64 " + %" PRIu64, ra, rb);
    CHECK(pa <= 16 << 20 && pb <= 16 << 20, "peaks %" PRIu64 " %" PRIu64, pa, pb);
    usermm_destroy(a);
    usermm_destroy(b);
    cfg.group = "/nonexistent/usermm-group";
    CHECK(usermm_create(&cfg) == NULL && strstr(usermm_last_error(), "/nonexistent/usermm-group"),
          "a missing group file is named: %s", usermm_last_error());
    unlink(path);
}

static void test_badenv(void) {
    errno = 0;
    void *p = usermm_mmap(NULL, 4096, RW, PA, -1, 0);
    CHECK(p == MAP_FAILED && errno == EINVAL, "usermm_mmap with a bad USERMM_BUDGET: errno %d", errno);
    const char *m = usermm_last_error();
    CHECK(strstr(m, "USERMM_BUDGET") != NULL && strstr(m, "256Q") != NULL, "message: %s", m);
    CHECK(usermm_default() == NULL, "usermm_default with a bad environment");
    printf("badenv message: %s\n", usermm_last_error());
}

/* fork(): usermm memory is not inherited (MADV_DONTFORK). A child touching it dies of SIGSEGV,
 * as before, but first says why in one line on stderr naming the address, the range and the
 * parent; the parent's memory is unchanged. A SIGSEGV elsewhere in the child says nothing. */
static void fork_child_touch(volatile uint64_t *p, int errfd) {
    dup2(errfd, 2);
    (void)p[0];
    _exit(0); /* not reached */
}

static void test_fork(void) {
    usermm_mm *mm = usermm_default();
    CHECK(mm != NULL, "usermm_default");
    size_t len = 1 << 20;
    uint64_t *p = usermm_mmap(NULL, len, RW, PA, -1, 0);
    CHECK(p != MAP_FAILED, "usermm_mmap: %s", usermm_last_error());
    if (p == MAP_FAILED)
        return;
    for (size_t i = 0; i < len / 8; i++)
        p[i] = pattern(i);
    for (int c = 0; c < 2; c++) {
        int fds[2];
        CHECK(pipe(fds) == 0, "pipe");
        /* Case 0 touches the managed memory; case 1 an address nothing maps (page 0). */
        volatile uint64_t *target = c == 0 ? (volatile uint64_t *)(p + 1000) : (volatile uint64_t *)8;
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            fork_child_touch(target, fds[1]);
        }
        close(fds[1]);
        char buf[2048] = {0};
        size_t got = 0;
        ssize_t n;
        while (got < sizeof buf - 1 && (n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
            got += (size_t)n;
        close(fds[0]);
        int st = 0;
        CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "case %d: child status %#x, want SIGSEGV", c, st);
        if (c == 0) {
            char want[128];
            snprintf(want, sizeof want, "usermm: SIGSEGV at %p: this process is a fork() child of pid %d",
                     (void *)target, (int)getpid());
            CHECK(strstr(buf, want) != NULL, "child's stderr lacks \"%s\": %s", want, buf);
            printf("fork: the child said: %s", buf);
            CHECK(strstr(buf, "spawn") != NULL && strchr(buf, '\n') == strrchr(buf, '\n'),
                  "one line naming what to do: %s", buf);
        } else {
            CHECK(strstr(buf, "usermm") == NULL, "a SIGSEGV outside usermm memory named usermm: %s", buf);
        }
    }
    size_t bad = 0;
    for (size_t i = 0; i < len / 8; i++)
        bad += p[i] != pattern(i);
    CHECK(bad == 0, "%zu words of the parent changed", bad);
    CHECK(usermm_munmap(p, len) == 0, "usermm_munmap");
}

/* A fault taken with the dynamic loader's lock held (a library constructor running inside
 * dlopen touches swapped-out usermm memory) is served: the fault path never needs that lock
 * (a handler thread registering a thread-local destructor on its first swap-in took it, and the
 * program hung for good). alarm() turns a hang into a failure. */
static void test_dlopen(const char *lib) {
    alarm(60);
    usermm_mm *mm = usermm_default();
    CHECK(mm != NULL, "usermm_default");
    size_t len = 64 << 20, n = len / 8;
    uint64_t *p = usermm_mmap(NULL, len, RW, PA, -1, 0);
    CHECK(p != MAP_FAILED, "usermm_mmap: %s", usermm_last_error());
    if (p == MAP_FAILED)
        return;
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(i);
    CHECK(stat_of(mm, "pswpout") > 0, "nothing swapped out");
    char addr[32];
    snprintf(addr, sizeof addr, "%" PRIxPTR, (uintptr_t)&p[7]);
    setenv("USERMM_TOUCH_ADDR", addr, 1);
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
    if (h) {
        uint64_t *v = dlsym(h, "usermm_touch_value");
        CHECK(v != NULL && *v == pattern(7), "the constructor read %#" PRIx64 ", want %#" PRIx64,
              v ? *v : 0, pattern(7));
        dlclose(h);
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != pattern(i);
    CHECK(bad == 0, "%zu words wrong", bad);
    CHECK(usermm_munmap(p, len) == 0, "usermm_munmap");
    alarm(0);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (!strcmp(what, "big"))
        test_big();
    else if (!strcmp(what, "bad"))
        test_bad();
    else if (!strcmp(what, "handle"))
        test_handle();
    else if (!strcmp(what, "badenv"))
        test_badenv();
    else if (!strcmp(what, "swapopts"))
        test_swapopts();
    else if (!strcmp(what, "fork"))
        test_fork();
    else if (!strcmp(what, "group"))
        test_group();
    else if (!strcmp(what, "dlopen") && argc > 2)
        test_dlopen(argv[2]);
    else {
        fprintf(stderr, "usage: capi_test big|bad|handle|badenv|swapopts|fork|group|dlopen LIB\n");
        return 2;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

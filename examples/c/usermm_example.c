/*
 * usermm_example.c: the C API in one page. A manager with a 64 MiB budget and a 256 MiB RAM
 * swap device maps 4x its budget, writes every word, reads it back, prints the counters;
 * then usermm_mmap (the mmap(2)-compatible call on the default manager) does the same.
 *
 *   cargo build --release -p usermm-capi
 *   gcc -O2 examples/c/usermm_example.c $(PKG_CONFIG_PATH=target/release/pkgconfig pkg-config --cflags --libs usermm) \
 *       -Wl,-rpath,$PWD/target/release -o /tmp/usermm_example && /tmp/usermm_example
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "usermm.h"

int main(void) {
    usermm_config cfg;
    usermm_config_init(&cfg);
    cfg.budget = 64 << 20;
    cfg.swap_kind = USERMM_SWAP_RAM;
    cfg.swap_size = 256 << 20;
    usermm_mm *mm = usermm_create(&cfg);
    if (!mm) {
        fprintf(stderr, "usermm_create: %s\n", usermm_last_error());
        return 1;
    }
    size_t len = 4 * cfg.budget;
    uint64_t *p = usermm_map_anon(mm, len);
    if (!p) {
        fprintf(stderr, "usermm_map_anon: %s\n", usermm_last_error());
        return 1;
    }
    size_t n = len / sizeof *p;
    for (size_t i = 0; i < n; i++) p[i] = i * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != i * 0x9e3779b97f4a7c15ull) {
            fprintf(stderr, "word %zu is wrong\n", i);
            return 1;
        }
    }
    usermm_vmstat_t st;
    usermm_vmstat(mm, &st, sizeof st);
    printf("handle API: %zu MiB through a %" PRIu64 " MiB budget: peak resident %" PRIu64
           " MiB, pswpout %" PRIu64 ", pswpin %" PRIu64 "\n",
           len >> 20, st.budget_bytes >> 20, st.peak_resident_bytes >> 20, st.pswpout, st.pswpin);
    usermm_unmap(mm, p);
    usermm_destroy(mm);

    /* mmap(2) conventions on the default manager (USERMM_BUDGET etc. from the environment). */
    char *q = usermm_mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) {
        fprintf(stderr, "usermm_mmap: %s (%s)\n", strerror(errno), usermm_last_error());
        return 1;
    }
    strcpy(q + 4096, "hello from usermm_mmap");
    printf("%s\n", q + 4096);
    if (usermm_mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
        printf("MAP_SHARED: %s: %s\n", strerror(errno), usermm_last_error());
    return usermm_munmap(q, 8 << 20);
}

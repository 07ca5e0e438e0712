/*
 * bigmalloc.c: an ordinary C program (no usermm in it) that mallocs MiB bytes in chunks of
 * CHUNK MiB, writes a pattern into every word, reads everything back, grows one chunk with
 * realloc and frees everything. Used by `usermm run` tests:
 *
 *   bigmalloc MiB [CHUNK_MiB]     prints "verified N MiB" or the first wrong word, exit 1
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t pattern(size_t chunk, size_t i) { return ((uint64_t)chunk << 48) ^ (i * 0x9e3779b97f4a7c15ull); }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bigmalloc MiB [CHUNK_MiB]\n");
        return 2;
    }
    size_t total = strtoull(argv[1], NULL, 10) << 20;
    size_t chunk = (argc > 2 ? strtoull(argv[2], NULL, 10) : 64) << 20;
    size_t n = (total + chunk - 1) / chunk;
    uint64_t **p = calloc(n, sizeof *p);
    for (size_t c = 0; c < n; c++) {
        p[c] = malloc(chunk);
        if (!p[c]) {
            fprintf(stderr, "malloc of chunk %zu failed\n", c);
            return 1;
        }
        for (size_t i = 0; i < chunk / 8; i++) p[c][i] = pattern(c, i);
    }
    for (size_t c = 0; c < n; c++)
        for (size_t i = 0; i < chunk / 8; i++)
            if (p[c][i] != pattern(c, i)) {
                fprintf(stderr, "chunk %zu word %zu: %#llx, want %#llx\n", c, i, (unsigned long long)p[c][i],
                        (unsigned long long)pattern(c, i));
                return 1;
            }
    /* Grow the first chunk: its contents must move along. */
    uint64_t *g = realloc(p[0], 2 * chunk);
    if (!g) {
        fprintf(stderr, "realloc failed\n");
        return 1;
    }
    for (size_t i = 0; i < chunk / 8; i++)
        if (g[i] != pattern(0, i)) {
            fprintf(stderr, "after realloc: word %zu wrong\n", i);
            return 1;
        }
    p[0] = g;
    /* calloc'd memory is zero. */
    uint64_t *z = calloc(chunk / 8, 8);
    for (size_t i = 0; i < chunk / 8; i += 511)
        if (z[i]) {
            fprintf(stderr, "calloc memory not zero at word %zu\n", i);
            return 1;
        }
    free(z);
    for (size_t c = 0; c < n; c++) free(p[c]);
    free(p);
    printf("verified %zu MiB\n", total >> 20);
    return 0;
}

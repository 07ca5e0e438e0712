/*
 * threads.c: THREADS threads each allocate, fill, verify and free a CHUNK MiB buffer ROUNDS
 * times (malloc and realloc above the threshold, small mallocs in between), concurrently; the
 * buffers together exceed the budget. Prints "threads ok" or the first wrong word.
 *
 *   threads THREADS CHUNK_MiB ROUNDS
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static size_t chunk;
static int rounds, bad;

static void *work(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    for (int r = 0; r < rounds; r++) {
        size_t n = chunk / 8;
        uint64_t *p = malloc(chunk / 2);
        char *small[64];
        for (int i = 0; i < 64; i++) small[i] = malloc(100 + i);
        p = realloc(p, chunk);
        if (!p) { __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED); return NULL; }
        for (size_t i = 0; i < n; i++) p[i] = (id << 56) ^ ((uint64_t)r << 48) ^ i;
        for (size_t i = 0; i < n; i++)
            if (p[i] != ((id << 56) ^ ((uint64_t)r << 48) ^ i)) {
                fprintf(stderr, "thread %lu round %d word %zu wrong\n", (unsigned long)id, r, i);
                __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
                break;
            }
        for (int i = 0; i < 64; i++) free(small[i]);
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: threads THREADS CHUNK_MiB ROUNDS\n"); return 2; }
    int nt = atoi(argv[1]);
    chunk = strtoull(argv[2], NULL, 10) << 20;
    rounds = atoi(argv[3]);
    pthread_t t[64];
    for (int i = 0; i < nt && i < 64; i++) pthread_create(&t[i], NULL, work, (void *)(uintptr_t)i);
    for (int i = 0; i < nt && i < 64; i++) pthread_join(t[i], NULL);
    printf(bad ? "threads FAILED\n" : "threads ok\n");
    return bad != 0;
}

/*
 * smallthreads.c: T threads allocate and free small blocks concurrently, and free each
 * other's blocks: each thread builds R rounds of N blocks of 8..520 bytes with a pattern,
 * hands half of them to the next thread through a shared slot (freed there), verifies and
 * frees its own. Also checks calloc zeroing, posix_memalign/aligned_alloc/memalign/valloc/
 * pvalloc alignment and malloc_usable_size in every thread. Prints "smallthreads ok".
 *
 *   smallthreads T N R
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int T, N, R;
static void **handoff[64];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t bar;
static long failures;

static void fail(const char *what, int t) {
    pthread_mutex_lock(&mu);
    failures++;
    printf("thread %d: %s\n", t, what);
    pthread_mutex_unlock(&mu);
}

static size_t size_of(int t, int r, int i) { return 8 + ((size_t)(t * 7919 + r * 104729 + i * 31) % 513); }
static unsigned char pat(int t, int i) { return (unsigned char)(t * 31 + i); }

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    void **mine = malloc(N * sizeof(void *));
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < N; i++) {
            size_t s = size_of(t, r, i);
            unsigned char *p = (i % 5 == 0) ? calloc(1, s) : malloc(s);
            if (!p) { fail("allocation failed", t); return NULL; }
            if (i % 5 == 0)
                for (size_t k = 0; k < s; k++) if (p[k]) { fail("calloc not zeroed", t); break; }
            if (malloc_usable_size(p) < s) fail("malloc_usable_size too small", t);
            memset(p, pat(t, i), s);
            mine[i] = p;
        }
        /* Hand the odd blocks to the next thread. */
        void **give = malloc(N * sizeof(void *));
        int g = 0;
        for (int i = 1; i < N; i += 2) { give[g++] = mine[i]; }
        give[g] = NULL;
        pthread_mutex_lock(&mu);
        handoff[(t + 1) % T] = give;
        pthread_mutex_unlock(&mu);
        pthread_barrier_wait(&bar);
        pthread_mutex_lock(&mu);
        void **got = handoff[t];
        handoff[t] = NULL;
        pthread_mutex_unlock(&mu);
        int from = (t + T - 1) % T;
        for (int k = 0; got && got[k]; k++) {
            int i = 1 + 2 * k;
            unsigned char *p = got[k];
            size_t s = size_of(from, r, i);
            for (size_t b = 0; b < s; b++) if (p[b] != pat(from, i)) { fail("handed block corrupted", t); break; }
            free(p); /* cross-thread free */
        }
        free(got);
        for (int i = 0; i < N; i += 2) {
            unsigned char *p = mine[i];
            size_t s = size_of(t, r, i);
            for (size_t b = 0; b < s; b++) if (p[b] != pat(t, i)) { fail("own block corrupted", t); break; }
            p = realloc(p, s * 3);
            if (!p) { fail("realloc failed", t); return NULL; }
            for (size_t b = 0; b < s; b++) if (p[b] != pat(t, i)) { fail("realloc lost data", t); break; }
            free(p);
        }
        pthread_barrier_wait(&bar);
    }
    free(mine);
    size_t aligns[] = {16, 64, 4096, 65536};
    for (int a = 0; a < 4; a++) {
        void *p = NULL;
        if (posix_memalign(&p, aligns[a], 1000) != 0 || ((uintptr_t)p % aligns[a])) fail("posix_memalign", t);
        free(p);
        p = aligned_alloc(aligns[a], 2 * aligns[a]);
        if (!p || ((uintptr_t)p % aligns[a])) fail("aligned_alloc", t);
        free(p);
        p = memalign(aligns[a], 100);
        if (!p || ((uintptr_t)p % aligns[a])) fail("memalign", t);
        free(p);
    }
    void *v = valloc(100), *pv = pvalloc(100);
    long pg = sysconf(_SC_PAGESIZE);
    if (!v || ((uintptr_t)v % pg) || !pv || ((uintptr_t)pv % pg) || malloc_usable_size(pv) < (size_t)pg)
        fail("valloc/pvalloc", t);
    free(v);
    free(pv);
    void *z = NULL;
    if (posix_memalign(&z, 24, 10) == 0) fail("posix_memalign accepted alignment 24", t);
    return NULL;
}

int main(int argc, char **argv) {
    T = argc > 1 ? atoi(argv[1]) : 4;
    N = argc > 2 ? atoi(argv[2]) : 100000;
    R = argc > 3 ? atoi(argv[3]) : 3;
    if (T < 2 || T > 64) return 2;
    pthread_barrier_init(&bar, NULL, T);
    pthread_t th[64];
    for (int t = 0; t < T; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    if (failures) { printf("smallthreads FAILED (%ld)\n", failures); return 1; }
    printf("smallthreads ok\n");
    return 0;
}

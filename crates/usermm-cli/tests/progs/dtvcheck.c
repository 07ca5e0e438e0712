/*
 * dtvcheck.c: where a thread's DTV lives. Every thread-local access of a shared library goes
 * through __tls_get_addr, which reads the thread's DTV (dynamic thread vector, x86-64: the
 * second word of the TCB); glibc's pthread_create allocates it with calloc. Under usermm run it
 * must not be in managed memory (a userfaultfd-registered mapping, "um" in the VmFlags of
 * /proc/self/smaps): usermm's own code reads thread-locals on the program's threads, some
 * while it holds a lock, and a fault there would wait for a handler that waits for that lock.
 * The program's own heap must be managed (the check is meaningful only then).
 *
 *   dtvcheck T    prints "heap managed 1, dtv managed K of T"
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 if addr lies in a userfaultfd-registered mapping, 0 if in another one, -1 if in none. */
static int managed(const void *addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) { perror("/proc/self/smaps"); exit(2); }
    char line[512];
    int in = 0, res = -1;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char dash;
        if (sscanf(line, "%lx%c%lx", &lo, &dash, &hi) == 3 && dash == '-') {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            res = strstr(line, " um") != NULL;
            break;
        }
    }
    fclose(f);
    return res;
}

static int results[64];

static void *thr(void *arg) {
    int i = (int)(intptr_t)arg;
    void **tp = __builtin_thread_pointer();
    results[i] = managed(tp[1]);
    return NULL;
}

int main(int argc, char **argv) {
    int t = argc > 1 ? atoi(argv[1]) : 4;
    if (t < 1 || t > 64) { fprintf(stderr, "1..64 threads\n"); return 2; }
    void *heap = malloc(100);
    int heap_managed = managed(heap);
    pthread_t th[64];
    for (int i = 0; i < t; i++)
        if (pthread_create(&th[i], NULL, thr, (void *)(intptr_t)i)) { perror("pthread_create"); return 2; }
    int k = 0;
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        if (results[i] < 0) { fprintf(stderr, "thread %d: its DTV is in no mapping\n", i); return 2; }
        k += results[i];
    }
    printf("heap managed %d, dtv managed %d of %d\n", heap_managed, k, t);
    free(heap);
    return 0;
}

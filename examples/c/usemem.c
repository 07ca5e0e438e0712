/*
 * usemem.c: vm-scalability's usemem as a plain C program (no usermm in it), for `usermm run`
 * and for comparing with the kernel. Each task (a forked process, like usemem -n) maps SIZE
 * bytes of private anonymous memory, writes every word (one word every STEP bytes with -j),
 * reads it back with --verify, and prints usemem's line
 *     N bytes / M usecs = K KB/s
 * The parent prints the sum as "throughput K KB/s" and exits non-zero if any task failed.
 *
 *   usemem [-n TASKS] [-j STEP] [-r REPEAT] [--malloc] [--verify] SIZE     (SIZE: 256M, 1G, ...)
 *
 *   gcc -O2 -o usemem examples/c/usemem.c
 *   ./usemem --verify 1G                                  # the kernel
 *   usermm run --budget 256M -- ./usemem --verify 1G      # usermm under a 256 MiB budget
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1 << 20; break;
    case 'g': case 'G': v *= 1 << 30; break;
    case 't': case 'T': v *= (double)(1ull << 40); break;
    case 0: break;
    default: fprintf(stderr, "usemem: bad size %s\n", s); exit(2);
    }
    return (uint64_t)v;
}

static uint64_t now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

static uint64_t word(int task, size_t i) { return ((uint64_t)task << 56) ^ (i * 0x9e3779b97f4a7c15ull); }

/* One task: returns 0 on success; writes its throughput (KB/s) to *kbs. */
static int task(int id, uint64_t size, uint64_t step, int repeat, int use_malloc, int verify, uint64_t *kbs) {
    uint64_t *p;
    if (use_malloc) {
        p = malloc(size);
        if (!p) { fprintf(stderr, "usemem: malloc(%" PRIu64 "): %s\n", size, strerror(errno)); return 1; }
    } else {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { fprintf(stderr, "usemem: mmap(%" PRIu64 "): %s\n", size, strerror(errno)); return 1; }
    }
    size_t n = size / 8, stride = step / 8 ? step / 8 : 1;
    uint64_t t0 = now_us();
    for (int r = 0; r < repeat; r++)
        for (size_t i = 0; i < n; i += stride) p[i] = word(id, i);
    uint64_t us = now_us() - t0;
    if (!us) us = 1;
    uint64_t bytes = size * repeat;
    *kbs = bytes * 1000000 / 1024 / us;
    printf("%" PRIu64 " bytes / %" PRIu64 " usecs = %" PRIu64 " KB/s\n", bytes, us, *kbs);
    fflush(stdout);
    if (verify) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i += stride) bad += p[i] != word(id, i);
        if (bad) { fprintf(stderr, "usemem: task %d: %zu words wrong\n", id, bad); return 1; }
        printf("task %d verified %" PRIu64 " bytes\n", id, size);
    }
    if (use_malloc) free(p); else munmap(p, size);
    return 0;
}

int main(int argc, char **argv) {
    int tasks = 1, repeat = 1, use_malloc = 0, verify = 0;
    uint64_t step = 8, size = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) tasks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-j") && i + 1 < argc) step = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--malloc")) use_malloc = 1;
        else if (!strcmp(argv[i], "--verify")) verify = 1;
        else if (argv[i][0] != '-') size = parse_size(argv[i]);
        else { fprintf(stderr, "usemem: unknown option %s\n", argv[i]); return 2; }
    }
    if (!size || tasks < 1 || repeat < 1) {
        fprintf(stderr, "usage: usemem [-n TASKS] [-j STEP] [-r REPEAT] [--malloc] [--verify] SIZE\n");
        return 2;
    }
    size &= ~(uint64_t)7;
    if (tasks == 1) {
        uint64_t kbs;
        int rc = task(0, size, step, repeat, use_malloc, verify, &kbs);
        if (!rc) printf("throughput %" PRIu64 " KB/s\n", kbs);
        return rc;
    }
    int pipefd[2];
    if (pipe(pipefd)) { perror("pipe"); return 1; }
    for (int t = 0; t < tasks; t++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            uint64_t kbs = 0;
            int rc = task(t, size, step, repeat, use_malloc, verify, &kbs);
            if (write(pipefd[1], &kbs, sizeof kbs) != sizeof kbs) rc = 1;
            exit(rc);
        }
    }
    int failed = 0;
    for (int t = 0; t < tasks; t++) {
        int st;
        wait(&st);
        failed += !WIFEXITED(st) || WEXITSTATUS(st);
    }
    uint64_t sum = 0, k;
    close(pipefd[1]);
    while (read(pipefd[0], &k, sizeof k) == sizeof k) sum += k;
    printf("throughput %" PRIu64 " KB/s\n", sum);
    return failed ? 1 : 0;
}

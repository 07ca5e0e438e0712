/*
 * orphan.c: a fork child that outlives its parent under `usermm run`. The parent fills a MiB
 * buffer (mostly swapped out at a small budget) and forks; the child waits until the parent
 * is gone, then checks every word and writes "orphan ok" (or what was wrong) to OUT. The
 * parent ends with exit(3), _exit(2), or SIGKILL ("kill", 0.3 s after the fork): an exiting
 * parent hands the pages it shares with the child over; a killed one cannot, and the child
 * must then die of SIGBUS with a message, never read zeros. With "daemon" the process calls
 * daemon(3) instead of fork, whose parent leaves through glibc's internal _exit, and the
 * daemon checks the words.
 *
 *   orphan MiB OUT exit|_exit|kill|daemon
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1u << 20)

static uint64_t val(size_t i) { return (i * 0x9e3779b97f4a7c15ull) ^ 0x55; }

static int check(const uint64_t *p, size_t n, const char *out) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += p[i] != val(i);
    FILE *f = fopen(out, "w");
    if (!f) return 3;
    if (bad) fprintf(f, "orphan FAILED: %zu words wrong\n", bad);
    else fprintf(f, "orphan ok\n");
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    size_t n = strtoull(argv[1], NULL, 10) * MIB / 8;
    uint64_t *p = malloc(n * 8);
    if (!p) return 1;
    for (size_t i = 0; i < n; i++) p[i] = val(i);
    pid_t parent = getpid();
    fflush(stdout);
    if (!strcmp(argv[3], "daemon")) {
        /* nochdir: OUT may be relative; noclose: the test reads our stderr. */
        if (daemon(1, 1) != 0) return 4;
        return check(p, n, argv[2]);
    }
    if (fork() == 0) {
        while (getppid() == parent) usleep(10000);
        exit(check(p, n, argv[2]));
    }
    if (!strcmp(argv[3], "kill")) {
        usleep(300 * 1000);
        kill(getpid(), SIGKILL);
    }
    if (!strcmp(argv[3], "_exit")) _exit(0);
    return 0;
}

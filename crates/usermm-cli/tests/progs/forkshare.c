/*
 * forkshare.c: fork(2) of a process whose managed memory is mostly swapped out, under
 * `usermm run` with a budget far below it. The swapped pages of a large range are shared
 * with the child by swap slot (read when the child touches them), the resident ones copied;
 * every side must see exactly the memory it had at fork, whatever the other writes after.
 *
 *   parent  fills a MiB buffer with pattern 1 and forks:
 *   child 1 checks the whole buffer is pattern 1, writes pattern 2 over the even MiBs and
 *           checks (even 2, odd 1), twice (reclaim runs all along: the budget is small);
 *   parent  meanwhile writes pattern 3 over the odd MiBs and checks (odd 3, even 1);
 *   child 2 forked after that sees (odd 3, even 1), forks a grandchild that checks the same
 *           (pages it shares with child 2, some of them child 2 shares with the parent),
 *           and checks again after the grandchild is gone;
 *   child 3 is killed with SIGKILL while it holds shared pages; the parent checks on after.
 * Prints "forkshare ok" and the time fork() took in the parent for child 1.
 *
 *   forkshare MiB
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1u << 20)

static uint64_t val(size_t i, uint64_t seed) { return (i * 0x9e3779b97f4a7c15ull) ^ (seed << 56); }

/* Fills (fill) or checks the MiBs of p whose index is odd (which = 1), even (0) or all (2). */
static size_t pass(uint64_t *p, size_t mibs, int which, uint64_t seed, int fill) {
    size_t bad = 0, per = MIB / 8;
    for (size_t m = 0; m < mibs; m++) {
        if (which != 2 && (int)(m & 1) != which) continue;
        for (size_t i = m * per; i < (m + 1) * per; i++) {
            if (fill) p[i] = val(i, seed);
            else bad += p[i] != val(i, seed);
        }
    }
    return bad;
}

static int status_ok(pid_t pid, const char *who) {
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("%s failed: status %#x\n", who, st);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    size_t mibs = argc > 1 ? strtoull(argv[1], NULL, 10) : 96;
    uint64_t *p = malloc(mibs * MIB);
    if (!p) return 1;
    pass(p, mibs, 2, 1, 1);
    fflush(stdout);
    int pipefd[2];
    if (pipe(pipefd)) return 2;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t c1 = fork();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (c1 == 0) {
        close(pipefd[1]);
        if (pass(p, mibs, 2, 1, 0)) { printf("child 1: its memory is not the parent's at fork\n"); _exit(3); }
        pass(p, mibs, 0, 2, 1);
        for (int k = 0; k < 2; k++)
            if (pass(p, mibs, 0, 2, 0) || pass(p, mibs, 1, 1, 0)) { printf("child 1: pass %d wrong\n", k); _exit(4); }
        exit(0);
    }
    close(pipefd[0]);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    pass(p, mibs, 1, 3, 1);
    int ok = 1;
    if (pass(p, mibs, 1, 3, 0) || pass(p, mibs, 0, 1, 0)) { printf("parent: wrong after child 1 forked\n"); ok = 0; }
    ok &= status_ok(c1, "child 1");

    pid_t c2 = fork();
    if (c2 == 0) {
        if (pass(p, mibs, 1, 3, 0) || pass(p, mibs, 0, 1, 0)) { printf("child 2: wrong at fork\n"); _exit(5); }
        pid_t g = fork();
        if (g == 0) {
            if (pass(p, mibs, 1, 3, 0) || pass(p, mibs, 0, 1, 0)) { printf("grandchild: wrong\n"); _exit(6); }
            pass(p, mibs, 2, 7, 1);
            exit(pass(p, mibs, 2, 7, 0) ? 7 : 0);
        }
        if (!status_ok(g, "grandchild")) _exit(8);
        if (pass(p, mibs, 1, 3, 0) || pass(p, mibs, 0, 1, 0)) { printf("child 2: wrong after the grandchild\n"); _exit(9); }
        exit(0);
    }
    ok &= status_ok(c2, "child 2");

    pid_t c3 = fork();
    if (c3 == 0) {
        /* Touch a little, then wait to be killed. */
        volatile uint64_t x = p[0] + p[mibs * MIB / 8 - 1];
        (void)x;
        for (;;) pause();
    }
    usleep(200 * 1000);
    kill(c3, SIGKILL);
    int st;
    waitpid(c3, &st, 0);
    if (pass(p, mibs, 1, 3, 0) || pass(p, mibs, 0, 1, 0)) { printf("parent: wrong at the end\n"); ok = 0; }
    pass(p, mibs, 2, 9, 1);
    if (pass(p, mibs, 2, 9, 0)) { printf("parent: rewrite wrong\n"); ok = 0; }
    printf("fork of %zu MiB took %.1f ms\n", mibs, ms);
    printf(ok ? "forkshare ok\n" : "forkshare FAILED\n");
    return ok ? 0 : 1;
}

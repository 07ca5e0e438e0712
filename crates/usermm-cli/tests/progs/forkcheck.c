/*
 * forkcheck.c: what a fork()ed child sees under `usermm run`. The parent mallocs MiB bytes
 * (managed), fills them and forks:
 *   child A allocates and verifies its own large buffer (the child gets its own manager), and
 *           runs a program with system() (fork+exec under the preload), then exits 0;
 *   child B verifies its copy of the parent's buffer (the parent streams the populated
 *           managed memory to a fork child: what the kernel's copy-on-write gives), overwrites
 *           it, and exits 0 if the copy was right;
 * A stdio stream (tmpfile(): its FILE is malloc'd, so managed) is open across both forks, as
 * in any program that forks with a log or data file open: glibc's fork resets the lock of
 * every open FILE in the child before any atfork handler runs. Child B writes a line to it.
 * Then the parent verifies its whole buffer (reclaim and swap-in still work after the fork)
 * and the stream's contents, and prints "forkcheck ok".
 *
 *   forkcheck MiB
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int fill_check(uint64_t *p, size_t n, uint64_t seed, int fill) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = (i * 0x9e3779b97f4a7c15ull) ^ seed;
        if (fill) p[i] = v;
        else bad += p[i] != v;
    }
    return bad == 0;
}

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? strtoull(argv[1], NULL, 10) : 64) << 20, n = len / 8;
    uint64_t *p = malloc(len);
    if (!p) return 1;
    fill_check(p, n, 1, 1);
    FILE *log = tmpfile();
    if (!log) return 2;
    fputs("parent\n", log);
    fflush(log);
    fflush(stdout);
    pid_t a = fork();
    if (a == 0) {
        uint64_t *q = malloc(len);
        if (!q) _exit(10);
        fill_check(q, n, 2, 1);
        if (!fill_check(q, n, 2, 0)) _exit(11);
        free(q);
        if (system("true") != 0) _exit(12);
        exit(0);
    }
    pid_t b = fork();
    if (b == 0) {
        if (!fill_check(p, n, 1, 0)) {
            printf("child B: its copy of the parent's buffer is wrong\n");
            _exit(1);
        }
        fill_check(p, n, 4, 1);
        fputs("child B\n", log);
        exit(0);
    }
    int sa, sb;
    waitpid(a, &sa, 0);
    waitpid(b, &sb, 0);
    int ok = 1;
    if (!WIFEXITED(sa) || WEXITSTATUS(sa) != 0) {
        printf("child A failed: status %#x\n", sa);
        ok = 0;
    }
    if (!WIFEXITED(sb) || WEXITSTATUS(sb) != 0) {
        printf("child B failed: status %#x\n", sb);
        ok = 0;
    }
    if (!fill_check(p, n, 1, 0)) {
        printf("parent buffer corrupted after fork\n");
        ok = 0;
    }
    char text[64] = {0};
    rewind(log);
    size_t got = fread(text, 1, sizeof text - 1, log);
    if (got != 15 || strcmp(text, "parent\nchild B\n") != 0) {
        printf("the stream open across fork holds %zu bytes: [%s]\n", got, text);
        ok = 0;
    }
    fclose(log);
    uint64_t *r = malloc(len);
    fill_check(r, n, 3, 1);
    if (!fill_check(r, n, 3, 0) || !fill_check(p, n, 1, 0)) {
        printf("parent buffers wrong after a second allocation\n");
        ok = 0;
    }
    printf(ok ? "forkcheck ok\n" : "forkcheck FAILED\n");
    return ok ? 0 : 1;
}

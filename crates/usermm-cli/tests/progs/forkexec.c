/*
 * forkexec.c: fork then exec, and fork without exec, with the program's data in its heap.
 * The parent builds a list of K small heap blocks and an argv in the heap, then:
 *   1. forks; the child execs `echo` with the heap-built argv (execvp), the parent checks
 *      the exit status;
 *   2. forks; the child verifies every heap block (a copy of the parent's heap as of the
 *      fork), overwrites them, allocates more, and exits 0 if all is well; the parent then
 *      verifies that its own blocks did not change;
 *   3. popen("echo ...") reads a line through a pipe (fork+exec inside libc).
 * Prints "forkexec ok".
 *
 *   forkexec K
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9e3779b97f4a7c15ull; return x ^ (x >> 29); }

int main(int argc, char **argv) {
    long k = argc > 1 ? atol(argv[1]) : 100000;
    uint64_t **blocks = malloc(k * sizeof(uint64_t *));
    if (!blocks) return 1;
    for (long i = 0; i < k; i++) {
        blocks[i] = malloc(40);
        if (!blocks[i]) return 1;
        for (int j = 0; j < 5; j++) blocks[i][j] = mix(i * 5 + j);
    }
    char **args = malloc(4 * sizeof(char *));
    args[0] = strdup("echo");
    args[1] = strdup("exec'd");
    args[2] = strdup("from the heap");
    args[3] = NULL;
    fflush(stdout);
    pid_t a = fork();
    if (a < 0) { perror("fork"); return 1; }
    if (a == 0) {
        execvp(args[0], args);
        _exit(99);
    }
    int st;
    waitpid(a, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("exec child failed: %#x\n", st); return 1; }

    pid_t b = fork();
    if (b < 0) { perror("fork"); return 1; }
    if (b == 0) {
        long bad = 0;
        for (long i = 0; i < k; i++)
            for (int j = 0; j < 5; j++) bad += blocks[i][j] != mix(i * 5 + j);
        for (long i = 0; i < k; i++) blocks[i][0] = 0;
        void *more[1000];
        for (int i = 0; i < 1000; i++) { more[i] = malloc(100 + i); if (!more[i]) bad++; else memset(more[i], 1, 100 + i); }
        for (int i = 0; i < 1000; i++) free(more[i]);
        if (bad) { printf("child: %ld bad words in its copy of the heap\n", bad); fflush(stdout); _exit(1); }
        exit(0);
    }
    waitpid(b, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("copy child failed: %#x\n", st); return 1; }
    long bad = 0;
    for (long i = 0; i < k; i++)
        for (int j = 0; j < 5; j++) bad += blocks[i][j] != mix(i * 5 + j);
    if (bad) { printf("parent: %ld bad words after the child wrote its copy\n", bad); return 1; }

    FILE *f = popen("echo popen works", "r");
    char line[64] = {0};
    if (!f || !fgets(line, sizeof line, f) || pclose(f) != 0 || strcmp(line, "popen works\n")) {
        printf("popen failed: '%s'\n", line);
        return 1;
    }
    for (long i = 0; i < k; i++) free(blocks[i]);
    free(blocks);
    for (int i = 0; i < 3; i++) free(args[i]);
    free(args);
    printf("forkexec ok\n");
    return 0;
}

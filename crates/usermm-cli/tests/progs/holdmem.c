/* Touches SIZE MiB (mmap'd anonymous memory, one byte per page), writes "held\n" to stdout and
 * then sleeps until it is killed: a process of a budget group that dies (SIGKILL) holding pages.
 * With a second argument it leaves at once instead, the memory still mapped: `exit` returns
 * from main, `_exit` calls _exit(2) (skipping the destructors).
 * Usage: holdmem MIB [exit|_exit] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: holdmem MIB [exit|_exit]\n");
        return 2;
    }
    size_t len = (size_t)atol(argv[1]) << 20;
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (size_t i = 0; i < len; i += 4096)
        p[i] = (unsigned char)(i >> 12);
    /* The last pages touched are the resident ones; touch them again so they are the hottest. */
    for (size_t i = len > (8u << 20) ? len - (8u << 20) : 0; i < len; i += 4096)
        p[i] ^= 1;
    printf("held\n");
    fflush(stdout);
    if (argc == 3) {
        if (argv[2][0] == '_')
            _exit(0);
        return 0;
    }
    for (;;)
        pause();
}

/* Touches SIZE MiB (mmap'd anonymous memory, one byte per page), writes "held\n" to stdout and
 * then sleeps until it is killed: a process of a budget group that dies (SIGKILL) holding pages.
 * Usage: holdmem MIB */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: holdmem MIB\n");
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
    for (;;)
        pause();
}

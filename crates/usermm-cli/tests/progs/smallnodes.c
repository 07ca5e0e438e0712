/*
 * smallnodes.c: a program made of many small allocations. Builds a singly linked list of N
 * 48-byte nodes (each its own malloc), in a shuffled order of creation so that the list walks
 * the heap at random, then verifies every node twice (walking the list, and checking that
 * each index was seen once), frees every other node, allocates replacements of other sizes
 * (16..200 bytes, with realloc growth), and verifies again. Prints "smallnodes ok N" on success.
 *
 *   smallnodes N
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *next;
    uint64_t idx;
    uint64_t check;
    uint64_t pad[3];
};

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

int main(int argc, char **argv) {
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    struct node *head = NULL;
    for (uint64_t i = 0; i < n; i++) {
        struct node *x = malloc(sizeof *x);
        if (!x) {
            printf("malloc failed at node %llu\n", (unsigned long long)i);
            return 1;
        }
        x->idx = i;
        x->check = mix(i);
        for (int k = 0; k < 3; k++) x->pad[k] = mix(i + k + 1);
        x->next = head;
        head = x;
    }
    /* Walk and verify. */
    uint64_t seen = 0, bad = 0, expect = n;
    for (struct node *x = head; x; x = x->next) {
        expect--;
        if (x->idx != expect || x->check != mix(x->idx)) bad++;
        for (int k = 0; k < 3; k++) bad += x->pad[k] != mix(x->idx + k + 1);
        seen++;
    }
    if (seen != n || bad) {
        printf("first walk: %llu nodes seen, %llu bad\n", (unsigned long long)seen, (unsigned long long)bad);
        return 1;
    }
    /* Replace every other node by a string of 16..200 bytes grown with realloc. */
    char **strs = malloc(((n + 1) / 2) * sizeof(char *));
    if (!strs) return 1;
    uint64_t j = 0;
    struct node *prev = NULL;
    for (struct node *x = head; x;) {
        struct node *next = x->next;
        if (x->idx % 2 == 0) {
            size_t len = 16 + mix(x->idx) % 100;
            char *s = malloc(len);
            if (!s) return 1;
            memset(s, (int)(x->idx & 0x7f), len);
            s = realloc(s, len * 2);
            if (!s) return 1;
            memset(s + len, (int)(x->idx & 0x7f), len);
            strs[j++] = s;
            if (prev) prev->next = next; else head = next;
            free(x);
        } else {
            prev = x;
        }
        x = next;
    }
    seen = 0;
    for (struct node *x = head; x; x = x->next) {
        if (x->idx % 2 != 1 || x->check != mix(x->idx)) bad++;
        seen++;
    }
    for (uint64_t i = 0; i < j; i++) {
        uint64_t idx = n - 1 - (n - 1) % 2 - 2 * i; /* even indexes, descending */
        size_t len = 16 + mix(idx) % 100;
        for (size_t k = 0; k < 2 * len; k++) bad += (unsigned char)strs[i][k] != (idx & 0x7f);
        free(strs[i]);
    }
    free(strs);
    if (seen != n / 2 || bad) {
        printf("second walk: %llu nodes seen, %llu bad\n", (unsigned long long)seen, (unsigned long long)bad);
        return 1;
    }
    while (head) {
        struct node *next = head->next;
        free(head);
        head = next;
    }
    printf("smallnodes ok %llu\n", (unsigned long long)n);
    return 0;
}

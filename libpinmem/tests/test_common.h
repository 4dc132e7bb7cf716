/* What libpinmem's test program's files share: the check macro and its
 * counters, and the helpers test_pinmem.c defines. */
#ifndef PINMEM_TEST_COMMON_H
#define PINMEM_TEST_COMMON_H

#include <stdio.h>

#include "../pinmem.h"

extern int checks, failures;

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        checks++;                                                                               \
        if (!(cond)) {                                                                          \
            failures++;                                                                         \
            printf("FAIL %s:%d: %s -- ", __FILE__, __LINE__, #cond);                            \
            printf(__VA_ARGS__);                                                                \
            printf(" [detail: %s]\n", pinmem_last_detail());                                    \
        }                                                                                       \
    } while (0)

#define MIB ((size_t)1 << 20)

/* Defaults with pin NONE. */
pinmem_alloc_params params(size_t size);
/* A reservation: mapped, nothing resident, nothing pinned. */
int reserve(size_t size, int hugepages, pinmem_region *r);
size_t resident_range(void *addr, size_t len);
size_t live_count(void);
double now_s(void);

/* test_entry.c (O_DIRECT entries, stamps, evictions) */
void test_entry_files(void);

/* test_register.c */
void test_register_plan(void);
/* With the fake runtime loaded (h: its dlopen handle, already reloaded). */
void test_register_fake(void *h);

#endif

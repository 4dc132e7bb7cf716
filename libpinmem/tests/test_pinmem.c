/*
 * libpinmem's own test program: every public call, without Python.
 *
 *   test_pinmem [path/to/libfakecudart.so [path/to/production/libpinmem.so]]
 *
 * It is linked against the test build of the library (-DPINMEM_TESTING,
 * which has the fault switches).  With the fake CUDA runtime's path it also
 * tests the CUDA paths (register in chunks, rollback, cudaHostAlloc, the
 * size threshold); with the production library's path it checks that that
 * one has no test calls and no fault variables.  Exits 0 when all checks
 * pass; prints one line per failed check.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../pinmem.h"
#include "test_common.h"

int checks, failures;

pinmem_alloc_params params(size_t size)
{
    pinmem_alloc_params p;
    pinmem_params_init(&p);
    p.size = size;
    p.pin = PINMEM_PIN_NONE;
    return p;
}

static size_t resident(const pinmem_region *r)
{
    size_t bytes = 0;
    if (pinmem_resident_bytes(r->addr, r->mapped_size, &bytes) != PINMEM_OK)
        return 0;
    return bytes;
}

static int pattern_ok(const pinmem_region *r)
{
    unsigned char *b = r->addr;
    for (size_t i = 0; i < r->size; i += 4093)
        b[i] = (unsigned char)(i * 7 + 3);
    b[r->size - 1] = 0xA5;
    for (size_t i = 0; i < r->size - 1; i += 4093)
        if (b[i] != (unsigned char)(i * 7 + 3))
            return 0;
    return b[r->size - 1] == 0xA5;
}

/* Bytes of the mapping at addr that /proc/self/smaps reports as Locked. */
static size_t locked_bytes(void *addr, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL)
        return 0;
    char line[512];
    uintptr_t lo = (uintptr_t)addr, hi = lo + len;
    int inside = 0;
    size_t total = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && b <= hi;
            continue;
        }
        unsigned long kb;
        if (inside && sscanf(line, "Locked: %lu kB", &kb) == 1)
            total += kb * 1024;
    }
    fclose(f);
    return total;
}

size_t resident_range(void *addr, size_t len)
{
    size_t bytes = 0;
    if (pinmem_resident_bytes(addr, len, &bytes) != PINMEM_OK)
        return (size_t)-1;
    return bytes;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A reservation: mapped, nothing resident, nothing pinned. */
int reserve(size_t size, int hugepages, pinmem_region *r)
{
    pinmem_alloc_params p = params(size);
    p.populate = 0;
    p.hugepages = hugepages;
    return pinmem_alloc(&p, r);
}

size_t live_count(void)
{
    size_t n = 0, bytes = 0;
    pinmem_live(&n, &bytes);
    return n;
}

static void test_basics(void)
{
    CHECK(pinmem_version() == PINMEM_VERSION, "version %d", pinmem_version());
    for (int s = 0; s < PINMEM_STATUS_COUNT; s++)
        CHECK(pinmem_strerror(s) != NULL && pinmem_strerror(s)[0] != '\0', "status %d", s);
    CHECK(strcmp(pinmem_strerror(999), "unknown libpinmem status") == 0, "999");
    CHECK(pinmem_strerror(-1) != NULL, "-1");
    int64_t v = 0;
    CHECK(pinmem_option_get(PINMEM_OPT_REGISTER_CHUNK, &v) == PINMEM_OK && v == (int64_t)64 << 30,
          "default register chunk %lld", (long long)v);
    CHECK(pinmem_option_get(PINMEM_OPT_COUNT, &v) == PINMEM_EINVAL, "bad option");
    CHECK(pinmem_option_set(PINMEM_OPT_USE_POPULATE_WRITE, 7) == PINMEM_EINVAL, "out of range");
    CHECK(strstr(pinmem_last_detail(), "KVPOOL_USE_POPULATE_WRITE") != NULL, "detail names env");
}

/* main() set these before the library read its options. */
static void test_option_reports(void)
{
    CHECK(pinmem_option_check() == PINMEM_EOPTION, "rejected variables reported");
    const char *d = pinmem_last_detail();
    CHECK(strstr(d, "KVPOOL_MLOCK_MODE='7'") != NULL && strstr(d, "0..3") != NULL,
          "detail names the variable, its text and the range: %s", d);
    CHECK(strstr(d, "KVPOOL_MIN_THREAD_BYTES='lots'") != NULL, "second one: %s", d);
    CHECK(strstr(d, "KVPOOL_REGISTER_THRESHOLD_BYTES") == NULL, "valid one not named");
    pinmem_option_info info;
    CHECK(pinmem_option_describe(PINMEM_OPT_MLOCK_MODE, &info) == PINMEM_OK, "describe");
    CHECK(strcmp(info.name, "mlock_mode") == 0 && strcmp(info.env, "KVPOOL_MLOCK_MODE") == 0,
          "names %s %s", info.name, info.env);
    CHECK(info.env_rejected == 1 && strcmp(info.env_text, "7") == 0, "rejected text '%s'",
          info.env_text);
    CHECK(info.value == info.default_value && info.value == 3, "default kept: %lld",
          (long long)info.value);
    CHECK(info.source == PINMEM_OPTION_DEFAULT && info.min == 0 && info.max == 3, "range");
    CHECK(pinmem_option_describe(PINMEM_OPT_REGISTER_THRESHOLD, &info) == PINMEM_OK &&
              info.source == PINMEM_OPTION_ENV && info.value == (int64_t)256 << 30 &&
              info.env_rejected == 0 && info.env_text[0] == '\0',
          "a valid variable is used: source %d value %lld", info.source, (long long)info.value);
    CHECK(info.default_value == (int64_t)1 << 30, "the threshold's default is 1 GiB: %lld",
          (long long)info.default_value);
    CHECK(pinmem_option_set(PINMEM_OPT_MLOCK_MODE, 4) == PINMEM_EINVAL, "set out of range");
    CHECK(strstr(pinmem_last_detail(), "KVPOOL_MLOCK_MODE") != NULL &&
              strstr(pinmem_last_detail(), "0..3") != NULL,
          "set detail names the option and the range");
    CHECK(pinmem_option_describe(PINMEM_OPT_MLOCK_MODE, &info) == PINMEM_OK && info.value == 3 &&
              info.source == PINMEM_OPTION_DEFAULT,
          "a refused set changes nothing");
    CHECK(pinmem_option_set(PINMEM_OPT_MLOCK_MODE, 3) == PINMEM_OK, "set");
    CHECK(pinmem_option_describe(PINMEM_OPT_MLOCK_MODE, &info) == PINMEM_OK &&
              info.source == PINMEM_OPTION_SET,
          "source set");
    CHECK(pinmem_option_describe(PINMEM_OPT_COUNT, &info) == PINMEM_EINVAL, "no such option");
    CHECK(pinmem_option_describe(0, NULL) == PINMEM_EINVAL, "NULL out");
    pinmem_option_set(PINMEM_OPT_REGISTER_THRESHOLD, (int64_t)1 << 30);
    CHECK(pinmem_test_set_fault(PINMEM_FAULT_COUNT, 1) == PINMEM_EINVAL, "no such fault");
    CHECK(pinmem_test_set_fault(-1, 1) == PINMEM_EINVAL, "negative fault");
}

/* The production library: no test call, no fault variable. */
static void test_production_surface(const char *path)
{
    if (path == NULL) {
        printf("skip production surface: no path given\n");
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen %s: %s", path, dlerror());
    if (h == NULL)
        return;
    CHECK(dlsym(h, "pinmem_alloc") != NULL, "has pinmem_alloc");
    CHECK(dlsym(h, "pinmem_test_set_fault") == NULL, "no pinmem_test_set_fault");
    CHECK(dlsym(h, "pinmem_test_set_entry_hook") == NULL, "no entry hooks");
    dlclose(h);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s", path);
    if (f == NULL)
        return;
    static char buf[1 << 16];
    const char *needle = "KVPOOL_FAKE_M";
    size_t n, keep = 0, found = 0, len = strlen(needle);
    while ((n = fread(buf + keep, 1, sizeof buf - keep, f)) > 0) {
        size_t have = keep + n;
        for (size_t i = 0; i + len <= have; i++)
            found += memcmp(buf + i, needle, len) == 0;
        keep = len - 1;
        memmove(buf, buf + have - keep, keep);
    }
    fclose(f);
    CHECK(found == 0, "%zu fault variable name(s) in the production library", found);
}

/* The decision with made-up facts: no machine needed. */
static void test_populate_decide(void)
{
    pinmem_populate_facts f;
    pinmem_populate_plan plan;
    memset(&f, 0, sizeof f);
    f.populate_write = 1;
    f.cpus = 64;
    CHECK(pinmem_populate_decide(&f, &plan) == PINMEM_OK, "rule");
    CHECK(plan.method == PINMEM_POPULATE_MADVISE && plan.method_source == PINMEM_PLAN_RULE,
          "rule method %d source %d", plan.method, plan.method_source);
    CHECK(plan.threads == 16 && plan.threads_source == PINMEM_PLAN_RULE, "rule threads %d",
          plan.threads);
    f.populate_write = 0;
    f.cpus = 3;
    CHECK(pinmem_populate_decide(&f, &plan) == PINMEM_OK &&
              plan.method == PINMEM_POPULATE_FIRST_TOUCH && plan.threads == 3,
          "no POPULATE_WRITE: touch, %d threads", plan.threads);

    memset(&f, 0, sizeof f);
    f.probed = 1;
    f.populate_write = 1;
    f.cpus = 8;
    f.madvise_gbps = 2.0;
    f.touch_gbps = 2.4; /* within 25%: madvise stays */
    CHECK(pinmem_populate_decide(&f, &plan) == PINMEM_OK, "probed");
    CHECK(plan.method == PINMEM_POPULATE_MADVISE && plan.method_source == PINMEM_PLAN_PROBE,
          "ties keep madvise");
    CHECK(plan.threads == 8 && plan.threads_source == PINMEM_PLAN_RULE,
          "threads by rule after a probe: %d", plan.threads);
    f.touch_gbps = 2.6;
    CHECK(pinmem_populate_decide(&f, &plan) == PINMEM_OK &&
              plan.method == PINMEM_POPULATE_FIRST_TOUCH && plan.threads == 8,
          "touch faster by > 25%%: method %d threads %d", plan.method, plan.threads);
    f.madvise_gbps = -1.0;
    CHECK(pinmem_populate_decide(&f, &plan) == PINMEM_EINVAL, "negative rate");
    f.madvise_gbps = 2.0;
    f.cpus = -1;
    CHECK(pinmem_populate_decide(&f, &plan) == PINMEM_EINVAL, "negative cpus");
    CHECK(pinmem_populate_decide(NULL, &plan) == PINMEM_EINVAL, "NULL facts");
}

/* The probe for real, then the options over it. */
static void test_populate_probe(void)
{
    pinmem_populate_facts f;
    pinmem_populate_plan plan;
    CHECK(pinmem_populate_probe(3, &f) == PINMEM_EINVAL, "bad run");
    CHECK(pinmem_populate_probe(1, &f) == PINMEM_OK && f.probed == 1, "probe runs");
    CHECK(f.touch_gbps > 0.0 && (f.madvise_gbps > 0.0) == (f.populate_write != 0), "rates %g %g",
          f.touch_gbps, f.madvise_gbps);
    CHECK(f.bytes >= 24 * MIB && f.seconds > 0.0, "cost %llu bytes %g s",
          (unsigned long long)f.bytes, f.seconds);
    double first = f.seconds;
    CHECK(pinmem_populate_probe(0, &f) == PINMEM_OK && f.probed && f.seconds == first,
          "kept, not rerun");
    pinmem_populate_plan decided;
    pinmem_populate_decide(&f, &decided);
    CHECK(pinmem_populate_plan_get(&plan) == PINMEM_OK && plan.method == decided.method &&
              plan.threads == decided.threads && plan.method_source == decided.method_source &&
              plan.threads_source == PINMEM_PLAN_RULE,
          "plan in effect is the probe's");
    pinmem_option_set(PINMEM_OPT_POPULATE_METHOD, 2);
    pinmem_option_set(PINMEM_OPT_POPULATE_THREADS, 3);
    CHECK(pinmem_populate_plan_get(&plan) == PINMEM_OK &&
              plan.method == PINMEM_POPULATE_FIRST_TOUCH &&
              plan.method_source == PINMEM_PLAN_OPTION && plan.threads == 3 &&
              plan.threads_source == PINMEM_PLAN_OPTION,
          "options win");
    pinmem_alloc_params p = params(64 * MIB);
    pinmem_region r;
    pinmem_option_set(PINMEM_OPT_MIN_THREAD_BYTES, 4 * MIB);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.populate_method == PINMEM_POPULATE_FIRST_TOUCH &&
              r.threads_used == 3 && resident(&r) == r.mapped_size,
          "alloc follows the options: method %d threads %d", r.populate_method, r.threads_used);
    pinmem_free(r.addr);
    pinmem_option_set(PINMEM_OPT_POPULATE_METHOD, 1);
    if (f.populate_write) {
        CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.populate_method == PINMEM_POPULATE_MADVISE,
              "method 1: madvise");
        pinmem_free(r.addr);
    }
    pinmem_option_set(PINMEM_OPT_POPULATE_METHOD, 0);
    pinmem_option_set(PINMEM_OPT_POPULATE_THREADS, 0);
    pinmem_option_set(PINMEM_OPT_MIN_THREAD_BYTES, 64 * MIB);
    CHECK(pinmem_populate_probe(2, &f) == PINMEM_OK && f.probed, "rerun");
}

/* A reservation far beyond RAM, and a commit beyond the room refused first. */
static void test_memory_room(void)
{
    uint64_t room = 0;
    const char *limit = NULL;
    CHECK(pinmem_memory_room(1, &room, &limit) == PINMEM_OK && room > 0 && limit != NULL,
          "room %llu", (unsigned long long)room);
    CHECK(pinmem_memory_room(1, NULL, NULL) == PINMEM_EINVAL, "NULL room");
    pinmem_caps c;
    pinmem_probe(&c);
    pinmem_region r, q;
    size_t big = (size_t)c.mem_total * 3;
    CHECK(reserve(big, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve 3x RAM: %s",
          pinmem_last_detail());
    size_t over = (size_t)(room + 256 * MIB) / (2 * MIB) * (2 * MIB);
    if (room < c.mem_total - 512 * MIB) {
        int how = -1;
        CHECK(pinmem_commit(r.addr, 0, over, PINMEM_PIN_MLOCK, 0, &how) == PINMEM_ELIMIT,
              "commit beyond the room");
        CHECK(strstr(pinmem_last_detail(), limit) != NULL, "names the limit: %s",
              pinmem_last_detail());
        CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 0 &&
                  resident_range(r.addr, 64 * MIB) == 0,
              "nothing committed or resident");
    } else {
        printf("skip commit beyond the room: room %llu is close to RAM\n",
               (unsigned long long)room);
    }
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free the reservation");
}

static void test_bad_input(void)
{
    pinmem_region r;
    pinmem_alloc_params p = params(0);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_EINVAL, "size 0");
    CHECK(strstr(pinmem_last_detail(), "size") != NULL, "detail names size");
    p = params((size_t)1 << 62);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_ETOO_LARGE, "size 2^62");
    p = params(SIZE_MAX);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_ETOO_LARGE, "SIZE_MAX");
    p = params(MIB);
    p.pin = 42;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_EINVAL, "pin 42");
    p = params(MIB);
    p.hugepages = -1;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_EINVAL, "hugepages -1");
    p = params(MIB);
    p.threads = -3;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_EINVAL, "threads -3");
    CHECK(pinmem_alloc(NULL, &r) == PINMEM_EINVAL, "NULL params");
    CHECK(pinmem_free(NULL) == PINMEM_EUNKNOWN_PTR, "free NULL");
    int x;
    CHECK(pinmem_free(&x) == PINMEM_EUNKNOWN_PTR, "free stack pointer");
    CHECK(strstr(pinmem_last_detail(), "not a live mapping") != NULL, "detail");
    CHECK(pinmem_query(&x, &r) == PINMEM_EUNKNOWN_PTR, "query unknown");
}

static void test_anonymous(void)
{
    size_t before = live_count();
    pinmem_alloc_params p = params(64 * MIB + 123);
    p.threads = 2;
    pinmem_region r;
    int rc = pinmem_alloc(&p, &r);
    CHECK(rc == PINMEM_OK, "anonymous alloc rc %d", rc);
    if (rc != PINMEM_OK)
        return;
    CHECK(r.kind == PINMEM_KIND_ANONYMOUS, "kind %d", r.kind);
    CHECK(r.size == p.size && r.mapped_size >= r.size && r.mapped_size % 4096 == 0, "sizes");
    CHECK(r.pinned == PINMEM_PINNED_NONE, "pinned %d", r.pinned);
    CHECK(resident(&r) == r.mapped_size, "resident %zu of %zu", resident(&r), r.mapped_size);
    CHECK(r.populate_method == PINMEM_POPULATE_MADVISE ||
              r.populate_method == PINMEM_POPULATE_FIRST_TOUCH,
          "method %d", r.populate_method);
    CHECK(pattern_ok(&r), "pattern");
    CHECK(live_count() == before + 1, "live +1");
    pinmem_region q;
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.size == r.size, "query");
    CHECK(pinmem_free((char *)r.addr + 4096) == PINMEM_EUNKNOWN_PTR, "interior pointer");
    CHECK(strstr(pinmem_last_detail(), "inside the mapping") != NULL, "interior detail");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
    CHECK(pinmem_free(r.addr) == PINMEM_EUNKNOWN_PTR, "double free");
    CHECK(live_count() == before, "live back");

    /* Not populated: nothing resident yet. */
    p = params(32 * MIB);
    p.populate = 0;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "unpopulated");
    CHECK(resident(&r) == 0, "unpopulated resident %zu", resident(&r));
    CHECK(r.populate_method == PINMEM_POPULATE_NONE, "method none");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
}

static void test_first_touch(void)
{
    pinmem_option_set(PINMEM_OPT_USE_POPULATE_WRITE, 0);
    pinmem_alloc_params p = params(48 * MIB);
    p.threads = 2;
    pinmem_region r;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "first-touch alloc");
    CHECK(r.populate_method == PINMEM_POPULATE_FIRST_TOUCH, "method %d", r.populate_method);
    CHECK(resident(&r) == r.mapped_size, "resident %zu", resident(&r));
    pinmem_free(r.addr);
    pinmem_option_set(PINMEM_OPT_USE_POPULATE_WRITE, 1);
}

static void test_mlock(void)
{
    pinmem_alloc_params p = params(8 * MIB);
    pinmem_region r;
    p.pin = PINMEM_PIN_MLOCK;
    int rc = pinmem_alloc(&p, &r);
    CHECK(rc == PINMEM_OK || rc == PINMEM_EMLOCK, "mlock rc %d", rc);
    if (rc == PINMEM_OK) {
        CHECK(r.pinned == PINMEM_PINNED_MLOCK, "pinned %d", r.pinned);
        CHECK(locked_bytes(r.addr, r.mapped_size) == r.mapped_size, "locked %zu of %zu",
              locked_bytes(r.addr, r.mapped_size), r.mapped_size);
        CHECK(resident(&r) == r.mapped_size, "resident");
        pinmem_free(r.addr);
    }
    pinmem_test_set_fault(PINMEM_FAULT_MLOCK_EPERM, 1);
    rc = pinmem_alloc(&p, &r);
    CHECK(rc == PINMEM_EMLOCK, "explicit mlock refused rc %d", rc);
    CHECK(strstr(pinmem_last_detail(), "memlock limit") != NULL, "detail names limit");
    p.pin = PINMEM_PIN_AUTO;
    rc = pinmem_alloc(&p, &r);
    CHECK(rc == PINMEM_OK && r.pinned == PINMEM_PINNED_NONE, "auto degrades rc %d pinned %d", rc,
          r.pinned);
    if (rc == PINMEM_OK) {
        CHECK(resident(&r) == r.mapped_size, "still populated");
        CHECK(locked_bytes(r.addr, r.mapped_size) == 0, "nothing locked");
        pinmem_free(r.addr);
    }
    pinmem_test_set_fault(PINMEM_FAULT_MLOCK_EPERM, 0);
}

static void test_hugepages(void)
{
    int64_t total = -1, avail = -1;
    if (pinmem_hugepages_2m(-1, &total, &avail) != PINMEM_OK) {
        printf("skip hugepages: no 2 MiB pool\n");
        return;
    }
    pinmem_region r;
    pinmem_alloc_params p = params((size_t)(avail + 1) * 2 * MIB);
    p.hugepages = PINMEM_HUGE_REQUIRED;
    p.populate = 0;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_EHUGEPAGES, "pool too small");
    CHECK(strstr(pinmem_last_detail(), "nr_hugepages") != NULL, "detail names the fix");
    p.hugepages = PINMEM_HUGE_AUTO;
    p.size = 8 * MIB;
    if (avail < 4) {
        CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.kind == PINMEM_KIND_ANONYMOUS,
              "auto falls back");
        pinmem_free(r.addr);
        printf("skip hugetlb mapping: %lld free 2 MiB pages\n", (long long)avail);
        return;
    }
    p.size = 3 * MIB + 5;
    p.hugepages = PINMEM_HUGE_REQUIRED;
    p.populate = 1;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "hugetlb alloc");
    CHECK(r.kind == PINMEM_KIND_HUGETLB && r.hugepages == PINMEM_HUGE_RESULT_HUGETLB_2M, "kind");
    CHECK(r.mapped_size == 4 * MIB && r.page_size == 2 * MIB, "rounded %zu", r.mapped_size);
    CHECK(resident(&r) == r.mapped_size, "resident");
    CHECK(pattern_ok(&r), "pattern");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
}

static void test_thp(void)
{
    pinmem_alloc_params p = params(16 * MIB);
    p.hugepages = PINMEM_HUGE_THP;
    pinmem_region r;
    pinmem_caps c;
    pinmem_probe(&c);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "thp alloc");
    CHECK((uintptr_t)r.addr % (2 * MIB) == 0, "2 MiB aligned");
    CHECK(r.hugepages == (c.thp_mode > 0 ? PINMEM_HUGE_RESULT_THP : PINMEM_HUGE_RESULT_NONE),
          "thp result %d mode %d", r.hugepages, c.thp_mode);
    pinmem_free(r.addr);
}

static void test_numa(void)
{
    int nodes[64], count = 0;
    CHECK(pinmem_numa_nodes(nodes, 64, &count) == PINMEM_OK && count >= 1, "nodes");
    pinmem_alloc_params p = params(8 * MIB);
    p.numa_node = nodes[0];
    pinmem_region r;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "numa alloc");
    CHECK(r.numa_node == nodes[0], "node");
    pinmem_free(r.addr);
    pinmem_test_set_fault(PINMEM_FAULT_MBIND_EPERM, 1);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.numa_bound == 0, "mbind refused falls back");
    CHECK(resident(&r) == r.mapped_size, "still populated");
    pinmem_free(r.addr);
    pinmem_test_set_fault(PINMEM_FAULT_MBIND_EPERM, 0);
    p.numa_node = 999;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_ENUMA_NODE, "missing node");
    CHECK(strstr(pinmem_last_detail(), "999") != NULL, "names node");
    CHECK(strstr(pinmem_last_detail(), "this machine has") != NULL, "names real nodes");
    int cpu = -1, node = -1;
    CHECK(pinmem_current_cpu(&cpu, &node) == PINMEM_OK && cpu >= 0 && node >= 0, "getcpu");
}

static void test_shm(void)
{
    char name[64];
    snprintf(name, sizeof name, "/pinmem-test-%d", (int)getpid());
    pinmem_shm_unlink(name);
    CHECK(pinmem_shm_name_check("noslash") == PINMEM_ESHM_NAME, "no slash");
    CHECK(pinmem_shm_name_check("/a/b") == PINMEM_ESHM_NAME, "inner slash");
    CHECK(pinmem_shm_name_check("/") == PINMEM_ESHM_NAME, "empty");
    char longname[300];
    memset(longname, 'x', sizeof longname);
    longname[0] = '/';
    longname[299] = '\0';
    CHECK(pinmem_shm_name_check(longname) == PINMEM_ESHM_NAME, "too long");
    CHECK(strstr(pinmem_last_detail(), "NAME_MAX") != NULL, "names the limit");

    pinmem_alloc_params p = params(5 * MIB + 7);
    p.shm_name = name;
    pinmem_region r;
    int rc = pinmem_alloc(&p, &r);
    CHECK(rc == PINMEM_OK, "shm create rc %d", rc);
    if (rc != PINMEM_OK)
        return;
    CHECK(r.kind == PINMEM_KIND_SHM && r.shm_owner == 1, "kind/owner");
    CHECK(resident(&r) == r.mapped_size, "resident");
    pinmem_region dup;
    CHECK(pinmem_alloc(&p, &dup) == PINMEM_ESHM_EXISTS, "exists");
    size_t segsize = 0;
    CHECK(pinmem_shm_size(name, &segsize) == PINMEM_OK && segsize == r.mapped_size, "size");
    memcpy(r.addr, "hello from parent", 18);

    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        pinmem_region a;
        if (pinmem_shm_attach(name, 0, PINMEM_PIN_NONE, 0, &a) != PINMEM_OK)
            _exit(2);
        if (a.shm_owner != 0 || a.size != segsize)
            _exit(3);
        if (memcmp(a.addr, "hello from parent", 18) != 0)
            _exit(4);
        memcpy((char *)a.addr + MIB, "answer", 7);
        if (pinmem_free(a.addr) != PINMEM_OK)
            _exit(5);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    CHECK(memcmp((char *)r.addr + MIB, "answer", 7) == 0, "child's answer");

    /* A forked child that frees the inherited creator's mapping leaves the
     * name (and the parent's mapping) alone. */
    fflush(stdout);
    child = fork();
    if (child == 0) {
        int gone = -1;
        if (pinmem_shm_release_name(r.addr, &gone) != PINMEM_OK || gone != 0)
            _exit(6);
        _exit(pinmem_free(r.addr) == PINMEM_OK ? 0 : 7);
    }
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked free status %d", status);
    CHECK(pinmem_shm_size(name, &segsize) == PINMEM_OK, "name kept after the child's free");
    CHECK(memcmp(r.addr, "hello from parent", 18) == 0, "parent mapping intact");

    pinmem_region a;
    CHECK(pinmem_shm_attach(name, segsize + 1, PINMEM_PIN_NONE, 0, &a) == PINMEM_EINVAL,
          "attach too big");
    CHECK(pinmem_shm_attach(name, 4096, PINMEM_PIN_NONE, 1, &a) == PINMEM_OK, "attach part");
    CHECK(memcmp(a.addr, "hello from parent", 18) == 0, "populate kept contents");
    pinmem_free(a.addr);

    p.flags = PINMEM_SHM_REUSE;
    pinmem_region r2;
    CHECK(pinmem_alloc(&p, &r2) == PINMEM_OK, "reuse replaces");
    CHECK(((char *)r2.addr)[0] == 0, "fresh segment");
    /* The first creator's free must not unlink the second one's name. */
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free first");
    CHECK(pinmem_shm_size(name, &segsize) == PINMEM_OK, "name survives");
    int unlinked = 0;
    CHECK(pinmem_shm_release_name(r2.addr, &unlinked) == PINMEM_OK && unlinked == 1, "release");
    CHECK(pinmem_shm_size(name, &segsize) == PINMEM_ESHM_NOT_FOUND, "name gone");
    CHECK(pinmem_free(r2.addr) == PINMEM_OK, "free second");
    CHECK(pinmem_shm_attach(name, 0, PINMEM_PIN_NONE, 0, &a) == PINMEM_ESHM_NOT_FOUND, "gone");
    CHECK(pinmem_shm_unlink(name) == PINMEM_ESHM_NOT_FOUND, "unlink missing");
}

static void test_probe(void)
{
    pinmem_caps c;
    CHECK(pinmem_probe(&c) == PINMEM_OK, "probe");
    CHECK(c.cpu_count >= 1 && c.cpu_affinity >= 1, "cpus");
    CHECK(c.page_size >= 4096, "page");
    CHECK(c.numa_node_count >= 1, "numa");
    CHECK(c.default_populate_threads >= 1 && c.default_populate_threads <= 16, "threads");
    CHECK(c.mem_total > 0, "ram");
}

static void *churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 50; i++) {
        pinmem_alloc_params p = params(MIB);
        p.threads = 1;
        pinmem_region r;
        if (pinmem_alloc(&p, &r) != PINMEM_OK)
            return (void *)1;
        if (pinmem_free(r.addr) != PINMEM_OK)
            return (void *)2;
    }
    return NULL;
}

typedef struct race_arg {
    void *addr;
    pthread_barrier_t *barrier;
    int rc;
} race_arg;

static void *race_free(void *arg)
{
    race_arg *a = arg;
    pthread_barrier_wait(a->barrier);
    a->rc = pinmem_free(a->addr);
    return NULL;
}

static void test_threads(void)
{
    size_t before = live_count();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churn, NULL);
    for (int i = 0; i < 4; i++) {
        void *res = NULL;
        pthread_join(t[i], &res);
        CHECK(res == NULL, "churn thread %d: %p", i, res);
    }
    CHECK(live_count() == before, "no leak");
    for (int round = 0; round < 20; round++) {
        pinmem_alloc_params p = params(MIB);
        pinmem_region r;
        pinmem_alloc(&p, &r);
        pthread_barrier_t b;
        pthread_barrier_init(&b, NULL, 4);
        race_arg args[4];
        for (int i = 0; i < 4; i++) {
            args[i] = (race_arg){r.addr, &b, -1};
            pthread_create(&t[i], NULL, race_free, &args[i]);
        }
        int ok = 0, unknown = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(t[i], NULL);
            ok += args[i].rc == PINMEM_OK;
            unknown += args[i].rc == PINMEM_EUNKNOWN_PTR;
        }
        pthread_barrier_destroy(&b);
        CHECK(ok == 1 && unknown == 3, "concurrent frees: %d ok, %d unknown", ok, unknown);
    }
}

static void test_fork_child_free(void)
{
    pinmem_alloc_params p = params(4 * MIB);
    p.pin = PINMEM_PIN_MLOCK;
    pinmem_region r;
    if (pinmem_alloc(&p, &r) != PINMEM_OK) {
        printf("skip fork test: mlock refused\n");
        return;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        /* Not inherited (MADV_DONTFORK): freeing forgets it, touches nothing. */
        _exit(pinmem_free(r.addr) == PINMEM_OK ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child free %d", status);
    CHECK(pattern_ok(&r), "parent memory intact");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "parent free");
}


/* ------------------------------------------------------------- commit */

static void test_commit_steps(void)
{
    pinmem_region r, q;
    CHECK(reserve(64 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    CHECK(r.committed_bytes == 0 && r.pinned_bytes == 0 && r.pinned == PINMEM_PINNED_NONE,
          "fresh reservation: committed %zu pinned %zu", r.committed_bytes, r.pinned_bytes);
    CHECK(resident_range(r.addr, r.mapped_size) == 0, "nothing resident");
    /* A byte written before its range is committed survives the commit
     * (the write faults in one page, or a 2 MiB one where THP is always). */
    ((volatile char *)r.addr)[40 * MIB + 5] = 0x5A;
    size_t early = resident_range((char *)r.addr + 32 * MIB, 16 * MIB);
    CHECK(early > 0 && early <= 2 * MIB, "early fault %zu", early);
    int pin = PINMEM_PIN_MLOCK;
    for (size_t i = 0; i < 4; i++) {
        size_t off = i * 16 * MIB;
        int how = -1;
        int rc = pinmem_commit(r.addr, off, 16 * MIB, pin, 2, &how);
        if (i == 0 && rc == PINMEM_EMLOCK) {
            printf("skip commit with mlock: refused here; committing unpinned\n");
            pin = PINMEM_PIN_NONE;
            rc = pinmem_commit(r.addr, off, 16 * MIB, pin, 2, &how);
        }
        CHECK(rc == PINMEM_OK, "step %zu rc %d", i, rc);
        int want = pin == PINMEM_PIN_MLOCK ? PINMEM_PINNED_MLOCK : PINMEM_PINNED_NONE;
        CHECK(how == want, "step %zu pinned %d", i, how);
        CHECK(resident_range((char *)r.addr + off, 16 * MIB) == 16 * MIB, "step %zu resident",
              i);
        size_t done = (i + 1) * 16 * MIB;
        size_t all = resident_range(r.addr, r.mapped_size);
        size_t ahead = i < 2 ? early : 0;
        CHECK(all == done + ahead, "step %zu: %zu resident, want %zu", i, all, done + ahead);
        if (pin == PINMEM_PIN_MLOCK)
            CHECK(locked_bytes(r.addr, r.mapped_size) == done, "step %zu locked %zu", i,
                  locked_bytes(r.addr, r.mapped_size));
        CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == done, "committed %zu",
              q.committed_bytes);
        CHECK(q.pinned_bytes == (pin == PINMEM_PIN_MLOCK ? done : 0), "pinned_bytes %zu",
              q.pinned_bytes);
        /* Pinned names the whole mapping: only once all of it is. */
        CHECK(q.pinned == (i == 3 ? want : PINMEM_PINNED_NONE), "step %zu region pinned %d", i,
              q.pinned);
        CHECK(q.addr == r.addr, "never moves");
        memset((char *)r.addr + off, (int)i + 1, 4096);
    }
    CHECK(((volatile char *)r.addr)[40 * MIB + 5] == 0x5A, "contents kept by the commit");
    for (size_t i = 0; i < 4; i++)
        CHECK(((char *)r.addr)[i * 16 * MIB + 100] == (char)(i + 1), "data of step %zu", i);
    CHECK(q.populate_method == PINMEM_POPULATE_MADVISE ||
              q.populate_method == PINMEM_POPULATE_FIRST_TOUCH,
          "method %d", q.populate_method);
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
}

static void test_commit_first_touch_keeps_contents(void)
{
    pinmem_option_set(PINMEM_OPT_USE_POPULATE_WRITE, 0);
    pinmem_region r, q;
    CHECK(reserve(8 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    unsigned char *b = r.addr;
    for (size_t i = 0; i < 4 * MIB; i += 64 * 1024 + 17)
        b[i] = (unsigned char)(i % 251 + 1);
    int how = -1;
    CHECK(pinmem_commit(r.addr, 0, 8 * MIB, PINMEM_PIN_NONE, 2, &how) == PINMEM_OK, "commit");
    CHECK(how == PINMEM_PINNED_NONE, "pinned %d", how);
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK &&
              q.populate_method == PINMEM_POPULATE_FIRST_TOUCH,
          "method %d", q.populate_method);
    CHECK(resident_range(r.addr, r.mapped_size) == r.mapped_size, "resident");
    int kept = 1;
    for (size_t i = 0; i < 4 * MIB; i += 64 * 1024 + 17)
        kept &= b[i] == (unsigned char)(i % 251 + 1);
    CHECK(kept, "first touch kept the contents");
    CHECK(b[5 * MIB] == 0, "untouched pages read zero");
    pinmem_free(r.addr);
    pinmem_option_set(PINMEM_OPT_USE_POPULATE_WRITE, 1);
}

static void test_commit_bad_input(void)
{
    pinmem_region r, q;
    int x = 0, how = -1;
    CHECK(pinmem_commit(NULL, 0, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EUNKNOWN_PTR, "NULL");
    CHECK(pinmem_commit(&x, 0, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EUNKNOWN_PTR, "stack");
    CHECK(strstr(pinmem_last_detail(), "not a live mapping") != NULL, "detail");
    CHECK(reserve(16 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    char *a = r.addr;
    CHECK(pinmem_commit(a + 4096, 0, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EUNKNOWN_PTR,
          "interior");
    CHECK(strstr(pinmem_last_detail(), "inside the mapping") != NULL, "interior detail");
    CHECK(pinmem_commit(a, 0, 0, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL, "len 0");
    CHECK(pinmem_commit(a, 100, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL, "offset");
    CHECK(strstr(pinmem_last_detail(), "offset 100") != NULL &&
              strstr(pinmem_last_detail(), "page size 4096") != NULL,
          "detail names the values");
    CHECK(pinmem_commit(a, 0, 5000, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL, "length");
    CHECK(pinmem_commit(a, 16 * MIB, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL, "at end");
    CHECK(strstr(pinmem_last_detail(), "mapped size is 16.00 MiB") != NULL, "names the limit");
    CHECK(pinmem_commit(a, 12 * MIB, 8 * MIB, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL,
          "past the end");
    size_t huge = SIZE_MAX / 4096 * 4096;
    CHECK(pinmem_commit(a, 8 * MIB, huge, PINMEM_PIN_NONE, 0, &how) == PINMEM_ETOO_LARGE,
          "absurd length");
    CHECK(pinmem_commit(a, huge, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL,
          "offset + len wraps");
    CHECK(pinmem_commit(a, 0, 4096, PINMEM_PIN_CUDA_ALLOC, 0, &how) == PINMEM_EINVAL,
          "cuda-alloc");
    CHECK(strstr(pinmem_last_detail(), "cuda-register") != NULL, "names the alternative");
    CHECK(pinmem_commit(a, 0, 4096, 42, 0, &how) == PINMEM_EINVAL, "pin 42");
    CHECK(pinmem_commit(a, 0, 4096, PINMEM_PIN_NONE, -1, &how) == PINMEM_EINVAL, "threads -1");
    CHECK(pinmem_commit(a, 0, 4096, PINMEM_PIN_CUDA_REGISTER, 0, &how) == PINMEM_ENO_CUDA,
          "no cuda");
    CHECK(pinmem_query(a, &q) == PINMEM_OK && q.committed_bytes == 0, "failures commit nothing");
    CHECK(resident_range(a, r.mapped_size) == 0, "failures populate nothing");

    /* A range is committed once. */
    CHECK(pinmem_commit(a, 4 * MIB, 4 * MIB, PINMEM_PIN_NONE, 1, NULL) == PINMEM_OK,
          "pinned may be NULL");
    CHECK(pinmem_commit(a, 4 * MIB, 4 * MIB, PINMEM_PIN_NONE, 1, &how) == PINMEM_EINVAL, "again");
    CHECK(strstr(pinmem_last_detail(), "committed before") != NULL, "overlap detail");
    CHECK(pinmem_commit(a, 0, 8 * MIB, PINMEM_PIN_NONE, 1, &how) == PINMEM_EINVAL, "covers");
    CHECK(pinmem_commit(a, 6 * MIB, 4 * MIB, PINMEM_PIN_NONE, 1, &how) == PINMEM_EINVAL, "tail");
    CHECK(pinmem_commit(a, 0, 4 * MIB, PINMEM_PIN_NONE, 1, &how) == PINMEM_OK, "adjacent below");
    CHECK(pinmem_commit(a, 8 * MIB, 4096, PINMEM_PIN_NONE, 1, &how) == PINMEM_OK, "adjacent above");
    CHECK(pinmem_query(a, &q) == PINMEM_OK && q.committed_bytes == 8 * MIB + 4096, "committed %zu",
          q.committed_bytes);
    CHECK(pinmem_free(a) == PINMEM_OK, "free");
    CHECK(pinmem_commit(a, 12 * MIB, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EUNKNOWN_PTR,
          "after free");

    /* Populated (or pinned) at allocation: committed whole. */
    pinmem_alloc_params p = params(4 * MIB);
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "populated alloc");
    CHECK(r.committed_bytes == r.mapped_size && r.pinned_bytes == 0, "committed whole");
    CHECK(pinmem_commit(r.addr, 0, 4096, PINMEM_PIN_MLOCK, 0, &how) == PINMEM_EINVAL,
          "populated mapping");
    CHECK(strstr(pinmem_last_detail(), "committed whole") != NULL, "explains");
    pinmem_free(r.addr);
}

static void test_commit_mlock_refused(void)
{
    pinmem_region r, q;
    CHECK(reserve(8 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    pinmem_test_set_fault(PINMEM_FAULT_MLOCK_EPERM, 1);
    int how = -1;
    CHECK(pinmem_commit(r.addr, 0, 4 * MIB, PINMEM_PIN_MLOCK, 0, &how) == PINMEM_EMLOCK,
          "explicit mlock refused");
    CHECK(strstr(pinmem_last_detail(), "memlock limit") != NULL &&
              strstr(pinmem_last_detail(), "commit of [0, 4194304)") != NULL,
          "detail names the limit and the range");
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 0, "nothing committed");
    CHECK(locked_bytes(r.addr, r.mapped_size) == 0, "nothing locked");
    CHECK(pinmem_commit(r.addr, 0, 4 * MIB, PINMEM_PIN_AUTO, 0, &how) == PINMEM_OK &&
              how == PINMEM_PINNED_NONE,
          "auto degrades: pinned %d", how);
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 4 * MIB &&
              q.pinned_bytes == 0,
          "committed, unpinned");
    CHECK(resident_range(r.addr, 4 * MIB) == 4 * MIB, "resident");
    pinmem_test_set_fault(PINMEM_FAULT_MLOCK_EPERM, 0);
    int rc = pinmem_commit(r.addr, 4 * MIB, 4 * MIB, PINMEM_PIN_AUTO, 0, &how);
    CHECK(rc == PINMEM_OK, "auto rc %d", rc);
    if (how == PINMEM_PINNED_MLOCK)
        CHECK(locked_bytes(r.addr, r.mapped_size) == 4 * MIB, "only the second half locked");
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.pinned == PINMEM_PINNED_NONE,
          "half unpinned: region pinned %d", q.pinned);
    pinmem_free(r.addr);
}

static void test_commit_hugetlb(void)
{
    int64_t total = -1, avail = -1;
    if (pinmem_hugepages_2m(-1, &total, &avail) != PINMEM_OK || avail < 4) {
        printf("skip commit of hugetlb: %lld free 2 MiB pages\n", (long long)avail);
        return;
    }
    pinmem_region r, q;
    pinmem_alloc_params p = params(8 * MIB);
    p.hugepages = PINMEM_HUGE_REQUIRED;
    p.populate = 0;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.kind == PINMEM_KIND_HUGETLB, "hugetlb reserve");
    if (r.kind != PINMEM_KIND_HUGETLB)
        return;
    int how = -1;
    CHECK(pinmem_commit(r.addr, MIB, 2 * MIB, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL,
          "1 MiB offset");
    CHECK(strstr(pinmem_last_detail(), "2 MiB hugetlb") != NULL, "names the page size");
    CHECK(pinmem_commit(r.addr, 0, 4096, PINMEM_PIN_NONE, 0, &how) == PINMEM_EINVAL, "4 KiB");
    int rc = pinmem_commit(r.addr, 0, 4 * MIB, PINMEM_PIN_MLOCK, 2, &how);
    CHECK(rc == PINMEM_OK || rc == PINMEM_EMLOCK, "mlock commit rc %d", rc);
    if (rc == PINMEM_OK) {
        /* smaps never shows hugetlb pages as Locked (the kernel does not
         * mark hugetlb VMAs; their pages cannot be swapped anyway). */
        CHECK(how == PINMEM_PINNED_MLOCK, "pinned %d", how);
        CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.pinned_bytes == 4 * MIB, "pinned %zu",
              q.pinned_bytes);
    } else {
        CHECK(pinmem_commit(r.addr, 0, 4 * MIB, PINMEM_PIN_NONE, 2, &how) == PINMEM_OK, "none");
    }
    CHECK(resident_range(r.addr, r.mapped_size) == 4 * MIB, "half resident");
    CHECK(pinmem_commit(r.addr, 6 * MIB, 2 * MIB, PINMEM_PIN_NONE, 0, &how) == PINMEM_OK, "last");
    CHECK(pinmem_commit(r.addr, 4 * MIB, 2 * MIB, PINMEM_PIN_NONE, 0, &how) == PINMEM_OK, "gap");
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 8 * MIB, "all");
    CHECK(q.pinned == PINMEM_PINNED_NONE, "half unpinned");
    CHECK(resident_range(r.addr, r.mapped_size) == 8 * MIB, "resident");
    CHECK(pattern_ok(&r), "pattern");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
}

typedef struct commit_arg {
    void *addr;
    size_t offset;
    size_t len;
    int pin;
    pthread_barrier_t *barrier;
    int rc;
    int pinned;
    double done_at;
} commit_arg;

static void *commit_thread(void *arg)
{
    commit_arg *c = arg;
    if (c->barrier != NULL)
        pthread_barrier_wait(c->barrier);
    c->rc = pinmem_commit(c->addr, c->offset, c->len, c->pin, 1, &c->pinned);
    c->done_at = now_s();
    return NULL;
}

static void test_commit_threads(void)
{
    /* Disjoint ranges of one mapping, committed in parallel. */
    pinmem_region r, q;
    CHECK(reserve(32 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    pthread_t t[4];
    commit_arg c[4];
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, 4);
    for (int i = 0; i < 4; i++) {
        c[i] = (commit_arg){r.addr, (size_t)i * 8 * MIB, 8 * MIB, PINMEM_PIN_NONE, &b, -1, -1, 0};
        pthread_create(&t[i], NULL, commit_thread, &c[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(c[i].rc == PINMEM_OK, "thread %d rc %d", i, c[i].rc);
    }
    pthread_barrier_destroy(&b);
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 32 * MIB, "all four");
    CHECK(resident_range(r.addr, r.mapped_size) == r.mapped_size, "resident");
    pinmem_free(r.addr);

    /* The same range from four threads: exactly one commits it. */
    for (int round = 0; round < 10; round++) {
        CHECK(reserve(4 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
        pthread_barrier_init(&b, NULL, 4);
        for (int i = 0; i < 4; i++) {
            c[i] = (commit_arg){r.addr, 0, 4 * MIB, PINMEM_PIN_NONE, &b, -1, -1, 0};
            pthread_create(&t[i], NULL, commit_thread, &c[i]);
        }
        int ok = 0, refused = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(t[i], NULL);
            ok += c[i].rc == PINMEM_OK;
            refused += c[i].rc == PINMEM_EINVAL || c[i].rc == PINMEM_EBUSY;
        }
        pthread_barrier_destroy(&b);
        CHECK(ok == 1 && refused == 3, "same range: %d ok, %d refused", ok, refused);
        CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 4 * MIB, "once");
        pinmem_free(r.addr);
    }

    /* A free racing a commit: both finish, nothing leaks or crashes. */
    size_t before = live_count();
    for (int round = 0; round < 10; round++) {
        CHECK(reserve(16 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
        pthread_barrier_init(&b, NULL, 2);
        c[0] = (commit_arg){r.addr, 0, 16 * MIB, PINMEM_PIN_NONE, &b, -1, -1, 0};
        pthread_create(&t[0], NULL, commit_thread, &c[0]);
        pthread_barrier_wait(&b);
        int rc = pinmem_free(r.addr);
        pthread_join(t[0], NULL);
        pthread_barrier_destroy(&b);
        CHECK(rc == PINMEM_OK, "free rc %d", rc);
        CHECK(c[0].rc == PINMEM_OK || c[0].rc == PINMEM_EUNKNOWN_PTR, "commit rc %d", c[0].rc);
    }
    CHECK(live_count() == before, "no leak");
}

typedef void (*stats_fn)(int *, int *, int *, int *, size_t *);

typedef struct free_arg {
    void *addr;
    int started;
    int rc;
    double done_at;
} free_arg;

static void *free_thread(void *arg)
{
    free_arg *f = arg;
    __atomic_store_n(&f->started, 1, __ATOMIC_RELEASE);
    f->rc = pinmem_free(f->addr);
    f->done_at = now_s();
    return NULL;
}

/* Wait until the fake runtime has seen at least n cudaHostRegister calls. */
static int wait_registers(stats_fn stats, int n)
{
    int lr, la, regs, unregs;
    size_t largest;
    for (int i = 0; i < 5000; i++) {
        stats(&lr, &la, &regs, &unregs, &largest);
        if (regs >= n)
            return 1;
        usleep(1000);
    }
    return 0;
}

static void test_commit_cuda(stats_fn stats, void (*reset)(void), void *h)
{
    int (*is_registered)(void *, size_t) = (int (*)(void *, size_t))dlsym(h,
                                                                         "fake_cuda_is_registered");
    int lr, la, regs, unregs, how = -1;
    size_t largest;
    pinmem_region r, q;
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)4 * MIB);
    reset();
    CHECK(reserve(32 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    char *a = r.addr;
    CHECK(pinmem_commit(a, 0, 12 * MIB, PINMEM_PIN_CUDA_REGISTER, 0, &how) == PINMEM_OK &&
              how == PINMEM_PINNED_CUDA_REGISTER,
          "register step: pinned %d", how);
    CHECK(pinmem_commit(a, 12 * MIB, 8 * MIB, PINMEM_PIN_AUTO, 0, &how) == PINMEM_OK &&
              how == PINMEM_PINNED_CUDA_REGISTER,
          "auto registers: pinned %d", how);
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 5 && regs == 5 && largest == 4 * MIB, "books: live %d calls %d largest %zu", lr,
          regs, largest);
    CHECK(is_registered(a + 12 * MIB, 4 * MIB) && is_registered(a + 16 * MIB, 4 * MIB),
          "chunks start at the commit's offset");
    CHECK(pinmem_query(a, &q) == PINMEM_OK && q.register_chunks == 5 &&
              q.committed_bytes == 20 * MIB && q.pinned_bytes == 20 * MIB &&
              q.pinned == PINMEM_PINNED_NONE,
          "query: chunks %d committed %zu pinned %d", q.register_chunks, q.committed_bytes,
          q.pinned);
    CHECK(resident_range(a, 20 * MIB) == 20 * MIB, "resident");
    CHECK(pinmem_cuda_reload(NULL) == PINMEM_EBUSY, "reload refused while ranges registered");

    /* The second chunk of the next commit fails: its first chunk is rolled
     * back, earlier commits stay. */
    reset();
    setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "2", 1);
    int rc = pinmem_commit(a, 20 * MIB, 12 * MIB, PINMEM_PIN_CUDA_REGISTER, 0, &how);
    unsetenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N");
    CHECK(rc == PINMEM_ENOMEM, "failing chunk rc %d", rc);
    CHECK(strstr(pinmem_last_detail(), "chunk 2 of 3") != NULL &&
              strstr(pinmem_last_detail(), "commit of [20971520, 33554432)") != NULL,
          "detail names the chunk and the commit");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 5 && regs == 2 && unregs == 1, "rolled back: live %d calls %d unregs %d", lr,
          regs, unregs);
    CHECK(pinmem_query(a, &q) == PINMEM_OK && q.committed_bytes == 20 * MIB &&
              q.register_chunks == 5,
          "failed commit not recorded");
    CHECK(pinmem_commit(a, 20 * MIB, 12 * MIB, PINMEM_PIN_CUDA_REGISTER, 0, &how) == PINMEM_OK,
          "retry");
    CHECK(pinmem_query(a, &q) == PINMEM_OK && q.pinned == PINMEM_PINNED_CUDA_REGISTER &&
              q.register_chunks == 8 && q.pinned_bytes == 32 * MIB,
          "whole mapping registered: pinned %d chunks %d", q.pinned, q.register_chunks);
    reset();
    CHECK(pinmem_free(a) == PINMEM_OK, "free");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0 && unregs == 8, "every chunk unregistered once: live %d unregs %d", lr, unregs);

    /* Mixed pinning: the weakest names the mapping. */
    CHECK(reserve(8 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    CHECK(pinmem_commit(r.addr, 0, 4 * MIB, PINMEM_PIN_CUDA_REGISTER, 0, &how) == PINMEM_OK,
          "register half");
    rc = pinmem_commit(r.addr, 4 * MIB, 4 * MIB, PINMEM_PIN_MLOCK, 0, &how);
    if (rc == PINMEM_OK)
        CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.pinned == PINMEM_PINNED_MLOCK &&
                  q.pinned_bytes == 8 * MIB,
              "mixed: pinned %d", q.pinned);
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free mixed");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0, "mixed unregistered: live %d", lr);

    /* A mapping pinned with cudaHostAlloc is committed whole. */
    pinmem_alloc_params p = params(MIB);
    p.pin = PINMEM_PIN_CUDA_ALLOC;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.committed_bytes == r.mapped_size &&
              r.pinned_bytes == r.mapped_size,
          "cuda-host committed whole");
    CHECK(pinmem_commit(r.addr, 0, 4096, PINMEM_PIN_AUTO, 0, &how) == PINMEM_EINVAL,
          "cuda-host commit");
    pinmem_free(r.addr);

    /* A free while a commit registers waits for it, then unregisters what
     * it registered; meanwhile the range is busy and the mapping not yet
     * committed. */
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)16 * MIB);
    CHECK(reserve(32 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    reset();
    setenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS", "600", 1);
    commit_arg c = {r.addr, 0, 16 * MIB, PINMEM_PIN_CUDA_REGISTER, NULL, -1, -1, 0};
    pthread_t t, tf;
    pthread_create(&t, NULL, commit_thread, &c);
    CHECK(wait_registers(stats, 1), "the commit reached cudaHostRegister");
    CHECK(pinmem_query(r.addr, &q) == PINMEM_OK && q.committed_bytes == 0, "pending not counted");
    CHECK(pinmem_commit(r.addr, 8 * MIB, 16 * MIB, PINMEM_PIN_NONE, 0, &how) == PINMEM_EBUSY,
          "overlapping a commit in progress");
    CHECK(strstr(pinmem_last_detail(), "another thread") != NULL, "busy detail");
    CHECK(pinmem_cuda_reload(NULL) == PINMEM_EBUSY, "no runtime swap mid-commit");
    free_arg f = {r.addr, 0, -1, 0};
    pthread_create(&tf, NULL, free_thread, &f);
    while (!__atomic_load_n(&f.started, __ATOMIC_ACQUIRE))
        usleep(1000);
    usleep(100 * 1000); /* let the free reach its wait */
    CHECK(pinmem_commit(r.addr, 16 * MIB, 16 * MIB, PINMEM_PIN_NONE, 0, &how) ==
              PINMEM_EUNKNOWN_PTR,
          "new commit while the free waits");
    CHECK(strstr(pinmem_last_detail(), "being freed") != NULL, "being freed detail");
    CHECK(pinmem_free(r.addr) == PINMEM_EUNKNOWN_PTR, "second free while the first waits");
    pthread_join(t, NULL);
    pthread_join(tf, NULL);
    unsetenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS");
    CHECK(c.rc == PINMEM_OK && c.pinned == PINMEM_PINNED_CUDA_REGISTER, "commit finished: %d",
          c.rc);
    CHECK(f.rc == PINMEM_OK && f.done_at >= c.done_at - 0.05, "free waited: rc %d", f.rc);
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0 && regs == 1 && unregs == 1, "free unregistered the commit's chunk: %d %d %d",
          lr, regs, unregs);

    /* fork() while a commit is in progress: the child is not stuck on it. */
    CHECK(reserve(16 * MIB, PINMEM_HUGE_NEVER, &r) == PINMEM_OK, "reserve");
    reset();
    setenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS", "300", 1);
    c = (commit_arg){r.addr, 0, 16 * MIB, PINMEM_PIN_CUDA_REGISTER, NULL, -1, -1, 0};
    pthread_create(&t, NULL, commit_thread, &c);
    CHECK(wait_registers(stats, 1), "the commit reached cudaHostRegister");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        alarm(10);
        size_t n = 0, bytes = 0;
        if (pinmem_live(&n, &bytes) != PINMEM_OK || n == 0)
            _exit(2);
        int cr = pinmem_commit(r.addr, 0, 4096, PINMEM_PIN_NONE, 0, NULL);
        if (cr != PINMEM_EUNKNOWN_PTR || strstr(pinmem_last_detail(), "not inherited") == NULL)
            _exit(3);
        _exit(pinmem_free(r.addr) == PINMEM_OK ? 0 : 4);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    pthread_join(t, NULL);
    unsetenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS");
    CHECK(c.rc == PINMEM_OK, "parent's commit rc %d", c.rc);
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "parent free");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0, "live registrations %d", lr);
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)64 << 30);
}

static void test_cuda(const char *fake)
{
    pinmem_region r;
    pinmem_alloc_params p = params(MIB);
    /* No runtime at all. */
    CHECK(pinmem_cuda_reload("") == PINMEM_OK, "disable");
    p.pin = PINMEM_PIN_CUDA_REGISTER;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_ENO_CUDA, "no cuda");
    CHECK(pinmem_cuda_reload("/nonexistent/libcudart.so") == PINMEM_OK, "bad path");
    CHECK(pinmem_alloc(&p, &r) == PINMEM_ENO_CUDA, "bad path -> no cuda");
    CHECK(strstr(pinmem_last_detail(), "/nonexistent/libcudart.so") != NULL, "names path");
    if (fake == NULL) {
        printf("skip fake CUDA: no path given\n");
        pinmem_cuda_reload(NULL);
        return;
    }
    void *h = dlopen(fake, RTLD_NOW);
    CHECK(h != NULL, "dlopen fake %s", dlerror());
    if (h == NULL)
        return;
    stats_fn stats = (stats_fn)dlsym(h, "fake_cuda_stats");
    void (*reset)(void) = (void (*)(void))dlsym(h, "fake_cuda_reset");
    CHECK(pinmem_cuda_reload(fake) == PINMEM_OK, "load fake");
    pinmem_caps c;
    pinmem_probe(&c);
    CHECK(c.cuda_loaded && c.cuda_device_count == 1, "fake device");
    CHECK(strstr(c.cuda_runtime_path, "fake") != NULL, "path %s", c.cuda_runtime_path);

    int lr, la, regs, unregs;
    size_t largest;
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)4 * MIB);
    reset();
    p = params(10 * MIB);
    p.pin = PINMEM_PIN_CUDA_REGISTER;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "register");
    CHECK(r.pinned == PINMEM_PINNED_CUDA_REGISTER && r.register_chunks == 3, "chunks %d",
          r.register_chunks);
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 3 && regs == 3 && largest == 4 * MIB, "books %d %d %zu", lr, regs, largest);
    CHECK(pinmem_cuda_reload(NULL) == PINMEM_EBUSY, "reload refused while live");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0 && unregs == 3, "unregistered %d live %d", unregs, lr);

    /* The third chunk fails: the first two are rolled back. */
    reset();
    setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "3", 1);
    size_t before = live_count();
    int rc = pinmem_alloc(&p, &r);
    unsetenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N");
    CHECK(rc == PINMEM_ENOMEM, "chunk failure rc %d", rc);
    CHECK(strstr(pinmem_last_detail(), "chunk 3 of 3") != NULL, "detail names chunk");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0 && unregs == 2, "rolled back: live %d unregs %d", lr, unregs);
    CHECK(live_count() == before, "nothing registered");

    /* cudaHostAlloc below the threshold, register at or above it. */
    p = params(3 * MIB);
    p.pin = PINMEM_PIN_AUTO;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "auto");
    CHECK(r.kind == PINMEM_KIND_CUDA_HOST && r.pinned == PINMEM_PINNED_CUDA_ALLOC, "cuda host");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(la == 1, "one host alloc");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free host");
    CHECK(pinmem_free(r.addr) == PINMEM_EUNKNOWN_PTR, "double free host");
    stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(la == 0, "host freed");
    pinmem_option_set(PINMEM_OPT_REGISTER_THRESHOLD, (int64_t)2 * MIB);
    p.pin = PINMEM_PIN_AUTO;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "auto above threshold");
    CHECK(r.pinned == PINMEM_PINNED_CUDA_REGISTER && r.kind == PINMEM_KIND_ANONYMOUS,
          "auto registers: %d", r.pinned);
    pinmem_free(r.addr);
    p.pin = PINMEM_PIN_CUDA_ALLOC;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "cuda-alloc above threshold");
    CHECK(r.pinned == PINMEM_PINNED_CUDA_ALLOC && r.kind == PINMEM_KIND_CUDA_HOST,
          "cuda-alloc by name stays cudaHostAlloc: %d", r.pinned);
    pinmem_free(r.addr);
    pinmem_option_set(PINMEM_OPT_REGISTER_THRESHOLD, (int64_t)1 << 30);
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)64 << 30);

    test_commit_cuda(stats, reset, h);
    test_register_fake(h);

    setenv("KVPOOL_FAKE_CUDA_DEVICES", "0", 1);
    CHECK(pinmem_cuda_reload(fake) == PINMEM_OK, "reload");
    unsetenv("KVPOOL_FAKE_CUDA_DEVICES");
    p.pin = PINMEM_PIN_AUTO;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.pinned != PINMEM_PINNED_CUDA_ALLOC &&
              r.pinned != PINMEM_PINNED_CUDA_REGISTER,
          "no device -> no CUDA pinning");
    pinmem_free(r.addr);
    pinmem_cuda_reload(NULL);
}

/* ---- entry files (pinmem_entry_write / pinmem_entry_read) ---- */

static void entry_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

/* The file's bytes as a string ("" when missing or too long). */
static const char *entry_text(const char *path)
{
    static char buf[256];
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int entry_hook_calls;

static void count_entry_hook(void) { entry_hook_calls++; }

static void test_entries(void)
{
    char dir[] = "/tmp/pinmem-entries-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    char entry[128], temp[128], outside[128], link_name[128], fifo[128];
    snprintf(entry, sizeof entry, "%s/entry", dir);
    snprintf(temp, sizeof temp, "%s/.tmp-1", dir);
    snprintf(outside, sizeof outside, "%s/outside", dir);
    snprintf(link_name, sizeof link_name, "%s/link", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    int outcome = -1;
    uint64_t nread = 0;
    char head[4], data[8];

    /* A new entry: created at temp, renamed onto the entry's name. */
    CHECK(pinmem_entry_write(temp, entry, "HDR:", 4, "payload1", 8, PINMEM_ENTRY_EXCHANGE,
                             &outcome, NULL) == PINMEM_OK, "write a new entry");
    CHECK(outcome == PINMEM_ENTRY_RENAMED, "outcome %d", outcome);
    CHECK(strcmp(entry_text(entry), "HDR:payload1") == 0, "entry holds '%s'", entry_text(entry));
    CHECK(access(temp, F_OK) != 0, "temp is gone after a rename");
    /* Replacing it by exchange keeps the old file at temp: a spare. */
    CHECK(pinmem_entry_write(temp, entry, "HDR:", 4, "payload2", 8, PINMEM_ENTRY_EXCHANGE,
                             &outcome, NULL) == PINMEM_OK && outcome == PINMEM_ENTRY_SWAPPED,
          "exchange: outcome %d", outcome);
    CHECK(strcmp(entry_text(temp), "HDR:payload1") == 0, "spare holds '%s'", entry_text(temp));
    /* The spare is rewritten (and truncated to the shorter entry), then swapped in. */
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "p3", 2,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE, &outcome, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_SWAPPED,
          "spare rewrite: outcome %d", outcome);
    CHECK(strcmp(entry_text(entry), "H:p3") == 0, "entry holds '%s'", entry_text(entry));
    CHECK(strcmp(entry_text(temp), "HDR:payload2") == 0, "spare holds '%s'", entry_text(temp));

    /* Reads: exact, missing, trailing bytes, short. */
    CHECK(pinmem_entry_read(entry, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_READ && nread == 4 && memcmp(data, "p3", 2) == 0,
          "read: outcome %d nread %llu", outcome, (unsigned long long)nread);
    CHECK(pinmem_entry_read(outside, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_MISSING,
          "missing: outcome %d", outcome);
    CHECK(pinmem_entry_read(entry, head, 2, data, 1, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              nread == 4,
          "one trailing byte is read and counted: nread %llu", (unsigned long long)nread);
    CHECK(pinmem_entry_read(entry, head, 4, data, 8, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              nread == 4,
          "short file: nread %llu", (unsigned long long)nread);

    /* A spare that is not ours to write is dropped by name, never written. */
    entry_file(outside, "keep me");
    unlink(temp);
    CHECK(link(outside, temp) == 0, "hard link: %s", strerror(errno));
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "xx", 2,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE, &outcome, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_SPARE_UNUSABLE,
          "hard-linked spare: outcome %d", outcome);
    CHECK(strcmp(entry_text(outside), "keep me") == 0, "outside file untouched");
    CHECK(access(temp, F_OK) != 0, "the hard-linked spare's name is removed");
    CHECK(symlink(outside, temp) == 0, "symlink: %s", strerror(errno));
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "xx", 2,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE, &outcome, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_SPARE_UNUSABLE,
          "symlinked spare: outcome %d", outcome);
    CHECK(strcmp(entry_text(outside), "keep me") == 0, "symlink target untouched");
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "xx", 2,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE, &outcome, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_SPARE_UNUSABLE,
          "missing spare: outcome %d", outcome);
    /* A spare a reader still has locked is not rewritten. */
    entry_file(temp, "read by someone");
    int reader = open(temp, O_RDONLY);
    CHECK(reader >= 0 && flock(reader, LOCK_SH) == 0, "reader lock");
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "xx", 2,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE, &outcome, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_SPARE_UNUSABLE,
          "locked spare: outcome %d", outcome);
    if (reader >= 0) {
        char got[32] = {0};
        CHECK(pread(reader, got, sizeof got - 1, 0) == 15 && strcmp(got, "read by someone") == 0,
              "the reader's file is unchanged: '%s'", got);
        close(reader);
    }
    CHECK(strcmp(entry_text(entry), "H:p3") == 0, "entry unchanged: '%s'", entry_text(entry));

    /* Reads refuse what is not an entry, without blocking. */
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    CHECK(pinmem_entry_read(fifo, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_REFUSED,
          "FIFO: outcome %d", outcome);
    CHECK(symlink(entry, link_name) == 0, "symlink: %s", strerror(errno));
    CHECK(pinmem_entry_read(link_name, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_REFUSED,
          "symlink: outcome %d", outcome);
    CHECK(pinmem_entry_read(dir, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_REFUSED,
          "directory: outcome %d", outcome);
    unlink(link_name);
    CHECK(link(entry, link_name) == 0, "hard link: %s", strerror(errno));
    CHECK(pinmem_entry_read(entry, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_REFUSED,
          "hard-linked entry: outcome %d", outcome);
    unlink(link_name);

    /* Short system calls are finished; a failed write leaves no temp behind. */
    unlink(temp);
    char big[5000], back[5000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7);
    pinmem_test_set_fault(PINMEM_FAULT_SHORT_IO, 1);
    CHECK(pinmem_entry_write(temp, entry, "HDR:", 4, big, sizeof big, PINMEM_ENTRY_EXCHANGE,
                             &outcome, NULL) == PINMEM_OK && outcome == PINMEM_ENTRY_SWAPPED,
          "short writes: outcome %d", outcome);
    CHECK(pinmem_entry_read(entry, head, 4, back, sizeof back, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              nread == 4 + sizeof big && memcmp(big, back, sizeof big) == 0,
          "short reads: nread %llu", (unsigned long long)nread);
    pinmem_test_set_fault(PINMEM_FAULT_SHORT_IO, 0);
    unlink(temp);
    pinmem_test_set_fault(PINMEM_FAULT_ENTRY_ENOSPC, 1);
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "xx", 2, PINMEM_ENTRY_EXCHANGE, &outcome, NULL) ==
                  PINMEM_ESYS &&
              pinmem_last_errno() == ENOSPC,
          "ENOSPC is reported");
    pinmem_test_set_fault(PINMEM_FAULT_ENTRY_ENOSPC, 0);
    CHECK(access(temp, F_OK) != 0, "the failed write's temp file is removed");
    CHECK(pinmem_entry_read(entry, head, 4, back, sizeof back, 0, &outcome, &nread, NULL) == PINMEM_OK &&
              nread == 4 + sizeof big,
          "the entry is kept after a failed put");

    /* Test hooks run once, at their point. */
    entry_hook_calls = 0;
    CHECK(pinmem_test_set_entry_hook(PINMEM_HOOK_COUNT, count_entry_hook) == PINMEM_EINVAL,
          "a hook point that does not exist");
    CHECK(pinmem_test_set_entry_hook(PINMEM_HOOK_READ_BEFORE_LOCK, count_entry_hook) ==
              PINMEM_OK, "set the read hook");
    for (int i = 0; i < 2; i++)
        pinmem_entry_read(entry, head, 4, back, sizeof back, 0, &outcome, &nread, NULL);
    CHECK(entry_hook_calls == 1, "read hook ran %d times, not once", entry_hook_calls);
    pinmem_test_set_entry_hook(PINMEM_HOOK_WRITE_BEFORE_DATA, count_entry_hook);
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "xx", 2, PINMEM_ENTRY_EXCHANGE, &outcome, NULL) ==
                  PINMEM_OK && entry_hook_calls == 2,
          "write hook: %d calls", entry_hook_calls);
    CHECK(strcmp(entry_text(entry), "H:xx") == 0, "entry holds '%s'", entry_text(entry));

    /* Bad arguments. */
    CHECK(pinmem_entry_write(NULL, entry, "", 0, "", 0, 0, &outcome, NULL) == PINMEM_EINVAL, "NULL temp");
    CHECK(pinmem_entry_write(temp, entry, "", 0, "", 0, 64, &outcome, NULL) == PINMEM_EINVAL,
          "unknown flag");
    CHECK(pinmem_entry_write(temp, entry, NULL, 4, "", 0, 0, &outcome, NULL) == PINMEM_EINVAL,
          "NULL header with a length");
    CHECK(pinmem_entry_read(entry, NULL, 4, data, 2, 0, &outcome, &nread, NULL) == PINMEM_EINVAL,
          "NULL read buffer");
    CHECK(pinmem_entry_read(NULL, head, 2, data, 2, 0, &outcome, &nread, NULL) == PINMEM_EINVAL,
          "NULL path");

    unlink(entry);
    unlink(temp);
    unlink(outside);
    unlink(fifo);
    CHECK(rmdir(dir) == 0, "the directory is left empty: %s", strerror(errno));
}

int main(int argc, char **argv)
{
    const char *fake = argc > 1 ? argv[1] : getenv("PINMEM_TEST_FAKE_CUDART");
    const char *production = argc > 2 ? argv[2] : NULL;
    /* Options are read once, at first use: set the variables first. */
    setenv("KVPOOL_MLOCK_MODE", "7", 1);
    setenv("KVPOOL_MIN_THREAD_BYTES", "lots", 1);
    setenv("KVPOOL_REGISTER_THRESHOLD_BYTES", "256G", 1);
    /* Keep the tests off any real GPU: start without CUDA. */
    pinmem_cuda_reload("");
    test_option_reports();
    test_production_surface(production);
    test_populate_decide();
    test_populate_probe();
    test_memory_room();
    test_basics();
    test_bad_input();
    test_anonymous();
    test_first_touch();
    test_mlock();
    test_hugepages();
    test_thp();
    test_numa();
    test_shm();
    test_probe();
    test_threads();
    test_fork_child_free();
    test_commit_steps();
    test_commit_first_touch_keeps_contents();
    test_commit_bad_input();
    test_commit_mlock_refused();
    test_commit_hugetlb();
    test_commit_threads();
    test_entries();
    test_entry_files();
    test_register_plan();
    test_cuda(fake);
    CHECK(live_count() == 0, "live mappings left: %zu", live_count());
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

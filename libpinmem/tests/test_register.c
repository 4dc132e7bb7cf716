/*
 * CUDA registrations against the fake runtime: the chunk plan, the query of
 * registration boundaries, a request's own chunk, halving retries, the
 * runtime's last error after every refusal, population overlapped with
 * registration (and its rollback), and registrations of memory libpinmem
 * did not map.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_common.h"

#define GIB ((size_t)1 << 30)

typedef void (*stats_fn)(int *, int *, int *, int *, size_t *);

/* The fake runtime's calls a test needs. */
typedef struct fake_rt {
    stats_fn stats;
    void (*reset)(void);
    int (*get_last_error)(void);
    int (*peek_last_error)(void);
    int (*check_copy)(const void *, size_t);
    void (*register_info)(unsigned int *, int *);
} fake_rt;

static int live_registrations(const fake_rt *f)
{
    int lr, la, regs, unregs;
    size_t largest;
    f->stats(&lr, &la, &regs, &unregs, &largest);
    return lr;
}

static int register_calls(const fake_rt *f)
{
    int lr, la, regs, unregs;
    size_t largest;
    f->stats(&lr, &la, &regs, &unregs, &largest);
    return regs;
}

/* The spans of the mapping at addr, at most 64. */
static size_t spans_of(void *addr, pinmem_span *spans)
{
    size_t count = 0;
    if (pinmem_registrations(addr, spans, 64, &count) != PINMEM_OK)
        return (size_t)-1;
    return count;
}

void test_register_plan(void)
{
    size_t c = 0;
    CHECK(pinmem_register_plan(GIB, 0, NULL) == PINMEM_EINVAL, "NULL chunk");
    /* About a sixteenth, at least 256 MiB, at most the option. */
    CHECK(pinmem_register_plan(64 * GIB, 0, &c) == PINMEM_OK && c == 4 * GIB, "64 GiB: %zu", c);
    CHECK(pinmem_register_plan(GIB, 0, &c) == PINMEM_OK && c == 256 * MIB, "1 GiB: %zu", c);
    CHECK(pinmem_register_plan(4096, 0, &c) == PINMEM_OK && c == 256 * MIB, "small: %zu", c);
    CHECK(pinmem_register_plan(8192 * GIB, 0, &c) == PINMEM_OK && c == 64 * GIB,
          "capped by the option: %zu", c);
    /* A unit: chunks are multiples of lcm(unit, 2 MiB). */
    size_t unit = 3 * MIB + 4096; /* an odd KV page */
    CHECK(pinmem_register_plan(64 * GIB, unit, &c) == PINMEM_OK && c % unit == 0 &&
              c % (2 * MIB) == 0 && c <= 4 * GIB,
          "odd unit: %zu", c);
    CHECK(pinmem_register_plan(GIB, 48 * MIB, &c) == PINMEM_OK && c % (48 * MIB) == 0 &&
              c >= 48 * MIB,
          "48 MiB unit: %zu", c);
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)4 * MIB);
    CHECK(pinmem_register_plan(64 * MIB, 0, &c) == PINMEM_OK && c == 4 * MIB, "4 MiB cap: %zu",
          c);
    /* A unit too large for the cap cannot be honoured: the cap's granules. */
    CHECK(pinmem_register_plan(64 * MIB, 5 * MIB, &c) == PINMEM_OK && c == 4 * MIB,
          "unit above the cap: %zu", c);
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)64 << 10);
    CHECK(pinmem_register_plan(64 * MIB, 0, &c) == PINMEM_OK && c == 64 << 10,
          "cap below 2 MiB: %zu", c);
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)64 << 30);
}

/* Boundaries, a request's own chunk, the last error and error names. */
static void test_spans_and_errors(const fake_rt *f)
{
    pinmem_region r;
    pinmem_span spans[64];
    pinmem_alloc_params p = params(10 * MIB);
    p.pin = PINMEM_PIN_CUDA_REGISTER;
    p.register_chunk = 4 * MIB;
    f->reset();
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.register_chunks == 3,
          "the request's chunk: %d chunks", r.register_chunks);
    size_t n = spans_of(r.addr, spans);
    CHECK(n == 3 && spans[0].offset == 0 && spans[0].len == 4 * MIB &&
              spans[1].offset == 4 * MIB && spans[2].offset == 8 * MIB &&
              spans[2].len == 2 * MIB,
          "spans: %zu", n);
    size_t count = 0;
    CHECK(pinmem_registrations(r.addr, spans, 1, &count) == PINMEM_OK && count == 3 &&
              spans[0].offset == 0,
          "too little room: the count, the first span");
    CHECK(pinmem_registrations(r.addr, NULL, 0, &count) == PINMEM_OK && count == 3, "count only");
    CHECK(pinmem_registrations(r.addr, NULL, 1, &count) == PINMEM_EINVAL, "NULL spans");
    CHECK(pinmem_registrations((char *)r.addr + 4096, spans, 64, &count) == PINMEM_EUNKNOWN_PTR,
          "not a base");
    CHECK(f->check_copy((char *)r.addr + 3 * MIB, MIB) == 0, "a copy inside one chunk");
    CHECK(f->check_copy((char *)r.addr + 3 * MIB, 2 * MIB) == 1, "a copy across two refused");
    CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");

    /* A chunk above the option is capped; an unaligned one rounded down. */
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)2 * MIB);
    p.register_chunk = 8 * MIB;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.register_chunks == 5, "capped: %d",
          r.register_chunks);
    pinmem_free(r.addr);
    pinmem_option_set(PINMEM_OPT_REGISTER_CHUNK, (int64_t)64 << 30);
    p.register_chunk = 3 * MIB + 100;
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK && r.register_chunks == 4 &&
              spans_of(r.addr, spans) == 4 && spans[1].offset == 3 * MIB,
          "rounded down to pages: %d", r.register_chunks);
    pinmem_free(r.addr);

    /* A refusal: named as cudaGetErrorName names it, and no error left. */
    setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "2", 1);
    f->reset();
    p.register_chunk = 4 * MIB;
    int rc = pinmem_alloc(&p, &r);
    unsetenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N");
    CHECK(rc == PINMEM_ENOMEM, "refused: %d", rc);
    CHECK(strstr(pinmem_last_detail(), "cudaErrorMemoryAllocation") != NULL &&
              strstr(pinmem_last_detail(), "???") == NULL,
          "the error's name");
    CHECK(f->peek_last_error() == 0 && f->get_last_error() == 0, "no last error left");
    CHECK(live_registrations(f) == 0, "rolled back");
}

/* A call refused for its size is retried with halves down to the floor. */
static void test_halving(const fake_rt *f)
{
    pinmem_region r;
    pinmem_span spans[64];
    pinmem_alloc_params p = params(16 * MIB);
    p.pin = PINMEM_PIN_CUDA_REGISTER;
    p.register_chunk = 8 * MIB;
    pinmem_option_set(PINMEM_OPT_REGISTER_MIN_CHUNK, (int64_t)MIB);
    setenv("KVPOOL_FAKE_CUDA_MAX_REGISTER_BYTES", "3145728", 1); /* 3 MiB */
    f->reset();
    CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "halved until accepted");
    size_t n = spans_of(r.addr, spans);
    size_t sum = 0;
    for (size_t i = 0; i < n && n != (size_t)-1; i++)
        sum += spans[i].len;
    CHECK(r.register_chunks == 8 && n == 8 && spans[1].offset == 2 * MIB && sum == 16 * MIB,
          "the true pieces: %d chunks, %zu spans", r.register_chunks, n);
    CHECK(f->get_last_error() == 0, "the refusals left no error");
    CHECK(pinmem_free(r.addr) == PINMEM_OK && live_registrations(f) == 0, "all unregistered");
    /* Below the floor: refused, rolled back, nothing left. */
    pinmem_option_set(PINMEM_OPT_REGISTER_MIN_CHUNK, (int64_t)4 * MIB);
    int rc = pinmem_alloc(&p, &r);
    CHECK(rc == PINMEM_ENOMEM && strstr(pinmem_last_detail(), "halves down to") != NULL,
          "floor reached: %d", rc);
    CHECK(f->get_last_error() == 0 && live_registrations(f) == 0, "nothing left");
    unsetenv("KVPOOL_FAKE_CUDA_MAX_REGISTER_BYTES");
    pinmem_option_set(PINMEM_OPT_REGISTER_MIN_CHUNK, (int64_t)GIB);
}

typedef struct commit_arg {
    void *addr;
    size_t len;
    int rc;
} commit_arg;

static void *commit_thread(void *arg)
{
    commit_arg *c = arg;
    c->rc = pinmem_commit(c->addr, 0, c->len, PINMEM_PIN_CUDA_REGISTER, 0, NULL);
    return NULL;
}

/* While chunk 1 is being registered, the rest is being populated: a commit
 * of a reservation (its address is known), watched from outside while the
 * fake holds the first call for 400 ms.  Sequential (the option off), all
 * of it is resident before the first call. */
static void test_overlap(const fake_rt *f)
{
    size_t len = 256 * MIB; /* 64 chunks: ~0.1 s to populate on one thread */
    pinmem_alloc_params p = params(len);
    p.populate = 0;
    p.register_chunk = 4 * MIB;
    for (int overlap = 1; overlap >= 0; overlap--) {
        pinmem_region r;
        CHECK(pinmem_alloc(&p, &r) == PINMEM_OK, "reserve");
        pinmem_option_set(PINMEM_OPT_REGISTER_OVERLAP, overlap);
        commit_arg c = {r.addr, len, -1};
        f->reset();
        setenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS", "400", 1);
        pthread_t t;
        pthread_create(&t, NULL, commit_thread, &c);
        for (int i = 0; i < 20000 && register_calls(f) < 1; i++)
            usleep(500);
        size_t at_first_call = resident_range(r.addr, len);
        size_t second = 0;
        for (int i = 0; i < 300 && register_calls(f) == 1; i++) {
            second = resident_range((char *)r.addr + 4 * MIB, 4 * MIB);
            if (second == 4 * MIB)
                break;
            usleep(1000);
        }
        int calls = register_calls(f);
        unsetenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS"); /* the other calls at once */
        pthread_join(t, NULL);
        CHECK(c.rc == PINMEM_OK, "commit %d", c.rc);
        CHECK(second == 4 * MIB && calls == 1,
              "overlap %d: chunk 2 resident during chunk 1's registration (%zu, calls %d)",
              overlap, second, calls);
        if (overlap)
            CHECK(at_first_call < len, "the first call began before the rest was resident");
        else
            CHECK(at_first_call == len, "sequential: all resident first (%zu)", at_first_call);
        CHECK(pinmem_free(r.addr) == PINMEM_OK, "free");
    }
    pinmem_option_set(PINMEM_OPT_REGISTER_OVERLAP, 1);
    CHECK(live_registrations(f) == 0, "nothing left");
}

/* A refusal in the middle of the pipeline: exact rollback, feeder stopped. */
static void test_pipeline_rollback(const fake_rt *f)
{
    pinmem_region r;
    pinmem_alloc_params p = params(20 * MIB);
    p.pin = PINMEM_PIN_CUDA_REGISTER;
    p.register_chunk = 4 * MIB;
    size_t before = live_count();
    f->reset();
    setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "3", 1);
    int rc = pinmem_alloc(&p, &r);
    unsetenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N");
    CHECK(rc == PINMEM_ENOMEM && strstr(pinmem_last_detail(), "chunk 3 of 5") != NULL &&
              strstr(pinmem_last_detail(), "unregistered 2 of the 2") != NULL,
          "refused mid-pipeline: %d", rc);
    int lr, la, regs, unregs;
    size_t largest;
    f->stats(&lr, &la, &regs, &unregs, &largest);
    CHECK(lr == 0 && regs == 3 && unregs == 2, "exact rollback: live %d regs %d unregs %d", lr,
          regs, unregs);
    CHECK(f->get_last_error() == 0, "no last error left");
    CHECK(live_count() == before, "no mapping left");
}

/* Memory libpinmem did not map: register, query, refuse misuse, unregister. */
static void test_external(const fake_rt *f)
{
    size_t len = 10 * MIB;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED, "mmap");
    if (m == MAP_FAILED)
        return;
    pinmem_region out;
    pinmem_span spans[64];
    f->reset();
    CHECK(pinmem_register(m, len, 4 * MIB, PINMEM_REGISTER_READ_ONLY, &out) == PINMEM_OK,
          "register");
    unsigned int flags = 0;
    int refused = 0;
    f->register_info(&flags, &refused);
    CHECK(flags == (1u | 8u), "Portable | ReadOnly passed: 0x%x", flags);
    CHECK(out.kind == PINMEM_KIND_EXTERNAL && out.pinned == PINMEM_PINNED_CUDA_REGISTER &&
              out.register_chunks == 3 && out.size == len,
          "described: kind %d chunks %d", out.kind, out.register_chunks);
    CHECK(spans_of(m, spans) == 3 && spans[2].offset == 8 * MIB && spans[2].len == 2 * MIB,
          "spans");
    CHECK(pinmem_register(m + MIB, MIB, 0, 0, NULL) == PINMEM_EINVAL, "overlap refused");
    CHECK(pinmem_free(m) == PINMEM_EINVAL && strstr(pinmem_last_detail(), "pinmem_unregister"),
          "free refused");
    CHECK(pinmem_commit(m, 0, 4096, PINMEM_PIN_NONE, 0, NULL) == PINMEM_EINVAL, "commit refused");
    CHECK(pinmem_cuda_reload(NULL) == PINMEM_EBUSY, "reload refused while registered");
    CHECK(pinmem_unregister(m) == PINMEM_OK && live_registrations(f) == 0, "unregister");
    CHECK(pinmem_unregister(m) == PINMEM_EUNKNOWN_PTR, "twice");

    /* Refused part-way: rolled back, no error left. */
    setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "2", 1);
    f->reset();
    int rc = pinmem_register(m, len, 4 * MIB, 0, NULL);
    unsetenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N");
    CHECK(rc == PINMEM_ENOMEM && strstr(pinmem_last_detail(), "unregistered 1 of the 1"),
          "refused part-way: %d", rc);
    CHECK(live_registrations(f) == 0 && f->get_last_error() == 0, "rolled back, error cleared");
    CHECK(pinmem_unregister(m) == PINMEM_EUNKNOWN_PTR, "nothing recorded");

    /* Populated first: resident, contents kept. */
    m[5 * MIB] = 42;
    CHECK(pinmem_register(m, len, 4 * MIB, PINMEM_REGISTER_POPULATE, &out) == PINMEM_OK &&
              resident_range(m, len) == len && m[5 * MIB] == 42,
          "populated, kept");
    /* A forked child forgets the parent's registration. */
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        _exit(pinmem_unregister(m) == PINMEM_OK ? 0 : 1);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child forgot it");
    CHECK(live_registrations(f) == 3, "the parent's stays");
    CHECK(pinmem_unregister(m) == PINMEM_OK && live_registrations(f) == 0, "parent unregisters");

    /* Bad input. */
    CHECK(pinmem_register(NULL, len, 0, 0, NULL) == PINMEM_EINVAL, "NULL");
    CHECK(pinmem_register(m, 0, 0, 0, NULL) == PINMEM_EINVAL, "empty");
    CHECK(pinmem_register(m, len, 0, 64, NULL) == PINMEM_EINVAL, "unknown flag");
    CHECK(pinmem_register(m + 1, MIB, 0, PINMEM_REGISTER_POPULATE, NULL) == PINMEM_EINVAL,
          "populate unaligned");
    pinmem_region own;
    pinmem_alloc_params p = params(MIB);
    CHECK(pinmem_alloc(&p, &own) == PINMEM_OK, "a mapping of our own");
    CHECK(pinmem_register(own.addr, MIB, 0, 0, NULL) == PINMEM_EINVAL, "ours: commit it instead");
    CHECK(pinmem_unregister(own.addr) == PINMEM_EINVAL, "ours: free it instead");
    pinmem_free(own.addr);
    munmap(m, len);
}

void test_register_fake(void *h)
{
    fake_rt f;
    f.stats = (stats_fn)dlsym(h, "fake_cuda_stats");
    f.reset = (void (*)(void))dlsym(h, "fake_cuda_reset");
    f.get_last_error = (int (*)(void))dlsym(h, "cudaGetLastError");
    f.peek_last_error = (int (*)(void))dlsym(h, "cudaPeekAtLastError");
    f.check_copy = (int (*)(const void *, size_t))dlsym(h, "fake_cuda_check_copy");
    f.register_info = (void (*)(unsigned int *, int *))dlsym(h, "fake_cuda_register_info");
    CHECK(f.stats && f.reset && f.get_last_error && f.peek_last_error && f.check_copy &&
              f.register_info,
          "the fake's calls");
    if (!(f.stats && f.reset && f.get_last_error && f.peek_last_error && f.check_copy &&
          f.register_info))
        return;
    test_spans_and_errors(&f);
    test_halving(&f);
    test_overlap(&f);
    test_pipeline_rollback(&f);
    test_external(&f);
}

/* Parallel population: MADV_POPULATE_WRITE, else one touch per page. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define PM_MAX_THREADS 1024

typedef struct pm_pop_task {
    char *start;
    size_t len;
    size_t page;
    int use_madvise;
    int touch;      /* pm_touch */
    int lock;
    int method;     /* out: pinmem_populate_method */
    int err;        /* out: errno of a failed populate, 0 if fine */
    int lock_err;   /* out: errno of a failed mlock, 0 if fine */
} pm_pop_task;

static void pm_touch(pm_pop_task *t)
{
    char *end = t->start + t->len;
    if (t->touch == PM_TOUCH_READ) {
        /* Read faults leave contents alone (shared memory with data in it). */
        volatile char sink = 0;
        for (char *p = t->start; p < end; p += t->page)
            sink ^= *(volatile char *)p;
        (void)sink;
    } else if (t->touch == PM_TOUCH_KEEP) {
        /* A read fault of private memory maps the shared zero page, which
         * is not memory of our own; a compare-and-swap of a byte with
         * itself is a write fault that changes nothing, and never loses a
         * concurrent writer's byte (a plain read-then-write could). */
        for (char *p = t->start; p < end; p += t->page) {
            char seen = __atomic_load_n(p, __ATOMIC_RELAXED);
            while (!__atomic_compare_exchange_n(p, &seen, seen, 0, __ATOMIC_RELAXED,
                                                __ATOMIC_RELAXED))
                ;
        }
    } else {
        for (char *p = t->start; p < end; p += t->page)
            *(volatile char *)p = 0;
    }
    t->method = PINMEM_POPULATE_FIRST_TOUCH;
}

static void *pm_pop_worker(void *arg)
{
    pm_pop_task *t = arg;
    t->err = 0;
    t->lock_err = 0;
    if (t->use_madvise) {
        /* POPULATE_WRITE never changes contents, so it suits every touch mode. */
        if (madvise(t->start, t->len, MADV_POPULATE_WRITE) == 0) {
            t->method = PINMEM_POPULATE_MADVISE;
        } else if (errno == EINVAL) {
            pm_touch(t);
        } else {
            t->err = errno;
            return NULL;
        }
    } else {
        pm_touch(t);
    }
    if (t->lock && pm_mlock(t->start, t->len) != 0)
        t->lock_err = errno;
    return NULL;
}

int pm_populate(void *addr, size_t len, size_t page, int threads, int touch, int lock,
                int lock_in_threads, int *method, int *threads_used, int *lock_errno)
{
    if (threads <= 0)
        threads = pm_default_threads();
    if (threads > PM_MAX_THREADS)
        threads = PM_MAX_THREADS;
    size_t min_bytes = (size_t)pm_opt(PINMEM_OPT_MIN_THREAD_BYTES);
    size_t by_size = min_bytes ? len / min_bytes : (size_t)threads;
    if (by_size < 1)
        by_size = 1;
    if ((size_t)threads > by_size)
        threads = (int)by_size;

    /* Chunks start on 2 MiB boundaries (or the page size, if larger), so
     * transparent hugepages and hugetlb pages are never split by threads. */
    size_t align = page > PM_HUGE_2M ? page : PM_HUGE_2M;
    size_t chunk = (len + (size_t)threads - 1) / (size_t)threads;
    chunk = (chunk + align - 1) / align * align;
    int n = (int)((len + chunk - 1) / chunk);
    if (n < 1)
        n = 1;

    int use_madvise = pm_opt(PINMEM_OPT_USE_POPULATE_WRITE) && pm_populate_write_supported();
    int in_threads = lock && lock_in_threads;

    pm_pop_task stack_tasks[16];
    pthread_t stack_tids[16];
    pm_pop_task *tasks = stack_tasks;
    pthread_t *tids = stack_tids;
    char *started = NULL;
    char stack_started[16];
    if (n > 16) {
        tasks = calloc((size_t)n, sizeof *tasks);
        tids = calloc((size_t)n, sizeof *tids);
        started = calloc((size_t)n, 1);
        if (tasks == NULL || tids == NULL || started == NULL) {
            free(tasks);
            free(tids);
            free(started);
            return pm_fail(PINMEM_ENOMEM, ENOMEM, "could not allocate populate bookkeeping");
        }
    } else {
        started = stack_started;
    }

    for (int i = 0; i < n; i++) {
        size_t off = (size_t)i * chunk;
        pm_pop_task *t = &tasks[i];
        t->start = (char *)addr + off;
        t->len = len - off < chunk ? len - off : chunk;
        t->page = page;
        t->use_madvise = use_madvise;
        t->touch = touch;
        t->lock = in_threads;
        t->method = PINMEM_POPULATE_NONE;
        t->err = 0;
        t->lock_err = 0;
        started[i] = 0;
    }
    /* Chunk 0 runs on the calling thread; a thread that cannot start runs
     * inline too, so population never fails for lack of threads. */
    for (int i = 1; i < n; i++) {
        if (pthread_create(&tids[i], NULL, pm_pop_worker, &tasks[i]) == 0)
            started[i] = 1;
        else
            pm_pop_worker(&tasks[i]);
    }
    pm_pop_worker(&tasks[0]);
    for (int i = 1; i < n; i++)
        if (started[i])
            pthread_join(tids[i], NULL);

    int status = PINMEM_OK;
    int m = PINMEM_POPULATE_NONE;
    int lock_err = 0;
    for (int i = 0; i < n; i++) {
        if (tasks[i].err != 0 && status == PINMEM_OK) {
            char b[64];
            status = pm_fail(PINMEM_ENOMEM, tasks[i].err,
                             "populating %s at offset %zu failed: %s",
                             pm_fmt_bytes(b, sizeof b, tasks[i].len),
                             (size_t)(tasks[i].start - (char *)addr), strerror(tasks[i].err));
        }
        if (tasks[i].lock_err != 0 && lock_err == 0)
            lock_err = tasks[i].lock_err;
        /* Report the weakest method any chunk used. */
        if (tasks[i].method > m)
            m = tasks[i].method;
    }
    if (n > 16) {
        free(tasks);
        free(tids);
        free(started);
    }
    if (status != PINMEM_OK)
        return status;
    if (lock && !in_threads && pm_mlock(addr, len) != 0)
        lock_err = errno;
    if (method != NULL)
        *method = m;
    if (threads_used != NULL)
        *threads_used = n;
    if (lock_errno != NULL)
        *lock_errno = lock_err;
    return PINMEM_OK;
}

PINMEM_API int pinmem_populate(void *addr, size_t len, int threads, int *method, int *threads_used)
{
    size_t page = pm_page_size();
    if (addr == NULL || len == 0)
        return pm_fail(PINMEM_EINVAL, 0, "populate needs a non-NULL address and a length > 0");
    if ((uintptr_t)addr % page != 0)
        return pm_fail(PINMEM_EINVAL, 0, "populate address %p is not page aligned (%zu)", addr,
                       page);
    if (threads < 0)
        return pm_fail(PINMEM_EINVAL, 0, "threads must be >= 0 (0 = default), got %d", threads);
    return pm_populate(addr, len, page, threads, PM_TOUCH_ZERO, 0, 0, method, threads_used,
                       NULL);
}

PINMEM_API int pinmem_resident_bytes(void *addr, size_t len, size_t *resident)
{
    size_t page = pm_page_size();
    if (addr == NULL || resident == NULL || len == 0)
        return pm_fail(PINMEM_EINVAL, 0, "resident_bytes needs an address, a length and an out");
    if ((uintptr_t)addr % page != 0)
        return pm_fail(PINMEM_EINVAL, 0, "address %p is not page aligned (%zu)", addr, page);
    size_t pages = (len + page - 1) / page;
    size_t step = 1 << 20; /* pages per mincore call */
    unsigned char *vec = malloc(step < pages ? step : pages);
    if (vec == NULL)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "could not allocate the mincore vector");
    size_t total = 0;
    for (size_t done = 0; done < pages;) {
        size_t n = pages - done < step ? pages - done : step;
        if (mincore((char *)addr + done * page, n * page, vec) != 0) {
            int err = errno;
            free(vec);
            return pm_fail(err == ENOMEM ? PINMEM_EINVAL : PINMEM_ESYS, err,
                           "mincore failed: %s", strerror(err));
        }
        for (size_t i = 0; i < n; i++)
            total += vec[i] & 1;
        done += n;
    }
    free(vec);
    size_t bytes = total * page;
    *resident = bytes > len ? len : bytes;
    return PINMEM_OK;
}

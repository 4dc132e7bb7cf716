/* Parallel population: threads take 2 MiB-aligned slices of the range one
 * by one and make each resident with MADV_POPULATE_WRITE or one touch per
 * page (the method comes from the populate plan, strategy.c). */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PM_MAX_THREADS 1024
#define PM_SLICE_MAX ((size_t)64 << 20)
#define PM_SLICES_PER_THREAD 8

/* One population, shared by its threads. */
typedef struct pm_pop_job {
    char *base;
    size_t len;
    size_t page;
    size_t slice;
    int madvise;    /* try MADV_POPULATE_WRITE first */
    int touch;      /* pm_touch, for first touch */
    int lock;       /* mlock each slice once resident */
    size_t next;    /* atomic: offset of the next slice to take */
    int stop;       /* atomic: a thread failed, the others stop */
} pm_pop_job;

/* What one thread did. */
typedef struct pm_pop_worker {
    pm_pop_job *job;
    int method;     /* weakest pinmem_populate_method it used */
    int err;        /* errno of a failed populate, 0 if fine */
    size_t err_off;
    size_t err_len;
    int lock_err;   /* errno of the first failed mlock, 0 if fine */
} pm_pop_worker;

static void pm_touch_range(char *start, size_t len, size_t page, int touch)
{
    char *end = start + len;
    if (touch == PM_TOUCH_READ) {
        /* Read faults leave contents alone (shared memory with data in it). */
        volatile char sink = 0;
        for (char *p = start; p < end; p += page)
            sink ^= *(volatile char *)p;
        (void)sink;
    } else if (touch == PM_TOUCH_KEEP) {
        /* A read fault of private memory maps the shared zero page, which
         * is not memory of our own; a compare-and-swap of a byte with
         * itself is a write fault that changes nothing, and never loses a
         * concurrent writer's byte (a plain read-then-write could). */
        for (char *p = start; p < end; p += page) {
            char seen = __atomic_load_n(p, __ATOMIC_RELAXED);
            while (!__atomic_compare_exchange_n(p, &seen, seen, 0, __ATOMIC_RELAXED,
                                                __ATOMIC_RELAXED))
                ;
        }
    } else {
        for (char *p = start; p < end; p += page)
            *(volatile char *)p = 0;
    }
}

/* Make one slice resident; 0 or the errno of the failure. */
static int pm_pop_slice(pm_pop_worker *w, char *start, size_t len)
{
    const pm_pop_job *job = w->job;
    int method = PINMEM_POPULATE_FIRST_TOUCH;
    if (job->madvise) {
        /* POPULATE_WRITE never changes contents, so it suits every touch mode. */
        if (madvise(start, len, MADV_POPULATE_WRITE) == 0)
            method = PINMEM_POPULATE_MADVISE;
        else if (errno != EINVAL)
            return errno;
        else
            pm_touch_range(start, len, job->page, job->touch);
    } else {
        pm_touch_range(start, len, job->page, job->touch);
    }
    if (method > w->method)
        w->method = method;
    if (job->lock && pm_mlock(start, len) != 0 && w->lock_err == 0)
        w->lock_err = errno;
    return 0;
}

static void *pm_pop_main(void *arg)
{
    pm_pop_worker *w = arg;
    pm_pop_job *job = w->job;
    while (!__atomic_load_n(&job->stop, __ATOMIC_RELAXED)) {
        size_t off = __atomic_fetch_add(&job->next, job->slice, __ATOMIC_RELAXED);
        if (off >= job->len)
            break;
        size_t len = job->len - off < job->slice ? job->len - off : job->slice;
        int err = pm_pop_slice(w, job->base + off, len);
        if (err != 0) {
            w->err = err;
            w->err_off = off;
            w->err_len = len;
            __atomic_store_n(&job->stop, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    return NULL;
}

/* Slices: about PM_SLICES_PER_THREAD per thread, at most 64 MiB, whole
 * multiples of align (2 MiB, or the page size if larger) so transparent
 * hugepages and hugetlb pages are never split between threads. */
static size_t pm_slice_bytes(size_t len, int threads, size_t align)
{
    size_t slice = len / ((size_t)threads * PM_SLICES_PER_THREAD);
    if (slice > PM_SLICE_MAX)
        slice = PM_SLICE_MAX;
    slice = pm_round_up(slice ? slice : 1, align);
    return slice;
}

int pm_populate_run(void *addr, size_t len, size_t page, int method, int threads, int touch,
                    int lock_in_threads, int *method_used, int *threads_used, int *lock_errno)
{
    if (threads < 1)
        threads = 1;
    if (threads > PM_MAX_THREADS)
        threads = PM_MAX_THREADS;
    size_t align = page > PM_HUGE_2M ? page : PM_HUGE_2M;
    pm_pop_job job = {(char *)addr, len, page, 0, method == PINMEM_POPULATE_MADVISE, touch,
                      lock_in_threads, 0, 0};
    job.slice = pm_slice_bytes(len, threads, align);
    size_t slices = (len + job.slice - 1) / job.slice;
    if ((size_t)threads > slices)
        threads = (int)slices;

    pm_pop_worker stack_workers[16];
    pthread_t stack_tids[16];
    pm_pop_worker *workers = stack_workers;
    pthread_t *tids = stack_tids;
    if (threads > 16) {
        workers = calloc((size_t)threads, sizeof *workers);
        tids = calloc((size_t)threads, sizeof *tids);
        if (workers == NULL || tids == NULL) {
            free(workers);
            free(tids);
            return pm_fail(PINMEM_ENOMEM, ENOMEM, "could not allocate populate bookkeeping");
        }
    }
    memset(workers, 0, (size_t)threads * sizeof *workers);
    /* Worker 0 is the calling thread; a thread that cannot start is simply
     * not there (the others take its slices), so population never fails
     * for lack of threads. */
    int started = 1;
    workers[0].job = &job;
    for (int i = 1; i < threads; i++) {
        workers[started].job = &job;
        if (pthread_create(&tids[started], NULL, pm_pop_main, &workers[started]) == 0)
            started++;
    }
    pm_pop_main(&workers[0]);
    for (int i = 1; i < started; i++)
        pthread_join(tids[i], NULL);

    int status = PINMEM_OK;
    int weakest = PINMEM_POPULATE_NONE;
    int lock_err = 0;
    for (int i = 0; i < started; i++) {
        const pm_pop_worker *w = &workers[i];
        if (w->err != 0 && status == PINMEM_OK) {
            char b[64];
            status = pm_fail(PINMEM_ENOMEM, w->err, "populating %s at offset %zu failed: %s",
                             pm_fmt_bytes(b, sizeof b, w->err_len), w->err_off,
                             strerror(w->err));
        }
        if (w->lock_err != 0 && lock_err == 0)
            lock_err = w->lock_err;
        if (w->method > weakest) /* report the weakest method any slice used */
            weakest = w->method;
    }
    if (threads > 16) {
        free(workers);
        free(tids);
    }
    if (status != PINMEM_OK)
        return status;
    if (method_used != NULL)
        *method_used = weakest;
    if (threads_used != NULL)
        *threads_used = started;
    if (lock_errno != NULL)
        *lock_errno = lock_err;
    return PINMEM_OK;
}

int pm_populate(void *addr, size_t len, size_t page, int threads, int touch, int lock,
                int lock_in_threads, int *method, int *threads_used, int *lock_errno)
{
    int how = PINMEM_POPULATE_MADVISE;
    pm_plan_resolve(len, threads, &how, &threads);
    size_t min_bytes = (size_t)pm_opt(PINMEM_OPT_MIN_THREAD_BYTES);
    size_t by_size = min_bytes ? len / min_bytes : (size_t)threads;
    if (by_size < 1)
        by_size = 1;
    if ((size_t)threads > by_size)
        threads = (int)by_size;
    int in_threads = lock && lock_in_threads;
    int lock_err = 0;
    int rc = pm_populate_run(addr, len, page, how, threads, touch, in_threads, method,
                             threads_used, &lock_err);
    if (rc != PINMEM_OK)
        return rc;
    if (lock && !in_threads && pm_mlock(addr, len) != 0)
        lock_err = errno;
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

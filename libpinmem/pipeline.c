/* Population overlapped with registration: while the calling thread
 * registers chunk i with CUDA, a feeder thread and the populate threads it
 * starts make chunk i+1 resident.
 *
 * Why: on an H200 host, registering populated memory ran at 18-21 GB/s on
 * one thread (the driver serialises it, so more threads gained little) and
 * population alone at 29.9 GB/s on 16 threads; one after the other they
 * gave 11.85 GB/s, overlapped they approach the slower of the two.
 *
 * Every CUDA call stays in the calling thread, so the last error it clears
 * after a refusal is the one its caller (torch, in the same thread) would
 * otherwise meet.  A failure of either side stops the other, and every chunk
 * registered so far is unregistered: the range ends as it began, except that
 * pages stay resident. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The population, shared by the feeder and the registering thread. */
typedef struct pm_feed {
    char *addr;
    size_t len;
    size_t step;          /* bytes populated at a time (the chunk) */
    size_t page;
    int method;           /* the populate plan's, resolved once for the range */
    int threads;
    int touch;
    pthread_mutex_t lock;
    pthread_cond_t moved;
    size_t ready;         /* bytes from addr made resident so far */
    int stop;             /* the registering side gave up */
    int status;           /* a failed population's status, PINMEM_OK otherwise */
    int err;
    char detail[512];
    int method_used;      /* weakest pinmem_populate_method of the steps */
    int threads_used;     /* most threads a step used */
} pm_feed;

/* Populate every step in order, publishing progress; runs in the feeder
 * thread, or in the calling thread when nothing overlaps. */
static void *pm_feed_main(void *arg)
{
    pm_feed *f = arg;
    for (size_t off = 0; off < f->len; off += f->step) {
        size_t l = f->len - off < f->step ? f->len - off : f->step;
        pthread_mutex_lock(&f->lock);
        int stop = f->stop;
        pthread_mutex_unlock(&f->lock);
        if (stop)
            break;
        int method = PINMEM_POPULATE_NONE, used = 0;
        int rc = pm_populate_run(f->addr + off, l, f->page, f->method, f->threads, f->touch, 0,
                                 &method, &used, NULL);
        pthread_mutex_lock(&f->lock);
        if (rc != PINMEM_OK) {
            f->status = rc;
            f->err = pinmem_last_errno();
            snprintf(f->detail, sizeof f->detail, "%s", pinmem_last_detail());
        } else {
            f->ready = off + l;
            if (method > f->method_used)
                f->method_used = method;
            if (used > f->threads_used)
                f->threads_used = used;
        }
        pthread_cond_broadcast(&f->moved);
        pthread_mutex_unlock(&f->lock);
        if (rc != PINMEM_OK)
            break;
    }
    return NULL;
}

/* Wait until [0, end) is resident; the feeder's status. */
static int pm_feed_wait(pm_feed *f, size_t end)
{
    pthread_mutex_lock(&f->lock);
    while (f->ready < end && f->status == PINMEM_OK)
        pthread_cond_wait(&f->moved, &f->lock);
    int status = f->ready >= end ? PINMEM_OK : f->status;
    pthread_mutex_unlock(&f->lock);
    return status;
}

/* Undo what was registered and fail with what went wrong. */
static int pm_pipeline_fail(const pm_cuda_api *cuda, char *addr, pm_chunks *done, int status,
                            int err, const char *what)
{
    int had = done->count;
    int undone = pm_unregister_chunks(cuda, addr, done->lens, done->count, NULL);
    free(done->lens);
    memset(done, 0, sizeof *done);
    return pm_fail(status, err, "%s; unregistered %d of the %d chunk(s) already registered", what,
                   undone, had);
}

int pm_populate_register(const pm_cuda_api *cuda, char *addr, size_t len, size_t page,
                         size_t chunk, unsigned int flags, int populate, int threads, int touch,
                         pm_chunks *done, int *method, int *threads_used)
{
    memset(done, 0, sizeof *done);
    size_t n = (len + chunk - 1) / chunk;
    pm_feed f;
    memset(&f, 0, sizeof f);
    f.addr = addr;
    f.len = len;
    f.page = page;
    f.touch = touch;
    f.ready = populate ? 0 : len;
    pthread_mutex_init(&f.lock, NULL);
    pthread_cond_init(&f.moved, NULL);
    int overlap = populate && n > 1 && pm_opt(PINMEM_OPT_REGISTER_OVERLAP);
    f.step = overlap ? chunk : len;
    if (populate) {
        pm_plan_resolve(len, threads, &f.method, &f.threads);
        /* As pm_populate does, no thread gets less than min_thread_bytes of
         * the range -- the range, not a chunk: the chunks are one job, and
         * capping each would leave CPUs idle while the pipeline runs. */
        size_t min_bytes = (size_t)pm_opt(PINMEM_OPT_MIN_THREAD_BYTES);
        size_t by_size = min_bytes ? len / min_bytes : (size_t)f.threads;
        if ((size_t)f.threads > by_size)
            f.threads = by_size ? (int)by_size : 1;
    }
    /* Pinning pages is CPU work in the driver: overlapped, the registering
     * thread keeps a CPU of its own where there are enough to spare one. */
    int cpus = pm_affinity_cpus();
    if (overlap && cpus >= 4 && f.threads >= cpus)
        f.threads = cpus - 1;
    pthread_t feeder;
    int feeding = overlap && pthread_create(&feeder, NULL, pm_feed_main, &f) == 0;
    if (populate && !feeding) {
        f.step = len;
        pm_feed_main(&f); /* all of it now, then register */
    }
    int status = PINMEM_OK;
    char what[768] = "";
    int err = 0;
    for (size_t i = 0; i < n && status == PINMEM_OK; i++) {
        size_t off = i * chunk;
        size_t l = len - off < chunk ? len - off : chunk;
        status = pm_feed_wait(&f, off + l);
        if (status != PINMEM_OK) {
            err = f.err;
            snprintf(what, sizeof what, "%s", f.detail);
            break;
        }
        status = pm_register_span(cuda, addr + off, l, chunk, page, flags, done);
        if (status != PINMEM_OK) {
            char detail[512], b[64];
            snprintf(detail, sizeof detail, "%s", pinmem_last_detail());
            snprintf(what, sizeof what,
                     "cudaHostRegister of chunk %zu of %zu (%s at offset %zu) failed: %s", i + 1,
                     n, pm_fmt_bytes(b, sizeof b, l), off, detail);
        }
    }
    if (feeding) {
        pthread_mutex_lock(&f.lock);
        f.stop = 1;
        pthread_mutex_unlock(&f.lock);
        pthread_join(feeder, NULL);
    }
    pthread_cond_destroy(&f.moved);
    pthread_mutex_destroy(&f.lock);
    if (status != PINMEM_OK)
        return pm_pipeline_fail(cuda, addr, done, status, err, what);
    if (method != NULL)
        *method = populate ? f.method_used : PINMEM_POPULATE_NONE;
    if (threads_used != NULL)
        *threads_used = f.threads_used;
    return PINMEM_OK;
}

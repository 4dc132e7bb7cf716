/* cudaHostRegister in chunks: the chunk a request registers in, the calls
 * (a call refused for its size retried with halves), their undoing, and the
 * chunk a pool should ask for. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* pinmem_register_plan aims at this many chunks per range, so that the
 * population of chunk i+1 overlaps the registration of chunk i for all but
 * 1/16 of the work ... */
#define PM_PLAN_STEPS 16
/* ... with chunks of at least this size (a registration call costs more
 * than its pages for small chunks, and few calls keep the boundaries few). */
#define PM_PLAN_MIN ((size_t)256 << 20)

size_t pm_register_chunk(size_t asked, size_t page)
{
    size_t limit = (size_t)pm_opt(PINMEM_OPT_REGISTER_CHUNK);
    size_t chunk = asked != 0 && asked < limit ? asked : limit;
    chunk = chunk / page * page;
    return chunk < page ? page : chunk;
}

static size_t pm_gcd(size_t a, size_t b)
{
    while (b != 0) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

PINMEM_API int pinmem_register_plan(size_t len, size_t unit, size_t *chunk)
{
    if (chunk == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "chunk must not be NULL");
    size_t limit = (size_t)pm_opt(PINMEM_OPT_REGISTER_CHUNK);
    /* 2 MiB granules suit both page sizes; a limit below 2 MiB (tests)
     * leaves only 4 KiB granules, and then 4 KiB pages. */
    size_t granule = limit >= PM_HUGE_2M ? PM_HUGE_2M : 4096;
    size_t g = granule;
    if (unit > 0) {
        size_t step = unit / pm_gcd(unit, granule);
        g = step > SIZE_MAX / granule ? SIZE_MAX : step * granule; /* lcm(unit, granule) */
    }
    size_t target = len / PM_PLAN_STEPS + (len % PM_PLAN_STEPS != 0);
    if (target < PM_PLAN_MIN)
        target = PM_PLAN_MIN;
    if (target > limit)
        target = limit;
    /* A unit whose multiples cannot fit under the limit is not honoured:
     * the caller leaves out what would straddle a boundary. */
    size_t c = g <= limit ? g : granule;
    /* Doubling keeps the chunk a power of two times the base, so one
     * registering the same memory in chunks of the (power-of-two) option,
     * as a process attaching a shared pool does, meets no boundary of ours
     * that is not also its own. */
    while (c <= target / 2)
        c *= 2;
    *chunk = c;
    return PINMEM_OK;
}

/* Errors a driver may give for a call whose size it cannot take. */
static int pm_size_refusal(int rc)
{
    return rc == PM_CUDA_ERROR_MEMORY_ALLOCATION || rc == PM_CUDA_ERROR_INVALID_VALUE;
}

static int pm_chunks_room(pm_chunks *done)
{
    if (done->count < done->cap)
        return 0;
    int cap = done->cap ? done->cap * 2 : 16;
    size_t *grown = realloc(done->lens, (size_t)cap * sizeof *grown);
    if (grown == NULL)
        return -1;
    done->lens = grown;
    done->cap = cap;
    return 0;
}

int pm_register_span(const pm_cuda_api *cuda, char *addr, size_t len, size_t chunk,
                     size_t page, unsigned int flags, pm_chunks *done)
{
    size_t floor = (size_t)pm_opt(PINMEM_OPT_REGISTER_MIN_CHUNK);
    size_t cur = chunk;
    size_t off = 0;
    int retries = 0;
    while (off < len) {
        size_t l = len - off < cur ? len - off : cur;
        if (pm_chunks_room(done) != 0)
            return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the list of chunks");
        int rc = cuda->host_register(addr + off, l, PM_CUDA_PORTABLE | flags);
        if (rc == 0) {
            done->lens[done->count++] = l;
            off += l;
            continue;
        }
        char msg[256];
        pm_cuda_describe(cuda, rc, msg, sizeof msg);
        pm_cuda_clear_error(cuda);
        /* Refused, perhaps for its size: try half as much (and keep the
         * smaller size for the rest of the range), down to the floor. */
        size_t half = l / 2 / page * page;
        if (pm_size_refusal(rc) && half >= floor && half >= page) {
            cur = half;
            retries++;
            continue;
        }
        char b[64];
        return pm_fail(rc == PM_CUDA_ERROR_MEMORY_ALLOCATION ? PINMEM_ENOMEM : PINMEM_ECUDA, 0,
                       "%s%s%s", msg, retries ? "; also refused in halves down to " : "",
                       retries ? pm_fmt_bytes(b, sizeof b, l) : "");
    }
    return PINMEM_OK;
}

int pm_unregister_chunks(const pm_cuda_api *cuda, char *addr, const size_t *lens, int count,
                         int *first_error)
{
    int undone = 0;
    int failed = 0;
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        int rc = cuda->host_unregister(addr + off);
        if (rc == 0)
            undone++;
        else if (failed++ == 0 && first_error != NULL)
            *first_error = rc;
        off += lens[i];
    }
    if (failed)
        pm_cuda_clear_error(cuda);
    return undone;
}

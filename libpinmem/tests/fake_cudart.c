/*
 * A stand-in CUDA runtime for tests on machines without a GPU.  It exports
 * the runtime calls libpinmem uses, implemented over mmap, plus the copy
 * calls a pool's user makes, and keeps books that tests can read back.
 * Environment knobs, read at every call:
 *
 *   KVPOOL_FAKE_CUDA_DEVICES            device count (default 1; 0 = none)
 *   KVPOOL_FAKE_CUDA_FAIL_REGISTER_N    the Nth cudaHostRegister (1-based,
 *                                       counted since load or reset) fails
 *   KVPOOL_FAKE_CUDA_MAX_REGISTER_BYTES registrations larger than this fail,
 *                                       as one of >= 512 GiB does on real drivers
 *   KVPOOL_FAKE_CUDA_FAIL_ALLOC         1: cudaHostAlloc fails
 *   KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS  cudaHostRegister sleeps this long
 *                                       first (to catch it in progress)
 *   KVPOOL_FAKE_CUDA_REGISTER_MS_PER_GIB  and this long per GiB it registers
 *                                       (a driver's registration rate, to show
 *                                       population overlapping registration)
 *
 * What it enforces, as the real runtime does:
 *   - a copy (cudaMemcpy, cudaMemcpyAsync) whose host range is not wholly
 *     inside ONE registration or cudaHostAlloc allocation fails with
 *     cudaErrorInvalidValue.  The real runtime stages a copy from memory
 *     that is not registered at all; the fake refuses it too, so a test
 *     sees a pool object that is not pinned;
 *   - a failed call leaves its error as the thread's last error until
 *     cudaGetLastError() reads and clears it (cudaPeekAtLastError() reads
 *     without clearing);
 *   - no two registrations overlap; only a registered base unregisters.
 *
 * It is a test fixture, not a model of the driver: it only checks what
 * libpinmem and the pools must get right.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    ERR_SUCCESS = 0,
    ERR_INVALID_VALUE = 1,
    ERR_MEMORY_ALLOCATION = 2,
    ERR_NO_DEVICE = 100,
    ERR_ALREADY_REGISTERED = 712,
    ERR_NOT_REGISTERED = 713,
};

/* cudaMemcpyKind */
enum { COPY_H2H = 0, COPY_H2D = 1, COPY_D2H = 2, COPY_D2D = 3, COPY_DEFAULT = 4 };

#define MAX_RANGES 4096

typedef struct range {
    char *ptr;
    size_t size;
} range;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static range regs[MAX_RANGES];
static range allocs[MAX_RANGES];
static range device[MAX_RANGES]; /* cudaMalloc: "device" memory (host memory here) */
static unsigned int last_register_flags;
static int refused_copies;
static int register_calls, unregister_calls;
static size_t max_register_bytes;
static __thread int last_error;

static long env_long(const char *name, long fallback)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return fallback;
    return strtol(v, NULL, 0);
}

static int set_error(int e)
{
    if (e != ERR_SUCCESS)
        last_error = e;
    return e;
}

EXPORT int cudaGetDeviceCount(int *count)
{
    long n = env_long("KVPOOL_FAKE_CUDA_DEVICES", 1);
    *count = (int)(n > 0 ? n : 0);
    return set_error(n > 0 ? ERR_SUCCESS : ERR_NO_DEVICE);
}

EXPORT int cudaRuntimeGetVersion(int *version)
{
    *version = 12040;
    return ERR_SUCCESS;
}

EXPORT int cudaGetLastError(void)
{
    int e = last_error;
    last_error = ERR_SUCCESS;
    return e;
}

EXPORT int cudaPeekAtLastError(void) { return last_error; }

EXPORT const char *cudaGetErrorName(int e)
{
    switch (e) {
    case ERR_SUCCESS: return "cudaSuccess";
    case ERR_INVALID_VALUE: return "cudaErrorInvalidValue";
    case ERR_MEMORY_ALLOCATION: return "cudaErrorMemoryAllocation";
    case ERR_NO_DEVICE: return "cudaErrorNoDevice";
    case ERR_ALREADY_REGISTERED: return "cudaErrorHostMemoryAlreadyRegistered";
    case ERR_NOT_REGISTERED: return "cudaErrorHostMemoryNotRegistered";
    default: return "cudaErrorUnknown";
    }
}

EXPORT const char *cudaGetErrorString(int e)
{
    switch (e) {
    case ERR_SUCCESS: return "no error";
    case ERR_INVALID_VALUE: return "invalid argument";
    case ERR_MEMORY_ALLOCATION: return "out of memory";
    case ERR_NO_DEVICE: return "no CUDA-capable device is detected";
    case ERR_ALREADY_REGISTERED: return "part or all of the requested memory range is already mapped";
    case ERR_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
    default: return "unrecognized error code";
    }
}

static int mapped(void *p, size_t size)
{
    unsigned char v;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *first = (char *)((uintptr_t)p & ~(uintptr_t)(page - 1));
    char *last = (char *)(((uintptr_t)p + size - 1) & ~(uintptr_t)(page - 1));
    return mincore(first, page, &v) == 0 && mincore(last, page, &v) == 0;
}

EXPORT int cudaHostAlloc(void **out, size_t size, unsigned int flags)
{
    (void)flags;
    if (out == NULL || size == 0)
        return set_error(ERR_INVALID_VALUE);
    if (env_long("KVPOOL_FAKE_CUDA_FAIL_ALLOC", 0))
        return set_error(ERR_MEMORY_ALLOCATION);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0);
    if (p == MAP_FAILED)
        return set_error(ERR_MEMORY_ALLOCATION);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RANGES; i++) {
        if (allocs[i].ptr == NULL) {
            allocs[i].ptr = p;
            allocs[i].size = size;
            pthread_mutex_unlock(&lock);
            *out = p;
            return ERR_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    munmap(p, size);
    return set_error(ERR_MEMORY_ALLOCATION);
}

EXPORT int cudaFreeHost(void *p)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RANGES; i++) {
        if (allocs[i].ptr == p && p != NULL) {
            size_t size = allocs[i].size;
            allocs[i].ptr = NULL;
            pthread_mutex_unlock(&lock);
            munmap(p, size);
            return ERR_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return set_error(ERR_INVALID_VALUE);
}

static void sleep_ns(long long ns)
{
    struct timespec t = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

EXPORT int cudaHostRegister(void *p, size_t size, unsigned int flags)
{
    char *c = p;
    long delay_ms = env_long("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS", 0);
    long per_gib_ms = env_long("KVPOOL_FAKE_CUDA_REGISTER_MS_PER_GIB", 0);
    long long delay_ns = (long long)delay_ms * 1000000LL;
    if (per_gib_ms > 0)
        delay_ns += (long long)((double)per_gib_ms * 1e6 * (double)size / (double)(1ULL << 30));
    pthread_mutex_lock(&lock);
    int call = ++register_calls;
    last_register_flags = flags;
    if (delay_ns > 0) {
        /* Counted first, so a test sees the call begin, then sleep unlocked
         * (as a driver's registration takes time, not this process's CPU). */
        pthread_mutex_unlock(&lock);
        sleep_ns(delay_ns);
        pthread_mutex_lock(&lock);
    }
    long fail_n = env_long("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", 0);
    long max = env_long("KVPOOL_FAKE_CUDA_MAX_REGISTER_BYTES", 0);
    int rc = ERR_SUCCESS;
    if (p == NULL || size == 0 || !mapped(p, size))
        rc = ERR_INVALID_VALUE;
    else if (fail_n > 0 && call == fail_n)
        rc = ERR_MEMORY_ALLOCATION;
    else if (max > 0 && size > (size_t)max)
        rc = ERR_MEMORY_ALLOCATION;
    int slot = -1;
    for (int i = 0; rc == ERR_SUCCESS && i < MAX_RANGES; i++) {
        if (regs[i].ptr == NULL) {
            if (slot < 0)
                slot = i;
        } else if (c < regs[i].ptr + regs[i].size && regs[i].ptr < c + size) {
            rc = ERR_ALREADY_REGISTERED;
        }
    }
    if (rc == ERR_SUCCESS && slot < 0)
        rc = ERR_MEMORY_ALLOCATION;
    if (rc == ERR_SUCCESS) {
        regs[slot].ptr = c;
        regs[slot].size = size;
        if (size > max_register_bytes)
            max_register_bytes = size;
    }
    pthread_mutex_unlock(&lock);
    return set_error(rc);
}

EXPORT int cudaHostUnregister(void *p)
{
    pthread_mutex_lock(&lock);
    unregister_calls++;
    for (int i = 0; i < MAX_RANGES; i++) {
        if (regs[i].ptr == p && p != NULL) {
            regs[i].ptr = NULL;
            regs[i].size = 0;
            pthread_mutex_unlock(&lock);
            return ERR_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return set_error(ERR_NOT_REGISTERED);
}

/* "Device" memory: host memory the fake copies to and from. */
EXPORT int cudaMalloc(void **out, size_t size)
{
    if (out == NULL || size == 0)
        return set_error(ERR_INVALID_VALUE);
    void *p = malloc(size);
    if (p == NULL)
        return set_error(ERR_MEMORY_ALLOCATION);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RANGES; i++) {
        if (device[i].ptr == NULL) {
            device[i].ptr = p;
            device[i].size = size;
            pthread_mutex_unlock(&lock);
            *out = p;
            return ERR_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    free(p);
    return set_error(ERR_MEMORY_ALLOCATION);
}

EXPORT int cudaFree(void *p)
{
    if (p == NULL)
        return ERR_SUCCESS;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RANGES; i++) {
        if (device[i].ptr == p) {
            device[i].ptr = NULL;
            pthread_mutex_unlock(&lock);
            free(p);
            return ERR_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return set_error(ERR_INVALID_VALUE);
}

/* Is [p, p+size) inside one of table's ranges?  Called with the lock held. */
static int inside_one(const range *table, const char *p, size_t size)
{
    for (int i = 0; i < MAX_RANGES; i++)
        if (table[i].ptr != NULL && table[i].ptr <= p && size <= table[i].size &&
            (size_t)(p - table[i].ptr) <= table[i].size - size)
            return 1;
    return 0;
}

/* CUDA's rule for the host side of a copy: wholly inside ONE registration
 * or ONE cudaHostAlloc allocation.  0 or cudaErrorInvalidValue. */
EXPORT int fake_cuda_check_copy(const void *host, size_t size)
{
    pthread_mutex_lock(&lock);
    int ok = size > 0 && host != NULL &&
             (inside_one(regs, host, size) || inside_one(allocs, host, size));
    pthread_mutex_unlock(&lock);
    return ok ? ERR_SUCCESS : ERR_INVALID_VALUE;
}

static int copy(void *dst, const void *src, size_t count, int kind)
{
    if (count == 0)
        return ERR_SUCCESS;
    const void *host = kind == COPY_H2D ? src : kind == COPY_D2H ? dst : NULL;
    const void *dev = kind == COPY_H2D ? dst : kind == COPY_D2H ? src : NULL;
    if (host == NULL) /* H2H, D2D and inferred kinds: not what the fake models */
        return set_error(ERR_INVALID_VALUE);
    pthread_mutex_lock(&lock);
    int ok = inside_one(device, dev, count) &&
             (inside_one(regs, host, count) || inside_one(allocs, host, count));
    if (!ok)
        refused_copies++;
    pthread_mutex_unlock(&lock);
    if (!ok)
        return set_error(ERR_INVALID_VALUE);
    memcpy(dst, src, count);
    return ERR_SUCCESS;
}

EXPORT int cudaMemcpy(void *dst, const void *src, size_t count, int kind)
{
    return copy(dst, src, count, kind);
}

EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream)
{
    (void)stream; /* done at once: the fake has no streams */
    return copy(dst, src, count, kind);
}

/* The flags of the most recent cudaHostRegister; copies refused so far. */
EXPORT void fake_cuda_register_info(unsigned int *flags, int *refused)
{
    pthread_mutex_lock(&lock);
    *flags = last_register_flags;
    *refused = refused_copies;
    pthread_mutex_unlock(&lock);
}

/* Books for tests: live registrations and allocations, call counts. */
EXPORT void fake_cuda_stats(int *live_registrations, int *live_allocations, int *registers,
                            int *unregisters, size_t *largest_registration)
{
    int lr = 0, la = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RANGES; i++) {
        lr += regs[i].ptr != NULL;
        la += allocs[i].ptr != NULL;
    }
    *live_registrations = lr;
    *live_allocations = la;
    *registers = register_calls;
    *unregisters = unregister_calls;
    *largest_registration = max_register_bytes;
    pthread_mutex_unlock(&lock);
}

/* Reset the call counters (live ranges are kept). */
EXPORT void fake_cuda_reset(void)
{
    pthread_mutex_lock(&lock);
    register_calls = 0;
    unregister_calls = 0;
    max_register_bytes = 0;
    refused_copies = 0;
    pthread_mutex_unlock(&lock);
}

/* Is [p, p+size) covered by one live registration? */
EXPORT int fake_cuda_is_registered(void *p, size_t size)
{
    char *c = p;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RANGES; i++)
        if (regs[i].ptr != NULL && regs[i].ptr <= c && c + size <= regs[i].ptr + regs[i].size)
            found = 1;
    pthread_mutex_unlock(&lock);
    return found;
}

/* Populate and pin one range: mlock in its modes, or population and
 * cudaHostRegister in chunks (pipeline.c); the pinning plan of a range. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MADV_DONTFORK
#define MADV_DONTFORK 10
#endif
#ifndef MADV_DOFORK
#define MADV_DOFORK 11
#endif

int pm_mlock(void *addr, size_t len)
{
    if (pm_fault(PINMEM_FAULT_MLOCK_EPERM)) {
        errno = EPERM;
        return -1;
    }
    return mlock(addr, len);
}

int pm_mlock_onfault(void *addr, size_t len)
{
    if (pm_fault(PINMEM_FAULT_MLOCK_EPERM)) {
        errno = EPERM;
        return -1;
    }
    return (int)syscall(SYS_mlock2, addr, len, 1 /* MLOCK_ONFAULT */);
}

int pm_range_plan(int pin, const pm_cuda_api *cuda, const char *why, int *plan)
{
    switch (pin) {
    case PINMEM_PIN_AUTO:
        *plan = cuda != NULL ? PM_PLAN_CUDA_REGISTER : PM_PLAN_MLOCK_SOFT;
        return PINMEM_OK;
    case PINMEM_PIN_NONE:
        *plan = PM_PLAN_NONE;
        return PINMEM_OK;
    case PINMEM_PIN_MLOCK:
        *plan = PM_PLAN_MLOCK;
        return PINMEM_OK;
    case PINMEM_PIN_CUDA_REGISTER:
        if (cuda == NULL)
            return pm_fail(PINMEM_ENO_CUDA, 0, "cuda-register pinning needs CUDA: %s", why);
        *plan = PM_PLAN_CUDA_REGISTER;
        return PINMEM_OK;
    default:
        return pm_fail(PINMEM_EINVAL, 0, "pin mode %d cannot pin a range", pin);
    }
}

static const char *pm_memlock_text(char *buf, size_t len)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return "unknown";
    if (rl.rlim_cur == RLIM_INFINITY)
        return "unlimited";
    return pm_fmt_bytes(buf, len, (uint64_t)rl.rlim_cur);
}

/* How a range gets locked, decided before populating. */
typedef struct pm_lock {
    int lock;        /* the plan mlocks */
    int mode;        /* PINMEM_OPT_MLOCK_MODE resolved: 0, 1 or 2 */
    int in_populate; /* the populate step locks (mode 0 or 1) */
    int err;         /* first refusal, 0 if none */
} pm_lock;

/* Resolve the mlock mode; mode 2 locks on fault now, before populating. */
static void pm_lock_begin(char *addr, size_t len, int hugetlb, int plan, pm_lock *lk)
{
    memset(lk, 0, sizeof *lk);
    lk->lock = plan == PM_PLAN_MLOCK || plan == PM_PLAN_MLOCK_SOFT;
    lk->in_populate = lk->lock;
    lk->mode = (int)pm_opt(PINMEM_OPT_MLOCK_MODE);
    if (lk->mode == 3)
        lk->mode = hugetlb ? 0 : 2;
    if (!lk->lock || lk->mode != 2)
        return;
    /* Lock first, on fault: the populate threads then lock as they go and
     * a refusal costs nothing.  ENOSYS/EINVAL: old kernel, lock in the
     * threads instead. */
    if (pm_mlock_onfault(addr, len) == 0) {
        lk->in_populate = 0;
    } else if (errno != ENOSYS && errno != EINVAL) {
        lk->err = errno;
        lk->in_populate = 0; /* refused up front: populate unlocked */
    } else {
        lk->mode = 1;
    }
}

/* After populating: report mlock, or undo a refused lock (and fail when
 * the plan required it). */
static int pm_lock_end(char *addr, size_t len, int plan, const pm_lock *lk, pm_fill *out)
{
    if (lk->err == 0) {
        out->pinned = PINMEM_PINNED_MLOCK;
        return PINMEM_OK;
    }
    munlock(addr, len);
    if (plan != PM_PLAN_MLOCK)
        return PINMEM_OK;
    char a[64], b[64];
    return pm_fail(PINMEM_EMLOCK, lk->err,
                   "mlock of %s refused: %s; the memlock limit is %s (raise it: ulimit -l "
                   "unlimited, or memlock in /etc/security/limits.conf, or run with "
                   "CAP_IPC_LOCK)",
                   pm_fmt_bytes(a, sizeof a, len), strerror(lk->err),
                   pm_memlock_text(b, sizeof b));
}

int pm_fill_range(char *addr, size_t len, size_t page, int hugetlb, int plan,
                  const pm_cuda_api *cuda, int populate, int threads, int touch,
                  const pm_reg_req *reg, pm_fill *out)
{
    memset(out, 0, sizeof *out);
    out->pinned = PINMEM_PINNED_NONE;
    if (plan == PM_PLAN_CUDA_REGISTER) {
        pm_chunks done;
        size_t chunk = pm_register_chunk(reg != NULL ? reg->chunk : 0, page);
        int rc = pm_populate_register(cuda, addr, len, page, chunk, reg != NULL ? reg->flags : 0,
                                      1, threads, touch, &done, &out->method,
                                      &out->threads_used);
        if (rc != PINMEM_OK)
            return rc;
        out->pinned = PINMEM_PINNED_CUDA_REGISTER;
        out->register_chunks = done.count;
        out->chunk_lens = done.lens;
        return PINMEM_OK;
    }
    pm_lock lk;
    pm_lock_begin(addr, len, hugetlb, plan, &lk);
    int refused_required = lk.err != 0 && plan == PM_PLAN_MLOCK;
    if (!refused_required && (populate || plan != PM_PLAN_NONE)) {
        int populate_lock_err = 0;
        int rc = pm_populate(addr, len, page, threads, touch, lk.in_populate, lk.mode == 1,
                             &out->method, &out->threads_used, &populate_lock_err);
        if (rc != PINMEM_OK) {
            if (lk.lock)
                munlock(addr, len);
            return rc;
        }
        if (lk.err == 0)
            lk.err = populate_lock_err;
    }
    if (lk.lock)
        return pm_lock_end(addr, len, plan, &lk, out);
    return PINMEM_OK;
}

/* Populate and pin a fresh mapping per plan; fills the region fields and
 * records what was populated or pinned as one committed range. */
int pm_entry_fill(pm_entry *e, int plan, const pm_cuda_api *cuda, int populate, int threads,
                  int touch)
{
    pinmem_region *r = &e->region;
    int private_map = r->kind != PINMEM_KIND_SHM;
    int pinning = plan != PM_PLAN_NONE;
    int committing = populate || pinning;
    /* Room for the range first, so that nothing can fail once pinned. */
    if (committing && pm_ranges_reserve(e, 1) != 0)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    if (private_map && pinning && madvise(r->addr, r->mapped_size, MADV_DONTFORK) == 0)
        e->dontfork = 1;
    pm_fill f;
    pm_reg_req reg = {e->register_chunk, e->register_flags};
    int rc = pm_fill_range(r->addr, r->mapped_size, r->page_size,
                           r->kind == PINMEM_KIND_HUGETLB, plan, cuda, populate, threads, touch,
                           &reg, &f);
    if (rc != PINMEM_OK)
        return rc;
    r->populate_method = f.method;
    r->threads_used = f.threads_used;
    if (committing) {
        pm_range range = {0, r->mapped_size, f.pinned, 0, f.register_chunks, f.chunk_lens};
        pm_range_add(e, &range);
    }
    if (f.pinned == PINMEM_PINNED_CUDA_REGISTER)
        e->cuda = cuda;
    if (e->dontfork && f.pinned == PINMEM_PINNED_NONE) {
        madvise(r->addr, r->mapped_size, MADV_DOFORK);
        e->dontfork = 0;
    }
    pm_entry_totals(e);
    return PINMEM_OK;
}

/* Incremental commit of a reserved mapping: make one range resident and
 * pinned, with the registry lock held only to check and to record, never
 * while populating or pinning. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_DONTFORK
#define MADV_DONTFORK 10
#endif
#ifndef MADV_DOFORK
#define MADV_DOFORK 11
#endif

/* One commit, from its checks under the lock to its record under the lock. */
typedef struct pm_commit {
    size_t offset;
    size_t len;
    int pin;                 /* pinmem_pin_mode asked for */
    int plan;                /* pm_plan chosen */
    const pm_cuda_api *cuda; /* usable runtime (NULL if none); then the one to use */
    const char *why;         /* why cuda is NULL */
    char *base;              /* the mapping, copied for the unlocked work */
    size_t page;
    int hugetlb;
    int status;              /* of the unlocked work */
    pm_reg_req reg;          /* how the mapping registers */
    pm_fill fill;
} pm_commit;

static const char *pm_pinned_name(int pinned)
{
    switch (pinned) {
    case PINMEM_PINNED_MLOCK: return "mlock";
    case PINMEM_PINNED_CUDA_ALLOC: return "cuda-alloc";
    case PINMEM_PINNED_CUDA_REGISTER: return "cuda-register";
    default: return "none";
    }
}

/* Under the registry lock: check the range, choose the plan, claim the
 * range with a pending entry.  PINMEM_OK holds the entry. */
static int pm_commit_begin(pm_entry *e, void *arg)
{
    pm_commit *c = arg;
    pinmem_region *r = &e->region;
    if (e->pid != getpid() && e->dontfork)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                       "the mapping at %p was not inherited by this process (MADV_DONTFORK)",
                       r->addr);
    size_t page = r->page_size;
    if (c->offset % page != 0 || c->len % page != 0)
        return pm_fail(PINMEM_EINVAL, 0,
                       "commit offset %zu and length %zu must both be multiples of the page "
                       "size %zu of the mapping at %p%s",
                       c->offset, c->len, page, r->addr,
                       r->kind == PINMEM_KIND_HUGETLB ? " (2 MiB hugetlb pages)" : "");
    if (c->offset > r->mapped_size || c->len > r->mapped_size - c->offset) {
        char b[64];
        return pm_fail(PINMEM_EINVAL, 0,
                       "commit of %zu bytes at offset %zu ends past the end of the mapping at "
                       "%p, whose mapped size is %s",
                       c->len, c->offset, r->addr, pm_fmt_bytes(b, sizeof b, r->mapped_size));
    }
    if (r->kind == PINMEM_KIND_EXTERNAL)
        return pm_fail(PINMEM_EINVAL, 0,
                       "%p is a registration of memory libpinmem did not map (pinmem_register); "
                       "it has no range to commit",
                       r->addr);
    const pm_range *g = pm_range_overlap(e, c->offset, c->len);
    if (g != NULL && g->pending)
        return pm_fail(PINMEM_EBUSY, 0,
                       "commit of [%zu, %zu) overlaps [%zu, %zu), which another thread is "
                       "committing now",
                       c->offset, c->offset + c->len, g->offset, g->offset + g->len);
    if (g != NULL)
        return pm_fail(PINMEM_EINVAL, 0,
                       "commit of [%zu, %zu) overlaps [%zu, %zu), committed before (pinned: %s); "
                       "a range is committed once, and a mapping populated or pinned when "
                       "allocated is committed whole (reserve with pin none, populate off)",
                       c->offset, c->offset + c->len, g->offset, g->offset + g->len,
                       pm_pinned_name(g->pinned));
    /* Stay with the runtime that registered the rest of this mapping. */
    if (e->cuda != NULL)
        c->cuda = e->cuda;
    int rc = pm_range_plan(c->pin, c->cuda, c->why, &c->plan);
    if (rc != PINMEM_OK)
        return rc;
    if (pm_ranges_reserve(e, 1) != 0)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    int aim = PINMEM_PINNED_NONE;
    if (c->plan == PM_PLAN_CUDA_REGISTER)
        aim = PINMEM_PINNED_CUDA_REGISTER;
    else if (c->plan != PM_PLAN_NONE)
        aim = PINMEM_PINNED_MLOCK;
    pm_range pending = {c->offset, c->len, aim, 1, 0, NULL};
    pm_range_add(e, &pending);
    /* Pinned pages must not be shared copy-on-write with a child: as at
     * allocation, the whole private mapping stops being inherited. */
    if (aim != PINMEM_PINNED_NONE && r->kind != PINMEM_KIND_SHM && !e->dontfork &&
        madvise(r->addr, r->mapped_size, MADV_DONTFORK) == 0)
        e->dontfork = 1;
    /* Set now, so that the runtime cannot be swapped while registering. */
    if (aim == PINMEM_PINNED_CUDA_REGISTER)
        e->cuda = c->cuda;
    c->base = r->addr;
    c->reg.chunk = e->register_chunk;
    c->reg.flags = e->register_flags;
    c->page = page;
    c->hugetlb = r->kind == PINMEM_KIND_HUGETLB;
    return PINMEM_OK;
}

/* Under the registry lock: record the outcome, before the hold is dropped. */
static void pm_commit_end(pm_entry *e, void *arg)
{
    pm_commit *c = arg;
    pm_range *g = pm_range_at(e, c->offset); /* ours: ranges never overlap */
    if (g != NULL && c->status == PINMEM_OK) {
        g->pending = 0;
        g->pinned = c->fill.pinned;
        g->register_chunks = c->fill.register_chunks;
        g->chunk_lens = c->fill.chunk_lens; /* the range owns them now */
        e->region.populate_method = c->fill.method;
        e->region.threads_used = c->fill.threads_used;
    } else if (g != NULL) {
        pm_range_remove(e, g);
    }
    /* What still pins the mapping: finished ranges and commits in progress. */
    int pins = 0, registered = 0;
    for (size_t k = 0; k < e->range_count; k++) {
        pins |= e->ranges[k].pinned != PINMEM_PINNED_NONE;
        registered |= e->ranges[k].pinned == PINMEM_PINNED_CUDA_REGISTER;
    }
    if (!registered)
        e->cuda = NULL;
    if (!pins && e->dontfork && madvise(e->region.addr, e->region.mapped_size, MADV_DOFORK) == 0)
        e->dontfork = 0;
    pm_entry_totals(e);
}

PINMEM_API int pinmem_commit(void *addr, size_t offset, size_t len, int pin, int threads,
                             int *pinned)
{
    if (addr == NULL)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "NULL is not a mapping");
    if (len == 0)
        return pm_fail(PINMEM_EINVAL, 0, "commit length must be > 0, got 0");
    if (pin == PINMEM_PIN_CUDA_ALLOC)
        return pm_fail(PINMEM_EINVAL, 0,
                       "cudaHostAlloc cannot pin a range of an existing mapping; commit with "
                       "the cuda-register (or auto) pin mode");
    if (pin != PINMEM_PIN_AUTO && pin != PINMEM_PIN_NONE && pin != PINMEM_PIN_MLOCK &&
        pin != PINMEM_PIN_CUDA_REGISTER)
        return pm_fail(PINMEM_EINVAL, 0,
                       "pin mode %d cannot commit a range (auto, none, mlock or cuda-register)",
                       pin);
    if (threads < 0 || threads > 1024)
        return pm_fail(PINMEM_EINVAL, 0, "threads must be 0 (default) or 1..1024, got %d",
                       threads);
    uint64_t ram = pm_mem_total();
    if (ram != 0 && len > ram) {
        char a[64], b[64];
        return pm_fail(PINMEM_ETOO_LARGE, 0,
                       "making %s resident needs more than this machine's %s of RAM",
                       pm_fmt_bytes(a, sizeof a, len), pm_fmt_bytes(b, sizeof b, ram));
    }
    pm_commit c;
    memset(&c, 0, sizeof c);
    c.offset = offset;
    c.len = len;
    c.pin = pin;
    c.why = "";
    /* Looked up before the registry lock is taken (never both at once). */
    if (pin == PINMEM_PIN_AUTO || pin == PINMEM_PIN_CUDA_REGISTER)
        c.cuda = pm_cuda(&c.why);

    pm_entry *e = NULL;
    int rc = pm_registry_hold(addr, pm_commit_begin, &c, &e);
    if (rc == -1) {
        void *base = pm_registry_containing(addr);
        if (base != NULL)
            return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                           "%p lies inside the mapping at %p; commit with that base address and "
                           "an offset",
                           addr, base);
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                       "%p is not a live mapping (freed, or not from libpinmem)", addr);
    }
    if (rc == -2)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "the mapping at %p is being freed", addr);
    if (rc != PINMEM_OK)
        return rc;

    /* The memory limits first (hugetlb pages come from their own pool). */
    c.status = c.hugetlb ? PINMEM_OK : pm_check_room(c.len, c.plan != PM_PLAN_NONE);
    if (c.status == PINMEM_OK)
        c.status = pm_fill_range(c.base + c.offset, c.len, c.page, c.hugetlb, c.plan, c.cuda,
                                 1, threads, PM_TOUCH_KEEP, &c.reg, &c.fill);
    int err = pinmem_last_errno();
    char detail[768] = "";
    if (c.status != PINMEM_OK)
        snprintf(detail, sizeof detail, "%s", pinmem_last_detail());
    pm_registry_unhold(e, pm_commit_end, &c);
    if (c.status != PINMEM_OK)
        return pm_fail(c.status, err, "commit of [%zu, %zu) of the mapping at %p: %s", offset,
                       offset + len, addr, detail);
    if (pinned != NULL)
        *pinned = c.fill.pinned;
    return PINMEM_OK;
}

/* pinmem_alloc in four steps, each a function of its own: plan (check the
 * request, choose pages and pinning), map, bind (NUMA), fill (populate and
 * pin); and the cudaHostAlloc path when the plan chooses it. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* No user address space is larger than 2^56 bytes (5-level paging). */
#define PM_SIZE_LIMIT ((size_t)1 << 56)
/* One cudaHostAlloc of this size or more fails on drivers from r580: an
 * explicit cuda-alloc request of that size registers instead. */
#define PM_CUDA_ALLOC_LIMIT ((size_t)512 << 30)

/* What pm_step_plan decided, read by the steps after it. */
typedef struct pm_alloc_plan {
    const pinmem_alloc_params *p;
    int is_shm;
    int hugepages;           /* pinmem_hugepage_mode; map turns AUTO into its fallback */
    int pin_plan;            /* pm_plan */
    const pm_cuda_api *cuda; /* the runtime the plan pins with, or NULL */
} pm_alloc_plan;

PINMEM_API int pinmem_params_init(pinmem_alloc_params *params)
{
    if (params == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "params must not be NULL");
    memset(params, 0, sizeof *params);
    params->numa_node = -1;
    params->populate = 1;
    return PINMEM_OK;
}

/* ----------------------------------------------------------------- plan */

/* Every field of the request within its range. */
static int pm_alloc_check(const pinmem_alloc_params *p)
{
    if (p->size == 0)
        return pm_fail(PINMEM_EINVAL, 0, "size must be > 0, got 0");
    if (p->size > PM_SIZE_LIMIT) {
        char b[64];
        return pm_fail(PINMEM_ETOO_LARGE, 0,
                       "size %s is beyond any address space (limit 2^56 bytes)",
                       pm_fmt_bytes(b, sizeof b, p->size));
    }
    if (p->pin < PINMEM_PIN_AUTO || p->pin > PINMEM_PIN_CUDA_REGISTER)
        return pm_fail(PINMEM_EINVAL, 0, "pin mode %d is not a pinmem_pin_mode (0..4)", p->pin);
    if (p->hugepages < PINMEM_HUGE_NEVER || p->hugepages > PINMEM_HUGE_REQUIRED)
        return pm_fail(PINMEM_EINVAL, 0, "hugepage mode %d is not a pinmem_hugepage_mode (0..3)",
                       p->hugepages);
    if (p->numa_node < -1 || p->numa_node >= PINMEM_MAX_NUMA_NODES)
        return pm_fail(PINMEM_EINVAL, 0, "numa_node must be -1 or 0..%d, got %d",
                       PINMEM_MAX_NUMA_NODES - 1, p->numa_node);
    if (p->threads < 0 || p->threads > 1024)
        return pm_fail(PINMEM_EINVAL, 0, "threads must be 0 (default) or 1..1024, got %d",
                       p->threads);
    if (p->flags & ~(PINMEM_SHM_REUSE | PINMEM_SHM_KEEP_ON_FREE))
        return pm_fail(PINMEM_EINVAL, 0, "unknown flags 0x%x", (unsigned)p->flags);
    if (p->shm_mode > 07777)
        return pm_fail(PINMEM_EINVAL, 0, "shm_mode 0%o is not a permission mask", p->shm_mode);
    if (p->shm_name != NULL)
        return pinmem_shm_name_check(p->shm_name);
    return PINMEM_OK;
}

/* Choose how to pin: cudaHostAlloc, register, mlock (soft or required), none. */
static int pm_alloc_pin_plan(pm_alloc_plan *plan)
{
    const pinmem_alloc_params *p = plan->p;
    size_t threshold = (size_t)pm_opt(PINMEM_OPT_REGISTER_THRESHOLD);
    /* cudaHostAlloc gives private, unbound, 4 KiB-page memory only. */
    int plain = !plan->is_shm && p->numa_node < 0 && plan->hugepages == PINMEM_HUGE_NEVER;
    const char *why = "";
    switch (p->pin) {
    case PINMEM_PIN_AUTO:
        plan->cuda = pm_cuda(&why);
        if (plan->cuda == NULL)
            plan->pin_plan = PM_PLAN_MLOCK_SOFT;
        else
            plan->pin_plan = plain && p->size < threshold ? PM_PLAN_CUDA_ALLOC
                                                          : PM_PLAN_CUDA_REGISTER;
        return PINMEM_OK;
    case PINMEM_PIN_CUDA_ALLOC:
        if (!plain)
            return pm_fail(PINMEM_EINVAL, 0,
                           "cudaHostAlloc cannot give shared, NUMA-bound or hugepage memory; "
                           "use the cuda-register pin mode");
        plan->cuda = pm_cuda(&why);
        if (plan->cuda == NULL)
            return pm_fail(PINMEM_ENO_CUDA, 0, "cuda-alloc pinning needs CUDA: %s", why);
        /* Asked for by name: cudaHostAlloc whatever the threshold (which
         * is auto's), unless the driver cannot give that much in one call. */
        plan->pin_plan = p->size < PM_CUDA_ALLOC_LIMIT ? PM_PLAN_CUDA_ALLOC
                                                       : PM_PLAN_CUDA_REGISTER;
        return PINMEM_OK;
    case PINMEM_PIN_CUDA_REGISTER:
        plan->cuda = pm_cuda(&why);
        break;
    default: /* NONE, MLOCK: no runtime needed */
        break;
    }
    return pm_range_plan(p->pin, plan->cuda, why, &plan->pin_plan);
}

static int pm_step_plan(const pinmem_alloc_params *p, pm_alloc_plan *plan)
{
    int rc = pm_alloc_check(p);
    if (rc != PINMEM_OK)
        return rc;
    memset(plan, 0, sizeof *plan);
    plan->p = p;
    plan->is_shm = p->shm_name != NULL;
    plan->hugepages = p->hugepages;
    if (plan->is_shm) {
        if (p->hugepages == PINMEM_HUGE_THP || p->hugepages == PINMEM_HUGE_REQUIRED)
            return pm_fail(PINMEM_EINVAL, 0,
                           "hugepages are not supported with shared memory (segment '%s')",
                           p->shm_name);
        plan->hugepages = PINMEM_HUGE_NEVER;
    }
    if (p->numa_node >= 0 && !pm_numa_node_exists(p->numa_node))
        return pm_numa_missing(p->numa_node);
    uint64_t ram = pm_mem_total();
    if ((p->populate || p->pin != PINMEM_PIN_NONE) && ram != 0 && p->size > ram) {
        char a[64], b[64];
        return pm_fail(PINMEM_ETOO_LARGE, 0,
                       "making %s resident needs more than this machine's %s of RAM",
                       pm_fmt_bytes(a, sizeof a, p->size), pm_fmt_bytes(b, sizeof b, ram));
    }
    return pm_alloc_pin_plan(plan);
}

/* ------------------------------------------------------------------ map */

/* hugetlb when the plan wants it and the pool has the pages.  Leaves the
 * entry unmapped (and the plan's hugepages at its fallback) when AUTO
 * cannot have them; PINMEM_EHUGEPAGES when REQUIRED cannot. */
static int pm_map_hugetlb_step(pm_alloc_plan *plan, pm_entry *e)
{
    const pinmem_alloc_params *p = plan->p;
    size_t need = (p->size + PM_HUGE_2M - 1) / PM_HUGE_2M;
    int64_t total = -1, avail = -1;
    int err = ENOMEM;
    if (pinmem_hugepages_2m(p->numa_node, &total, &avail) == PINMEM_OK &&
        avail >= (int64_t)need) {
        void *a = pm_map_hugetlb(need * PM_HUGE_2M);
        if (a != MAP_FAILED) {
            pinmem_region *r = &e->region;
            r->addr = a;
            r->mapped_size = need * PM_HUGE_2M;
            r->kind = PINMEM_KIND_HUGETLB;
            r->hugepages = PINMEM_HUGE_RESULT_HUGETLB_2M;
            r->page_size = PM_HUGE_2M;
            return PINMEM_OK;
        }
        err = errno;
    }
    if (plan->hugepages == PINMEM_HUGE_REQUIRED)
        return pm_hugepages_short(need, p->numa_node, err);
    /* auto: back off to 4 KiB pages, or THP when so configured. */
    plan->hugepages = pm_opt(PINMEM_OPT_AUTO_FALLBACK_THP) ? PINMEM_HUGE_THP : PINMEM_HUGE_NEVER;
    return PINMEM_OK;
}

/* 4 KiB pages: a shared-memory segment or private anonymous memory. */
static int pm_map_pages_step(pm_alloc_plan *plan, pm_entry *e)
{
    const pinmem_alloc_params *p = plan->p;
    pinmem_region *r = &e->region;
    size_t mapped = pm_round_up(p->size, r->page_size);
    if (plan->is_shm) {
        e->shm_name = strdup(p->shm_name);
        if (e->shm_name == NULL)
            return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory copying the name");
        void *a = NULL;
        int rc = pm_shm_create(p->shm_name, mapped, p->flags, p->shm_mode, &a, &e->shm_dev,
                               &e->shm_ino);
        if (rc != PINMEM_OK)
            return rc;
        r->addr = a;
        r->kind = PINMEM_KIND_SHM;
        r->shm_owner = 1;
        e->shm_unlink_on_free = !(p->flags & PINMEM_SHM_KEEP_ON_FREE);
    } else {
        /* A reservation (nothing populated or pinned now) is committed step
         * by step later, each commit checking the memory limits; it must
         * not count against overcommit now (64 GiB on a 24 GiB machine). */
        int reservation = !p->populate && p->pin == PINMEM_PIN_NONE;
        void *a = pm_map_anonymous(mapped, reservation);
        if (a == MAP_FAILED) {
            int err = errno;
            char b[64];
            return pm_fail(PINMEM_ENOMEM, err, "mmap of %s failed: %s",
                           pm_fmt_bytes(b, sizeof b, mapped), strerror(err));
        }
        r->addr = a;
        r->kind = PINMEM_KIND_ANONYMOUS;
    }
    r->mapped_size = mapped;
    if (plan->hugepages == PINMEM_HUGE_THP && pm_advise_thp(r->addr, mapped))
        r->hugepages = PINMEM_HUGE_RESULT_THP;
    return PINMEM_OK;
}

static int pm_step_map(pm_alloc_plan *plan, pm_entry *e)
{
    if (plan->hugepages == PINMEM_HUGE_AUTO || plan->hugepages == PINMEM_HUGE_REQUIRED) {
        int rc = pm_map_hugetlb_step(plan, e);
        if (rc != PINMEM_OK || e->region.addr != NULL)
            return rc;
    }
    return pm_map_pages_step(plan, e);
}

/* ----------------------------------------------------------- bind, fill */

/* mbind before any page exists, so every page comes from the node. */
static int pm_step_bind(const pm_alloc_plan *plan, pm_entry *e)
{
    if (plan->p->numa_node < 0)
        return PINMEM_OK;
    pinmem_region *r = &e->region;
    return pm_mbind(r->addr, r->mapped_size, plan->p->numa_node, &r->numa_bound);
}

static int pm_step_fill(const pm_alloc_plan *plan, pm_entry *e)
{
    const pinmem_alloc_params *p = plan->p;
    /* The memory limits before any page is made resident (hugetlb pages
     * come from their own pool, checked when mapping). */
    int pinning = plan->pin_plan != PM_PLAN_NONE;
    if ((p->populate || pinning) && e->region.kind != PINMEM_KIND_HUGETLB) {
        int rc = pm_check_room(e->region.mapped_size, pinning);
        if (rc != PINMEM_OK)
            return rc;
    }
    return pm_entry_fill(e, plan->pin_plan, plan->cuda, plan->p->populate, plan->p->threads,
                         PM_TOUCH_ZERO);
}

/* ---------------------------------------------------------- cudaHostAlloc */

static int pm_alloc_cuda_host(const pinmem_alloc_params *p, const pm_cuda_api *cuda,
                              pinmem_region *out)
{
    pm_entry *e = calloc(1, sizeof *e);
    if (e == NULL || pm_ranges_reserve(e, 1) != 0) {
        free(e);
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    }
    void *ptr = NULL;
    int rc = cuda->host_alloc(&ptr, p->size, PM_CUDA_PORTABLE);
    if (rc != 0 || ptr == NULL) {
        char msg[256];
        pm_cuda_describe(cuda, rc, msg, sizeof msg);
        pm_cuda_clear_error(cuda);
        pm_entry_destroy(e);
        char b[64];
        return pm_fail(rc == PM_CUDA_ERROR_MEMORY_ALLOCATION ? PINMEM_ENOMEM : PINMEM_ECUDA, 0,
                       "cudaHostAlloc of %s failed: %s", pm_fmt_bytes(b, sizeof b, p->size),
                       msg);
    }
    size_t page = pm_page_size();
    pinmem_region *r = &e->region;
    r->addr = ptr;
    r->size = p->size;
    r->mapped_size = pm_round_up(p->size, page);
    r->kind = PINMEM_KIND_CUDA_HOST;
    r->pinned = PINMEM_PINNED_CUDA_ALLOC;
    r->hugepages = PINMEM_HUGE_RESULT_NONE;
    r->numa_node = -1;
    r->populate_method = PINMEM_POPULATE_BY_DRIVER;
    r->threads_used = 1;
    r->page_size = page;
    e->pid = getpid();
    e->dontfork = 1; /* the driver's own mapping; never ours to touch in a child */
    e->cuda = cuda;
    pm_range range = {0, r->mapped_size, PINMEM_PINNED_CUDA_ALLOC, 0, 0, NULL};
    pm_range_add(e, &range);
    pm_entry_totals(e);
    pm_registry_add(e);
    *out = *r;
    return PINMEM_OK;
}

/* ---------------------------------------------------------------- alloc */

PINMEM_API int pinmem_alloc(const pinmem_alloc_params *p, pinmem_region *out)
{
    if (p == NULL || out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "params and out must not be NULL");
    pm_alloc_plan plan;
    int rc = pm_step_plan(p, &plan);
    if (rc != PINMEM_OK)
        return rc;
    if (plan.pin_plan == PM_PLAN_CUDA_ALLOC)
        return pm_alloc_cuda_host(p, plan.cuda, out);

    pm_entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    e->region.size = p->size;
    e->region.numa_node = p->numa_node;
    e->region.page_size = pm_page_size();
    e->pid = getpid();
    e->register_chunk = p->register_chunk;
    rc = pm_step_map(&plan, e);
    if (rc == PINMEM_OK)
        rc = pm_step_bind(&plan, e);
    if (rc == PINMEM_OK)
        rc = pm_step_fill(&plan, e);
    if (rc != PINMEM_OK) {
        pm_entry_discard(e);
        return rc;
    }
    pm_registry_add(e);
    *out = e->region;
    return PINMEM_OK;
}

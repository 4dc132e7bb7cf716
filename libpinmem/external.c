/* CUDA registration of memory libpinmem did not map (pinmem_register and
 * pinmem_unregister): a Device-DAX or file mapping, a host buffer another
 * library allocated.  The same chunked, rolled-back, error-clearing path
 * as libpinmem's own mappings, and a registry entry so that queries,
 * runtime reloads and forks treat it like one. */
#include "internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PM_REGISTER_FLAGS \
    (PINMEM_REGISTER_IO_MEMORY | PINMEM_REGISTER_READ_ONLY | PINMEM_REGISTER_POPULATE)

static int pm_register_check(void *addr, size_t len, unsigned int flags)
{
    if (addr == NULL || len == 0)
        return pm_fail(PINMEM_EINVAL, 0, "register needs an address and a length > 0");
    if ((uintptr_t)addr > UINTPTR_MAX - len)
        return pm_fail(PINMEM_EINVAL, 0, "%p + %zu bytes wraps around the address space", addr,
                       len);
    if (flags & ~PM_REGISTER_FLAGS)
        return pm_fail(PINMEM_EINVAL, 0, "unknown register flags 0x%x (known: 0x%x)",
                       flags & ~PM_REGISTER_FLAGS, PM_REGISTER_FLAGS);
    if ((flags & PINMEM_REGISTER_POPULATE) && (uintptr_t)addr % pm_page_size() != 0)
        return pm_fail(PINMEM_EINVAL, 0,
                       "PINMEM_REGISTER_POPULATE needs a page-aligned address (%zu), got %p",
                       pm_page_size(), addr);
    void *base = pm_registry_overlapping(addr, len);
    if (base != NULL)
        return pm_fail(PINMEM_EINVAL, 0,
                       "[%p, +%zu) overlaps the live libpinmem mapping or registration at %p; "
                       "commit libpinmem's own mappings (pinmem_commit) instead of registering "
                       "them, and register other memory once",
                       addr, len, base);
    return PINMEM_OK;
}

PINMEM_API int pinmem_register(void *addr, size_t len, size_t chunk, unsigned int flags,
                               pinmem_region *out)
{
    int rc = pm_register_check(addr, len, flags);
    if (rc != PINMEM_OK)
        return rc;
    const char *why = "";
    const pm_cuda_api *cuda = pm_cuda(&why);
    if (cuda == NULL)
        return pm_fail(PINMEM_ENO_CUDA, 0, "registering host memory with CUDA needs CUDA: %s",
                       why);
    pm_entry *e = calloc(1, sizeof *e);
    if (e == NULL || pm_ranges_reserve(e, 1) != 0) {
        free(e);
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    }
    size_t page = pm_page_size();
    unsigned int cuda_flags = ((flags & PINMEM_REGISTER_IO_MEMORY) ? PM_CUDA_REGISTER_IO_MEMORY : 0) |
                              ((flags & PINMEM_REGISTER_READ_ONLY) ? PM_CUDA_REGISTER_READ_ONLY : 0);
    pm_chunks done;
    int method = PINMEM_POPULATE_NONE, threads_used = 0;
    rc = pm_populate_register(cuda, addr, len, page, pm_register_chunk(chunk, page), cuda_flags,
                              (flags & PINMEM_REGISTER_POPULATE) != 0, 0, PM_TOUCH_KEEP, &done,
                              &method, &threads_used);
    if (rc != PINMEM_OK) {
        pm_entry_destroy(e);
        return rc;
    }
    pinmem_region *r = &e->region;
    r->addr = addr;
    r->size = len;
    r->mapped_size = len;
    r->kind = PINMEM_KIND_EXTERNAL;
    r->numa_node = -1;
    r->populate_method = method;
    r->threads_used = threads_used;
    r->page_size = page;
    e->pid = getpid();
    e->cuda = cuda;
    e->register_chunk = chunk;
    e->register_flags = cuda_flags;
    pm_range range = {0, len, PINMEM_PINNED_CUDA_REGISTER, 0, done.count, done.lens};
    pm_range_add(e, &range);
    pm_entry_totals(e);
    pm_registry_add(e);
    if (out != NULL)
        *out = *r;
    return PINMEM_OK;
}

PINMEM_API int pinmem_unregister(void *addr)
{
    if (addr == NULL)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "NULL is not a registration");
    int own_mapping = 0;
    pm_entry *e = pm_registry_take(addr, 1, &own_mapping);
    if (own_mapping)
        return pm_fail(PINMEM_EINVAL, 0,
                       "%p is a libpinmem mapping, not a pinmem_register registration; free it "
                       "with pinmem_free",
                       addr);
    if (e == NULL)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                       "%p is not a live registration (unregistered already, or never "
                       "registered with pinmem_register)",
                       addr);
    int status = PINMEM_OK;
    /* A forked child has no CUDA context of the parent's: forget only. */
    if (e->pid == getpid()) {
        const pm_range *g = &e->ranges[0];
        int first = 0;
        int undone = pm_unregister_chunks(e->cuda, addr, g->chunk_lens, g->register_chunks, &first);
        if (undone < g->register_chunks) {
            char msg[256];
            pm_cuda_describe(e->cuda, first, msg, sizeof msg);
            status = pm_fail(PINMEM_ECUDA, 0,
                             "cudaHostUnregister failed for %d of %d chunk(s) of %p: %s",
                             g->register_chunks - undone, g->register_chunks, addr, msg);
        }
    }
    pm_entry_destroy(e);
    return status;
}

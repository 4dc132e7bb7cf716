/* Free, the way each kind of mapping requires: cudaFreeHost, every CUDA
 * chunk unregistered once, the creator's shared-memory name, munmap. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Undo a mapping that never reached the registry. */
void pm_entry_discard(pm_entry *e)
{
    if (e->region.addr != NULL)
        munmap(e->region.addr, e->region.mapped_size);
    if (e->shm_name != NULL && e->region.shm_owner)
        pm_shm_unlink_if_same(e->shm_name, e->shm_dev, e->shm_ino);
    pm_entry_destroy(e);
}

/* Why addr is not something to free. */
static int pm_free_unknown(void *addr)
{
    void *base = pm_registry_containing(addr);
    if (base != NULL)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                       "%p lies inside the mapping at %p; free that base address", addr, base);
    return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                   "%p is not a live mapping (already freed, or not from libpinmem)", addr);
}

static int pm_free_cuda_host(pm_entry *e)
{
    void *addr = e->region.addr;
    int rc = e->cuda->free_host(addr);
    if (rc == 0)
        return PINMEM_OK;
    char msg[256];
    pm_cuda_describe(e->cuda, rc, msg, sizeof msg);
    pm_cuda_clear_error(e->cuda);
    return pm_fail(PINMEM_ECUDA, 0, "cudaFreeHost(%p) failed: %s", addr, msg);
}

/* Unregister every chunk of every committed range, each exactly once. */
static int pm_unregister_all(pm_entry *e)
{
    char *addr = e->region.addr;
    int failed = 0, first = 0;
    for (size_t k = 0; k < e->range_count; k++) {
        const pm_range *g = &e->ranges[k];
        if (g->pinned != PINMEM_PINNED_CUDA_REGISTER || g->pending)
            continue;
        size_t off = g->offset;
        for (int i = 0; i < g->register_chunks; i++) {
            int rc = e->cuda->host_unregister(addr + off);
            if (rc != 0 && failed++ == 0)
                first = rc;
            off += g->chunk_lens[i];
        }
    }
    if (!failed)
        return PINMEM_OK;
    char msg[256];
    pm_cuda_describe(e->cuda, first, msg, sizeof msg);
    pm_cuda_clear_error(e->cuda);
    return pm_fail(PINMEM_ECUDA, 0,
                   "cudaHostUnregister failed for %d of %d chunk(s) of %p: %s; the mapping was "
                   "left in place",
                   failed, e->region.register_chunks, (void *)addr, msg);
}

static int pm_unmap(pm_entry *e)
{
    pinmem_region *r = &e->region;
    if (r->kind == PINMEM_KIND_SHM && r->shm_owner && e->shm_unlink_on_free &&
        !e->shm_name_released && e->pid == getpid())
        pm_shm_unlink_if_same(e->shm_name, e->shm_dev, e->shm_ino);
    if (munmap(r->addr, r->mapped_size) == 0)
        return PINMEM_OK;
    int err = errno;
    return pm_fail(PINMEM_ESYS, err, "munmap(%p, %zu) failed: %s", r->addr, r->mapped_size,
                   strerror(err));
}

PINMEM_API int pinmem_free(void *addr)
{
    if (addr == NULL)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "NULL is not a mapping");
    int external = 0;
    pm_entry *e = pm_registry_take(addr, 0, &external);
    if (external)
        return pm_fail(PINMEM_EINVAL, 0,
                       "%p is a registration of memory libpinmem did not map (pinmem_register); "
                       "release it with pinmem_unregister",
                       addr);
    if (e == NULL)
        return pm_free_unknown(addr);
    int status = PINMEM_OK;
    if (e->pid != getpid() && e->dontfork) {
        /* A forked child never inherited this mapping; forget it. */
    } else if (e->region.kind == PINMEM_KIND_CUDA_HOST) {
        status = pm_free_cuda_host(e);
    } else if (e->region.register_chunks > 0 && (status = pm_unregister_all(e)) != PINMEM_OK) {
        /* Unmapping memory the driver may still hold is worse than a leak. */
    } else {
        status = pm_unmap(e);
    }
    pm_entry_destroy(e);
    return status;
}

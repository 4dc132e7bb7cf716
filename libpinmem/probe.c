/* The capability probe. */
#include "internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int pm_cap_ipc_lock(void)
{
    char buf[4096];
    if (pm_read_text("/proc/self/status", buf, sizeof buf) != 0)
        return 0;
    const char *p = strstr(buf, "CapEff:");
    if (p == NULL)
        return 0;
    unsigned long long caps = strtoull(p + 7, NULL, 16);
    return (caps >> 14) & 1; /* CAP_IPC_LOCK */
}

static int pm_cmp_pool(const void *a, const void *b)
{
    const pinmem_hugepage_pool *x = a, *y = b;
    return x->page_size_kib < y->page_size_kib ? -1 : x->page_size_kib > y->page_size_kib;
}

static void pm_probe_hugepages(pinmem_caps *c)
{
    const char *base = "/sys/kernel/mm/hugepages";
    DIR *d = opendir(base);
    c->hugepage_size_count = 0;
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && c->hugepage_size_count < PINMEM_MAX_HUGEPAGE_SIZES) {
        unsigned long long kib = 0;
        if (sscanf(de->d_name, "hugepages-%llukB", &kib) != 1)
            continue;
        pinmem_hugepage_pool *pool = &c->hugepages[c->hugepage_size_count++];
        char path[512];
        pool->page_size_kib = kib;
        pool->total = -1;
        pool->free = -1;
        snprintf(path, sizeof path, "%s/%s/nr_hugepages", base, de->d_name);
        (void)pm_read_i64(path, &pool->total);
        snprintf(path, sizeof path, "%s/%s/free_hugepages", base, de->d_name);
        (void)pm_read_i64(path, &pool->free);
    }
    closedir(d);
    qsort(c->hugepages, (size_t)c->hugepage_size_count, sizeof c->hugepages[0], pm_cmp_pool);
}

PINMEM_API int pinmem_probe(pinmem_caps *out)
{
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    memset(out, 0, sizeof *out);
    pm_cuda_probe(out);
    pm_probe_hugepages(out);
    if (pm_numa_online(out->numa_nodes, PINMEM_MAX_NUMA_NODES, &out->numa_node_count) != 0)
        out->numa_node_count = 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        out->memlock_soft = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
        out->memlock_hard = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_max;
    }
    out->cap_ipc_lock = pm_cap_ipc_lock();
    out->populate_write = pm_populate_write_supported();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    out->cpu_count = online > 0 ? (int)online : 1;
    out->cpu_affinity = pm_affinity_cpus();
    out->thp_mode = pm_thp_mode();
    out->page_size = pm_page_size();
    out->default_populate_threads = pm_default_threads();
    out->mem_total = pm_mem_total();
    return PINMEM_OK;
}

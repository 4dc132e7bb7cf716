/* Private anonymous mappings: 4 KiB pages aligned for transparent
 * hugepages, 2 MiB hugetlb pages, and the hugetlb pool's counts. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>

#ifndef MAP_HUGETLB
#define MAP_HUGETLB 0x40000
#endif
#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#define PM_MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif

void *pm_map_anonymous(size_t len, int noreserve)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
    if (len < PM_HUGE_2M)
        return mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    size_t over = len + PM_HUGE_2M;
    if (over < len)
        return MAP_FAILED;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return MAP_FAILED;
    /* Trim so the start sits on a 2 MiB boundary: transparent hugepages can
     * then back the whole range. */
    uintptr_t start = ((uintptr_t)p + PM_HUGE_2M - 1) & ~(uintptr_t)(PM_HUGE_2M - 1);
    size_t head = start - (uintptr_t)p;
    size_t tail = over - head - len;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((char *)start + len, tail);
    return (void *)start;
}


void *pm_map_hugetlb(size_t len)
{
    return mmap(NULL, len, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | PM_MAP_HUGE_2MB, -1, 0);
}

int pm_advise_thp(void *addr, size_t len)
{
    return madvise(addr, len, MADV_HUGEPAGE) == 0 && pm_thp_mode() > 0;
}

/* ------------------------------------------------------ the hugetlb pool */

PINMEM_API int pinmem_hugepages_2m(int node, int64_t *total, int64_t *free_pages)
{
    char path[256];
    int64_t t = -1, f = -1, resv = 0;
    if (total == NULL || free_pages == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "total and free_pages must not be NULL");
    if (node < -1)
        return pm_fail(PINMEM_EINVAL, 0, "node must be -1 (system-wide) or a node, got %d", node);
    if (node < 0) {
        const char *base = "/sys/kernel/mm/hugepages/hugepages-2048kB";
        snprintf(path, sizeof path, "%s/nr_hugepages", base);
        if (pm_read_i64(path, &t) != 0)
            return pm_fail(PINMEM_ESYS, errno, "cannot read %s: no 2 MiB hugepage pool", path);
        snprintf(path, sizeof path, "%s/free_hugepages", base);
        if (pm_read_i64(path, &f) != 0)
            return pm_fail(PINMEM_ESYS, errno, "cannot read %s", path);
        /* Reserved pages are counted as free but promised to a mapping. */
        snprintf(path, sizeof path, "%s/resv_hugepages", base);
        if (pm_read_i64(path, &resv) != 0)
            resv = 0;
    } else {
        if (!pm_numa_node_exists(node))
            return pm_numa_missing(node);
        snprintf(path, sizeof path,
                 "/sys/devices/system/node/node%d/hugepages/hugepages-2048kB/nr_hugepages", node);
        if (pm_read_i64(path, &t) != 0) {
            if (node != 0)
                return pm_fail(PINMEM_ESYS, errno, "cannot read %s", path);
            return pinmem_hugepages_2m(-1, total, free_pages);
        }
        snprintf(path, sizeof path,
                 "/sys/devices/system/node/node%d/hugepages/hugepages-2048kB/free_hugepages",
                 node);
        if (pm_read_i64(path, &f) != 0)
            return pm_fail(PINMEM_ESYS, errno, "cannot read %s", path);
        /* Reservations are not kept per node; subtract the global ones. */
        int64_t g_resv = 0;
        if (pm_read_i64("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages", &g_resv) ==
            0)
            resv = g_resv;
    }
    f -= resv;
    if (f < 0)
        f = 0;
    *total = t;
    *free_pages = f;
    return PINMEM_OK;
}

int pm_hugepages_short(size_t need, int node, int err)
{
    int64_t total = -1, avail = -1;
    (void)pinmem_hugepages_2m(node, &total, &avail);
    char where[64] = "";
    if (node >= 0)
        snprintf(where, sizeof where, " on NUMA node %d", node);
    if (total < 0)
        return pm_fail(PINMEM_EHUGEPAGES, err,
                       "needs %zu hugepages of 2 MiB%s, but this kernel has no 2 MiB hugepage "
                       "pool",
                       need, where);
    int64_t grow = total + ((int64_t)need - avail);
    if (grow < total)
        grow = total;
    if (node >= 0)
        return pm_fail(PINMEM_EHUGEPAGES, err,
                       "needs %zu hugepages of 2 MiB%s, %lld free of %lld in that node's pool; "
                       "grow it: echo %lld | sudo tee /sys/devices/system/node/node%d/hugepages/"
                       "hugepages-2048kB/nr_hugepages",
                       need, where, (long long)avail, (long long)total, (long long)grow, node);
    return pm_fail(PINMEM_EHUGEPAGES, err,
                   "needs %zu hugepages of 2 MiB, %lld free of %lld in the pool; grow it: echo "
                   "%lld | sudo tee /proc/sys/vm/nr_hugepages",
                   need, (long long)avail, (long long)total, (long long)grow);
}

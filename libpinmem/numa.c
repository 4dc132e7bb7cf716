/* NUMA: the online node list, mbind(MPOL_BIND) through the raw syscall. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MPOL_BIND
#define MPOL_BIND 2
#endif

int pm_numa_online(int *nodes, int max, int *count)
{
    char buf[4096];
    if (pm_read_text("/sys/devices/system/node/online", buf, sizeof buf) == 0 &&
        pm_parse_list(buf, nodes, max, count) == 0 && *count > 0)
        return 0;
    /* Without NUMA support in the kernel there is one node, 0. */
    if (max < 1)
        return -1;
    nodes[0] = 0;
    *count = 1;
    return 0;
}

int pm_numa_node_exists(int node)
{
    int nodes[PINMEM_MAX_NUMA_NODES];
    int count = 0;
    if (pm_numa_online(nodes, PINMEM_MAX_NUMA_NODES, &count) != 0)
        return node == 0;
    for (int i = 0; i < count; i++)
        if (nodes[i] == node)
            return 1;
    return 0;
}

int pm_numa_missing(int node)
{
    int nodes[PINMEM_MAX_NUMA_NODES];
    int count = 0;
    char list[512];
    size_t used = 0;
    list[0] = '\0';
    if (pm_numa_online(nodes, PINMEM_MAX_NUMA_NODES, &count) == 0) {
        for (int i = 0; i < count && used + 16 < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", i ? ", " : "",
                                     nodes[i]);
    }
    return pm_fail(PINMEM_ENUMA_NODE, 0, "NUMA node %d does not exist; this machine has node%s %s",
                   node, count == 1 ? "" : "s", list);
}

PINMEM_API int pinmem_numa_nodes(int *nodes, int max, int *count)
{
    if (nodes == NULL || count == NULL || max <= 0)
        return pm_fail(PINMEM_EINVAL, 0, "nodes and count must be non-NULL and max > 0");
    if (pm_numa_online(nodes, max, count) != 0)
        return pm_fail(PINMEM_ESYS, 0, "could not read the online NUMA nodes");
    return PINMEM_OK;
}

PINMEM_API int pinmem_current_cpu(int *cpu, int *node)
{
    unsigned int c = 0, n = 0;
    if (syscall(SYS_getcpu, &c, &n, NULL) != 0)
        return pm_fail(PINMEM_ESYS, errno, "getcpu failed: %s", strerror(errno));
    if (cpu != NULL)
        *cpu = (int)c;
    if (node != NULL)
        *node = (int)n;
    return PINMEM_OK;
}

int pm_mbind(void *addr, size_t len, int node, int *bound)
{
    unsigned long mask[PINMEM_MAX_NUMA_NODES / (8 * sizeof(unsigned long))];
    memset(mask, 0, sizeof mask);
    *bound = 0;
    if (node < 0 || node >= PINMEM_MAX_NUMA_NODES)
        return pm_numa_missing(node);
    mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
    long rc;
    int err;
    if (pm_fault(PINMEM_FAULT_MBIND_EPERM)) {
        rc = -1;
        err = EPERM;
    } else {
        rc = syscall(SYS_mbind, addr, len, MPOL_BIND, mask, sizeof mask * 8 + 1, 0);
        err = errno;
    }
    if (rc == 0) {
        *bound = 1;
        return PINMEM_OK;
    }
    if (err == EPERM || err == ENOSYS || err == EACCES) {
        /* Containers often forbid mbind: keep the memory, report unbound. */
        return PINMEM_OK;
    }
    if (err == EINVAL)
        return pm_fail(PINMEM_ENUMA_NODE, err,
                       "mbind to NUMA node %d refused (EINVAL): the node may have no memory",
                       node);
    return pm_fail(PINMEM_ESYS, err, "mbind to NUMA node %d failed: %s", node, strerror(err));
}

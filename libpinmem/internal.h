/* Shared declarations between libpinmem's source files; not installed. */
#ifndef PINMEM_INTERNAL_H
#define PINMEM_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pinmem.h"

#define PM_HIDDEN __attribute__((visibility("hidden")))

#define PM_HUGE_2M ((size_t)2 << 20)
#define PM_KIB ((uint64_t)1 << 10)
#define PM_MIB ((uint64_t)1 << 20)
#define PM_GIB ((uint64_t)1 << 30)

/* ---- status.c: thread-local failure detail ---- */

/* Record a failure for pinmem_last_detail()/pinmem_last_errno() and return
 * the status, so call sites read `return pm_fail(...)`. */
PM_HIDDEN int pm_fail(int status, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Format a byte count as "4.00 GiB (4294967296 bytes)" into buf. */
PM_HIDDEN const char *pm_fmt_bytes(char *buf, size_t len, uint64_t bytes);

/* ---- options.c ---- */

PM_HIDDEN int64_t pm_opt(int option);

/* ---- util.c: small OS helpers ---- */

PM_HIDDEN size_t pm_page_size(void);
PM_HIDDEN int pm_affinity_cpus(void);
PM_HIDDEN int pm_default_threads(void);
/* Read a small text file into buf (NUL-terminated); 0 on success. */
PM_HIDDEN int pm_read_text(const char *path, char *buf, size_t len);
/* Read one integer from a file; 0 on success. */
PM_HIDDEN int pm_read_i64(const char *path, int64_t *value);
PM_HIDDEN uint64_t pm_mem_total(void);
/* Parse a cpulist/nodelist such as "0-3,8,10-11" into ascending ints. */
PM_HIDDEN int pm_parse_list(const char *text, int *out, int max, int *count);
PM_HIDDEN int pm_thp_mode(void);
PM_HIDDEN int pm_populate_write_supported(void);
PM_HIDDEN int pm_mlock(void *addr, size_t len);
/* mlock2(MLOCK_ONFAULT): pages lock as they are faulted in. */
PM_HIDDEN int pm_mlock_onfault(void *addr, size_t len);

/* ---- numa.c ---- */

PM_HIDDEN int pm_numa_online(int *nodes, int max, int *count);
PM_HIDDEN int pm_numa_node_exists(int node);
/* Build a status naming the nodes that do exist. */
PM_HIDDEN int pm_numa_missing(int node);
/* mbind(MPOL_BIND) to node.  PINMEM_OK with *bound = 1 when bound, with
 * *bound = 0 when refused (EPERM/ENOSYS: fall back); else a failure status. */
PM_HIDDEN int pm_mbind(void *addr, size_t len, int node, int *bound);

/* ---- populate.c ---- */

/* Populate [addr, addr+len) with up to threads threads.  preserve: never
 * write (for memory that may hold data).  lock: mlock the range once it is
 * resident -- each thread its own chunk when lock_in_threads, else one
 * call at the end; *lock_errno receives the first mlock failure (0 if
 * none). */
PM_HIDDEN int pm_populate(void *addr, size_t len, size_t page, int threads, int preserve,
                          int lock, int lock_in_threads, int *method, int *threads_used,
                          int *lock_errno);

/* ---- cuda.c ---- */

typedef struct pm_cuda_api {
    int (*get_device_count)(int *);
    int (*host_alloc)(void **, size_t, unsigned int);
    int (*free_host)(void *);
    int (*host_register)(void *, size_t, unsigned int);
    int (*host_unregister)(void *);
    const char *(*get_error_string)(int);
    int (*runtime_get_version)(int *);
    int (*get_last_error)(void);
} pm_cuda_api;

/* Load (once) and return the runtime if it is usable (loaded with >= 1
 * device); NULL otherwise.  *why explains a NULL (static or internal). */
PM_HIDDEN const pm_cuda_api *pm_cuda(const char **why);
PM_HIDDEN const char *pm_cuda_errstr(const pm_cuda_api *api, int err);
PM_HIDDEN void pm_cuda_clear_error(const pm_cuda_api *api);
/* Fill the CUDA part of the probe. */
PM_HIDDEN void pm_cuda_probe(pinmem_caps *caps);

/* ---- registry.c ---- */

typedef struct pm_entry {
    struct pm_entry *next;
    pinmem_region region;
    pid_t pid;              /* process that created the entry */
    int dontfork;           /* MADV_DONTFORK applied (or CUDA host memory) */
    size_t register_chunk;  /* bytes per cudaHostRegister call */
    const pm_cuda_api *cuda;/* runtime that pinned it (NULL if none) */
    int shm_unlink_on_free; /* creator unlinks on free */
    int shm_name_released;  /* creator already unlinked (or gave up) the name */
    char *shm_name;         /* malloc'ed copy, NULL for anonymous */
    dev_t shm_dev;
    ino_t shm_ino;
} pm_entry;

PM_HIDDEN void pm_registry_add(pm_entry *entry);
/* Unlink and return the entry whose base is addr, or NULL. */
PM_HIDDEN pm_entry *pm_registry_take(void *addr);
/* Copy the entry for addr under the lock; 0 if found. */
PM_HIDDEN int pm_registry_get(void *addr, pm_entry *copy);
/* The entry containing addr (not at its base): its base, or NULL. */
PM_HIDDEN void *pm_registry_containing(void *addr);
PM_HIDDEN void pm_registry_stats(size_t *count, size_t *bytes, size_t *cuda_count);
/* Run fn on the entry for addr with the registry locked; -1 if absent. */
PM_HIDDEN int pm_registry_with(void *addr, int (*fn)(pm_entry *, void *), void *arg);
PM_HIDDEN void pm_entry_destroy(pm_entry *entry);

#endif /* PINMEM_INTERNAL_H */

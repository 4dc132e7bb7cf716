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

/* cudaHostAllocPortable == cudaHostRegisterPortable == 1. */
#define PM_CUDA_PORTABLE 1u
#define PM_CUDA_REGISTER_IO_MEMORY 4u
#define PM_CUDA_REGISTER_READ_ONLY 8u
#define PM_CUDA_ERROR_INVALID_VALUE 1
#define PM_CUDA_ERROR_MEMORY_ALLOCATION 2

static inline size_t pm_round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* ---- status.c: thread-local failure detail ---- */

/* Record a failure for pinmem_last_detail()/pinmem_last_errno() and return
 * the status, so call sites read `return pm_fail(...)`. */
PM_HIDDEN int pm_fail(int status, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Format a byte count as "4.00 GiB (4294967296 bytes)" into buf. */
PM_HIDDEN const char *pm_fmt_bytes(char *buf, size_t len, uint64_t bytes);

/* ---- options.c ---- */

PM_HIDDEN int64_t pm_opt(int option);

/* ---- fault.c: test-only faults (PINMEM_TESTING builds) ---- */

#ifdef PINMEM_TESTING
/* Nonzero while the pinmem_fault is switched on. */
PM_HIDDEN int pm_fault(int fault);
/* Run (and clear) the pinmem_test_set_entry_hook hook of point, if any. */
PM_HIDDEN void pm_entry_hook(int point);
#else
/* Production builds have no faults: every check folds away. */
#define pm_fault(fault) 0
#define pm_entry_hook(point) ((void)0)
#endif

/* ---- util.c: small OS helpers ---- */

PM_HIDDEN size_t pm_page_size(void);
PM_HIDDEN int pm_affinity_cpus(void);
/* Read a small text file into buf (NUL-terminated); 0 on success. */
PM_HIDDEN int pm_read_text(const char *path, char *buf, size_t len);
/* Read one integer from a file; 0 on success. */
PM_HIDDEN int pm_read_i64(const char *path, int64_t *value);
PM_HIDDEN uint64_t pm_mem_total(void);
/* Parse a cpulist/nodelist such as "0-3,8,10-11" into ascending ints. */
PM_HIDDEN int pm_parse_list(const char *text, int *out, int max, int *count);
PM_HIDDEN int pm_thp_mode(void);
PM_HIDDEN int pm_populate_write_supported(void);

/* ---- limits.c ---- */

/* PINMEM_OK when len bytes fit within pinmem_memory_room, else
 * PINMEM_ELIMIT naming the limit. */
PM_HIDDEN int pm_check_room(size_t len, int pinned);

/* ---- map.c: private anonymous and hugetlb mappings ---- */

/* len bytes of private anonymous memory, 2 MiB aligned when len >= 2 MiB
 * (so THP can back it); MAP_FAILED with errno set on failure.  noreserve:
 * MAP_NORESERVE, for reservations that are committed step by step (the
 * commits check the memory limits instead of the overcommit accounting). */
PM_HIDDEN void *pm_map_anonymous(size_t len, int noreserve);
/* len bytes (a multiple of 2 MiB) of 2 MiB hugetlb pages; MAP_FAILED. */
PM_HIDDEN void *pm_map_hugetlb(size_t len);
/* MADV_HUGEPAGE; 1 when transparent hugepages can now back the range. */
PM_HIDDEN int pm_advise_thp(void *addr, size_t len);
/* PINMEM_EHUGEPAGES with a detail naming the pool's counts and the fix. */
PM_HIDDEN int pm_hugepages_short(size_t need, int node, int err);

/* ---- shm.c ---- */

/* Create (or, with PINMEM_SHM_REUSE, replace) a segment of mapped bytes
 * after checking /dev/shm has room, and map it; on failure the name is
 * removed again. */
PM_HIDDEN int pm_shm_create(const char *name, size_t mapped, int flags, unsigned int mode,
                            void **addr_out, dev_t *dev, ino_t *ino);
/* Unlink name only if it still names the segment (dev, ino); 1 if it did. */
PM_HIDDEN int pm_shm_unlink_if_same(const char *name, dev_t dev, ino_t ino);

/* ---- numa.c ---- */

PM_HIDDEN int pm_numa_online(int *nodes, int max, int *count);
PM_HIDDEN int pm_numa_node_exists(int node);
/* Build a status naming the nodes that do exist. */
PM_HIDDEN int pm_numa_missing(int node);
/* mbind(MPOL_BIND) to node.  PINMEM_OK with *bound = 1 when bound, with
 * *bound = 0 when refused (EPERM/ENOSYS: fall back); else a failure status. */
PM_HIDDEN int pm_mbind(void *addr, size_t len, int node, int *bound);

/* ---- populate.c ---- */

/* How the first-touch fallback of pm_populate faults a page in. */
enum pm_touch {
    PM_TOUCH_ZERO = 0, /* write a zero: fresh memory only */
    PM_TOUCH_READ = 1, /* read: never writes (shared memory that holds data) */
    PM_TOUCH_KEEP = 2, /* atomic compare-and-swap of the byte with itself: a
                        * write fault that keeps the contents, even against
                        * concurrent writers (commits of private memory) */
};

/* Populate [addr, addr+len) per the populate plan (method and threads;
 * threads > 0 overrides the plan's count, and the count is capped at one
 * thread per PINMEM_OPT_MIN_THREAD_BYTES).  touch: the pm_touch used where
 * first touch is the method (MADV_POPULATE_WRITE never changes contents).
 * lock: mlock the range once resident -- each slice as it is done when
 * lock_in_threads, else one call at the end; *lock_errno receives the
 * first mlock failure (0 if none). */
PM_HIDDEN int pm_populate(void *addr, size_t len, size_t page, int threads, int touch,
                          int lock, int lock_in_threads, int *method, int *threads_used,
                          int *lock_errno);
/* The same with an explicit method (pinmem_populate_method: MADVISE, which
 * falls back to first touch per slice where the kernel refuses it, or
 * FIRST_TOUCH) and thread count; lock_in_threads: mlock each slice. */
PM_HIDDEN int pm_populate_run(void *addr, size_t len, size_t page, int method, int threads,
                              int touch, int lock_in_threads, int *method_used,
                              int *threads_used, int *lock_errno);

/* ---- strategy.c: the populate plan ---- */

/* Method and thread count for populating len bytes; requested > 0 is the
 * caller's thread count.  Runs the probe first when the plan needs it. */
PM_HIDDEN void pm_plan_resolve(size_t len, int requested, int *method, int *threads);
/* Threads of the plan in effect (never probes). */
PM_HIDDEN int pm_default_threads(void);

/* ---- cuda.c ---- */

typedef struct pm_cuda_api {
    int (*get_device_count)(int *);
    int (*host_alloc)(void **, size_t, unsigned int);
    int (*free_host)(void *);
    int (*host_register)(void *, size_t, unsigned int);
    int (*host_unregister)(void *);
    const char *(*get_error_string)(int);
    const char *(*get_error_name)(int);
    int (*runtime_get_version)(int *);
    int (*get_last_error)(void);
} pm_cuda_api;

/* Load (once) and return the runtime if it is usable (loaded with >= 1
 * device); NULL otherwise.  *why explains a NULL (static or internal). */
PM_HIDDEN const pm_cuda_api *pm_cuda(const char **why);
PM_HIDDEN const char *pm_cuda_errstr(const pm_cuda_api *api, int err);
/* "cudaErrorInvalidValue: invalid argument (1)" into buf (cudaGetErrorName,
 * cudaGetErrorString and the number); returns buf. */
PM_HIDDEN const char *pm_cuda_describe(const pm_cuda_api *api, int err, char *buf, size_t len);
/* cudaGetLastError(): after every failed call, so the error does not stay
 * pending for the thread's next, unrelated CUDA call. */
PM_HIDDEN void pm_cuda_clear_error(const pm_cuda_api *api);
/* Fill the CUDA part of the probe. */
PM_HIDDEN void pm_cuda_probe(pinmem_caps *caps);

/* ---- registry.c ---- */

/* One committed range of a mapping: what the allocation populated or
 * pinned (offset 0, the whole mapping), or one pinmem_commit. */
typedef struct pm_range {
    size_t offset;
    size_t len;
    int pinned;             /* pinmem_pinned; a pending range: what it aims for */
    int pending;            /* a commit is still working on it (not counted) */
    int register_chunks;    /* cudaHostRegister calls behind the range */
    size_t *chunk_lens;     /* their lengths, in address order from offset
                             * (malloc'ed, owned by the range; NULL if none) */
} pm_range;

typedef struct pm_entry {
    struct pm_entry *next;
    pinmem_region region;
    pid_t pid;              /* process that created the entry */
    int dontfork;           /* MADV_DONTFORK applied (or CUDA host memory) */
    const pm_cuda_api *cuda;/* runtime that pinned it (NULL if none) */
    size_t register_chunk;  /* bytes per cudaHostRegister asked for (0 = option) */
    unsigned int register_flags; /* cudaHostRegister flags beyond Portable */
    pm_range *ranges;       /* committed ranges, unordered, never overlapping */
    size_t range_count;
    size_t range_cap;
    int busy;               /* commits in progress: the entry stays registered */
    int freeing;            /* a free is waiting for busy to reach 0 */
    int shm_unlink_on_free; /* creator unlinks on free */
    int shm_name_released;  /* creator already unlinked (or gave up) the name */
    char *shm_name;         /* malloc'ed copy, NULL for anonymous */
    dev_t shm_dev;
    ino_t shm_ino;
} pm_entry;

PM_HIDDEN void pm_registry_add(pm_entry *entry);
/* Unlink and return the entry whose base is addr, or NULL (also when
 * another free is taking it).  Only an entry of kind PINMEM_KIND_EXTERNAL
 * when external, of another kind otherwise; *wrong_kind is set when the
 * entry at addr is of the other sort.  Waits while commits hold the entry. */
PM_HIDDEN pm_entry *pm_registry_take(void *addr, int external, int *wrong_kind);
/* Run fn on the entry for addr with the registry locked; when fn returns
 * PINMEM_OK the entry is held (it stays registered, a free waits) and
 * *held receives it.  Returns fn's status, -1 if addr is not a live
 * mapping, -2 if it is being freed. */
PM_HIDDEN int pm_registry_hold(void *addr, int (*fn)(pm_entry *, void *), void *arg,
                               pm_entry **held);
/* Run fn (if not NULL) on a held entry with the registry locked, then drop
 * the hold and wake a free waiting for it. */
PM_HIDDEN void pm_registry_unhold(pm_entry *entry, void (*fn)(pm_entry *, void *), void *arg);
/* Copy the entry for addr under the lock; 0 if found.  The copy owns
 * nothing (no name, no ranges). */
PM_HIDDEN int pm_registry_get(void *addr, pm_entry *copy);
/* The entry containing addr (not at its base): its base, or NULL. */
PM_HIDDEN void *pm_registry_containing(void *addr);
/* The base of a live entry overlapping [addr, addr+len), or NULL. */
PM_HIDDEN void *pm_registry_overlapping(void *addr, size_t len);
PM_HIDDEN void pm_registry_stats(size_t *count, size_t *bytes, size_t *cuda_count);
/* Run fn on the entry for addr with the registry locked; -1 if absent. */
PM_HIDDEN int pm_registry_with(void *addr, int (*fn)(pm_entry *, void *), void *arg);
PM_HIDDEN void pm_entry_destroy(pm_entry *entry);

/* Ranges of an entry (registry locked, or the entry not registered). */
/* Make room for extra more ranges; 0 on success, -1 out of memory. */
PM_HIDDEN int pm_ranges_reserve(pm_entry *entry, size_t extra);
/* Append a range (room reserved first); return it. */
PM_HIDDEN pm_range *pm_range_add(pm_entry *entry, const pm_range *range);
/* The range starting at offset, or NULL. */
PM_HIDDEN pm_range *pm_range_at(pm_entry *entry, size_t offset);
/* Remove a range, freeing its chunk lengths. */
PM_HIDDEN void pm_range_remove(pm_entry *entry, pm_range *range);
/* The first range overlapping [offset, offset+len), or NULL. */
PM_HIDDEN const pm_range *pm_range_overlap(const pm_entry *entry, size_t offset, size_t len);
/* Recompute region.committed_bytes, pinned_bytes, pinned, register_chunks. */
PM_HIDDEN void pm_entry_totals(pm_entry *entry);

/* ---- pin.c: populate and pin one range ---- */

enum pm_plan {
    PM_PLAN_NONE,
    PM_PLAN_MLOCK_SOFT, /* try mlock, report "none" when refused */
    PM_PLAN_MLOCK,      /* mlock or fail */
    PM_PLAN_CUDA_ALLOC,
    PM_PLAN_CUDA_REGISTER,
};

/* What pm_fill_range did. */
typedef struct pm_fill {
    int pinned;             /* pinmem_pinned */
    int method;             /* pinmem_populate_method */
    int threads_used;
    int register_chunks;    /* cudaHostRegister calls (CUDA_REGISTER only) */
    size_t *chunk_lens;     /* their lengths (malloc'ed; the caller takes them) */
} pm_fill;

/* How a range is registered with CUDA. */
typedef struct pm_reg_req {
    size_t chunk;           /* bytes per call asked for (0 = the option) */
    unsigned int flags;     /* cudaHostRegister flags beyond Portable */
} pm_reg_req;

/* Populate (when populate or the plan pins) and pin [addr, addr+len) of a
 * mapping with pages of page bytes (hugetlb: 2 MiB pages, mlocked after
 * populating) per plan, a pm_plan other than CUDA_ALLOC; reg says how a
 * CUDA_REGISTER plan registers.  On failure nothing of the range stays
 * locked or registered. */
PM_HIDDEN int pm_fill_range(char *addr, size_t len, size_t page, int hugetlb, int plan,
                            const pm_cuda_api *cuda, int populate, int threads, int touch,
                            const pm_reg_req *reg, pm_fill *out);

/* ---- register.c: cudaHostRegister in chunks ---- */

/* The chunk a request of asked bytes (0 = the option) registers in: capped
 * by the PINMEM_OPT_REGISTER_CHUNK option, a multiple of page, >= page. */
PM_HIDDEN size_t pm_register_chunk(size_t asked, size_t page);

/* The chunks registered so far by one registration: lengths in address
 * order from its start. */
typedef struct pm_chunks {
    size_t *lens;
    int count;
    int cap;
} pm_chunks;

/* Register [addr, addr+len) in calls of chunk bytes, appending each to
 * *done; a call refused with an error that may be about its size is
 * retried with halves down to the PINMEM_OPT_REGISTER_MIN_CHUNK option
 * (multiples of page).  On failure the chunks registered before stay in
 * *done (the caller unregisters them) and the detail names the call. */
PM_HIDDEN int pm_register_span(const pm_cuda_api *cuda, char *addr, size_t len, size_t chunk,
                               size_t page, unsigned int flags, pm_chunks *done);
/* Unregister count chunks of the given lengths, the first at addr;
 * returns how many went (*first_error, may be NULL: the first refusal).
 * Clears the runtime's last error after a refusal. */
PM_HIDDEN int pm_unregister_chunks(const pm_cuda_api *cuda, char *addr, const size_t *lens,
                                   int count, int *first_error);

/* ---- pipeline.c: population overlapped with registration ---- */

/* Make [addr, addr+len) resident (when populate) and register it in chunks
 * of chunk bytes; with several chunks and PINMEM_OPT_REGISTER_OVERLAP the
 * populate threads fill chunk i+1 while the calling thread registers chunk
 * i (every CUDA call is made by the calling thread, so the error it clears
 * is the one its caller would see).  On success *done holds the chunks and
 * method/threads_used (may be NULL) the population's; on failure nothing of
 * the range is registered and *done is empty. */
PM_HIDDEN int pm_populate_register(const pm_cuda_api *cuda, char *addr, size_t len,
                                   size_t page, size_t chunk, unsigned int flags, int populate,
                                   int threads, int touch, pm_chunks *done, int *method,
                                   int *threads_used);

/* mlock, and mlock2(MLOCK_ONFAULT) (pages lock as they are faulted in). */
PM_HIDDEN int pm_mlock(void *addr, size_t len);
PM_HIDDEN int pm_mlock_onfault(void *addr, size_t len);
/* The plan for pinning an existing range per pin (AUTO, NONE, MLOCK,
 * CUDA_REGISTER): cuda is the usable runtime or NULL (why says why). */
PM_HIDDEN int pm_range_plan(int pin, const pm_cuda_api *cuda, const char *why, int *plan);
/* Populate and pin a fresh, unregistered entry per plan; fill its region
 * fields and record what was populated or pinned as one committed range. */
PM_HIDDEN int pm_entry_fill(pm_entry *e, int plan, const pm_cuda_api *cuda, int populate,
                            int threads, int touch);

/* ---- free.c ---- */

/* Undo an entry that never reached the registry: unmap, remove its name. */
PM_HIDDEN void pm_entry_discard(pm_entry *e);

#endif /* PINMEM_INTERNAL_H */

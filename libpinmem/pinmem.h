/*
 * libpinmem -- the operating-system and CUDA half of kvpool.
 *
 * One header, one prefix (pinmem_ / PINMEM_).  Every call returns an int
 * status (PINMEM_OK == 0, otherwise one of the PINMEM_E* codes below) and
 * hands results back through out-parameters.  pinmem_strerror() names a
 * status; pinmem_last_detail() gives the calling thread's explanation of its
 * most recent failure (errno text, CUDA error string, page counts).  The
 * library never prints and never aborts.
 *
 * Thread safety: every call may be made from any thread.  The registry of
 * live mappings and the CUDA runtime loader are each guarded by a mutex;
 * options are atomic; the failure detail is thread-local.
 *
 * What it does:
 *   - pinned host memory: cudaHostAlloc, or mmap + parallel populate +
 *     cudaHostRegister in chunks (population and registration overlapped,
 *     with rollback), or mlock without CUDA;
 *   - CUDA registration of memory it did not map (pinmem_register), so that
 *     every cudaHostRegister of kvpool goes through one path, and a query of
 *     where each registration of a mapping starts and ends
 *     (pinmem_registrations): a copy whose host range spans two
 *     registrations fails in CUDA, so placements need the boundaries;
 *     the CUDA runtime is found at run time with dlopen, never linked;
 *   - NUMA-local memory through the raw mbind(2) syscall;
 *   - 2 MiB hugetlb pages and transparent hugepages;
 *   - POSIX shared memory that other processes attach to by name;
 *   - parallel population of fresh mappings;
 *   - incremental commit of a reserved mapping: make one range after
 *     another resident and pinned without ever moving the mapping;
 *   - frees that match the kind of each mapping, driven by a registry, so a
 *     double free or a stray pointer is a status, never a crash;
 *   - a capability probe.
 *
 * The block between the PINMEM_CDEF markers is also fed to cffi by
 * build.py, so it holds only declarations cffi understands: integer
 * #defines, enums with explicit values, structs and prototypes (the
 * PINMEM_API marker is removed before cffi sees it).
 */
#ifndef PINMEM_H
#define PINMEM_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define PINMEM_API __attribute__((visibility("default")))
#else
#define PINMEM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* PINMEM_CDEF_BEGIN */

#define PINMEM_VERSION 7
#define PINMEM_MAX_NUMA_NODES 1024
#define PINMEM_MAX_HUGEPAGE_SIZES 8
#define PINMEM_PATH_MAX 512

/* Status codes.  0 is success; every other value names one failure. */
typedef enum pinmem_status {
    PINMEM_OK = 0,
    PINMEM_EINVAL = 1,          /* an argument is out of range or inconsistent */
    PINMEM_ENOMEM = 2,          /* the kernel could not map or populate the memory */
    PINMEM_EHUGEPAGES = 3,      /* too few free 2 MiB pages in the hugetlb pool */
    PINMEM_ENUMA_NODE = 4,      /* the NUMA node does not exist (or has no memory) */
    PINMEM_ESHM_EXISTS = 5,     /* a shared-memory segment of that name exists */
    PINMEM_ESHM_NOT_FOUND = 6,  /* no shared-memory segment of that name */
    PINMEM_ESHM_NAME = 7,       /* the shared-memory name breaks the naming rule */
    PINMEM_EUNKNOWN_PTR = 8,    /* not the base of a live mapping (double free?) */
    PINMEM_ENO_CUDA = 9,        /* a CUDA path was asked for, no runtime or device */
    PINMEM_ECUDA = 10,          /* a CUDA runtime call failed */
    PINMEM_EMLOCK = 11,         /* mlock was asked for and refused */
    PINMEM_EPERM = 12,          /* the operating system refused (permissions) */
    PINMEM_ESYS = 13,           /* another operating-system call failed */
    PINMEM_EBUSY = 14,          /* in use: CUDA mappings live, or a commit in progress */
    PINMEM_ETOO_LARGE = 15,     /* size beyond what the machine can map or hold */
    PINMEM_EOPTION = 16,        /* a KVPOOL_* variable held an invalid option value */
    PINMEM_ELIMIT = 17,         /* it would exceed an effective memory limit (RAM, cgroup) */
    PINMEM_STATUS_COUNT = 18
} pinmem_status;

/* How a request wants its memory pinned. */
typedef enum pinmem_pin_mode {
    PINMEM_PIN_AUTO = 0,          /* best available: CUDA, else mlock, else none */
    PINMEM_PIN_NONE = 1,          /* do not pin */
    PINMEM_PIN_MLOCK = 2,         /* mlock, fail with PINMEM_EMLOCK if refused */
    PINMEM_PIN_CUDA_ALLOC = 3,    /* cudaHostAlloc (register path from 512 GiB, where
                                   * one cudaHostAlloc fails on drivers from r580) */
    PINMEM_PIN_CUDA_REGISTER = 4  /* mmap + populate + cudaHostRegister in chunks */
} pinmem_pin_mode;

/* How a mapping actually ended up pinned (reported, never assumed). */
typedef enum pinmem_pinned {
    PINMEM_PINNED_NONE = 0,
    PINMEM_PINNED_MLOCK = 1,
    PINMEM_PINNED_CUDA_ALLOC = 2,
    PINMEM_PINNED_CUDA_REGISTER = 3
} pinmem_pinned;

/* Hugepage policy of a request. */
typedef enum pinmem_hugepage_mode {
    PINMEM_HUGE_NEVER = 0,     /* 4 KiB pages, no advice */
    PINMEM_HUGE_THP = 1,       /* MADV_HUGEPAGE before populating */
    PINMEM_HUGE_AUTO = 2,      /* hugetlb 2 MiB if enough free pages, else 4 KiB (or THP) */
    PINMEM_HUGE_REQUIRED = 3   /* hugetlb 2 MiB or PINMEM_EHUGEPAGES */
} pinmem_hugepage_mode;

/* Which pages back a mapping (reported). */
typedef enum pinmem_huge_result {
    PINMEM_HUGE_RESULT_NONE = 0,
    PINMEM_HUGE_RESULT_THP = 1,
    PINMEM_HUGE_RESULT_HUGETLB_2M = 2
} pinmem_huge_result;

/* What kind of mapping a region is; each kind has its own free path. */
typedef enum pinmem_kind {
    PINMEM_KIND_ANONYMOUS = 0,  /* private anonymous mmap, 4 KiB pages (maybe THP) */
    PINMEM_KIND_HUGETLB = 1,    /* private anonymous mmap of 2 MiB hugetlb pages */
    PINMEM_KIND_SHM = 2,        /* POSIX shared memory, MAP_SHARED */
    PINMEM_KIND_CUDA_HOST = 3,  /* cudaHostAlloc */
    PINMEM_KIND_EXTERNAL = 4    /* memory libpinmem did not map, registered by
                                 * pinmem_register (released by pinmem_unregister) */
} pinmem_kind;

/* How pages were made resident. */
typedef enum pinmem_populate_method {
    PINMEM_POPULATE_NONE = 0,          /* not populated by libpinmem */
    PINMEM_POPULATE_MADVISE = 1,       /* MADV_POPULATE_WRITE */
    PINMEM_POPULATE_FIRST_TOUCH = 2,   /* one write per page */
    PINMEM_POPULATE_BY_DRIVER = 3      /* cudaHostAlloc populated it */
} pinmem_populate_method;

/* Flags of pinmem_alloc_params.flags. */
#define PINMEM_SHM_REUSE 1             /* replace a leftover segment of the same name */
#define PINMEM_SHM_KEEP_ON_FREE 2      /* creator's free does not unlink the name */

/*
 * Options, in the mimalloc style: each has a default, an environment
 * variable read once on first use, and pinmem_option_set() to change it.
 * An environment variable whose text is not a number in the option's
 * range is never silently replaced: the default stays in effect, and
 * pinmem_option_check() / pinmem_option_describe() report the variable,
 * its text and the accepted range (the caller decides how to warn; the
 * library never prints).
 *
 *   PINMEM_OPT_POPULATE_THREADS      KVPOOL_POPULATE_THREADS       0 = auto: the
 *        populate plan's count (the CPUs in the affinity mask, at most 16).
 *        Threads used to populate a mapping.
 *   PINMEM_OPT_REGISTER_CHUNK        KVPOOL_REGISTER_CHUNK_BYTES   64 GiB.
 *        Largest single cudaHostRegister call (drivers from r580 refuse one
 *        of 512 GiB or more).  A request's own register_chunk is capped by it.
 *   PINMEM_OPT_REGISTER_THRESHOLD    KVPOOL_REGISTER_THRESHOLD_BYTES 1 GiB.
 *        At or above this size pin AUTO takes the register path; below it,
 *        cudaHostAlloc (for plain memory: NUMA, hugepage and shared memory
 *        always register).  Measured on an H200
 *        (driver 580, 16 cores): populate + register was 2.60x faster than
 *        cudaHostAlloc at 1 GiB, 2.81x at 4 GiB, 3.13x at 16 GiB (median of
 *        3); below 1 GiB nothing was measured, so cudaHostAlloc stays there.
 *   PINMEM_OPT_REGISTER_OVERLAP      KVPOOL_REGISTER_OVERLAP       1.  1 = a
 *        mapping registered in several chunks is populated and registered
 *        as a pipeline: chunk i is registered (in the calling thread) while
 *        the populate threads fill chunk i+1; 0 = populate all, then
 *        register (for comparison).
 *   PINMEM_OPT_REGISTER_MIN_CHUNK    KVPOOL_REGISTER_MIN_CHUNK_BYTES 1 GiB.
 *        A cudaHostRegister refused with cudaErrorMemoryAllocation or
 *        cudaErrorInvalidValue is retried with half the bytes, down to this
 *        size, before the registration fails (a driver may refuse a size
 *        that a smaller call gets); pinmem_registrations reports the
 *        pieces as they were registered.
 *   PINMEM_OPT_USE_POPULATE_WRITE    KVPOOL_USE_POPULATE_WRITE     1.  0 makes
 *        populate behave as if the kernel lacked MADV_POPULATE_WRITE.
 *   PINMEM_OPT_MLOCK_MODE            KVPOOL_MLOCK_MODE             3.  How mlock
 *        pinning is done: 0 = one mlock call after populating; 1 = each
 *        populate thread mlocks its own chunk; 2 = mlock2(MLOCK_ONFAULT)
 *        before populating, so pages are locked as the threads fault them
 *        (falls back to 1 where the kernel lacks mlock2); 3 = by page
 *        size: 0 for hugetlb (locking resident 2 MiB pages costs < 1 ms per
 *        4 GiB, while ONFAULT serialised the populate threads), 2 for
 *        4 KiB/THP mappings (saves a second page walk of ~0.25 s per 4 GiB
 *        that does not parallelise).
 *   PINMEM_OPT_MIN_THREAD_BYTES      KVPOOL_MIN_THREAD_BYTES       64 MiB.
 *        Smallest share of a mapping worth its own populate thread.
 *   PINMEM_OPT_AUTO_FALLBACK_THP     KVPOOL_AUTO_FALLBACK_THP      0.  What
 *        PINMEM_HUGE_AUTO falls back to without enough hugetlb pages: 0 =
 *        4 KiB pages, 1 = transparent hugepages.  (On a VM with free-page
 *        reporting, THP on memory the host has taken back populated at
 *        0.13-0.4 GB/s against 1-3 GB/s for 4 KiB pages; only memory freed
 *        by a THP mapping moments before was fast, ~10 GB/s.)
 *   PINMEM_OPT_POPULATE_METHOD       KVPOOL_POPULATE_METHOD        0.  How pages
 *        are made resident: 0 = auto (the populate plan: the probe's choice,
 *        else MADV_POPULATE_WRITE where the kernel has it); 1 =
 *        MADV_POPULATE_WRITE (first touch where the kernel lacks it); 2 =
 *        one write per page from user space (first touch).
 *   PINMEM_OPT_POPULATE_PROBE        KVPOOL_POPULATE_PROBE         1.  1 = before
 *        the first population of at least PINMEM_PROBE_MIN_BYTES whose method
 *        is auto, measure both methods on small fresh mappings, once per
 *        process (see
 *        pinmem_populate_probe); 0 = never probe: the rule decides.
 *
 * Sizes accept binary suffixes: "64M", "2G", "1GiB"; numbers may be
 * decimal or 0x hexadecimal.  An empty variable counts as unset.
 */
typedef enum pinmem_option {
    PINMEM_OPT_POPULATE_THREADS = 0,
    PINMEM_OPT_REGISTER_CHUNK = 1,
    PINMEM_OPT_REGISTER_THRESHOLD = 2,
    PINMEM_OPT_USE_POPULATE_WRITE = 3,
    PINMEM_OPT_MLOCK_MODE = 4,
    PINMEM_OPT_MIN_THREAD_BYTES = 5,
    PINMEM_OPT_AUTO_FALLBACK_THP = 6,
    PINMEM_OPT_POPULATE_METHOD = 7,
    PINMEM_OPT_POPULATE_PROBE = 8,
    PINMEM_OPT_REGISTER_OVERLAP = 9,
    PINMEM_OPT_REGISTER_MIN_CHUNK = 10,
    PINMEM_OPT_COUNT = 11
} pinmem_option;

/* Where an option's value came from. */
typedef enum pinmem_option_source {
    PINMEM_OPTION_DEFAULT = 0,      /* the built-in default */
    PINMEM_OPTION_ENV = 1,          /* its environment variable */
    PINMEM_OPTION_SET = 2           /* pinmem_option_set() */
} pinmem_option_source;

/* One option, described (pinmem_option_describe). */
typedef struct pinmem_option_info {
    char name[32];          /* e.g. "populate_threads" */
    char env[64];           /* its environment variable, e.g. "KVPOOL_POPULATE_THREADS" */
    int64_t value;          /* in effect now */
    int64_t default_value;
    int64_t min;            /* accepted range, inclusive */
    int64_t max;
    int source;             /* pinmem_option_source of value */
    int env_rejected;       /* 1: the variable was set, but not to a number in
                             * min..max; the default was kept */
    char env_text[128];     /* the rejected text (truncated), "" otherwise */
} pinmem_option_info;

/*
 * The populate plan: how a large mapping is made resident (method and
 * threads), chosen from measured facts.
 *
 * The probe (pinmem_populate_probe) maps, populates and unmaps a few small
 * fresh mappings of 4 KiB pages: MADV_POPULATE_WRITE and first touch with
 * one thread, alternated (best of three each, so a burst of load on a
 * shared machine hits both).  It touches 48 MiB and cost 22 ms on the
 * 2-CPU development VM; it runs once per process and its facts are kept.
 *
 * pinmem_populate_decide turns facts into a plan (a pure function; tests
 * feed it made-up facts):
 *   - method: first touch when the kernel lacks MADV_POPULATE_WRITE, or when
 *     the probe measured first touch more than 25% faster; else
 *     MADV_POPULATE_WRITE (it never writes from user space, so it also
 *     suits memory that holds data).  The 25% margin comes from
 *     measurements on a shared 2-CPU VM: madvise was faster per thread in
 *     every run (1.2-1.6x), while single probes under load picked first
 *     touch by chance;
 *   - threads: the CPUs this process may use, at most 16, whatever was
 *     measured.  A probe cheap enough to run before a pool misjudges
 *     threads: on a 2-vCPU VM a second thread starts its work
 *     milliseconds late, so fresh 32 MiB mappings were no faster with two
 *     threads (and the old probe's 32 MiB sample picked one), while
 *     mappings of 128 MiB and more populated 1.6-1.9x faster with both.
 *     PINMEM_OPT_MIN_THREAD_BYTES keeps small mappings on fewer threads.
 * Every population then splits its range into slices (2 MiB aligned) that
 * the threads take one by one, so a thread slowed by other load on its CPU
 * does less of the work instead of holding everyone up.
 *
 * Options override the plan: PINMEM_OPT_POPULATE_METHOD (nonzero),
 * PINMEM_OPT_POPULATE_THREADS (nonzero), PINMEM_OPT_USE_POPULATE_WRITE = 0
 * (first touch), a request's own thread count; PINMEM_OPT_POPULATE_PROBE =
 * 0 leaves the rule to decide.  pinmem_populate_plan_get says what is in
 * effect and where each part of it came from.
 */
#define PINMEM_PROBE_MIN_BYTES 1073741824 /* 1 GiB */

/* Where a part of the plan came from. */
typedef enum pinmem_plan_source {
    PINMEM_PLAN_RULE = 0,      /* the rule, without measurements */
    PINMEM_PLAN_PROBE = 1,     /* the probe's measurements */
    PINMEM_PLAN_OPTION = 2     /* an option (or the kernel lacking MADV_POPULATE_WRITE) */
} pinmem_plan_source;

/* What the probe measured (all rates in GB/s of fresh memory made resident). */
typedef struct pinmem_populate_facts {
    int probed;                 /* 1 once measured; 0: only the two fields below */
    int populate_write;         /* MADV_POPULATE_WRITE works here */
    int cpus;                   /* CPUs this process may run on */
    double madvise_gbps;        /* MADV_POPULATE_WRITE, 1 thread (0 if not measured) */
    double touch_gbps;          /* one write per page, 1 thread */
    double seconds;             /* what the probe cost */
    uint64_t bytes;             /* memory it made resident */
} pinmem_populate_facts;

/* How large mappings are populated. */
typedef struct pinmem_populate_plan {
    int method;                 /* PINMEM_POPULATE_MADVISE or PINMEM_POPULATE_FIRST_TOUCH */
    int threads;                /* threads for a mapping of PINMEM_PROBE_MIN_BYTES or more */
    int method_source;          /* pinmem_plan_source */
    int threads_source;
} pinmem_populate_plan;

/* A request.  Zero-initialise, then set what you need; pinmem_params_init
 * fills the defaults (numa_node -1, everything else 0/auto). */
typedef struct pinmem_alloc_params {
    size_t size;            /* bytes wanted, > 0 */
    int pin;                /* pinmem_pin_mode */
    int hugepages;          /* pinmem_hugepage_mode */
    int numa_node;          /* -1 = no binding */
    int populate;           /* nonzero: make every page resident */
    int threads;            /* populate threads, 0 = option default */
    int flags;              /* PINMEM_SHM_* */
    const char *shm_name;   /* NULL = anonymous; else "/name" */
    unsigned int shm_mode;  /* permission bits, 0 = 0600 */
    size_t register_chunk;  /* bytes per cudaHostRegister call, for this mapping
                             * and every pinmem_commit of it: rounded down to a
                             * multiple of the page size in use and capped by the
                             * PINMEM_OPT_REGISTER_CHUNK option; 0 = that option
                             * (as few calls as it allows).  A pool passes
                             * pinmem_register_plan's chunk, a multiple of its unit */
} pinmem_alloc_params;

/* What a live mapping is. */
typedef struct pinmem_region {
    void *addr;             /* base address */
    size_t size;            /* usable bytes (what was asked for) */
    size_t mapped_size;     /* bytes mapped, rounded up to the page size in use */
    int kind;               /* pinmem_kind */
    int pinned;             /* pinmem_pinned */
    int hugepages;          /* pinmem_huge_result */
    int numa_node;          /* -1 when not requested */
    int numa_bound;         /* 1 when mbind(MPOL_BIND) took effect */
    int shm_owner;          /* 1 for the creator of a segment */
    int populate_method;    /* pinmem_populate_method */
    int threads_used;       /* threads that populated it */
    int register_chunks;    /* cudaHostRegister calls behind it (0 if none) */
    size_t page_size;       /* page size in use */
    size_t committed_bytes; /* bytes made resident by the allocation (populate or
                             * pin: all of mapped_size) or by pinmem_commit */
    size_t pinned_bytes;    /* of those, bytes pinned (mlock, CUDA) */
} pinmem_region;
/* pinned describes the whole mapping: it names a pinning only when
 * pinned_bytes == mapped_size, and then the weakest one any part got
 * (mlock < cuda-alloc < cuda-register); a partly committed or partly
 * pinned mapping reports PINMEM_PINNED_NONE, with committed_bytes and
 * pinned_bytes saying how far it got.  populate_method and threads_used
 * describe the most recent population (the allocation's, or the last
 * commit's). */

typedef struct pinmem_hugepage_pool {
    uint64_t page_size_kib;
    int64_t total;          /* nr_hugepages, -1 if unreadable */
    int64_t free;           /* free_hugepages, -1 if unreadable */
} pinmem_hugepage_pool;

/* The capability probe. */
typedef struct pinmem_caps {
    int cuda_loaded;                        /* a CUDA runtime was found */
    int cuda_device_count;                  /* 0 without devices */
    int cuda_runtime_version;               /* e.g. 12040, 0 if unknown */
    int cuda_status;                        /* cudaGetDeviceCount's error code */
    char cuda_runtime_path[PINMEM_PATH_MAX];/* what was loaded, or "" */
    char cuda_error[PINMEM_PATH_MAX];       /* why none was usable, or "" */
    int hugepage_size_count;
    pinmem_hugepage_pool hugepages[PINMEM_MAX_HUGEPAGE_SIZES];
    int numa_node_count;
    int numa_nodes[PINMEM_MAX_NUMA_NODES];  /* online nodes, ascending */
    uint64_t memlock_soft;                  /* bytes, UINT64_MAX = unlimited */
    uint64_t memlock_hard;
    int cap_ipc_lock;                       /* CAP_IPC_LOCK in the effective set */
    int populate_write;                     /* MADV_POPULATE_WRITE works here */
    int cpu_count;                          /* CPUs online */
    int cpu_affinity;                       /* CPUs this process may run on */
    int thp_mode;                           /* 0 never, 1 madvise, 2 always, -1 unknown */
    size_t page_size;
    int default_populate_threads;
    uint64_t mem_total;                     /* bytes of RAM */
} pinmem_caps;

/* Version of this library (PINMEM_VERSION when built). */
PINMEM_API int pinmem_version(void);

/* Static text for a status; never NULL. */
PINMEM_API const char *pinmem_strerror(int status);

/* The calling thread's explanation of its last failed call ("" if none). */
PINMEM_API const char *pinmem_last_detail(void);

/* The errno behind the calling thread's last failure (0 if none). */
PINMEM_API int pinmem_last_errno(void);

/* Fill *params with defaults. */
PINMEM_API int pinmem_params_init(pinmem_alloc_params *params);

/* Map, bind, populate and pin per *params; describe the result in *out. */
PINMEM_API int pinmem_alloc(const pinmem_alloc_params *params, pinmem_region *out);

/* Map an existing shared-memory segment created by another process.
 * size 0 maps the whole segment; pin is a pinmem_pin_mode (AUTO, NONE,
 * MLOCK, CUDA_REGISTER); populate prefaults without changing contents. */
PINMEM_API int pinmem_shm_attach(const char *name, size_t size, int pin, int populate,
                                 pinmem_region *out);

/* Remove a shared-memory name (mappings stay valid until freed). */
PINMEM_API int pinmem_shm_unlink(const char *name);

/* Size in bytes of a named segment. */
PINMEM_API int pinmem_shm_size(const char *name, size_t *size);

/* Check a shared-memory name: '/' then 1..255 bytes, none of them '/'. */
PINMEM_API int pinmem_shm_name_check(const char *name);

/* The creator unlinks its segment's name now (only if the name still refers
 * to the segment it created).  *unlinked is set to 1 when it did. */
PINMEM_API int pinmem_shm_release_name(void *addr, int *unlinked);

/* Free a mapping by its base address, the way its kind requires.  A free
 * that meets commits in progress on the mapping (pinmem_commit in other
 * threads) waits for them to finish, then frees; meanwhile new commits and
 * other frees of addr fail with PINMEM_EUNKNOWN_PTR. */
PINMEM_API int pinmem_free(void *addr);

/* Commit [offset, offset+len) of the live mapping whose base is addr: make
 * the range resident with the parallel populate machinery (threads 0 = the
 * option default; MADV_POPULATE_WRITE, else one atomic write per page that
 * keeps the byte it finds, so the contents of the range never change) and
 * pin it per pin, a pinmem_pin_mode:
 *   PINMEM_PIN_AUTO           cudaHostRegister when a runtime and a device
 *                             are usable, else mlock if allowed, else none;
 *   PINMEM_PIN_NONE           resident only;
 *   PINMEM_PIN_MLOCK          mlock, or fail with PINMEM_EMLOCK;
 *   PINMEM_PIN_CUDA_REGISTER  cudaHostRegister in chunks of the mapping's
 *                             register_chunk (pinmem_alloc_params), or
 *                             PINMEM_ENO_CUDA without CUDA;
 *   (PINMEM_PIN_CUDA_ALLOC cannot pin a range: PINMEM_EINVAL).
 * *pinned (may be NULL) receives how the range ended up pinned, a
 * pinmem_pinned (AUTO may end as PINMEM_PINNED_NONE; it is never claimed
 * when not done).  The mapping never moves: a lazily growing pool reserves
 * it with pin NONE and populate 0, then commits step by step.
 *
 * Rules:
 *   - addr must be the base of a live mapping (else PINMEM_EUNKNOWN_PTR);
 *     offset and len must be multiples of its page size (2 MiB for
 *     hugetlb), len > 0, offset + len <= mapped_size (else PINMEM_EINVAL,
 *     the detail naming the values and the limit).
 *   - A range may be committed once: overlapping a committed range is
 *     PINMEM_EINVAL, and a mapping that was populated or pinned when
 *     allocated counts as committed whole (so does cudaHostAlloc memory);
 *     overlapping a commit still in progress in another thread is
 *     PINMEM_EBUSY.  A failed commit leaves its range uncommitted (pages
 *     may stay resident, never locked or registered), so it can be retried.
 *   - Each commit's CUDA chunks are recorded with the mapping
 *     (pinmem_registrations lists them), and pinmem_free unregisters every
 *     one of them exactly once; a cudaHostRegister failing part-way
 *     unregisters the chunks of that commit and leaves earlier commits
 *     alone.  Population and registration of a commit in several chunks
 *     overlap as in pinmem_alloc (PINMEM_OPT_REGISTER_OVERLAP).
 *   - The registry lock is not held while populating or pinning: commits of
 *     disjoint ranges of one mapping may run in parallel, and queries run
 *     meanwhile (they count finished commits only).  pinmem_free of the
 *     mapping waits for commits in progress (see pinmem_free).
 *   - The first pinning commit of a private mapping marks the whole
 *     mapping MADV_DONTFORK (as pinning at allocation does): children
 *     forked afterwards do not inherit it. */
PINMEM_API int pinmem_commit(void *addr, size_t offset, size_t len, int pin, int threads,
                             int *pinned);

/* Describe the live mapping whose base is addr. */
PINMEM_API int pinmem_query(void *addr, pinmem_region *out);

/* Number of live mappings and their mapped bytes. */
PINMEM_API int pinmem_live(size_t *count, size_t *bytes);

/* ---- CUDA registrations ----
 *
 * CUDA copies a host range to or from a GPU only when the range lies wholly
 * inside ONE registration (one cudaHostRegister call, or one cudaHostAlloc
 * allocation); a copy that spans two registrations fails with
 * cudaErrorInvalidValue.  A mapping registered in chunks therefore has
 * boundaries that no object handed out of it may straddle.  libpinmem
 * reports them (pinmem_registrations), and a pool can choose chunks that are
 * multiples of its unit (pinmem_register_plan, then the register_chunk of
 * pinmem_alloc_params), so that its objects pack with no loss.
 *
 * Every failed CUDA call is followed by cudaGetLastError(), so a refused
 * registration leaves no error behind for the next, unrelated CUDA call of
 * the thread (torch's kernel launch, say).  Failure details name the error
 * as cudaGetErrorName does ("cudaErrorInvalidValue"), with its text and
 * number. */

/* One registration of a mapping: [offset, offset + len) from its base. */
typedef struct pinmem_span {
    size_t offset;
    size_t len;
} pinmem_span;

/* Flags of pinmem_register. */
#define PINMEM_REGISTER_IO_MEMORY 1u  /* cudaHostRegisterIoMemory: I/O memory (a PCIe BAR
                                       * mapped with VM_IO/VM_PFNMAP), not RAM pages */
#define PINMEM_REGISTER_READ_ONLY 2u  /* cudaHostRegisterReadOnly: the GPU only reads it
                                       * (the driver then pins without FOLL_WRITE) */
#define PINMEM_REGISTER_POPULATE 4u   /* make the range resident first (contents kept),
                                       * overlapped with the registration of the chunks */

/* The chunk a pool should register len bytes in: *chunk receives
 * lcm(unit, 2 MiB) times a power of two (unit 0 = 2 MiB), the largest not
 * above about len / 16 (so that population and registration overlap,
 * PINMEM_OPT_REGISTER_OVERLAP) nor the PINMEM_OPT_REGISTER_CHUNK option,
 * and not below 256 MiB where those allow.  When
 * lcm(unit, 2 MiB) is above that option the unit cannot be honoured: the
 * chunk is the option's, rounded down to 2 MiB, and objects that would
 * straddle a boundary must be left out by the caller.  2 MiB granularity
 * suits both 4 KiB and 2 MiB pages.  A pure function of its arguments and
 * the options; PINMEM_EINVAL for a NULL chunk. */
PINMEM_API int pinmem_register_plan(size_t len, size_t unit, size_t *chunk);

/* The CUDA registrations of the live mapping whose base is addr, in address
 * order: up to max spans into spans (which may be NULL when max is 0), the
 * total number into *count (call again with more room when it is larger).
 * A cudaHostAlloc mapping is one span; a registered one has a span per
 * cudaHostRegister call of every finished commit; unpinned, mlocked and
 * uncommitted parts have none. */
PINMEM_API int pinmem_registrations(void *addr, pinmem_span *spans, size_t max, size_t *count);

/* Register [addr, addr + len) -- memory libpinmem did not map (a Device-DAX
 * or file mapping, a host buffer another library allocated) -- with CUDA,
 * in calls of chunk bytes (rounded down to a multiple of 4 KiB, capped by
 * the PINMEM_OPT_REGISTER_CHUNK option; 0 = that option), each retried
 * smaller as PINMEM_OPT_REGISTER_MIN_CHUNK says.  flags: PINMEM_REGISTER_*.
 * A call refused part-way unregisters every chunk it registered, and the
 * runtime's last error is cleared.  On success *out (may be NULL)
 * describes it: kind PINMEM_KIND_EXTERNAL, pinned
 * PINMEM_PINNED_CUDA_REGISTER, register_chunks.  It is a registry entry
 * keyed by addr, as a mapping is: pinmem_registrations and pinmem_query
 * take addr; pinmem_free refuses it (pinmem_unregister releases it).
 * PINMEM_EINVAL: NULL addr, len 0, unknown flags, or a range that overlaps
 * a live libpinmem mapping or registration (commit libpinmem's own
 * mappings instead); PINMEM_ENO_CUDA: no usable runtime; PINMEM_ECUDA /
 * PINMEM_ENOMEM: the driver refused (the detail names the CUDA error). */
PINMEM_API int pinmem_register(void *addr, size_t len, size_t chunk, unsigned int flags,
                               pinmem_region *out);

/* Unregister every chunk of a pinmem_register registration, each once, and
 * forget it.  The caller makes sure no copy from the range is in flight
 * (synchronise the streams first).  In a forked child the parent's
 * registration is forgotten without a CUDA call.  PINMEM_EUNKNOWN_PTR:
 * addr is no such registration; PINMEM_ECUDA: a chunk could not be
 * unregistered (the entry is forgotten all the same). */
PINMEM_API int pinmem_unregister(void *addr);

/* Make [addr, addr+len) resident with up to threads threads (0 = the plan's);
 * writes zeros where MADV_POPULATE_WRITE is unavailable, so only for fresh
 * memory.  *method receives a pinmem_populate_method, *threads_used the
 * number of threads. */
PINMEM_API int pinmem_populate(void *addr, size_t len, int threads, int *method,
                               int *threads_used);

/* The probe's facts, *out.  run: 0 = report what is known (probed 0 when
 * the probe has not run); 1 = run the probe first if it has not run in this
 * process; 2 = run it again now.  Thread-safe; a population that needs the
 * probe waits for one in progress. */
PINMEM_API int pinmem_populate_probe(int run, pinmem_populate_facts *out);

/* Turn facts into a plan by the rule above (options not applied). */
PINMEM_API int pinmem_populate_decide(const pinmem_populate_facts *facts,
                                      pinmem_populate_plan *out);

/* The plan in effect now for a large population: the probe's facts when it
 * ran (this call never runs it), with the options applied. */
PINMEM_API int pinmem_populate_plan_get(pinmem_populate_plan *out);

/* Bytes this process may still make resident before an effective limit
 * binds: MemAvailable (plus SwapFree unless pinned, since pinned pages
 * cannot be swapped out) and the memory cgroup's limit minus its usage
 * (v2 memory.max, v1 memory.limit_in_bytes, this cgroup and its parents),
 * whichever is smaller.  *limit (may be NULL) receives a static name of the
 * one that binds.  pinmem_alloc (when it populates or pins) and
 * pinmem_commit check this first and fail with PINMEM_ELIMIT, naming the
 * limit, rather than let the kernel's OOM killer act. */
PINMEM_API int pinmem_memory_room(int pinned, uint64_t *room, const char **limit);

/* Bytes of [addr, addr+len) resident in memory (mincore). */
PINMEM_API int pinmem_resident_bytes(void *addr, size_t len, size_t *resident);

/* The capability probe. */
PINMEM_API int pinmem_probe(pinmem_caps *out);

/* Online NUMA nodes: up to max entries into nodes, count into *count. */
PINMEM_API int pinmem_numa_nodes(int *nodes, int max, int *count);

/* CPU and NUMA node the calling thread runs on (getcpu). */
PINMEM_API int pinmem_current_cpu(int *cpu, int *node);

/* Free and total 2 MiB hugepages, system-wide (node -1) or on one node. */
PINMEM_API int pinmem_hugepages_2m(int node, int64_t *total, int64_t *free_pages);

/* Read or change an option.  pinmem_option_set of a value outside the
 * option's range fails with PINMEM_EINVAL (the detail names the option's
 * variable, the value and the range) and changes nothing. */
PINMEM_API int pinmem_option_get(int option, int64_t *value);
PINMEM_API int pinmem_option_set(int option, int64_t value);

/* Describe an option: its name, variable, value, default, range, where the
 * value came from, and the text of its variable when that was rejected. */
PINMEM_API int pinmem_option_describe(int option, pinmem_option_info *out);

/* PINMEM_OK when every option variable that was set held a valid value;
 * otherwise PINMEM_EOPTION, the detail naming each rejected variable, its
 * text and the accepted range (each option's info says the same). */
PINMEM_API int pinmem_option_check(void);

/* Choose the CUDA runtime again: path NULL = discovery (KVPOOL_CUDART, then
 * an already loaded libcudart, then the usual sonames); "" = no CUDA.
 * PINMEM_EBUSY while CUDA-pinned mappings (or CUDA commits) are live. */
PINMEM_API int pinmem_cuda_reload(const char *path);

/* ---- Entry files: one FileStore put, get or eviction in one call ----
 *
 * kvpool's FileStore keeps one file per entry (a header, then the bytes).
 * These calls make the system calls of one put, one get and one eviction,
 * so that a put or a get costs what bare pwritev/preadv cost, plus only
 * the checks that keep it safe.  An entry is only ever a regular file with
 * one link owned by this user, opened with O_NOFOLLOW | O_NONBLOCK: a
 * symlink, FIFO, device, directory, hard link or another user's file is
 * never written, and never read. */

/* pinmem_entry_write flags (PINMEM_ENTRY_DIRECT: pinmem_entry_read's too). */
#define PINMEM_ENTRY_SPARE 1u    /* temp names a spare to overwrite, else temp is created (O_EXCL) */
#define PINMEM_ENTRY_EXCHANGE 2u /* replace an existing entry by renameat2(RENAME_EXCHANGE) */
#define PINMEM_ENTRY_SYNC 4u     /* fsync the file before it gets the entry's name */
#define PINMEM_ENTRY_DIRECT 8u   /* move the bytes with O_DIRECT (page cache bypassed) when
                                  * the data's address and length and the header's length
                                  * are multiples of PINMEM_ENTRY_ALIGN; else buffered */
/* pinmem_entry_evict flag. */
#define PINMEM_ENTRY_KEEP 16u /* leave the evicted file at temp (a spare) instead of unlinking it */
/* The alignment PINMEM_ENTRY_DIRECT needs (every file system's O_DIRECT unit fits in it). */
#define PINMEM_ENTRY_ALIGN 4096

/* How pinmem_entry_write left the names (its *outcome). */
typedef enum pinmem_entry_outcome {
    PINMEM_ENTRY_RENAMED = 0,            /* temp was renamed onto path */
    PINMEM_ENTRY_SWAPPED = 1,            /* path existed: exchanged; temp now names
                                          * the replaced file (a spare to reuse) */
    PINMEM_ENTRY_RENAMED_NO_EXCHANGE = 2, /* renamed: the file system refused the
                                          * exchange (EINVAL/ENOSYS/EPERM); stop asking */
    PINMEM_ENTRY_SPARE_UNUSABLE = 3      /* PINMEM_ENTRY_SPARE: the spare was missing,
                                          * not an entry-kind file, or locked by a
                                          * reader; nothing was written */
} pinmem_entry_outcome;

/* How pinmem_entry_read found path (its *outcome). */
typedef enum pinmem_entry_found {
    PINMEM_ENTRY_READ = 0,    /* read: *nread bytes */
    PINMEM_ENTRY_MISSING = 1, /* no entry at path */
    PINMEM_ENTRY_REFUSED = 2  /* something else is at path (symlink, FIFO, device,
                               * directory, hard link, another user's file), or it
                               * was replaced at every try: nothing was read */
} pinmem_entry_found;

/* What pinmem_entry_evict did (its *outcome). */
typedef enum pinmem_entry_evicted {
    PINMEM_ENTRY_EVICTED = 0, /* the expected file left path (unlinked, or at temp) */
    PINMEM_ENTRY_GONE = 1,    /* nothing was at path */
    PINMEM_ENTRY_CHANGED = 2  /* path held another file (written since): left there */
} pinmem_entry_evicted;

/* Which file an entry call wrote or read: its identity when the call
 * ended, and how its bytes moved. */
typedef struct pinmem_entry_stamp {
    uint64_t inode;   /* st_ino */
    int64_t mtime_ns; /* st_mtim, in nanoseconds */
    uint64_t size;    /* st_size */
    int direct;       /* 1 when the bytes moved with O_DIRECT, 0 buffered */
} pinmem_entry_stamp;

/* Write header then data (one pwritev/writev, short writes finished) into
 * the file temp and give it the name path atomically: a reader sees the
 * old entry or the new one, never part of one.
 *   - flags & PINMEM_ENTRY_SPARE: temp is a spare (a file an earlier put
 *     swapped out); it is rewritten only while it is an entry-kind file and
 *     flock(LOCK_EX | LOCK_NB) succeeds (a reader that opened it while it
 *     was an entry holds LOCK_SH), and truncated to the new length; else
 *     *outcome is PINMEM_ENTRY_SPARE_UNUSABLE and nothing is written.
 *     Without the flag temp is created with O_CREAT | O_EXCL | O_NOFOLLOW.
 *   - flags & PINMEM_ENTRY_EXCHANGE: an existing path is replaced with
 *     renameat2(RENAME_EXCHANGE), so the replaced file stays at temp
 *     (PINMEM_ENTRY_SWAPPED); a missing path gets a rename.
 *   - flags & PINMEM_ENTRY_SYNC: fsync before the rename (the directory's
 *     fsync is the caller's).
 *   - flags & PINMEM_ENTRY_DIRECT: O_DIRECT when aligned (see the flag; the
 *     header is copied to an aligned buffer); a file system that refuses
 *     O_DIRECT, or unaligned bytes, are written buffered.
 * stamp (may be NULL) receives the written file's identity and whether
 * O_DIRECT was used.  After the call temp exists only when *outcome is
 * PINMEM_ENTRY_SWAPPED (any other name at temp is unlinked; the file it
 * named is not touched).  PINMEM_ESYS (with pinmem_last_errno) when a
 * create, write, truncate, fsync, stat or rename fails; PINMEM_EINVAL for
 * NULLs, unknown flags or sizes beyond a file's. */
PINMEM_API int pinmem_entry_write(const char *temp, const char *path, const void *header,
                                  size_t header_len, const void *data, size_t data_len,
                                  unsigned int flags, int *outcome, pinmem_entry_stamp *stamp);

/* Read the entry at path into header (header_len bytes) then data
 * (data_len bytes), plus one byte more to detect trailing bytes, safely
 * against concurrent puts: open, check the file is an entry-kind file,
 * flock(LOCK_SH), check the name still refers to it (else open it again,
 * up to 100 times), one preadv.  *nread counts every byte read (header +
 * data + 1 means trailing bytes; fewer means a short file).  flags:
 * PINMEM_ENTRY_DIRECT reads with O_DIRECT when aligned (as for writes) and
 * the file is exactly header_len + data_len bytes long (no byte more is
 * then read: there is none); any other file is read buffered.  stamp (may
 * be NULL) receives the identity of the file read.  The caller checks the
 * header.  PINMEM_ESYS for an open, stat, lock or read the OS refused for
 * another reason (EACCES, EIO...); PINMEM_EINVAL for NULLs or unknown flags. */
PINMEM_API int pinmem_entry_read(const char *path, void *header, size_t header_len, void *data,
                                 size_t data_len, unsigned int flags, int *outcome,
                                 uint64_t *nread, pinmem_entry_stamp *stamp);

/* Evict the entry at path if it is still the file expected describes
 * (inode, mtime and size, as a write's or a stat's stamp gave them): a file
 * already another is left alone (stat first: no rename, so another process
 * never sees its entry vanish for a moment); else the file is renamed to
 * temp (a new name), checked there again, then unlinked - or,
 * with PINMEM_ENTRY_KEEP, left at temp as a spare.  A file written since
 * (by another process) goes back under path with
 * renameat2(RENAME_NOREPLACE), or is dropped if a newer one took the name
 * meanwhile: an eviction never removes an entry newer than the one
 * expected.  A reader that opened the file reads it whole (a reader
 * opening path meanwhile finds no entry).  *outcome: pinmem_entry_evicted.
 * PINMEM_ESYS when a rename or unlink fails; PINMEM_EINVAL for NULLs or
 * unknown flags. */
PINMEM_API int pinmem_entry_evict(const char *path, const char *temp,
                                  const pinmem_entry_stamp *expected, unsigned int flags,
                                  int *outcome);

/* PINMEM_CDEF_END */

#ifdef PINMEM_TESTING
/*
 * Test builds only (compiled with -DPINMEM_TESTING: libpinmem/build/
 * testing/libpinmem.so, which `make lib` builds for the test suites).  The
 * production library has neither these calls nor any environment variable
 * for them.  build.py feeds this block to cffi as well; in a production
 * library the call is simply absent.
 */
/* PINMEM_TEST_CDEF_BEGIN */

/* Faults a test can switch on: the kernel call behaves as if refused. */
typedef enum pinmem_fault {
    PINMEM_FAULT_MBIND_EPERM = 0,   /* mbind fails with EPERM (as in containers) */
    PINMEM_FAULT_MLOCK_EPERM = 1,   /* mlock and mlock2 fail with EPERM */
    PINMEM_FAULT_SHORT_IO = 2,      /* entry reads and writes move at most 1000 bytes
                                     * per system call (their loops must finish them) */
    PINMEM_FAULT_ENTRY_ENOSPC = 3,  /* entry writes fail with ENOSPC */
    PINMEM_FAULT_ENTRY_DIE_BEFORE_RENAME = 4, /* pinmem_entry_write kills its process
                                     * (SIGKILL) after its write, before its rename */
    PINMEM_FAULT_COUNT = 5
} pinmem_fault;

/* Switch a fault on (on != 0) or off, process-wide; PINMEM_EINVAL for a
 * fault that does not exist. */
PINMEM_API int pinmem_test_set_fault(int fault, int on);

/* Where the entry calls run a test's hook. */
typedef enum pinmem_entry_hook {
    PINMEM_HOOK_READ_BEFORE_LOCK = 0,  /* pinmem_entry_read, between its open and its
                                        * lock (when a put can swap the file out) */
    PINMEM_HOOK_WRITE_BEFORE_DATA = 1, /* pinmem_entry_write, before it writes (while
                                        * the caller holds the source's bytes) */
    PINMEM_HOOK_COUNT = 2
} pinmem_entry_hook;

/* Have the entry calls run hook once at point (then the hook is cleared,
 * before it runs, so it may itself call them); NULL removes it;
 * PINMEM_EINVAL for a point that does not exist. */
PINMEM_API int pinmem_test_set_entry_hook(int point, void (*hook)(void));

/* PINMEM_TEST_CDEF_END */
#endif

#ifdef __cplusplus
}
#endif

#endif /* PINMEM_H */

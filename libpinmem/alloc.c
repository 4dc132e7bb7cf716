/* Allocation and free of every kind: anonymous, hugetlb, shared memory,
 * CUDA host memory; the pinning that goes with each. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

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
#ifndef MADV_DONTFORK
#define MADV_DONTFORK 10
#endif
#ifndef MADV_DOFORK
#define MADV_DOFORK 11
#endif

/* No user address space is larger than 2^56 bytes (5-level paging). */
#define PM_SIZE_LIMIT ((size_t)1 << 56)

/* cudaHostAllocPortable == cudaHostRegisterPortable == 1. */
#define PM_CUDA_PORTABLE 1u
#define PM_CUDA_ERROR_MEMORY_ALLOCATION 2

static size_t pm_round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* ---------------------------------------------------------------- names */

PINMEM_API int pinmem_shm_name_check(const char *name)
{
    if (name == NULL)
        return pm_fail(PINMEM_ESHM_NAME, 0, "shared-memory name is NULL");
    size_t len = strnlen(name, NAME_MAX + 2);
    if (name[0] != '/')
        return pm_fail(PINMEM_ESHM_NAME, 0,
                       "shared-memory name '%.64s' must start with '/' (rule: '/' followed by "
                       "1..%d characters, none of them '/')",
                       name, NAME_MAX);
    if (len < 2)
        return pm_fail(PINMEM_ESHM_NAME, 0,
                       "shared-memory name '/' needs at least one character after the '/'");
    if (len - 1 > NAME_MAX)
        return pm_fail(PINMEM_ESHM_NAME, 0,
                       "shared-memory name is longer than %d characters after the '/' "
                       "(NAME_MAX)",
                       NAME_MAX);
    if (strchr(name + 1, '/') != NULL)
        return pm_fail(PINMEM_ESHM_NAME, 0,
                       "shared-memory name '%.64s' may contain no '/' after the leading one",
                       name);
    if (strcmp(name, "/.") == 0 || strcmp(name, "/..") == 0)
        return pm_fail(PINMEM_ESHM_NAME, 0, "shared-memory name '%s' is reserved", name);
    return PINMEM_OK;
}

/* Unlink name only if it still names the segment (dev, ino); 1 if it did. */
static int pm_shm_unlink_if_same(const char *name, dev_t dev, ino_t ino)
{
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct stat st;
    int same = fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
    close(fd);
    if (same && shm_unlink(name) == 0)
        return 1;
    return 0;
}

static int pm_shm_open_status(int err, const char *name, const char *what)
{
    switch (err) {
    case ENOENT:
        return pm_fail(PINMEM_ESHM_NOT_FOUND, err,
                       "no shared-memory segment named '%s' (looked for /dev/shm%s)", name, name);
    case EEXIST:
        return pm_fail(PINMEM_ESHM_EXISTS, err,
                       "a shared-memory segment named '%s' already exists; reuse it by "
                       "passing the reuse flag, or unlink it first",
                       name);
    case EACCES:
    case EPERM:
        return pm_fail(PINMEM_EPERM, err, "%s '%s' refused: %s", what, name, strerror(err));
    case EINVAL:
    case ENAMETOOLONG:
        return pm_fail(PINMEM_ESHM_NAME, err, "%s '%s' refused the name: %s", what, name,
                       strerror(err));
    default:
        return pm_fail(PINMEM_ESYS, err, "%s '%s' failed: %s", what, name, strerror(err));
    }
}

PINMEM_API int pinmem_shm_unlink(const char *name)
{
    int rc = pinmem_shm_name_check(name);
    if (rc != PINMEM_OK)
        return rc;
    if (shm_unlink(name) != 0)
        return pm_shm_open_status(errno, name, "shm_unlink");
    return PINMEM_OK;
}

PINMEM_API int pinmem_shm_size(const char *name, size_t *size)
{
    int rc = pinmem_shm_name_check(name);
    if (rc != PINMEM_OK)
        return rc;
    if (size == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "size must not be NULL");
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return pm_shm_open_status(errno, name, "shm_open");
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    int err = errno;
    close(fd);
    if (!ok)
        return pm_fail(PINMEM_ESYS, err, "fstat of '%s' failed: %s", name, strerror(err));
    *size = (size_t)st.st_size;
    return PINMEM_OK;
}

/* -------------------------------------------------------------- helpers */

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

static int pm_hugepages_short(size_t need, int node, int err)
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

static const char *pm_memlock_text(char *buf, size_t len)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return "unknown";
    if (rl.rlim_cur == RLIM_INFINITY)
        return "unlimited";
    return pm_fmt_bytes(buf, len, (uint64_t)rl.rlim_cur);
}

/* cudaHostRegister [addr, addr+len) in chunks; on failure unregister the
 * chunks already done.  Returns a status. */
static int pm_cuda_register(const pm_cuda_api *cuda, char *addr, size_t len, size_t page,
                            size_t *chunk_out, int *chunks_out)
{
    size_t chunk = (size_t)pm_opt(PINMEM_OPT_REGISTER_CHUNK);
    chunk = chunk / page * page;
    if (chunk < page)
        chunk = page;
    size_t n = (len + chunk - 1) / chunk;
    for (size_t i = 0; i < n; i++) {
        size_t off = i * chunk;
        size_t l = len - off < chunk ? len - off : chunk;
        int rc = cuda->host_register(addr + off, l, PM_CUDA_PORTABLE);
        if (rc != 0) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", pm_cuda_errstr(cuda, rc));
            pm_cuda_clear_error(cuda);
            size_t undone = 0;
            for (size_t j = 0; j < i; j++)
                if (cuda->host_unregister(addr + j * chunk) == 0)
                    undone++;
            pm_cuda_clear_error(cuda);
            char b[64];
            return pm_fail(rc == PM_CUDA_ERROR_MEMORY_ALLOCATION ? PINMEM_ENOMEM : PINMEM_ECUDA,
                           0,
                           "cudaHostRegister of chunk %zu of %zu (%s at offset %zu) failed: %s "
                           "(%d); unregistered %zu of the %zu chunk(s) already registered",
                           i + 1, n, pm_fmt_bytes(b, sizeof b, l), off, msg, rc, undone, i);
        }
    }
    *chunk_out = chunk;
    *chunks_out = (int)n;
    return PINMEM_OK;
}

/* Map len bytes of private anonymous memory aligned to 2 MiB when large. */
static void *pm_map_anonymous(size_t len)
{
    if (len < PM_HUGE_2M)
        return mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t over = len + PM_HUGE_2M;
    if (over < len)
        return MAP_FAILED;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
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

/* Create (or, with PINMEM_SHM_REUSE, replace) a segment and map it. */
static int pm_shm_create(const char *name, size_t mapped, int flags, unsigned int mode,
                         void **addr_out, dev_t *dev, ino_t *ino)
{
    mode_t m = mode ? (mode_t)mode : 0600;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, m);
    if (fd < 0 && errno == EEXIST && (flags & PINMEM_SHM_REUSE)) {
        if (shm_unlink(name) != 0 && errno != ENOENT)
            return pm_shm_open_status(errno, name, "shm_unlink of the leftover segment");
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, m);
    }
    if (fd < 0) {
        int err = errno;
        if (err == EEXIST)
            return pm_fail(PINMEM_ESHM_EXISTS, err,
                           "a shared-memory segment named '%s' already exists; pass the "
                           "reuse flag (shm_reuse=True) to replace it, or unlink it first",
                           name);
        return pm_shm_open_status(err, name, "shm_open");
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        shm_unlink(name);
        return pm_fail(PINMEM_ESYS, err, "fstat of '%s' failed: %s", name, strerror(err));
    }
    /* tmpfs hands out pages on first touch; a full /dev/shm would then kill
     * the process with SIGBUS, so check the room now. */
    struct statvfs vfs;
    if (fstatvfs(fd, &vfs) == 0 && vfs.f_blocks != 0) {
        uint64_t room = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        if (room < mapped) {
            close(fd);
            shm_unlink(name);
            char a[64], b[64];
            return pm_fail(PINMEM_ENOMEM, ENOSPC,
                           "shared memory (/dev/shm) has %s free, the segment needs %s; grow it: "
                           "sudo mount -o remount,size=<bytes> /dev/shm",
                           pm_fmt_bytes(a, sizeof a, room), pm_fmt_bytes(b, sizeof b, mapped));
        }
    }
    if (ftruncate(fd, (off_t)mapped) != 0) {
        int err = errno;
        close(fd);
        shm_unlink(name);
        return pm_fail(err == EFBIG || err == ENOSPC ? PINMEM_ENOMEM : PINMEM_ESYS, err,
                       "ftruncate of '%s' to %zu bytes failed: %s", name, mapped, strerror(err));
    }
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return pm_fail(err == ENOMEM ? PINMEM_ENOMEM : PINMEM_ESYS, err,
                       "mmap of shared-memory segment '%s' (%zu bytes) failed: %s", name, mapped,
                       strerror(err));
    }
    *addr_out = p;
    *dev = st.st_dev;
    *ino = st.st_ino;
    return PINMEM_OK;
}

/* Undo a mapping that never reached the registry. */
static void pm_discard(pm_entry *e)
{
    if (e->region.addr != NULL)
        munmap(e->region.addr, e->region.mapped_size);
    if (e->shm_name != NULL && e->region.shm_owner)
        pm_shm_unlink_if_same(e->shm_name, e->shm_dev, e->shm_ino);
    pm_entry_destroy(e);
}

int pm_fill_range(char *addr, size_t len, size_t page, int hugetlb, int plan,
                  const pm_cuda_api *cuda, int populate, int threads, int touch, pm_fill *out)
{
    memset(out, 0, sizeof *out);
    int pinning = plan != PM_PLAN_NONE;
    int lock = plan == PM_PLAN_MLOCK || plan == PM_PLAN_MLOCK_SOFT;
    int lock_err = 0;
    int lock_in_populate = lock;
    int mode = (int)pm_opt(PINMEM_OPT_MLOCK_MODE);
    if (mode == 3)
        mode = hugetlb ? 0 : 2;
    if (lock && mode == 2) {
        /* Lock first, on fault: the populate threads then lock as they go
         * and a refusal costs nothing.  ENOSYS/EINVAL: old kernel, lock in
         * the threads instead. */
        if (pm_mlock_onfault(addr, len) == 0)
            lock_in_populate = 0;
        else if (errno != ENOSYS && errno != EINVAL)
            lock_err = errno;
        else
            mode = 1;
    }
    if (lock_err != 0)
        lock_in_populate = 0; /* refused up front: populate unlocked */
    if (!(lock_err != 0 && plan == PM_PLAN_MLOCK) && (populate || pinning)) {
        int populate_lock_err = 0;
        int rc = pm_populate(addr, len, page, threads, touch, lock_in_populate, mode == 1,
                             &out->method, &out->threads_used, &populate_lock_err);
        if (rc != PINMEM_OK) {
            if (lock)
                munlock(addr, len);
            return rc;
        }
        if (lock_err == 0)
            lock_err = populate_lock_err;
    }
    out->pinned = PINMEM_PINNED_NONE;
    if (lock) {
        if (lock_err == 0) {
            out->pinned = PINMEM_PINNED_MLOCK;
        } else {
            munlock(addr, len);
            if (plan == PM_PLAN_MLOCK) {
                char a[64], b[64];
                return pm_fail(PINMEM_EMLOCK, lock_err,
                               "mlock of %s refused: %s; the memlock limit is %s (raise it: "
                               "ulimit -l unlimited, or memlock in /etc/security/limits.conf, "
                               "or run with CAP_IPC_LOCK)",
                               pm_fmt_bytes(a, sizeof a, len), strerror(lock_err),
                               pm_memlock_text(b, sizeof b));
            }
        }
    } else if (plan == PM_PLAN_CUDA_REGISTER) {
        int rc = pm_cuda_register(cuda, addr, len, page, &out->register_chunk,
                                  &out->register_chunks);
        if (rc != PINMEM_OK)
            return rc;
        out->pinned = PINMEM_PINNED_CUDA_REGISTER;
    }
    return PINMEM_OK;
}

/* Populate and pin a fresh mapping per plan; fills the region fields and
 * records what was populated or pinned as one committed range. */
static int pm_finish(pm_entry *e, int plan, const pm_cuda_api *cuda, int populate, int threads,
                     int touch)
{
    pinmem_region *r = &e->region;
    int private_map = r->kind != PINMEM_KIND_SHM;
    int pinning = plan != PM_PLAN_NONE;
    int committing = populate || pinning;
    /* Room for the range first, so that nothing can fail once pinned. */
    if (committing && pm_ranges_reserve(e, 1) != 0)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    if (private_map && pinning && madvise(r->addr, r->mapped_size, MADV_DONTFORK) == 0)
        e->dontfork = 1;
    pm_fill f;
    int rc = pm_fill_range(r->addr, r->mapped_size, r->page_size,
                           r->kind == PINMEM_KIND_HUGETLB, plan, cuda, populate, threads, touch,
                           &f);
    if (rc != PINMEM_OK)
        return rc;
    r->populate_method = f.method;
    r->threads_used = f.threads_used;
    if (committing) {
        pm_range range = {0, r->mapped_size, f.pinned, 0, f.register_chunks, f.register_chunk};
        pm_range_add(e, &range);
    }
    if (f.pinned == PINMEM_PINNED_CUDA_REGISTER)
        e->cuda = cuda;
    if (e->dontfork && f.pinned == PINMEM_PINNED_NONE) {
        madvise(r->addr, r->mapped_size, MADV_DOFORK);
        e->dontfork = 0;
    }
    pm_entry_totals(e);
    return PINMEM_OK;
}

/* ---------------------------------------------------------------- alloc */

PINMEM_API int pinmem_params_init(pinmem_alloc_params *params)
{
    if (params == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "params must not be NULL");
    memset(params, 0, sizeof *params);
    params->numa_node = -1;
    params->populate = 1;
    return PINMEM_OK;
}

static int pm_alloc_cuda_host(const pinmem_alloc_params *p, const pm_cuda_api *cuda,
                              pinmem_region *out)
{
    pm_entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    void *ptr = NULL;
    int rc = cuda->host_alloc(&ptr, p->size, PM_CUDA_PORTABLE);
    if (rc != 0 || ptr == NULL) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", pm_cuda_errstr(cuda, rc));
        pm_cuda_clear_error(cuda);
        free(e);
        char b[64];
        return pm_fail(rc == PM_CUDA_ERROR_MEMORY_ALLOCATION ? PINMEM_ENOMEM : PINMEM_ECUDA, 0,
                       "cudaHostAlloc of %s failed: %s (%d)", pm_fmt_bytes(b, sizeof b, p->size),
                       msg, rc);
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
    pm_range range = {0, r->mapped_size, PINMEM_PINNED_CUDA_ALLOC, 0, 0, 0};
    if (pm_ranges_reserve(e, 1) != 0) {
        cuda->free_host(ptr);
        free(e);
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    }
    pm_range_add(e, &range);
    pm_entry_totals(e);
    pm_registry_add(e);
    *out = *r;
    return PINMEM_OK;
}

PINMEM_API int pinmem_alloc(const pinmem_alloc_params *p, pinmem_region *out)
{
    if (p == NULL || out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "params and out must not be NULL");
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
    int is_shm = p->shm_name != NULL;
    if (is_shm) {
        int rc = pinmem_shm_name_check(p->shm_name);
        if (rc != PINMEM_OK)
            return rc;
    }
    int hp = p->hugepages;
    if (is_shm && (hp == PINMEM_HUGE_THP || hp == PINMEM_HUGE_REQUIRED))
        return pm_fail(PINMEM_EINVAL, 0,
                       "hugepages are not supported with shared memory (segment '%s')",
                       p->shm_name);
    if (is_shm)
        hp = PINMEM_HUGE_NEVER;
    if (p->numa_node >= 0 && !pm_numa_node_exists(p->numa_node))
        return pm_numa_missing(p->numa_node);

    size_t page = pm_page_size();
    size_t threshold = (size_t)pm_opt(PINMEM_OPT_REGISTER_THRESHOLD);
    uint64_t ram = pm_mem_total();
    int will_populate = p->populate || p->pin != PINMEM_PIN_NONE;
    if (will_populate && ram != 0 && p->size > ram) {
        char a[64], b[64];
        return pm_fail(PINMEM_ETOO_LARGE, 0,
                       "making %s resident needs more than this machine's %s of RAM",
                       pm_fmt_bytes(a, sizeof a, p->size), pm_fmt_bytes(b, sizeof b, ram));
    }

    const pm_cuda_api *cuda = NULL;
    const char *why = "";
    int plan = PM_PLAN_NONE;
    switch (p->pin) {
    case PINMEM_PIN_AUTO:
        cuda = pm_cuda(&why);
        if (cuda == NULL)
            plan = PM_PLAN_MLOCK_SOFT;
        else if (!is_shm && p->numa_node < 0 && hp == PINMEM_HUGE_NEVER && p->size < threshold)
            plan = PM_PLAN_CUDA_ALLOC;
        else
            plan = PM_PLAN_CUDA_REGISTER;
        break;
    case PINMEM_PIN_NONE:
        plan = PM_PLAN_NONE;
        break;
    case PINMEM_PIN_MLOCK:
        plan = PM_PLAN_MLOCK;
        break;
    case PINMEM_PIN_CUDA_ALLOC:
        if (is_shm || p->numa_node >= 0 || hp != PINMEM_HUGE_NEVER)
            return pm_fail(PINMEM_EINVAL, 0,
                           "cudaHostAlloc cannot give shared, NUMA-bound or hugepage memory; "
                           "use the cuda-register pin mode");
        cuda = pm_cuda(&why);
        if (cuda == NULL)
            return pm_fail(PINMEM_ENO_CUDA, 0, "cuda-alloc pinning needs CUDA: %s", why);
        plan = p->size < threshold ? PM_PLAN_CUDA_ALLOC : PM_PLAN_CUDA_REGISTER;
        break;
    default: /* PINMEM_PIN_CUDA_REGISTER */
        cuda = pm_cuda(&why);
        if (cuda == NULL)
            return pm_fail(PINMEM_ENO_CUDA, 0, "cuda-register pinning needs CUDA: %s", why);
        plan = PM_PLAN_CUDA_REGISTER;
        break;
    }
    if (plan == PM_PLAN_CUDA_ALLOC)
        return pm_alloc_cuda_host(p, cuda, out);

    pm_entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    pinmem_region *r = &e->region;
    r->size = p->size;
    r->numa_node = p->numa_node;
    r->page_size = page;
    e->pid = getpid();

    /* 1. Map. */
    if (hp == PINMEM_HUGE_AUTO || hp == PINMEM_HUGE_REQUIRED) {
        size_t need = (p->size + PM_HUGE_2M - 1) / PM_HUGE_2M;
        int64_t total = -1, avail = -1;
        int err = ENOMEM;
        if (pinmem_hugepages_2m(p->numa_node, &total, &avail) == PINMEM_OK &&
            avail >= (int64_t)need) {
            void *a = mmap(NULL, need * PM_HUGE_2M, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | PM_MAP_HUGE_2MB, -1, 0);
            if (a != MAP_FAILED) {
                r->addr = a;
                r->mapped_size = need * PM_HUGE_2M;
                r->kind = PINMEM_KIND_HUGETLB;
                r->hugepages = PINMEM_HUGE_RESULT_HUGETLB_2M;
                r->page_size = PM_HUGE_2M;
            } else {
                err = errno;
            }
        }
        if (r->addr == NULL) {
            if (hp == PINMEM_HUGE_REQUIRED) {
                free(e);
                return pm_hugepages_short(need, p->numa_node, err);
            }
            /* auto: back off to 4 KiB pages, or THP when so configured. */
            hp = pm_opt(PINMEM_OPT_AUTO_FALLBACK_THP) ? PINMEM_HUGE_THP : PINMEM_HUGE_NEVER;
        }
    }
    if (r->addr == NULL) {
        size_t mapped = pm_round_up(p->size, page);
        if (is_shm) {
            e->shm_name = strdup(p->shm_name);
            if (e->shm_name == NULL) {
                free(e);
                return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory copying the name");
            }
            void *a = NULL;
            int rc = pm_shm_create(p->shm_name, mapped, p->flags, p->shm_mode, &a, &e->shm_dev,
                                   &e->shm_ino);
            if (rc != PINMEM_OK) {
                pm_entry_destroy(e);
                return rc;
            }
            r->addr = a;
            r->kind = PINMEM_KIND_SHM;
            r->shm_owner = 1;
            e->shm_unlink_on_free = !(p->flags & PINMEM_SHM_KEEP_ON_FREE);
        } else {
            void *a = pm_map_anonymous(mapped);
            if (a == MAP_FAILED) {
                int err = errno;
                free(e);
                char b[64];
                return pm_fail(PINMEM_ENOMEM, err, "mmap of %s failed: %s",
                               pm_fmt_bytes(b, sizeof b, mapped), strerror(err));
            }
            r->addr = a;
            r->kind = PINMEM_KIND_ANONYMOUS;
        }
        r->mapped_size = mapped;
        if (hp == PINMEM_HUGE_THP && madvise(r->addr, mapped, MADV_HUGEPAGE) == 0 &&
            pm_thp_mode() > 0)
            r->hugepages = PINMEM_HUGE_RESULT_THP;
    }

    /* 2. Bind, before any page exists. */
    if (p->numa_node >= 0) {
        int rc = pm_mbind(r->addr, r->mapped_size, p->numa_node, &r->numa_bound);
        if (rc != PINMEM_OK) {
            pm_discard(e);
            return rc;
        }
    }

    /* 3. Populate and pin. */
    int rc = pm_finish(e, plan, cuda, p->populate, p->threads, PM_TOUCH_ZERO);
    if (rc != PINMEM_OK) {
        pm_discard(e);
        return rc;
    }
    pm_registry_add(e);
    *out = *r;
    return PINMEM_OK;
}

PINMEM_API int pinmem_shm_attach(const char *name, size_t size, int pin, int populate,
                                 pinmem_region *out)
{
    int rc = pinmem_shm_name_check(name);
    if (rc != PINMEM_OK)
        return rc;
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    if (pin != PINMEM_PIN_AUTO && pin != PINMEM_PIN_NONE && pin != PINMEM_PIN_MLOCK &&
        pin != PINMEM_PIN_CUDA_REGISTER)
        return pm_fail(PINMEM_EINVAL, 0,
                       "pin mode %d cannot be used to attach (auto, none, mlock or "
                       "cuda-register)",
                       pin);
    const pm_cuda_api *cuda = NULL;
    const char *why = "";
    int plan = PM_PLAN_NONE;
    if (pin == PINMEM_PIN_AUTO) {
        cuda = pm_cuda(&why);
        plan = cuda != NULL ? PM_PLAN_CUDA_REGISTER : PM_PLAN_MLOCK_SOFT;
    } else if (pin == PINMEM_PIN_MLOCK) {
        plan = PM_PLAN_MLOCK;
    } else if (pin == PINMEM_PIN_CUDA_REGISTER) {
        cuda = pm_cuda(&why);
        if (cuda == NULL)
            return pm_fail(PINMEM_ENO_CUDA, 0, "cuda-register pinning needs CUDA: %s", why);
        plan = PM_PLAN_CUDA_REGISTER;
    }

    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return pm_shm_open_status(errno, name, "shm_open");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return pm_fail(PINMEM_ESYS, err, "fstat of '%s' failed: %s", name, strerror(err));
    }
    size_t seg = (size_t)st.st_size;
    if (seg == 0) {
        close(fd);
        return pm_fail(PINMEM_EINVAL, 0,
                       "shared-memory segment '%s' is empty (its creator may not have sized it "
                       "yet)",
                       name);
    }
    if (size == 0)
        size = seg;
    if (size > seg) {
        close(fd);
        return pm_fail(PINMEM_EINVAL, 0,
                       "attaching %zu bytes of shared-memory segment '%s', which has only %zu",
                       size, name, seg);
    }
    size_t page = pm_page_size();
    size_t mapped = pm_round_up(size, page);
    void *a = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (a == MAP_FAILED)
        return pm_fail(err == ENOMEM ? PINMEM_ENOMEM : PINMEM_ESYS, err,
                       "mmap of shared-memory segment '%s' (%zu bytes) failed: %s", name, mapped,
                       strerror(err));
    pm_entry *e = calloc(1, sizeof *e);
    char *copy = strdup(name);
    if (e == NULL || copy == NULL) {
        free(e);
        free(copy);
        munmap(a, mapped);
        return pm_fail(PINMEM_ENOMEM, ENOMEM, "out of memory for the registry entry");
    }
    pinmem_region *r = &e->region;
    r->addr = a;
    r->size = size;
    r->mapped_size = mapped;
    r->kind = PINMEM_KIND_SHM;
    r->numa_node = -1;
    r->page_size = page;
    e->shm_name = copy;
    e->shm_dev = st.st_dev;
    e->shm_ino = st.st_ino;
    e->pid = getpid();
    rc = pm_finish(e, plan, cuda, populate, 0, PM_TOUCH_READ);
    if (rc != PINMEM_OK) {
        pm_discard(e); /* not the owner: the name is left alone */
        return rc;
    }
    pm_registry_add(e);
    *out = *r;
    return PINMEM_OK;
}

/* ----------------------------------------------------------------- free */

static int pm_release_cb(pm_entry *e, void *arg)
{
    int *unlinked = arg;
    if (e->region.kind != PINMEM_KIND_SHM || !e->region.shm_owner)
        return PINMEM_EINVAL;
    if (e->pid != getpid()) /* a forked child never removes its parent's name */
        return PINMEM_OK;
    if (!e->shm_name_released) {
        *unlinked = pm_shm_unlink_if_same(e->shm_name, e->shm_dev, e->shm_ino);
        e->shm_name_released = 1;
    }
    return PINMEM_OK;
}

PINMEM_API int pinmem_shm_release_name(void *addr, int *unlinked)
{
    int done = 0;
    int rc = pm_registry_with(addr, pm_release_cb, &done);
    if (rc < 0)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "%p is not the base of a live mapping", addr);
    if (rc == PINMEM_EINVAL)
        return pm_fail(PINMEM_EINVAL, 0,
                       "the mapping at %p is not a shared-memory segment this process created",
                       addr);
    if (unlinked != NULL)
        *unlinked = done;
    return PINMEM_OK;
}

PINMEM_API int pinmem_free(void *addr)
{
    if (addr == NULL)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "NULL is not a mapping");
    pm_entry *e = pm_registry_take(addr);
    if (e == NULL) {
        void *base = pm_registry_containing(addr);
        if (base != NULL)
            return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                           "%p lies inside the mapping at %p; free that base address", addr,
                           base);
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0,
                       "%p is not a live mapping (already freed, or not from libpinmem)", addr);
    }
    pinmem_region *r = &e->region;
    if (e->pid != getpid() && e->dontfork) {
        /* A forked child never inherited this mapping; forget it. */
        pm_entry_destroy(e);
        return PINMEM_OK;
    }
    if (r->kind == PINMEM_KIND_CUDA_HOST) {
        int rc = e->cuda->free_host(addr);
        if (rc != 0) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", pm_cuda_errstr(e->cuda, rc));
            pm_cuda_clear_error(e->cuda);
            pm_entry_destroy(e);
            return pm_fail(PINMEM_ECUDA, 0, "cudaFreeHost(%p) failed: %s (%d)", addr, msg, rc);
        }
        pm_entry_destroy(e);
        return PINMEM_OK;
    }
    if (r->register_chunks > 0) {
        /* Every chunk of every committed range, each exactly once. */
        int failed = 0, first = 0;
        for (size_t k = 0; k < e->range_count; k++) {
            const pm_range *g = &e->ranges[k];
            if (g->pinned != PINMEM_PINNED_CUDA_REGISTER || g->pending)
                continue;
            for (int i = 0; i < g->register_chunks; i++) {
                char *base = (char *)addr + g->offset + (size_t)i * g->register_chunk;
                int rc = e->cuda->host_unregister(base);
                if (rc != 0 && failed++ == 0)
                    first = rc;
            }
        }
        if (failed) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", pm_cuda_errstr(e->cuda, first));
            pm_cuda_clear_error(e->cuda);
            pm_entry_destroy(e);
            /* Unmapping memory the driver may still hold is worse than a leak. */
            return pm_fail(PINMEM_ECUDA, 0,
                           "cudaHostUnregister failed for %d of %d chunk(s) of %p: %s (%d); "
                           "the mapping was left in place",
                           failed, r->register_chunks, addr, msg, first);
        }
    }
    int status = PINMEM_OK;
    if (r->kind == PINMEM_KIND_SHM && r->shm_owner && e->shm_unlink_on_free &&
        !e->shm_name_released && e->pid == getpid())
        pm_shm_unlink_if_same(e->shm_name, e->shm_dev, e->shm_ino);
    if (munmap(addr, r->mapped_size) != 0) {
        int err = errno;
        status = pm_fail(PINMEM_ESYS, err, "munmap(%p, %zu) failed: %s", addr, r->mapped_size,
                         strerror(err));
    }
    pm_entry_destroy(e);
    return status;
}

PINMEM_API int pinmem_query(void *addr, pinmem_region *out)
{
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    pm_entry copy;
    if (addr == NULL || pm_registry_get(addr, &copy) != 0)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "%p is not the base of a live mapping", addr);
    *out = copy.region;
    return PINMEM_OK;
}

/* POSIX shared memory: the naming rule, create (with a room check),
 * attach, unlink, size, and the creator's release of its name. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

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
int pm_shm_unlink_if_same(const char *name, dev_t dev, ino_t ino)
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

/* --------------------------------------------------------------- create */

/* Create (or, with PINMEM_SHM_REUSE, replace) a segment and map it. */
int pm_shm_create(const char *name, size_t mapped, int flags, unsigned int mode, void **addr_out,
                  dev_t *dev, ino_t *ino)
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

/* --------------------------------------------------------------- attach */

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
    const char *why = "";
    const pm_cuda_api *cuda = NULL;
    if (pin == PINMEM_PIN_AUTO || pin == PINMEM_PIN_CUDA_REGISTER)
        cuda = pm_cuda(&why);
    int plan = PM_PLAN_NONE;
    rc = pm_range_plan(pin, cuda, why, &plan);
    if (rc != PINMEM_OK)
        return rc;

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
    rc = pm_entry_fill(e, plan, cuda, populate, 0, PM_TOUCH_READ);
    if (rc != PINMEM_OK) {
        pm_entry_discard(e); /* not the owner: the name is left alone */
        return rc;
    }
    pm_registry_add(e);
    *out = *r;
    return PINMEM_OK;
}

/* --------------------------------------------------- the creator's name */

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


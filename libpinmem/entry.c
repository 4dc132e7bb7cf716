/* Entry files (kvpool's FileStore): one put's or one get's system calls in one call. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* The kernel's value (linux/fs.h); older C libraries do not define it. */
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* Times a reader opens the name again when the file it opened was replaced
 * or deleted meanwhile, before it gives up (the caller's own path then
 * reports it). */
#define PM_ENTRY_OPEN_TRIES 100

#define PM_ENTRY_FLAGS (PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE | PINMEM_ENTRY_SYNC)

/* Only a regular file with one link, owned by this user, is an entry: a
 * FIFO or device could block, a hard link could be a file outside the
 * store, another user's file is not ours to read or write. */
static int pm_entry_file_ok(const struct stat *st)
{
    return S_ISREG(st->st_mode) && st->st_nlink == 1 && st->st_uid == geteuid();
}

/* Step over n bytes already moved, and over empty parts. */
static void pm_iov_advance(struct iovec **iov, int *count, size_t n)
{
    while (*count > 0 && n >= (*iov)->iov_len) {
        n -= (*iov)->iov_len;
        (*iov)++;
        (*count)--;
    }
    if (*count > 0) {
        (*iov)->iov_base = (char *)(*iov)->iov_base + n;
        (*iov)->iov_len -= n;
    }
}

/* At most 1000 bytes per call under PINMEM_FAULT_SHORT_IO (test builds). */
static int pm_io_count(struct iovec *iov, int count, struct iovec *cut)
{
    if (!pm_fault(PINMEM_FAULT_SHORT_IO))
        return count;
    *cut = iov[0];
    if (cut->iov_len > 1000)
        cut->iov_len = 1000;
    return -1;
}

/* Write all of iov (two parts) at offset 0 (pwritev) or at the file
 * position (writev), finishing short writes.  0, or -1 with errno. */
static int pm_write_all(int fd, struct iovec *iov, int count, int positioned)
{
    off_t at = 0;
    for (;;) {
        pm_iov_advance(&iov, &count, 0);
        if (count == 0)
            return 0;
        if (pm_fault(PINMEM_FAULT_ENTRY_ENOSPC)) {
            errno = ENOSPC;
            return -1;
        }
        struct iovec cut;
        int parts = pm_io_count(iov, count, &cut);
        struct iovec *from = parts < 0 ? &cut : iov;
        parts = parts < 0 ? 1 : parts;
        ssize_t n = positioned ? pwritev(fd, from, parts, at) : writev(fd, from, parts);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        at += n;
        pm_iov_advance(&iov, &count, (size_t)n);
    }
}

/* renameat2(2) through the raw system call: glibc's wrapper exists only from
 * 2.28, and the release build links against 2.17 so that the wheel loads on
 * older systems.  A kernel without it (< 3.15) says ENOSYS, which the caller
 * treats as "cannot exchange". */
static int pm_renameat2(int olddir, const char *oldpath, int newdir, const char *newpath,
                        unsigned int flags)
{
    return (int)syscall(SYS_renameat2, olddir, oldpath, newdir, newpath, flags);
}

/* Give the written file at temp the name path: exchange (the replaced file
 * stays at temp) or rename.  Sets *outcome; 0, or -1 with errno. */
static int pm_entry_place(const char *temp, const char *path, unsigned int flags, int *outcome)
{
    if (flags & PINMEM_ENTRY_EXCHANGE) {
        if (pm_renameat2(AT_FDCWD, temp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
            *outcome = PINMEM_ENTRY_SWAPPED;
            return 0;
        }
        int err = errno;
        if (err == EINVAL || err == ENOSYS || err == EPERM) {
            /* The file system cannot exchange: rename, and say so. */
            if (rename(temp, path) != 0)
                return -1;
            *outcome = PINMEM_ENTRY_RENAMED_NO_EXCHANGE;
            return 0;
        }
        if (err != ENOENT)
            return -1;
        /* ENOENT: no entry at path yet (or temp itself vanished, which the
         * rename below then reports). */
    }
    if (rename(temp, path) != 0)
        return -1;
    *outcome = PINMEM_ENTRY_RENAMED;
    return 0;
}

PINMEM_API int pinmem_entry_write(const char *temp, const char *path, const void *header,
                                  size_t header_len, const void *data, size_t data_len,
                                  unsigned int flags, int *outcome)
{
    if (temp == NULL || path == NULL || outcome == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_write: temp, path and outcome must "
                                         "not be NULL");
    if ((header_len > 0 && header == NULL) || (data_len > 0 && data == NULL))
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_write: a NULL buffer with a length > 0");
    if (flags & ~PM_ENTRY_FLAGS)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_write: unknown flags 0x%x (known: 0x%x)",
                       flags & ~PM_ENTRY_FLAGS, PM_ENTRY_FLAGS);
    if (data_len > (size_t)INT64_MAX || header_len > (size_t)INT64_MAX - data_len)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_write: %zu + %zu bytes overflow a file "
                                         "size", header_len, data_len);
    *outcome = PINMEM_ENTRY_SPARE_UNUSABLE;
    size_t total = header_len + data_len;
    int spare = (flags & PINMEM_ENTRY_SPARE) != 0;
    int fd;
    struct stat st;
    if (spare) {
        fd = open(temp, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) {
            unlink(temp);
            return PINMEM_OK; /* missing, a symlink, a FIFO...: not usable */
        }
        /* Rewrite the spare only if it is still our kind of file and no
         * reader that opened it while it was an entry still holds LOCK_SH. */
        if (fstat(fd, &st) != 0 || !pm_entry_file_ok(&st) || flock(fd, LOCK_EX | LOCK_NB) != 0) {
            close(fd);
            unlink(temp); /* drops the name only: the file it names is never written */
            return PINMEM_OK;
        }
    } else {
        fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
            return pm_fail(PINMEM_ESYS, errno, "open(%.200s, O_CREAT | O_EXCL) failed", temp);
    }
    pm_entry_hook(PINMEM_HOOK_WRITE_BEFORE_DATA);
    struct iovec iov[2] = {{(void *)header, header_len}, {(void *)data, data_len}};
    const char *step = "write";
    int failed = pm_write_all(fd, iov, 2, spare) != 0;
    if (!failed && spare && (uint64_t)st.st_size != (uint64_t)total) {
        step = "ftruncate";
        failed = ftruncate(fd, (off_t)total) != 0;
    }
    if (!failed && (flags & PINMEM_ENTRY_SYNC)) {
        step = "fsync";
        failed = fsync(fd) != 0;
    }
    int err = errno;
    /* The file is closed (dropping a spare's lock) only after the rename. */
    if (!failed && pm_fault(PINMEM_FAULT_ENTRY_DIE_BEFORE_RENAME))
        raise(SIGKILL); /* a writer that crashes between its write and its rename */
    if (!failed) {
        step = "rename";
        failed = pm_entry_place(temp, path, flags, outcome) != 0;
        err = errno;
    }
    close(fd);
    if (failed) {
        *outcome = PINMEM_ENTRY_SPARE_UNUSABLE;
        unlink(temp);
        return pm_fail(PINMEM_ESYS, err, "%s of %.200s failed", step, temp);
    }
    return PINMEM_OK;
}

PINMEM_API int pinmem_entry_read(const char *path, void *header, size_t header_len, void *data,
                                 size_t data_len, int *outcome, uint64_t *nread)
{
    if (path == NULL || outcome == NULL || nread == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_read: path, outcome and nread must not "
                                         "be NULL");
    if ((header_len > 0 && header == NULL) || (data_len > 0 && data == NULL))
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_read: a NULL buffer with a length > 0");
    *outcome = PINMEM_ENTRY_REFUSED;
    *nread = 0;
    for (int tries = 0; tries < PM_ENTRY_OPEN_TRIES; tries++) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) {
            int err = errno;
            if (err == ENOENT) {
                *outcome = PINMEM_ENTRY_MISSING;
                return PINMEM_OK;
            }
            if (err == ELOOP || err == ENXIO || err == ENODEV)
                return PINMEM_OK; /* a symlink, socket or device: refused */
            return pm_fail(PINMEM_ESYS, err, "open(%.200s) failed", path);
        }
        struct stat st, now;
        if (fstat(fd, &st) != 0) {
            int err = errno;
            close(fd);
            return pm_fail(PINMEM_ESYS, err, "fstat of %.200s failed", path);
        }
        if (S_ISREG(st.st_mode) && st.st_nlink == 0) {
            close(fd); /* unlinked since the open (replaced or deleted): again */
            continue;
        }
        if (!pm_entry_file_ok(&st)) {
            close(fd);
            return PINMEM_OK;
        }
        pm_entry_hook(PINMEM_HOOK_READ_BEFORE_LOCK);
        /* A writer rewrites a spare only under LOCK_EX, so with LOCK_SH
         * held the file cannot change; then check it is still the entry. */
        if (flock(fd, LOCK_SH) != 0) {
            int err = errno;
            close(fd);
            return pm_fail(PINMEM_ESYS, err, "flock of %.200s failed", path);
        }
        if (fstatat(AT_FDCWD, path, &now, AT_SYMLINK_NOFOLLOW) != 0) {
            int err = errno;
            close(fd);
            if (err == ENOENT) {
                *outcome = PINMEM_ENTRY_MISSING;
                return PINMEM_OK;
            }
            return pm_fail(PINMEM_ESYS, err, "stat of %.200s failed", path);
        }
        if (now.st_ino != st.st_ino || now.st_dev != st.st_dev) {
            close(fd);
            continue;
        }
        /* One byte more than asked: reading it means trailing bytes. */
        char extra;
        struct iovec iov[3] = {{header, header_len}, {data, data_len}, {&extra, 1}};
        struct iovec *part = iov;
        int count = 3;
        uint64_t done = 0;
        for (;;) {
            pm_iov_advance(&part, &count, 0);
            if (count == 0)
                break;
            struct iovec cut;
            int parts = pm_io_count(part, count, &cut);
            ssize_t n = parts < 0 ? preadv(fd, &cut, 1, (off_t)done)
                                  : preadv(fd, part, parts, (off_t)done);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                int err = errno;
                close(fd);
                return pm_fail(PINMEM_ESYS, err, "read of %.200s failed", path);
            }
            if (n == 0)
                break; /* end of file */
            done += (uint64_t)n;
            pm_iov_advance(&part, &count, (size_t)n);
        }
        close(fd);
        *outcome = PINMEM_ENTRY_READ;
        *nread = done;
        return PINMEM_OK;
    }
    return PINMEM_OK; /* replaced at every try: refused, the caller reports it */
}

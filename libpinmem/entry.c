/* Entry files (kvpool's FileStore): one put's or one get's system calls in one call. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* The kernel's values (linux/fs.h); older C libraries do not define them. */
#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* Times a reader opens the name again when the file it opened was replaced
 * or deleted meanwhile, before it gives up (the caller's own path then
 * reports it). */
#define PM_ENTRY_OPEN_TRIES 100

#define PM_ENTRY_FLAGS                                                                          \
    (PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE | PINMEM_ENTRY_SYNC | PINMEM_ENTRY_DIRECT)

/* Bytes a system call moves at most under PINMEM_FAULT_SHORT_IO: 1000, or
 * one alignment unit for O_DIRECT (which refuses unaligned offsets). */
#define PM_SHORT_IO 1000

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

/* At most unit bytes per call under PINMEM_FAULT_SHORT_IO (test builds). */
static int pm_io_count(struct iovec *iov, int count, struct iovec *cut, size_t unit)
{
    if (!pm_fault(PINMEM_FAULT_SHORT_IO))
        return count;
    *cut = iov[0];
    if (cut->iov_len > unit)
        cut->iov_len = unit;
    return -1;
}

static int64_t pm_mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + (int64_t)st->st_mtim.tv_nsec;
}

static void pm_stamp(pinmem_entry_stamp *stamp, const struct stat *st, int direct)
{
    if (stamp == NULL)
        return;
    stamp->inode = (uint64_t)st->st_ino;
    stamp->mtime_ns = pm_mtime_ns(st);
    stamp->size = (uint64_t)st->st_size;
    stamp->direct = direct;
}

/* O_DIRECT needs the buffer's address, its length and the file offset
 * aligned; the header goes through an aligned copy, so its length counts. */
static int pm_direct_ok(const void *data, size_t data_len, size_t header_len)
{
    return (uintptr_t)data % PINMEM_ENTRY_ALIGN == 0 && data_len % PINMEM_ENTRY_ALIGN == 0 &&
           header_len % PINMEM_ENTRY_ALIGN == 0;
}

/* open(path, oflags, mode), with O_DIRECT added when want: *direct says
 * whether it was.  A file system that refuses O_DIRECT (EINVAL) gets the
 * open without it; a file created by the refused open (the check comes
 * after the create) is removed first, so O_EXCL still holds.  -1 with errno. */
static int pm_open_direct(const char *path, int oflags, mode_t mode, int want, int *direct)
{
    *direct = 0;
    if (want && O_DIRECT != 0) {
        int fd = open(path, oflags | O_DIRECT, mode);
        if (fd >= 0) {
            *direct = 1;
            return fd;
        }
        if (errno != EINVAL)
            return -1;
        if (oflags & O_CREAT)
            unlink(path); /* temp is this call's own name (O_EXCL) */
    }
    return open(path, oflags, mode);
}

/* Leave O_DIRECT on fd (*direct 0); 0, or -1 with errno. */
static int pm_stop_direct(int fd, int *direct)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0)
        return -1;
    *direct = 0;
    return 0;
}

/* An aligned copy of the header for an O_DIRECT transfer (*aligned; NULL
 * for none), or fd back to buffered I/O when no memory is left for it.
 * 0, or -1 with errno. */
static int pm_aligned_header(int fd, size_t header_len, int *direct, void **aligned)
{
    *aligned = NULL;
    if (!*direct || header_len == 0)
        return 0;
    if (posix_memalign(aligned, PINMEM_ENTRY_ALIGN, header_len) == 0)
        return 0;
    *aligned = NULL;
    return pm_stop_direct(fd, direct);
}

/* Write all of iov (two parts) at offset 0 (pwritev) or at the file
 * position (writev), finishing short writes.  0, or -1 with errno. */
static int pm_write_all(int fd, struct iovec *iov, int count, int positioned, size_t unit)
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
        int parts = pm_io_count(iov, count, &cut, unit);
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
                                  unsigned int flags, int *outcome, pinmem_entry_stamp *stamp)
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
    if (stamp != NULL)
        memset(stamp, 0, sizeof *stamp);
    size_t total = header_len + data_len;
    int spare = (flags & PINMEM_ENTRY_SPARE) != 0;
    int fd;
    struct stat st;
    int direct = 0;
    int want = (flags & PINMEM_ENTRY_DIRECT) && pm_direct_ok(data, data_len, header_len);
    if (spare) {
        fd = pm_open_direct(temp, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0, want, &direct);
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
        fd = pm_open_direct(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644,
                            want, &direct);
        if (fd < 0)
            return pm_fail(PINMEM_ESYS, errno, "open(%.200s, O_CREAT | O_EXCL) failed", temp);
    }
    void *aligned = NULL;
    if (pm_aligned_header(fd, header_len, &direct, &aligned) != 0) {
        int err = errno;
        close(fd);
        unlink(temp);
        return pm_fail(PINMEM_ESYS, err, "fcntl of %.200s failed", temp);
    }
    if (aligned != NULL)
        memcpy(aligned, header, header_len);
    pm_entry_hook(PINMEM_HOOK_WRITE_BEFORE_DATA);
    struct iovec iov[2] = {{aligned != NULL ? aligned : (void *)header, header_len},
                           {(void *)data, data_len}};
    const char *step = "write";
    int failed = pm_write_all(fd, iov, 2, spare, direct ? PINMEM_ENTRY_ALIGN : PM_SHORT_IO) != 0;
    if (!failed && spare && (uint64_t)st.st_size != (uint64_t)total) {
        step = "ftruncate";
        failed = ftruncate(fd, (off_t)total) != 0;
    }
    if (!failed && (flags & PINMEM_ENTRY_SYNC)) {
        step = "fsync";
        failed = fsync(fd) != 0;
    }
    /* The stamp is taken before the rename, which leaves size and mtime as they are. */
    if (!failed && stamp != NULL) {
        step = "fstat";
        failed = fstat(fd, &st) != 0;
        if (!failed)
            pm_stamp(stamp, &st, direct);
    }
    int err = errno;
    free(aligned);
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

/* Read header then data (and, buffered, one byte more) from offset 0,
 * finishing short reads; *done counts the bytes read.  0, or -1 with errno. */
static int pm_read_all(int fd, struct iovec *part, int count, size_t unit, uint64_t *done)
{
    *done = 0;
    for (;;) {
        pm_iov_advance(&part, &count, 0);
        if (count == 0)
            return 0;
        struct iovec cut;
        int parts = pm_io_count(part, count, &cut, unit);
        ssize_t n = parts < 0 ? preadv(fd, &cut, 1, (off_t)*done)
                              : preadv(fd, part, parts, (off_t)*done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            return 0; /* end of file */
        *done += (uint64_t)n;
        pm_iov_advance(&part, &count, (size_t)n);
    }
}

PINMEM_API int pinmem_entry_read(const char *path, void *header, size_t header_len, void *data,
                                 size_t data_len, unsigned int flags, int *outcome,
                                 uint64_t *nread, pinmem_entry_stamp *stamp)
{
    if (path == NULL || outcome == NULL || nread == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_read: path, outcome and nread must not "
                                         "be NULL");
    if ((header_len > 0 && header == NULL) || (data_len > 0 && data == NULL))
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_read: a NULL buffer with a length > 0");
    if (flags & ~PINMEM_ENTRY_DIRECT)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_read: unknown flags 0x%x (known: 0x%x)",
                       flags & ~PINMEM_ENTRY_DIRECT, PINMEM_ENTRY_DIRECT);
    *outcome = PINMEM_ENTRY_REFUSED;
    *nread = 0;
    if (stamp != NULL)
        memset(stamp, 0, sizeof *stamp);
    int want = (flags & PINMEM_ENTRY_DIRECT) && pm_direct_ok(data, data_len, header_len);
    for (int tries = 0; tries < PM_ENTRY_OPEN_TRIES; tries++) {
        int direct = 0;
        int fd = pm_open_direct(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0, want,
                                &direct);
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
        /* O_DIRECT only for a file of exactly the size asked (it cannot read
         * the one byte more that finds trailing bytes, nor go on from an
         * unaligned end of file): any other file is read buffered, and the
         * caller's checks say what is wrong with it. */
        void *aligned = NULL;
        if (direct && (uint64_t)st.st_size != (uint64_t)header_len + data_len &&
            pm_stop_direct(fd, &direct) != 0) {
            int err = errno;
            close(fd);
            return pm_fail(PINMEM_ESYS, err, "fcntl of %.200s failed", path);
        }
        if (pm_aligned_header(fd, header_len, &direct, &aligned) != 0) {
            int err = errno;
            close(fd);
            return pm_fail(PINMEM_ESYS, err, "fcntl of %.200s failed", path);
        }
        /* The one byte more finds trailing bytes; under LOCK_SH the size
         * cannot change, so a file of exactly the size asked needs no such
         * read (which would cost a second preadv, returning 0, on every get). */
        char extra;
        struct iovec iov[3] = {{aligned != NULL ? aligned : header, header_len},
                               {data, data_len},
                               {&extra, 1}};
        int exact = (uint64_t)st.st_size == (uint64_t)header_len + data_len;
        uint64_t done = 0;
        int failed = pm_read_all(fd, iov, (direct || exact) ? 2 : 3,
                                 direct ? PINMEM_ENTRY_ALIGN : PM_SHORT_IO, &done) != 0;
        int err = errno;
        close(fd);
        if (aligned != NULL) {
            if (!failed)
                memcpy(header, aligned, done < header_len ? (size_t)done : header_len);
            free(aligned);
        }
        if (failed)
            return pm_fail(PINMEM_ESYS, err, "read of %.200s failed", path);
        pm_stamp(stamp, &st, direct);
        *outcome = PINMEM_ENTRY_READ;
        *nread = done;
        return PINMEM_OK;
    }
    return PINMEM_OK; /* replaced at every try: refused, the caller reports it */
}

/* 1 when st is the regular file expected describes (inode, mtime, size). */
static int is_expected(const struct stat *st, const pinmem_entry_stamp *expected)
{
    return S_ISREG(st->st_mode) && (uint64_t)st->st_ino == expected->inode &&
           pm_mtime_ns(st) == expected->mtime_ns && (uint64_t)st->st_size == expected->size;
}

PINMEM_API int pinmem_entry_evict(const char *path, const char *temp,
                                  const pinmem_entry_stamp *expected, unsigned int flags,
                                  int *outcome)
{
    if (path == NULL || temp == NULL || expected == NULL || outcome == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_evict: path, temp, expected and outcome "
                                         "must not be NULL");
    if (flags & ~PINMEM_ENTRY_KEEP)
        return pm_fail(PINMEM_EINVAL, 0, "pinmem_entry_evict: unknown flags 0x%x (known: 0x%x)",
                       flags & ~PINMEM_ENTRY_KEEP, PINMEM_ENTRY_KEEP);
    *outcome = PINMEM_ENTRY_GONE;
    /* A file already not the one expected stays under its name untouched:
     * renaming it aside and back would leave the name empty meanwhile, so
     * another process's get would miss and its delete be lost. */
    struct stat st;
    if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT)
            return PINMEM_OK;
    } else if (!is_expected(&st, expected)) {
        *outcome = PINMEM_ENTRY_CHANGED;
        return PINMEM_OK;
    }
    /* The file leaves the entry's name first, atomically: what is then
     * checked at temp is what the name held, and no put can slip in
     * between the check and the removal (one may have since the stat). */
    if (rename(path, temp) != 0) {
        if (errno == ENOENT)
            return PINMEM_OK;
        return pm_fail(PINMEM_ESYS, errno, "rename of %.200s (to evict it) failed", path);
    }
    if (fstatat(AT_FDCWD, temp, &st, AT_SYMLINK_NOFOLLOW) == 0 && is_expected(&st, expected)) {
        *outcome = PINMEM_ENTRY_EVICTED;
        if (!(flags & PINMEM_ENTRY_KEEP) && unlink(temp) != 0)
            return pm_fail(PINMEM_ESYS, errno, "unlink of %.200s (evicted) failed", temp);
        return PINMEM_OK;
    }
    /* Another file than the one expected: written since by someone else.
     * It goes back under its name, unless a newer one took the name
     * meanwhile (then the one held here is the older, replaced one). */
    *outcome = PINMEM_ENTRY_CHANGED;
    if (pm_renameat2(AT_FDCWD, temp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return PINMEM_OK;
    int err = errno;
    if (err == EEXIST) {
        unlink(temp); /* fails only for a directory planted at path: left at temp */
        return PINMEM_OK;
    }
    if (err == EINVAL || err == ENOSYS) {
        /* No RENAME_NOREPLACE on this file system: a plain rename back. */
        if (rename(temp, path) == 0)
            return PINMEM_OK;
        err = errno;
    }
    return pm_fail(PINMEM_ESYS, err, "rename of %.200s back to %.200s failed", temp, path);
}

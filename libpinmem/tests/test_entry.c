/*
 * Entry files beyond the basic put and get (test_pinmem.c): O_DIRECT puts
 * and gets (aligned bytes only, any other file read buffered), the stamps
 * the calls give, and evictions that remove only the file expected.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_common.h"

#define ALIGN PINMEM_ENTRY_ALIGN

/* 1 when the file system of dir takes O_DIRECT (then the calls must use it). */
static int takes_o_direct(const char *dir)
{
    char path[256];
    snprintf(path, sizeof path, "%s/.probe", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_DIRECT, 0600);
    if (fd < 0)
        return 0;
    void *page = NULL;
    int ok = posix_memalign(&page, ALIGN, ALIGN) == 0;
    if (ok) {
        memset(page, 0, ALIGN);
        ok = write(fd, page, ALIGN) == ALIGN;
    }
    free(page);
    close(fd);
    unlink(path);
    return ok;
}

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

static void test_entry_direct(const char *dir)
{
    char entry[256], temp[256];
    snprintf(entry, sizeof entry, "%s/direct", dir);
    snprintf(temp, sizeof temp, "%s/.tmp-d", dir);
    int direct_here = takes_o_direct(dir);
    size_t data_len = 4 * ALIGN;
    unsigned char *data = NULL, *back = NULL;
    CHECK(posix_memalign((void **)&data, ALIGN, data_len + 1) == 0 &&
              posix_memalign((void **)&back, ALIGN, data_len + ALIGN) == 0,
          "aligned buffers");
    if (data == NULL || back == NULL)
        return;
    for (size_t i = 0; i < data_len + 1; i++)
        data[i] = (unsigned char)(i * 13 + 5);
    /* The header is an unaligned buffer of one alignment unit: copied aside. */
    char header_space[ALIGN + 1];
    char *header = header_space + 1;
    memset(header, 'h', ALIGN);
    int outcome = -1;
    uint64_t nread = 0;
    pinmem_entry_stamp stamp;
    CHECK(pinmem_entry_write(temp, entry, header, ALIGN, data, data_len,
                             PINMEM_ENTRY_EXCHANGE | PINMEM_ENTRY_DIRECT, &outcome,
                             &stamp) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_RENAMED,
          "direct write: outcome %d", outcome);
    CHECK(stamp.direct == direct_here, "direct write used O_DIRECT: %d (file system takes it: %d)",
          stamp.direct, direct_here);
    struct stat st;
    CHECK(stat(entry, &st) == 0 && (uint64_t)st.st_ino == stamp.inode &&
              stamp.size == ALIGN + data_len &&
              stamp.mtime_ns == (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
          "the stamp names the written file: inode %llu size %llu",
          (unsigned long long)stamp.inode, (unsigned long long)stamp.size);
    /* Read back with O_DIRECT into an unaligned header and an aligned payload. */
    char got_header[ALIGN + 1];
    memset(back, 0, data_len);
    CHECK(pinmem_entry_read(entry, got_header + 1, ALIGN, back, data_len, PINMEM_ENTRY_DIRECT,
                            &outcome, &nread, &stamp) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_READ && nread == ALIGN + data_len &&
              memcmp(back, data, data_len) == 0 && memcmp(got_header + 1, header, ALIGN) == 0,
          "direct read: outcome %d nread %llu", outcome, (unsigned long long)nread);
    CHECK(stamp.direct == direct_here && stamp.inode == (uint64_t)st.st_ino,
          "direct read stamp: direct %d", stamp.direct);
    /* A file of another size is read buffered: the trailing byte is counted. */
    memset(back, 0, data_len);
    CHECK(pinmem_entry_read(entry, got_header, ALIGN, back, data_len - ALIGN,
                            PINMEM_ENTRY_DIRECT, &outcome, &nread, &stamp) == PINMEM_OK &&
              nread == data_len + 1 && stamp.direct == 0,
          "longer file, buffered: nread %llu direct %d", (unsigned long long)nread, stamp.direct);
    /* Unaligned bytes are written buffered, and read back whole. */
    CHECK(pinmem_entry_write(temp, entry, header, ALIGN, data + 1, data_len,
                             PINMEM_ENTRY_EXCHANGE | PINMEM_ENTRY_DIRECT, &outcome,
                             &stamp) == PINMEM_OK &&
              stamp.direct == 0 && outcome == PINMEM_ENTRY_SWAPPED,
          "unaligned address: direct %d outcome %d", stamp.direct, outcome);
    CHECK(pinmem_entry_read(entry, got_header, ALIGN, back, data_len, PINMEM_ENTRY_DIRECT,
                            &outcome, &nread, NULL) == PINMEM_OK &&
              nread == ALIGN + data_len && memcmp(back, data + 1, data_len) == 0,
          "read of the unaligned put: nread %llu", (unsigned long long)nread);
    CHECK(pinmem_entry_write(temp, entry, header, 100, data, data_len,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE | PINMEM_ENTRY_DIRECT,
                             &outcome, &stamp) == PINMEM_OK &&
              stamp.direct == 0 && file_size(entry) == (off_t)(100 + data_len),
          "unaligned header length: direct %d", stamp.direct);
    /* A spare rewritten with O_DIRECT; short system calls are finished in
     * whole alignment units. */
    pinmem_test_set_fault(PINMEM_FAULT_SHORT_IO, 1);
    CHECK(pinmem_entry_write(temp, entry, header, ALIGN, data, data_len,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE | PINMEM_ENTRY_DIRECT,
                             &outcome, &stamp) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_SWAPPED && stamp.direct == direct_here &&
              file_size(entry) == (off_t)(ALIGN + data_len),
          "direct spare rewrite in short writes: outcome %d direct %d", outcome, stamp.direct);
    memset(back, 0, data_len);
    CHECK(pinmem_entry_read(entry, got_header, ALIGN, back, data_len, PINMEM_ENTRY_DIRECT,
                            &outcome, &nread, &stamp) == PINMEM_OK &&
              nread == ALIGN + data_len && memcmp(back, data, data_len) == 0 &&
              stamp.direct == direct_here,
          "direct short reads: nread %llu", (unsigned long long)nread);
    pinmem_test_set_fault(PINMEM_FAULT_SHORT_IO, 0);
    CHECK(pinmem_entry_read(entry, got_header, ALIGN, back, data_len, 2, &outcome, &nread,
                            NULL) == PINMEM_EINVAL,
          "a write-only flag is refused by a read");
    unlink(entry);
    unlink(temp);
    free(data);
    free(back);
}

static void test_entry_evict(const char *dir)
{
    char entry[256], temp[256], victim[256];
    snprintf(entry, sizeof entry, "%s/evicted", dir);
    snprintf(temp, sizeof temp, "%s/.tmp-w", dir);
    snprintf(victim, sizeof victim, "%s/.tmp-v", dir);
    int outcome = -1;
    pinmem_entry_stamp first, second;
    CHECK(pinmem_entry_write(temp, entry, "H:", 2, "one", 3, PINMEM_ENTRY_EXCHANGE, &outcome,
                             &first) == PINMEM_OK && first.size == 5,
          "write: size %llu", (unsigned long long)first.size);
    /* The expected file goes (unlinked). */
    CHECK(pinmem_entry_evict(entry, victim, &first, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_EVICTED && access(entry, F_OK) != 0 &&
              access(victim, F_OK) != 0,
          "evicted: outcome %d", outcome);
    CHECK(pinmem_entry_evict(entry, victim, &first, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_GONE,
          "nothing left to evict: outcome %d", outcome);
    /* Kept as a spare: it stays at temp, its bytes unchanged. */
    pinmem_entry_write(temp, entry, "H:", 2, "two", 3, PINMEM_ENTRY_EXCHANGE, &outcome, &first);
    CHECK(pinmem_entry_evict(entry, victim, &first, PINMEM_ENTRY_KEEP, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_EVICTED && access(entry, F_OK) != 0 &&
              file_size(victim) == 5,
          "kept as a spare: outcome %d", outcome);
    CHECK(pinmem_entry_write(victim, entry, "H:", 2, "three", 5,
                             PINMEM_ENTRY_SPARE | PINMEM_ENTRY_EXCHANGE, &outcome,
                             &second) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_RENAMED && second.inode == first.inode,
          "the evicted file is the next put's: outcome %d", outcome);
    /* Rewritten since (same inode, a later mtime or another size): left in place. */
    CHECK(pinmem_entry_evict(entry, victim, &first, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_CHANGED && file_size(entry) == 7 &&
              access(victim, F_OK) != 0,
          "rewritten entry kept: outcome %d size %lld", outcome, (long long)file_size(entry));
    pinmem_entry_stamp wrong = second;
    wrong.inode += 1;
    CHECK(pinmem_entry_evict(entry, victim, &wrong, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_CHANGED && file_size(entry) == 7,
          "another inode kept: outcome %d", outcome);
    wrong = second;
    wrong.mtime_ns -= 1;
    CHECK(pinmem_entry_evict(entry, victim, &wrong, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_CHANGED && file_size(entry) == 7,
          "another mtime kept: outcome %d", outcome);
    /* A file already not the one expected never leaves its name: a busy
     * directory planted at temp would refuse the rename aside. */
    CHECK(mkdir(victim, 0700) == 0, "mkdir: %s", strerror(errno));
    char inside[300];
    snprintf(inside, sizeof inside, "%s/x", victim);
    CHECK(mkdir(inside, 0700) == 0, "mkdir: %s", strerror(errno));
    struct stat before, after;
    stat(entry, &before);
    CHECK(pinmem_entry_evict(entry, victim, &first, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_CHANGED && stat(entry, &after) == 0 &&
              after.st_ino == before.st_ino,
          "a changed entry is left without a rename: outcome %d", outcome);
    rmdir(inside);
    rmdir(victim);
    /* A directory planted at the name is put back, not removed. */
    unlink(entry);
    CHECK(mkdir(entry, 0700) == 0, "mkdir: %s", strerror(errno));
    CHECK(pinmem_entry_evict(entry, victim, &second, 0, &outcome) == PINMEM_OK &&
              outcome == PINMEM_ENTRY_CHANGED && rmdir(entry) == 0,
          "a directory is put back: outcome %d", outcome);
    /* Bad arguments. */
    CHECK(pinmem_entry_evict(NULL, victim, &second, 0, &outcome) == PINMEM_EINVAL, "NULL path");
    CHECK(pinmem_entry_evict(entry, victim, NULL, 0, &outcome) == PINMEM_EINVAL,
          "NULL expected");
    CHECK(pinmem_entry_evict(entry, victim, &second, 1, &outcome) == PINMEM_EINVAL,
          "unknown flag");
    unlink(temp);
    unlink(victim);
}

void test_entry_files(void)
{
    char dir[] = "/tmp/pinmem-entry-files-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    test_entry_direct(dir);
    test_entry_evict(dir);
    CHECK(rmdir(dir) == 0, "the directory is left empty: %s", strerror(errno));
}

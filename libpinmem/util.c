/* Small operating-system helpers: page size, CPUs, sysfs reads, probes. */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

size_t pm_page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

int pm_affinity_cpus(void)
{
    /* Large enough for machines with up to 8192 CPUs. */
    int ncpu = 8192;
    cpu_set_t *set = CPU_ALLOC(ncpu);
    if (set == NULL)
        return 1;
    size_t bytes = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(bytes, set);
    int n = 0;
    if (sched_getaffinity(0, bytes, set) == 0)
        n = CPU_COUNT_S(bytes, set);
    CPU_FREE(set);
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    return n;
}

int pm_read_text(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got + 1 < len) {
        ssize_t r = read(fd, buf + got, len - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    return got > 0 ? 0 : -1;
}

int pm_read_i64(const char *path, int64_t *value)
{
    char buf[64];
    if (pm_read_text(path, buf, sizeof buf) != 0)
        return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno != 0 || end == buf)
        return -1;
    *value = (int64_t)v;
    return 0;
}

uint64_t pm_mem_total(void)
{
    struct sysinfo si;
    if (sysinfo(&si) != 0)
        return 0;
    return (uint64_t)si.totalram * (uint64_t)si.mem_unit;
}

int pm_parse_list(const char *text, int *out, int max, int *count)
{
    int n = 0;
    const char *p = text;
    while (*p != '\0') {
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
        if (*p == '\0')
            break;
        if (!isdigit((unsigned char)*p))
            return -1;
        char *end = NULL;
        long lo = strtol(p, &end, 10);
        long hi = lo;
        p = end;
        if (*p == '-') {
            p++;
            if (!isdigit((unsigned char)*p))
                return -1;
            hi = strtol(p, &end, 10);
            p = end;
        }
        if (hi < lo)
            return -1;
        for (long v = lo; v <= hi; v++) {
            if (n >= max)
                return -1;
            out[n++] = (int)v;
        }
    }
    *count = n;
    return 0;
}

int pm_thp_mode(void)
{
    char buf[128];
    if (pm_read_text("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof buf) != 0)
        return -1;
    if (strstr(buf, "[always]") != NULL)
        return 2;
    if (strstr(buf, "[madvise]") != NULL)
        return 1;
    if (strstr(buf, "[never]") != NULL)
        return 0;
    return -1;
}

static int pm_populate_write_flag;
static pthread_once_t pm_populate_write_once = PTHREAD_ONCE_INIT;

static void pm_populate_write_detect(void)
{
    size_t page = pm_page_size();
    void *p = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    pm_populate_write_flag = madvise(p, page, MADV_POPULATE_WRITE) == 0;
    munmap(p, page);
}

int pm_populate_write_supported(void)
{
    pthread_once(&pm_populate_write_once, pm_populate_write_detect);
    return pm_populate_write_flag;
}

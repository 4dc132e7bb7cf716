/* The effective memory limits: MemAvailable (and swap), the memory cgroup;
 * checked before memory is made resident, so the OOM killer never acts first. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A "Key:   123 kB" line of /proc/meminfo, in bytes; -1 if missing. */
static int64_t pm_meminfo(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    if (p == NULL)
        return -1;
    long long kb = 0;
    if (sscanf(p + strlen(key), " %lld", &kb) != 1)
        return -1;
    return (int64_t)kb * 1024;
}

/* limit - usage of one cgroup directory, or -1 when it sets no limit. */
static int64_t pm_cgroup_room_at(const char *dir, int v2)
{
    char path[PINMEM_PATH_MAX + 64];
    char buf[64];
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    if (pm_read_text(path, buf, sizeof buf) != 0 || strncmp(buf, "max", 3) == 0)
        return -1;
    long long limit = strtoll(buf, NULL, 10);
    if (limit <= 0 || limit >= (long long)1 << 60) /* v1 "unlimited" is ~2^63 */
        return -1;
    int64_t usage = 0;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    if (pm_read_i64(path, &usage) != 0)
        return -1;
    /* The working set, as container runtimes count it (and as kvpool's
     * Python check does): inactive page cache is reclaimed before the OOM
     * killer acts, so it is not counted against the room. */
    char stat[8192];
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    if (pm_read_text(path, stat, sizeof stat) == 0) {
        const char *key = v2 ? "inactive_file " : "total_inactive_file ";
        size_t klen = strlen(key);
        const char *value = NULL;
        for (const char *line = stat; line != NULL && value == NULL;) {
            if (strncmp(line, key, klen) == 0)
                value = line + klen;
            const char *next = strchr(line, '\n');
            line = next != NULL ? next + 1 : NULL;
        }
        long long inactive = 0;
        if (value != NULL && sscanf(value, "%lld", &inactive) == 1 && inactive > 0 &&
            inactive <= usage)
            usage -= inactive;
    }
    return limit > usage ? limit - usage : 0;
}

/* The smallest room of the process's memory cgroup and its parents; -1 if
 * none sets a limit (or none can be read). */
static int64_t pm_cgroup_room(void)
{
    char text[4096];
    if (pm_read_text("/proc/self/cgroup", text, sizeof text) != 0)
        return -1;
    int64_t best = -1;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        int v2 = strncmp(line, "0::", 3) == 0;
        char *path = NULL;
        const char *mount = NULL;
        if (v2) {
            path = line + 3;
            mount = "/sys/fs/cgroup";
        } else {
            char *ctrl = strchr(line, ':');
            char *rest = ctrl ? strchr(ctrl + 1, ':') : NULL;
            if (rest == NULL || strncmp(ctrl + 1, "memory:", 7) != 0)
                continue;
            path = rest + 1;
            mount = "/sys/fs/cgroup/memory";
        }
        /* This cgroup, then each parent up to the root of the mount. */
        char dir[PINMEM_PATH_MAX];
        snprintf(dir, sizeof dir, "%s%s", mount, path);
        for (;;) {
            int64_t room = pm_cgroup_room_at(dir, v2);
            if (room >= 0 && (best < 0 || room < best))
                best = room;
            char *slash = strrchr(dir, '/');
            if (slash == NULL || (size_t)(slash - dir) < strlen(mount))
                break;
            *slash = '\0';
        }
    }
    return best;
}

PINMEM_API int pinmem_memory_room(int pinned, uint64_t *room, const char **limit)
{
    if (room == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "room must not be NULL");
    char text[8192];
    uint64_t best = UINT64_MAX;
    const char *why = "none known";
    if (pm_read_text("/proc/meminfo", text, sizeof text) == 0) {
        int64_t avail = pm_meminfo(text, "MemAvailable:");
        int64_t swap = pinned ? 0 : pm_meminfo(text, "SwapFree:");
        if (avail >= 0) {
            best = (uint64_t)avail + (uint64_t)(swap > 0 ? swap : 0);
            why = swap > 0 ? "MemAvailable + SwapFree" : "MemAvailable";
        }
    }
    int64_t cg = pm_cgroup_room();
    if (cg >= 0 && (uint64_t)cg < best) {
        best = (uint64_t)cg;
        why = "the memory cgroup's limit";
    }
    *room = best;
    if (limit != NULL)
        *limit = why;
    return PINMEM_OK;
}

int pm_check_room(size_t len, int pinned)
{
    uint64_t room = 0;
    const char *why = "";
    pinmem_memory_room(pinned, &room, &why);
    if (room == UINT64_MAX || len <= room)
        return PINMEM_OK;
    char a[64], b[64];
    return pm_fail(PINMEM_ELIMIT, 0,
                   "making %s resident%s would exceed %s: %s can still be made resident; free "
                   "memory or ask for less",
                   pm_fmt_bytes(a, sizeof a, len), pinned ? " and pinned" : "", why,
                   pm_fmt_bytes(b, sizeof b, room));
}

/* Status names, the thread-local failure detail, the library version. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static __thread char pm_detail[1024];
static __thread int pm_errno_saved;

static const char *const pm_status_text[PINMEM_STATUS_COUNT] = {
    [PINMEM_OK] = "success",
    [PINMEM_EINVAL] = "invalid argument",
    [PINMEM_ENOMEM] = "out of memory",
    [PINMEM_EHUGEPAGES] = "not enough free 2 MiB hugepages",
    [PINMEM_ENUMA_NODE] = "no such NUMA node",
    [PINMEM_ESHM_EXISTS] = "shared-memory segment already exists",
    [PINMEM_ESHM_NOT_FOUND] = "shared-memory segment not found",
    [PINMEM_ESHM_NAME] = "invalid shared-memory name",
    [PINMEM_EUNKNOWN_PTR] = "not the base of a live mapping",
    [PINMEM_ENO_CUDA] = "CUDA runtime or device unavailable",
    [PINMEM_ECUDA] = "CUDA runtime call failed",
    [PINMEM_EMLOCK] = "mlock refused",
    [PINMEM_EPERM] = "operation not permitted",
    [PINMEM_ESYS] = "system call failed",
    [PINMEM_EBUSY] = "busy: CUDA-pinned mappings are live, or a commit is in progress",
    [PINMEM_ETOO_LARGE] = "size too large for this machine",
    [PINMEM_EOPTION] = "invalid option value in the environment",
    [PINMEM_ELIMIT] = "it would exceed an effective memory limit",
};

PINMEM_API int pinmem_version(void) { return PINMEM_VERSION; }

PINMEM_API const char *pinmem_strerror(int status)
{
    if (status < 0 || status >= PINMEM_STATUS_COUNT || pm_status_text[status] == NULL)
        return "unknown libpinmem status";
    return pm_status_text[status];
}

PINMEM_API const char *pinmem_last_detail(void) { return pm_detail; }

PINMEM_API int pinmem_last_errno(void) { return pm_errno_saved; }

int pm_fail(int status, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pm_detail, sizeof pm_detail, fmt, ap);
    va_end(ap);
    pm_errno_saved = err;
    return status;
}

const char *pm_fmt_bytes(char *buf, size_t len, uint64_t bytes)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu bytes", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s (%llu bytes)", v, units[u], (unsigned long long)bytes);
    return buf;
}

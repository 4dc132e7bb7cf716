/* Options: defaults, environment overrides read once, atomic get/set. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct pm_option_desc {
    const char *env;
    int64_t fallback;
    int64_t min;
    int64_t max;
} pm_option_desc;

static const pm_option_desc pm_option_table[PINMEM_OPT_COUNT] = {
    [PINMEM_OPT_POPULATE_THREADS] = {"KVPOOL_POPULATE_THREADS", 0, 0, 1024},
    [PINMEM_OPT_REGISTER_CHUNK] = {"KVPOOL_REGISTER_CHUNK_BYTES", (int64_t)64 << 30, 4096,
                                   INT64_MAX},
    [PINMEM_OPT_REGISTER_THRESHOLD] = {"KVPOOL_REGISTER_THRESHOLD_BYTES", (int64_t)512 << 30, 1,
                                       INT64_MAX},
    [PINMEM_OPT_USE_POPULATE_WRITE] = {"KVPOOL_USE_POPULATE_WRITE", 1, 0, 1},
    [PINMEM_OPT_FAKE_MBIND_EPERM] = {"KVPOOL_FAKE_MBIND_EPERM", 0, 0, 1},
    [PINMEM_OPT_FAKE_MLOCK_EPERM] = {"KVPOOL_FAKE_MLOCK_EPERM", 0, 0, 1},
    [PINMEM_OPT_MLOCK_MODE] = {"KVPOOL_MLOCK_MODE", 3, 0, 3},
    [PINMEM_OPT_MIN_THREAD_BYTES] = {"KVPOOL_MIN_THREAD_BYTES", (int64_t)64 << 20, 4096,
                                     INT64_MAX},
    [PINMEM_OPT_AUTO_FALLBACK_THP] = {"KVPOOL_AUTO_FALLBACK_THP", 0, 0, 1},
};

static int64_t pm_option_value[PINMEM_OPT_COUNT];
static pthread_once_t pm_option_once = PTHREAD_ONCE_INIT;

/* Parse "123", "64M", "2g", "0x10" (binary suffixes K, M, G, T). */
static int pm_parse_i64(const char *text, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 0);
    if (errno != 0 || end == text)
        return -1;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    if (shift && (v > (INT64_MAX >> shift) || v < 0))
        return -1;
    *out = (int64_t)v << shift;
    return 0;
}

static void pm_options_init(void)
{
    for (int i = 0; i < PINMEM_OPT_COUNT; i++) {
        const pm_option_desc *d = &pm_option_table[i];
        int64_t v = d->fallback;
        const char *env = getenv(d->env);
        int64_t parsed;
        if (env != NULL && *env != '\0' && pm_parse_i64(env, &parsed) == 0 && parsed >= d->min &&
            parsed <= d->max)
            v = parsed;
        __atomic_store_n(&pm_option_value[i], v, __ATOMIC_RELAXED);
    }
}

int64_t pm_opt(int option)
{
    pthread_once(&pm_option_once, pm_options_init);
    if (option < 0 || option >= PINMEM_OPT_COUNT)
        return 0;
    return __atomic_load_n(&pm_option_value[option], __ATOMIC_RELAXED);
}

PINMEM_API int pinmem_option_get(int option, int64_t *value)
{
    if (option < 0 || option >= PINMEM_OPT_COUNT)
        return pm_fail(PINMEM_EINVAL, 0, "option %d does not exist (0..%d)", option,
                       PINMEM_OPT_COUNT - 1);
    if (value == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "value must not be NULL");
    *value = pm_opt(option);
    return PINMEM_OK;
}

PINMEM_API int pinmem_option_set(int option, int64_t value)
{
    if (option < 0 || option >= PINMEM_OPT_COUNT)
        return pm_fail(PINMEM_EINVAL, 0, "option %d does not exist (0..%d)", option,
                       PINMEM_OPT_COUNT - 1);
    const pm_option_desc *d = &pm_option_table[option];
    if (value < d->min || value > d->max)
        return pm_fail(PINMEM_EINVAL, 0, "option %s: %lld is outside %lld..%lld", d->env,
                       (long long)value, (long long)d->min, (long long)d->max);
    pthread_once(&pm_option_once, pm_options_init);
    __atomic_store_n(&pm_option_value[option], value, __ATOMIC_RELAXED);
    return PINMEM_OK;
}

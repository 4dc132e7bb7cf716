/* Options: defaults, environment overrides read once (rejected text kept
 * for the caller to report), atomic get/set. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pm_option_desc {
    const char *name;
    const char *env;
    int64_t fallback;
    int64_t min;
    int64_t max;
} pm_option_desc;

static const pm_option_desc pm_option_table[PINMEM_OPT_COUNT] = {
    [PINMEM_OPT_POPULATE_THREADS] = {"populate_threads", "KVPOOL_POPULATE_THREADS", 0, 0, 1024},
    [PINMEM_OPT_REGISTER_CHUNK] = {"register_chunk", "KVPOOL_REGISTER_CHUNK_BYTES",
                                   (int64_t)64 << 30, 4096, INT64_MAX},
    [PINMEM_OPT_REGISTER_THRESHOLD] = {"register_threshold", "KVPOOL_REGISTER_THRESHOLD_BYTES",
                                       (int64_t)1 << 30, 1, INT64_MAX},
    [PINMEM_OPT_USE_POPULATE_WRITE] = {"use_populate_write", "KVPOOL_USE_POPULATE_WRITE", 1, 0,
                                       1},
    [PINMEM_OPT_MLOCK_MODE] = {"mlock_mode", "KVPOOL_MLOCK_MODE", 3, 0, 3},
    [PINMEM_OPT_MIN_THREAD_BYTES] = {"min_thread_bytes", "KVPOOL_MIN_THREAD_BYTES",
                                     (int64_t)64 << 20, 4096, INT64_MAX},
    [PINMEM_OPT_AUTO_FALLBACK_THP] = {"auto_fallback_thp", "KVPOOL_AUTO_FALLBACK_THP", 0, 0, 1},
    [PINMEM_OPT_POPULATE_METHOD] = {"populate_method", "KVPOOL_POPULATE_METHOD", 0, 0, 2},
    [PINMEM_OPT_POPULATE_PROBE] = {"populate_probe", "KVPOOL_POPULATE_PROBE", 1, 0, 1},
    [PINMEM_OPT_REGISTER_OVERLAP] = {"register_overlap", "KVPOOL_REGISTER_OVERLAP", 1, 0, 1},
    [PINMEM_OPT_REGISTER_MIN_CHUNK] = {"register_min_chunk", "KVPOOL_REGISTER_MIN_CHUNK_BYTES",
                                       (int64_t)1 << 30, 4096, INT64_MAX},
};

/* Written once under pm_option_once, read-only afterwards. */
typedef struct pm_option_env {
    int from_env;           /* the variable set the value */
    int rejected;           /* the variable was set to something invalid */
    char text[128];         /* its text when rejected */
} pm_option_env;

static pm_option_env pm_option_envs[PINMEM_OPT_COUNT];
/* Current values and their sources: atomics. */
static int64_t pm_option_value[PINMEM_OPT_COUNT];
static int pm_option_set_flag[PINMEM_OPT_COUNT];
static pthread_once_t pm_option_once = PTHREAD_ONCE_INIT;

/* Parse "123", "64M", "2g", "1GiB", "0x10" (binary suffixes K, M, G, T). */
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
    if (shift && (*end == 'i' || *end == 'I'))
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
        pm_option_env *seen = &pm_option_envs[i];
        int64_t v = d->fallback;
        const char *env = getenv(d->env);
        int64_t parsed;
        if (env != NULL && *env != '\0') {
            if (pm_parse_i64(env, &parsed) == 0 && parsed >= d->min && parsed <= d->max) {
                v = parsed;
                seen->from_env = 1;
            } else {
                seen->rejected = 1;
                snprintf(seen->text, sizeof seen->text, "%s", env);
            }
        }
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

static int pm_option_exists(int option)
{
    if (option < 0 || option >= PINMEM_OPT_COUNT)
        return pm_fail(PINMEM_EINVAL, 0, "option %d does not exist (0..%d)", option,
                       PINMEM_OPT_COUNT - 1);
    return PINMEM_OK;
}

PINMEM_API int pinmem_option_get(int option, int64_t *value)
{
    int rc = pm_option_exists(option);
    if (rc != PINMEM_OK)
        return rc;
    if (value == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "value must not be NULL");
    *value = pm_opt(option);
    return PINMEM_OK;
}

PINMEM_API int pinmem_option_set(int option, int64_t value)
{
    int rc = pm_option_exists(option);
    if (rc != PINMEM_OK)
        return rc;
    const pm_option_desc *d = &pm_option_table[option];
    if (value < d->min || value > d->max)
        return pm_fail(PINMEM_EINVAL, 0, "option %s (%s): %lld is outside %lld..%lld", d->name,
                       d->env, (long long)value, (long long)d->min, (long long)d->max);
    pthread_once(&pm_option_once, pm_options_init);
    __atomic_store_n(&pm_option_value[option], value, __ATOMIC_RELAXED);
    __atomic_store_n(&pm_option_set_flag[option], 1, __ATOMIC_RELAXED);
    return PINMEM_OK;
}

PINMEM_API int pinmem_option_describe(int option, pinmem_option_info *out)
{
    int rc = pm_option_exists(option);
    if (rc != PINMEM_OK)
        return rc;
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    const pm_option_desc *d = &pm_option_table[option];
    const pm_option_env *seen = &pm_option_envs[option];
    memset(out, 0, sizeof *out);
    out->value = pm_opt(option); /* runs the one-time init first */
    snprintf(out->name, sizeof out->name, "%s", d->name);
    snprintf(out->env, sizeof out->env, "%s", d->env);
    out->default_value = d->fallback;
    out->min = d->min;
    out->max = d->max;
    if (__atomic_load_n(&pm_option_set_flag[option], __ATOMIC_RELAXED))
        out->source = PINMEM_OPTION_SET;
    else
        out->source = seen->from_env ? PINMEM_OPTION_ENV : PINMEM_OPTION_DEFAULT;
    out->env_rejected = seen->rejected;
    snprintf(out->env_text, sizeof out->env_text, "%s", seen->text);
    return PINMEM_OK;
}

PINMEM_API int pinmem_option_check(void)
{
    pthread_once(&pm_option_once, pm_options_init);
    char detail[900];
    size_t used = 0;
    int bad = 0;
    detail[0] = '\0';
    for (int i = 0; i < PINMEM_OPT_COUNT; i++) {
        const pm_option_env *seen = &pm_option_envs[i];
        if (!seen->rejected)
            continue;
        const pm_option_desc *d = &pm_option_table[i];
        if (used < sizeof detail) {
            int n = snprintf(detail + used, sizeof detail - used,
                             "%s%s='%.40s' is not a number in %lld..%lld (default %lld kept)",
                             bad ? "; " : "", d->env, seen->text, (long long)d->min,
                             (long long)d->max, (long long)d->fallback);
            used += n > 0 ? (size_t)n : 0;
        }
        bad++;
    }
    if (bad == 0)
        return PINMEM_OK;
    return pm_fail(PINMEM_EOPTION, 0, "%s", detail);
}

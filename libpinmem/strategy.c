/* The populate plan: a one-time probe of how fast this machine makes fresh
 * memory resident (which method), the rule that turns its facts into a
 * plan, and the options applied on top. */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PM_PROBE_METHOD_BYTES ((size_t)8 << 20)
#define PM_RULE_MAX_THREADS 16
#define PM_PROBE_ROUNDS 3
/* First touch must beat MADV_POPULATE_WRITE by this much to be chosen: on
 * a shared machine a probe of milliseconds is noisy, and madvise was the
 * faster method in every measured run here (1.2-1.6x per thread). */
#define PM_PROBE_MARGIN 1.25

/* The probe's facts, guarded by pm_probe_lock (held while probing, so a
 * population that needs them waits for a probe in progress). */
static pthread_mutex_t pm_probe_lock = PTHREAD_MUTEX_INITIALIZER;
static pinmem_populate_facts pm_probe_facts;
static pthread_once_t pm_probe_once = PTHREAD_ONCE_INIT;

static void pm_probe_fork_prepare(void) { pthread_mutex_lock(&pm_probe_lock); }

static void pm_probe_fork_after(void) { pthread_mutex_unlock(&pm_probe_lock); }

static void pm_probe_init(void)
{
    pthread_atfork(pm_probe_fork_prepare, pm_probe_fork_after, pm_probe_fork_after);
}

static double pm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int pm_rule_threads(int cpus)
{
    if (cpus < 1)
        cpus = 1;
    return cpus > PM_RULE_MAX_THREADS ? PM_RULE_MAX_THREADS : cpus;
}

/* GB/s of making a fresh mapping of bytes resident (0 on any failure).
 * The mapping is made the way pools make theirs (pm_map_anonymous). */
static double pm_probe_sample(size_t bytes, int method, int threads, uint64_t *touched)
{
    void *p = pm_map_anonymous(bytes, 0);
    if (p == MAP_FAILED)
        return 0.0;
    int used = 0, got = 0;
    double start = pm_now();
    int rc = pm_populate_run(p, bytes, pm_page_size(), method, threads, PM_TOUCH_ZERO, 0, &got,
                             &used, NULL);
    double seconds = pm_now() - start;
    munmap(p, bytes);
    *touched += bytes;
    if (rc != PINMEM_OK || got != method || seconds <= 0.0)
        return 0.0;
    return (double)bytes / seconds / 1e9;
}

/* Best of PM_PROBE_ROUNDS samples, alternated, so a burst of other load
 * hits both methods alike and the least disturbed sample counts. */
static void pm_probe_methods(pinmem_populate_facts *f)
{
    double madvise = 0.0, touch = 0.0;
    for (int round = 0; round < PM_PROBE_ROUNDS; round++) {
        if (f->populate_write) {
            double m = pm_probe_sample(PM_PROBE_METHOD_BYTES, PINMEM_POPULATE_MADVISE, 1,
                                       &f->bytes);
            madvise = m > madvise ? m : madvise;
        }
        double t = pm_probe_sample(PM_PROBE_METHOD_BYTES, PINMEM_POPULATE_FIRST_TOUCH, 1,
                                   &f->bytes);
        touch = t > touch ? t : touch;
    }
    f->madvise_gbps = madvise;
    f->touch_gbps = touch;
}

/* Called with pm_probe_lock held. */
static void pm_probe_run_locked(void)
{
    pinmem_populate_facts f;
    memset(&f, 0, sizeof f);
    f.populate_write = pm_populate_write_supported();
    f.cpus = pm_affinity_cpus();
    double start = pm_now();
    pm_probe_methods(&f);
    f.probed = 1;
    f.seconds = pm_now() - start;
    pm_probe_facts = f;
}

/* The facts known now (probed 0 when the probe has not run). */
static void pm_facts_now(int run, pinmem_populate_facts *out)
{
    pthread_once(&pm_probe_once, pm_probe_init);
    pthread_mutex_lock(&pm_probe_lock);
    if (run == 2 || (run == 1 && !pm_probe_facts.probed))
        pm_probe_run_locked();
    if (pm_probe_facts.probed) {
        *out = pm_probe_facts;
    } else {
        memset(out, 0, sizeof *out);
        out->populate_write = pm_populate_write_supported();
        out->cpus = pm_affinity_cpus();
    }
    pthread_mutex_unlock(&pm_probe_lock);
}

PINMEM_API int pinmem_populate_probe(int run, pinmem_populate_facts *out)
{
    if (run < 0 || run > 2)
        return pm_fail(PINMEM_EINVAL, 0, "run must be 0 (report), 1 (once) or 2 (again), got %d",
                       run);
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    pm_facts_now(run, out);
    return PINMEM_OK;
}

static int pm_facts_check(const pinmem_populate_facts *f)
{
    if (f->cpus < 0)
        return pm_fail(PINMEM_EINVAL, 0, "cpus must be >= 0, got %d", f->cpus);
    if (!(f->madvise_gbps >= 0.0) || !(f->touch_gbps >= 0.0))
        return pm_fail(PINMEM_EINVAL, 0, "rates must be >= 0");
    return PINMEM_OK;
}

PINMEM_API int pinmem_populate_decide(const pinmem_populate_facts *f, pinmem_populate_plan *out)
{
    if (f == NULL || out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "facts and out must not be NULL");
    int rc = pm_facts_check(f);
    if (rc != PINMEM_OK)
        return rc;
    memset(out, 0, sizeof *out);
    out->method = PINMEM_POPULATE_MADVISE;
    out->method_source = f->probed ? PINMEM_PLAN_PROBE : PINMEM_PLAN_RULE;
    if (!f->populate_write) {
        out->method = PINMEM_POPULATE_FIRST_TOUCH;
        out->method_source = PINMEM_PLAN_RULE;
    } else if (f->probed && f->touch_gbps > f->madvise_gbps * PM_PROBE_MARGIN) {
        out->method = PINMEM_POPULATE_FIRST_TOUCH;
    }
    /* Threads by rule, never by the probe.  A probe small enough to be
     * cheap misjudges them: on a 2-vCPU VM a second thread starts its work
     * milliseconds late (an idle vCPU has to be woken), so the old probe's
     * 32 MiB sample with 2 threads ran at 2.03 GB/s against 3.36 for 8 MiB
     * with 1, and fresh 32 MiB mappings were no faster with 2; 128 MiB and
     * more, the sizes that matter, were 1.6-1.9x faster with 2, a 4 GiB
     * pool 1.8x. */
    out->threads = pm_rule_threads(f->cpus);
    out->threads_source = PINMEM_PLAN_RULE;
    return PINMEM_OK;
}

/* Options on top of a decided plan; requested > 0 is a caller's thread count. */
static void pm_plan_apply_options(pinmem_populate_plan *plan, int requested)
{
    int64_t method = pm_opt(PINMEM_OPT_POPULATE_METHOD);
    if (!pm_opt(PINMEM_OPT_USE_POPULATE_WRITE) || !pm_populate_write_supported()) {
        plan->method = PINMEM_POPULATE_FIRST_TOUCH;
        plan->method_source = pm_populate_write_supported() ? PINMEM_PLAN_OPTION
                                                            : PINMEM_PLAN_RULE;
    } else if (method != 0) {
        plan->method = method == 1 ? PINMEM_POPULATE_MADVISE : PINMEM_POPULATE_FIRST_TOUCH;
        plan->method_source = PINMEM_PLAN_OPTION;
    }
    int64_t threads = requested > 0 ? requested : pm_opt(PINMEM_OPT_POPULATE_THREADS);
    if (threads > 0) {
        plan->threads = (int)threads;
        plan->threads_source = PINMEM_PLAN_OPTION;
    }
}

PINMEM_API int pinmem_populate_plan_get(pinmem_populate_plan *out)
{
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    pinmem_populate_facts f;
    pm_facts_now(0, &f);
    pinmem_populate_decide(&f, out);
    pm_plan_apply_options(out, 0);
    return PINMEM_OK;
}

void pm_plan_resolve(size_t len, int requested, int *method, int *threads)
{
    int method_auto = pm_opt(PINMEM_OPT_POPULATE_METHOD) == 0 &&
                      pm_opt(PINMEM_OPT_USE_POPULATE_WRITE) && pm_populate_write_supported();
    int probe = pm_opt(PINMEM_OPT_POPULATE_PROBE) && len >= PINMEM_PROBE_MIN_BYTES && method_auto;
    pinmem_populate_facts f;
    pm_facts_now(probe ? 1 : 0, &f);
    pinmem_populate_plan plan;
    pinmem_populate_decide(&f, &plan);
    pm_plan_apply_options(&plan, requested);
    *method = plan.method;
    *threads = plan.threads;
}

int pm_default_threads(void)
{
    pinmem_populate_plan plan;
    pinmem_populate_plan_get(&plan);
    return plan.threads;
}

/* The CUDA runtime, found at run time with dlopen and never linked. */
#include "internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const pm_cudart_sonames[] = {
    "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so",
};

typedef struct pm_cuda_state {
    int tried;
    int explicit_choice; /* a path or KVPOOL_CUDART decided it: never retry */
    int loaded;
    int device_count;
    int status;
    int version;
    pm_cuda_api api;
    char path[PINMEM_PATH_MAX];
    char error[PINMEM_PATH_MAX];
} pm_cuda_state;

static void pm_cuda_discover(const char *path, pm_cuda_state *st);

static pthread_mutex_t pm_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
/* The current state.  A reload installs a new one and keeps the old one
 * allocated, so an API pointer handed out earlier never dangles. */
static pm_cuda_state *pm_cuda_cur;

/* Make sure a state exists; called with the lock held.  NULL if out of
 * memory. */
static pm_cuda_state *pm_cuda_state_get(void)
{
    if (pm_cuda_cur == NULL) {
        pm_cuda_state *st = calloc(1, sizeof *st);
        if (st == NULL)
            return NULL;
        pm_cuda_cur = st;
    }
    /* Nothing found by discovery: look again, since torch may have loaded
     * its libcudart since (a handful of dlopen calls, only on this path). */
    if (!pm_cuda_cur->tried || (!pm_cuda_cur->loaded && !pm_cuda_cur->explicit_choice))
        pm_cuda_discover(NULL, pm_cuda_cur);
    return pm_cuda_cur;
}

static void *pm_sym(void *handle, const char *name, int required, pm_cuda_state *st)
{
    void *p = dlsym(handle, name);
    if (p == NULL && required && st->error[0] == '\0')
        snprintf(st->error, sizeof st->error, "the CUDA runtime lacks %s", name);
    return p;
}

/* Resolve the API from handle; fills st.  Called with the lock held. */
static void pm_cuda_bind(void *handle, const char *how, pm_cuda_state *st)
{
    pm_cuda_api *a = &st->api;
    st->error[0] = '\0';
    *(void **)&a->get_device_count = pm_sym(handle, "cudaGetDeviceCount", 1, st);
    *(void **)&a->host_alloc = pm_sym(handle, "cudaHostAlloc", 1, st);
    *(void **)&a->free_host = pm_sym(handle, "cudaFreeHost", 1, st);
    *(void **)&a->host_register = pm_sym(handle, "cudaHostRegister", 1, st);
    *(void **)&a->host_unregister = pm_sym(handle, "cudaHostUnregister", 1, st);
    *(void **)&a->get_error_string = pm_sym(handle, "cudaGetErrorString", 0, st);
    *(void **)&a->get_error_name = pm_sym(handle, "cudaGetErrorName", 0, st);
    *(void **)&a->runtime_get_version = pm_sym(handle, "cudaRuntimeGetVersion", 0, st);
    *(void **)&a->get_last_error = pm_sym(handle, "cudaGetLastError", 0, st);
    if (st->error[0] != '\0')
        return;
    Dl_info info;
    if (dladdr(*(void **)&a->host_alloc, &info) != 0 && info.dli_fname != NULL)
        snprintf(st->path, sizeof st->path, "%s", info.dli_fname);
    else
        snprintf(st->path, sizeof st->path, "%s", how);
    st->loaded = 1;
    if (a->runtime_get_version != NULL)
        a->runtime_get_version(&st->version);
    int count = 0;
    st->status = a->get_device_count(&count);
    if (st->status != 0) {
        char why[256];
        snprintf(st->error, sizeof st->error, "cudaGetDeviceCount failed: %s",
                 pm_cuda_describe(a, st->status, why, sizeof why));
        pm_cuda_clear_error(a);
        count = 0;
    } else if (count == 0) {
        snprintf(st->error, sizeof st->error, "the CUDA runtime sees no device");
    }
    st->device_count = count;
}

/* Discover per the rules in pinmem.h.  Called with the lock held. */
static void pm_cuda_discover(const char *path, pm_cuda_state *st)
{
    memset(st, 0, sizeof *st);
    st->tried = 1;
    const char *env = path != NULL ? path : getenv("KVPOOL_CUDART");
    if (env != NULL) {
        st->explicit_choice = 1;
        if (env[0] == '\0' || strcmp(env, "none") == 0) {
            snprintf(st->error, sizeof st->error, "CUDA disabled (KVPOOL_CUDART is empty)");
            return;
        }
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            const char *e = dlerror();
            snprintf(st->error, sizeof st->error, "could not load the CUDA runtime %s: %s", env,
                     e != NULL ? e : "unknown error");
            return;
        }
        pm_cuda_bind(h, env, st);
        return;
    }
    size_t n = sizeof pm_cudart_sonames / sizeof pm_cudart_sonames[0];
    for (int pass = 0; pass < 2; pass++) {
        /* First pass: a runtime already in the process (torch's), then any. */
        int flags = RTLD_NOW | RTLD_LOCAL | (pass == 0 ? RTLD_NOLOAD : 0);
        for (size_t i = 0; i < n; i++) {
            void *h = dlopen(pm_cudart_sonames[i], flags);
            if (h != NULL) {
                pm_cuda_bind(h, pm_cudart_sonames[i], st);
                return;
            }
        }
    }
    snprintf(st->error, sizeof st->error,
             "no CUDA runtime found (tried libcudart.so.13, .so.12, .so.11.0, .so; "
             "set KVPOOL_CUDART to its path)");
}

const pm_cuda_api *pm_cuda(const char **why)
{
    static __thread char reason[PINMEM_PATH_MAX];
    const pm_cuda_api *api = NULL;
    pthread_mutex_lock(&pm_cuda_lock);
    pm_cuda_state *st = pm_cuda_state_get();
    if (st == NULL)
        snprintf(reason, sizeof reason, "out of memory loading the CUDA runtime");
    else if (st->loaded && st->device_count > 0)
        api = &st->api;
    else
        snprintf(reason, sizeof reason, "%s", st->error);
    pthread_mutex_unlock(&pm_cuda_lock);
    if (why != NULL)
        *why = api != NULL ? "" : reason;
    return api;
}

const char *pm_cuda_errstr(const pm_cuda_api *api, int err)
{
    const char *s = NULL;
    if (api != NULL && api->get_error_string != NULL)
        s = api->get_error_string(err);
    return s != NULL ? s : "unknown CUDA error";
}

const char *pm_cuda_describe(const pm_cuda_api *api, int err, char *buf, size_t len)
{
    const char *name = NULL;
    if (api != NULL && api->get_error_name != NULL)
        name = api->get_error_name(err);
    if (name != NULL)
        snprintf(buf, len, "%s: %s (%d)", name, pm_cuda_errstr(api, err), err);
    else
        snprintf(buf, len, "CUDA error %d: %s", err, pm_cuda_errstr(api, err));
    return buf;
}

void pm_cuda_clear_error(const pm_cuda_api *api)
{
    /* Failed runtime calls leave a pending error that the next unrelated
     * call (torch's, say) would otherwise report. */
    if (api != NULL && api->get_last_error != NULL)
        api->get_last_error();
}

void pm_cuda_probe(pinmem_caps *caps)
{
    pthread_mutex_lock(&pm_cuda_lock);
    pm_cuda_state *st = pm_cuda_state_get();
    if (st != NULL) {
        caps->cuda_loaded = st->loaded;
        caps->cuda_device_count = st->device_count;
        caps->cuda_runtime_version = st->version;
        caps->cuda_status = st->status;
        snprintf(caps->cuda_runtime_path, sizeof caps->cuda_runtime_path, "%s", st->path);
        snprintf(caps->cuda_error, sizeof caps->cuda_error, "%s", st->error);
    } else {
        snprintf(caps->cuda_error, sizeof caps->cuda_error, "out of memory");
    }
    pthread_mutex_unlock(&pm_cuda_lock);
}

PINMEM_API int pinmem_cuda_reload(const char *path)
{
    size_t count = 0, bytes = 0, cuda_count = 0;
    pm_registry_stats(&count, &bytes, &cuda_count);
    if (cuda_count > 0)
        return pm_fail(PINMEM_EBUSY, 0,
                       "%zu CUDA-pinned mapping(s) are live; free them before choosing another "
                       "CUDA runtime",
                       cuda_count);
    pm_cuda_state *st = calloc(1, sizeof *st);
    if (st == NULL)
        return pm_fail(PINMEM_ENOMEM, 0, "out of memory");
    pthread_mutex_lock(&pm_cuda_lock);
    /* Handles are never dlclose'd (a runtime may be shared with torch) and
     * old states are kept (an API pointer may still be in use). */
    pm_cuda_discover(path, st);
    pm_cuda_state *old = pm_cuda_cur;
    pm_cuda_cur = st;
    pthread_mutex_unlock(&pm_cuda_lock);
    /* A state whose API was never handed out (no usable runtime) can go. */
    if (old != NULL && !(old->loaded && old->device_count > 0))
        free(old);
    return PINMEM_OK;
}

/* The registry of live mappings: one mutex, a singly linked list.  Live
 * mappings are few and large (whole pools), so lookups are O(live).
 *
 * Commits work on an entry without the lock: they hold it (busy > 0) so
 * that it stays registered, and a free waits on pm_registry_idle until no
 * commit holds it.  Around fork() the lock is taken (so the child never
 * inherits it locked), and the child forgets the holds of commits whose
 * threads it does not have. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t pm_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pm_registry_idle = PTHREAD_COND_INITIALIZER;
static pm_entry *pm_registry_head;
static pthread_once_t pm_registry_once = PTHREAD_ONCE_INIT;

static void pm_fork_prepare(void) { pthread_mutex_lock(&pm_registry_lock); }

static void pm_fork_parent(void) { pthread_mutex_unlock(&pm_registry_lock); }

static void pm_fork_child(void)
{
    /* Only the forking thread lives on: commits in progress in other
     * threads will never finish here, and nobody waits for them. */
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        e->busy = 0;
        e->freeing = 0;
        for (size_t k = e->range_count; k-- > 0;)
            if (e->ranges[k].pending)
                pm_range_remove(e, &e->ranges[k]);
    }
    pthread_cond_init(&pm_registry_idle, NULL);
    pthread_mutex_unlock(&pm_registry_lock);
}

static void pm_registry_init(void)
{
    pthread_atfork(pm_fork_prepare, pm_fork_parent, pm_fork_child);
}

void pm_registry_add(pm_entry *entry)
{
    pthread_once(&pm_registry_once, pm_registry_init);
    pthread_mutex_lock(&pm_registry_lock);
    entry->next = pm_registry_head;
    pm_registry_head = entry;
    pthread_mutex_unlock(&pm_registry_lock);
}

static pm_entry *pm_find_locked(void *addr)
{
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next)
        if (e->region.addr == addr)
            return e;
    return NULL;
}

pm_entry *pm_registry_take(void *addr, int external, int *wrong_kind)
{
    pm_entry *found = NULL;
    pthread_mutex_lock(&pm_registry_lock);
    pm_entry *e = pm_find_locked(addr);
    *wrong_kind = e != NULL && (e->region.kind == PINMEM_KIND_EXTERNAL) != (external != 0);
    if (e != NULL && !e->freeing && !*wrong_kind) {
        /* Claim it (other frees and new commits now fail), then wait for
         * the commits in progress to let go. */
        e->freeing = 1;
        while (e->busy > 0)
            pthread_cond_wait(&pm_registry_idle, &pm_registry_lock);
        for (pm_entry **pp = &pm_registry_head; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == e) {
                *pp = e->next;
                e->next = NULL;
                found = e;
                break;
            }
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return found;
}

int pm_registry_hold(void *addr, int (*fn)(pm_entry *, void *), void *arg, pm_entry **held)
{
    int rc;
    pthread_mutex_lock(&pm_registry_lock);
    pm_entry *e = pm_find_locked(addr);
    if (e == NULL) {
        rc = -1;
    } else if (e->freeing) {
        rc = -2;
    } else {
        rc = fn(e, arg);
        if (rc == PINMEM_OK) {
            e->busy++;
            *held = e;
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return rc;
}

void pm_registry_unhold(pm_entry *entry, void (*fn)(pm_entry *, void *), void *arg)
{
    pthread_mutex_lock(&pm_registry_lock);
    if (fn != NULL)
        fn(entry, arg);
    if (--entry->busy == 0)
        pthread_cond_broadcast(&pm_registry_idle);
    pthread_mutex_unlock(&pm_registry_lock);
}

int pm_registry_get(void *addr, pm_entry *copy)
{
    int rc = -1;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        if (e->region.addr == addr) {
            *copy = *e;
            copy->next = NULL;
            copy->shm_name = NULL; /* the copy owns neither the name */
            copy->ranges = NULL;   /* nor the ranges */
            copy->range_count = copy->range_cap = 0;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return rc;
}

int pm_registry_with(void *addr, int (*fn)(pm_entry *, void *), void *arg)
{
    int rc = -1;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        if (e->region.addr == addr) {
            rc = fn(e, arg);
            break;
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return rc;
}

void *pm_registry_containing(void *addr)
{
    void *base = NULL;
    char *p = addr;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        char *b = e->region.addr;
        if (p > b && p < b + e->region.mapped_size) {
            base = b;
            break;
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return base;
}

void *pm_registry_overlapping(void *addr, size_t len)
{
    void *base = NULL;
    char *p = addr;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        char *b = e->region.addr;
        if (p < b + e->region.mapped_size && b < p + len) {
            base = b;
            break;
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return base;
}

void pm_registry_stats(size_t *count, size_t *bytes, size_t *cuda_count)
{
    size_t c = 0, b = 0, cc = 0;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        c++;
        b += e->region.mapped_size;
        if (e->cuda != NULL)
            cc++;
    }
    pthread_mutex_unlock(&pm_registry_lock);
    *count = c;
    *bytes = b;
    *cuda_count = cc;
}

void pm_entry_destroy(pm_entry *entry)
{
    if (entry == NULL)
        return;
    for (size_t k = 0; k < entry->range_count; k++)
        free(entry->ranges[k].chunk_lens);
    free(entry->shm_name);
    free(entry->ranges);
    free(entry);
}

int pm_ranges_reserve(pm_entry *entry, size_t extra)
{
    if (entry->range_count + extra <= entry->range_cap)
        return 0;
    size_t cap = entry->range_cap ? entry->range_cap * 2 : 4;
    while (cap < entry->range_count + extra)
        cap *= 2;
    pm_range *grown = realloc(entry->ranges, cap * sizeof *grown);
    if (grown == NULL)
        return -1;
    entry->ranges = grown;
    entry->range_cap = cap;
    return 0;
}

pm_range *pm_range_add(pm_entry *entry, const pm_range *range)
{
    pm_range *slot = &entry->ranges[entry->range_count++];
    *slot = *range;
    return slot;
}

pm_range *pm_range_at(pm_entry *entry, size_t offset)
{
    for (size_t k = 0; k < entry->range_count; k++)
        if (entry->ranges[k].offset == offset)
            return &entry->ranges[k];
    return NULL;
}

void pm_range_remove(pm_entry *entry, pm_range *range)
{
    free(range->chunk_lens);
    /* Order does not matter: move the last one into the hole. */
    *range = entry->ranges[--entry->range_count];
}

const pm_range *pm_range_overlap(const pm_entry *entry, size_t offset, size_t len)
{
    for (size_t k = 0; k < entry->range_count; k++) {
        const pm_range *g = &entry->ranges[k];
        if (offset < g->offset + g->len && g->offset < offset + len)
            return g;
    }
    return NULL;
}

void pm_entry_totals(pm_entry *entry)
{
    pinmem_region *r = &entry->region;
    size_t committed = 0, pinned_bytes = 0;
    int chunks = 0;
    int weakest = -1;
    for (size_t k = 0; k < entry->range_count; k++) {
        const pm_range *g = &entry->ranges[k];
        if (g->pending)
            continue;
        committed += g->len;
        if (g->pinned == PINMEM_PINNED_NONE)
            continue;
        pinned_bytes += g->len;
        chunks += g->register_chunks;
        if (weakest < 0 || g->pinned < weakest)
            weakest = g->pinned;
    }
    r->committed_bytes = committed;
    r->pinned_bytes = pinned_bytes;
    r->register_chunks = chunks;
    /* Ranges never overlap, so full coverage means every byte is pinned. */
    r->pinned = pinned_bytes == r->mapped_size && weakest > 0 ? weakest : PINMEM_PINNED_NONE;
}

PINMEM_API int pinmem_live(size_t *count, size_t *bytes)
{
    size_t c = 0, b = 0, cc = 0;
    pm_registry_stats(&c, &b, &cc);
    if (count != NULL)
        *count = c;
    if (bytes != NULL)
        *bytes = b;
    return PINMEM_OK;
}

PINMEM_API int pinmem_query(void *addr, pinmem_region *out)
{
    if (out == NULL)
        return pm_fail(PINMEM_EINVAL, 0, "out must not be NULL");
    pm_entry copy;
    if (addr == NULL || pm_registry_get(addr, &copy) != 0)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "%p is not the base of a live mapping", addr);
    *out = copy.region;
    return PINMEM_OK;
}

/* ------------------------------------------------------- registrations */

typedef struct pm_span_query {
    pinmem_span *spans;
    size_t max;
    size_t count;
} pm_span_query;

static void pm_span_put(pm_span_query *q, size_t offset, size_t len)
{
    if (q->count < q->max) {
        q->spans[q->count].offset = offset;
        q->spans[q->count].len = len;
    }
    q->count++;
}

static int pm_spans_of(pm_entry *e, void *arg)
{
    pm_span_query *q = arg;
    /* Ranges are unordered but never overlap: take them by offset, each
     * the first at or after the end of the one before (few ranges). */
    size_t cursor = 0;
    for (;;) {
        const pm_range *next = NULL;
        for (size_t k = 0; k < e->range_count; k++) {
            const pm_range *g = &e->ranges[k];
            int registered = g->pinned == PINMEM_PINNED_CUDA_ALLOC ||
                             g->pinned == PINMEM_PINNED_CUDA_REGISTER;
            if (!g->pending && registered && g->offset >= cursor &&
                (next == NULL || g->offset < next->offset))
                next = g;
        }
        if (next == NULL)
            return PINMEM_OK;
        if (next->pinned == PINMEM_PINNED_CUDA_ALLOC) {
            pm_span_put(q, next->offset, next->len);
        } else {
            size_t off = next->offset;
            for (int i = 0; i < next->register_chunks; i++) {
                pm_span_put(q, off, next->chunk_lens[i]);
                off += next->chunk_lens[i];
            }
        }
        cursor = next->offset + next->len;
    }
}

PINMEM_API int pinmem_registrations(void *addr, pinmem_span *spans, size_t max, size_t *count)
{
    if (count == NULL || (spans == NULL && max > 0))
        return pm_fail(PINMEM_EINVAL, 0, "count must not be NULL, nor spans when max > 0");
    pm_span_query q = {spans, max, 0};
    if (addr == NULL || pm_registry_with(addr, pm_spans_of, &q) != PINMEM_OK)
        return pm_fail(PINMEM_EUNKNOWN_PTR, 0, "%p is not the base of a live mapping", addr);
    *count = q.count;
    return PINMEM_OK;
}

/* The registry of live mappings: one mutex, a singly linked list.  Live
 * mappings are few and large (whole pools), so lookups are O(live). */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t pm_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pm_entry *pm_registry_head;

void pm_registry_add(pm_entry *entry)
{
    pthread_mutex_lock(&pm_registry_lock);
    entry->next = pm_registry_head;
    pm_registry_head = entry;
    pthread_mutex_unlock(&pm_registry_lock);
}

pm_entry *pm_registry_take(void *addr)
{
    pm_entry *found = NULL;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry **pp = &pm_registry_head; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->region.addr == addr) {
            found = *pp;
            *pp = found->next;
            found->next = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&pm_registry_lock);
    return found;
}

int pm_registry_get(void *addr, pm_entry *copy)
{
    int rc = -1;
    pthread_mutex_lock(&pm_registry_lock);
    for (pm_entry *e = pm_registry_head; e != NULL; e = e->next) {
        if (e->region.addr == addr) {
            *copy = *e;
            copy->next = NULL;
            copy->shm_name = NULL; /* the copy does not own the name */
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
    free(entry->shm_name);
    free(entry);
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

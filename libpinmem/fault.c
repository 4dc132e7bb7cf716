/* Test-only fault switches and the entry-call hooks (built with -DPINMEM_TESTING; absent otherwise). */
#include "internal.h"

#ifdef PINMEM_TESTING

static int pm_faults[PINMEM_FAULT_COUNT]; /* atomics */

int pm_fault(int fault)
{
    if (fault < 0 || fault >= PINMEM_FAULT_COUNT)
        return 0;
    return __atomic_load_n(&pm_faults[fault], __ATOMIC_RELAXED);
}

PINMEM_API int pinmem_test_set_fault(int fault, int on)
{
    if (fault < 0 || fault >= PINMEM_FAULT_COUNT)
        return pm_fail(PINMEM_EINVAL, 0, "fault %d does not exist (0..%d)", fault,
                       PINMEM_FAULT_COUNT - 1);
    __atomic_store_n(&pm_faults[fault], on ? 1 : 0, __ATOMIC_RELAXED);
    return PINMEM_OK;
}

static void (*pm_hooks[PINMEM_HOOK_COUNT])(void); /* atomics */

void pm_entry_hook(int point)
{
    void (*hook)(void) = __atomic_exchange_n(&pm_hooks[point], NULL, __ATOMIC_ACQ_REL);
    if (hook != NULL)
        hook();
}

PINMEM_API int pinmem_test_set_entry_hook(int point, void (*hook)(void))
{
    if (point < 0 || point >= PINMEM_HOOK_COUNT)
        return pm_fail(PINMEM_EINVAL, 0, "hook point %d does not exist (0..%d)", point,
                       PINMEM_HOOK_COUNT - 1);
    __atomic_store_n(&pm_hooks[point], hook, __ATOMIC_RELEASE);
    return PINMEM_OK;
}

#else

/* ISO C wants at least one declaration in a translation unit. */
typedef int pm_fault_unused;

#endif

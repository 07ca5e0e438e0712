/* A shared library whose constructor reads one word at the address in USERMM_TOUCH_ADDR.
 * Constructors run inside dlopen(3) with the dynamic loader's lock held: the read faults on
 * usermm memory that is swapped out, so the fault must be served without that lock (capi_test
 * "dlopen"). */
#include <stdint.h>
#include <stdlib.h>

uint64_t usermm_touch_value;

__attribute__((constructor)) static void touch(void) {
    const char *a = getenv("USERMM_TOUCH_ADDR");
    if (a)
        usermm_touch_value = *(volatile uint64_t *)(uintptr_t)strtoull(a, NULL, 16);
}

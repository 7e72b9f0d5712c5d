/* pygc.c: whether the run froze objects of its own (gc.freeze()), asked once per run at its end.
 *
 * The zygote freezes everything it made, and gc.get_objects() leaves the frozen objects out, so
 * objects the program froze would escape the check of what finalizing could show (python.c,
 * needs_finalize). gc.get_freeze_count() tells, but it counts by walking the whole permanent
 * generation: every object the zygote made, tens of thousands, one cache miss each (a third of a
 * short run's time in the program). Instead the zygote notes the two ends of that list after its
 * freeze, and the program compares them: gc.freeze() appends to the end; gc.unfreeze() empties the
 * list; freeing the first or last frozen object moves an end too (a false alarm: the slow, exact
 * path is taken). What it misses: a program that unfreezes the zygote's objects and freezes them
 * again with its own, in an order that keeps the same first and last object; what its frozen
 * objects would do when finalized (a buffered file's flush) is then skipped, as if it had ended
 * with os._exit().
 *
 * The list head is the interpreter's internal state, reached through CPython's internal headers
 * (Py_BUILD_CORE, this file only), for the versions whose layout is known; any other version
 * counts as gc.get_freeze_count() does.
 */
#define Py_BUILD_CORE 1
#include <Python.h>

#include "zygote.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#include "internal/pycore_interp.h"
#define FROZEN_ENDS 1
#endif

static struct {
#ifdef FROZEN_ENDS
	uintptr_t first, last;  /* the permanent generation's ends in the zygote */
#endif
	long count;             /* or its size (gc.get_freeze_count()) */
} frozen;

#ifdef FROZEN_ENDS
static PyGC_Head *permanent(void)
{
	return &PyInterpreterState_Get()->gc.permanent_generation.head;
}
#else
static long freeze_count(void)
{
	PyObject *gc = PyImport_ImportModule("gc"), *n = NULL;
	long r = -1;

	if (gc)
		n = PyObject_CallMethod(gc, "get_freeze_count", NULL);
	if (n)
		r = PyLong_AsLong(n);
	Py_XDECREF(n);
	Py_XDECREF(gc);
	PyErr_Clear();
	return r;
}
#endif

int py_frozen_mark(void)
{
#ifdef FROZEN_ENDS
	frozen.first = permanent()->_gc_next;
	frozen.last = permanent()->_gc_prev;
	return 0;
#else
	frozen.count = freeze_count();
	return frozen.count < 0 ? -1 : 0;
#endif
}

int py_frozen_grew(void)
{
#ifdef FROZEN_ENDS
	return permanent()->_gc_next != frozen.first || permanent()->_gc_prev != frozen.last;
#else
	long n = freeze_count();

	/* Freeing frozen objects lowers the count; only gc.freeze() raises it. */
	return n < 0 || n > frozen.count;
#endif
}

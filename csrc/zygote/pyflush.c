/* pyflush.c: the flush handlers of the programs (--flush-handlers), which a run of the zygote's
 * has instead of corral's prelude (lua/corral/prelude.lua): the same two handlers, so that a
 * warm run is `python3 -I FILE` itself, with nothing of Python's to run before FILE.
 *
 *   SIGXCPU (RLIMIT_CPU's soft limit): sys.stdout, sys.stderr, sys.__stdout__ and
 *     sys.__stderr__ flushed, then death by SIGXCPU, as without the handler;
 *   FLUSH_SIGNAL (the run's init, before it kills what is left of the run): the same flush, then
 *     death by SIGKILL, as the kill would have done.
 *
 * They are Python-level handlers (the _signal module's table), set once in the zygote: Python's
 * own C handler only notes the signal, and the main thread calls the function between two
 * bytecodes, where it may run Python code. A fork keeps the table, and py_run_program() gives
 * the program the kernel dispositions Python's start-up left (py.sig), these two among them; the
 * zygote itself keeps the default ones.
 */
#include "python.h"

static PyObject *flush_and_die(PyObject *self, PyObject *args)
{
	static const char *const names[] = { "stdout", "stderr", "__stdout__", "__stderr__" };
	PyObject *frame, *f, *r;
	size_t i;
	int signum;

	(void)self;
	if (!PyArg_ParseTuple(args, "iO", &signum, &frame))
		return NULL;
	for (i = 0; i < sizeof names / sizeof names[0]; i++) {
		f = PySys_GetObject(names[i]);
		if (!f || f == Py_None)
			continue;
		r = PyObject_CallMethod(f, "flush", NULL);
		Py_XDECREF(r);
		PyErr_Clear();
	}
	/* not inside the kernel's handler: nothing blocks the signal sent here */
	signal(signum, SIG_DFL);
	kill(getpid(), signum == SIGXCPU ? SIGXCPU : SIGKILL);
	Py_RETURN_NONE;
}

static PyMethodDef flush_def = {
	"_corral_flush", flush_and_die, METH_VARARGS,
	"Flush the standard streams, then die of the signal (SIGKILL for the flush signal).",
};

int py_flush_handlers(void)
{
	static const int sigs[] = { SIGXCPU, FLUSH_SIGNAL };
	PyObject *mod, *set = NULL, *fn, *r;
	size_t i;
	int ok = 1;

	/* _signal: the signal module would import enum */
	mod = PyImport_ImportModule("_signal");
	if (mod)
		set = PyObject_GetAttrString(mod, "signal");
	Py_XDECREF(mod);
	fn = PyCFunction_New(&flush_def, NULL);
	if (!set || !fn)
		ok = 0;
	for (i = 0; ok && i < sizeof sigs / sizeof sigs[0]; i++) {
		r = PyObject_CallFunction(set, "iO", sigs[i], fn);
		ok = r != NULL;
		Py_XDECREF(r);
	}
	Py_XDECREF(set);
	Py_XDECREF(fn);
	return ok ? 0 : -1;
}

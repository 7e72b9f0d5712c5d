/* pyend.c: the program's end, as Py_RunMain() and Py_Exit() end python3.
 *
 * The non-daemon threads joined, the atexit functions, sys.stdout and sys.stderr flushed; then,
 * when finalizing the interpreter could run nothing of the program's, _exit() at once:
 * finalizing would tear down every object the zygote made (a write to each, which copies most
 * of the zygote's memory into the program) for nothing to see. Otherwise Py_FinalizeEx().
 */
#include "python.h"

#include <stdio.h>
#include <string.h>

/* Exported by libpython3.11 from its internal headers (pycore_pylifecycle.h). */
extern int _Py_UnhandledKeyboardInterrupt;

/* CPython's flush_std_files() (Python/pylifecycle.c): -1 when a flush failed (exit 120). */
static int file_is_closed(PyObject *f)
{
	PyObject *c = PyObject_GetAttrString(f, "closed");
	int r;

	if (!c) {
		PyErr_Clear();
		return 0;
	}
	r = PyObject_IsTrue(c);
	Py_DECREF(c);
	if (r < 0)
		PyErr_Clear();
	return r > 0;
}

static int flush_std_files(void)
{
	PyObject *out = PySys_GetObject("stdout"), *err = PySys_GetObject("stderr"), *r;
	int status = 0;

	if (out && out != Py_None && !file_is_closed(out)) {
		r = PyObject_CallMethod(out, "flush", NULL);
		if (!r) {
			PyErr_WriteUnraisable(out);
			status = -1;
		}
		Py_XDECREF(r);
	}
	if (err && err != Py_None && !file_is_closed(err)) {
		r = PyObject_CallMethod(err, "flush", NULL);
		if (!r) {
			PyErr_Clear();
			status = -1;
		}
		Py_XDECREF(r);
	}
	return status;
}


static int is_run_stdio(PyObject *o)
{
	size_t i;

	for (i = 0; i < sizeof py.run_std / sizeof py.run_std[0] && py.run_std[i]; i++)
		if (py.run_std[i] == o)
			return 1;
	return 0;
}

static int attr_true(PyObject *o, const char *name)
{
	PyObject *a = PyObject_GetAttrString(o, name);
	int r = a ? PyObject_IsTrue(a) : -1;

	Py_XDECREF(a);
	if (r < 0)
		PyErr_Clear();
	return r;
}

static int attr_none(PyObject *o, const char *name)
{
	PyObject *a = PyObject_GetAttrString(o, name);
	int r = a ? a == Py_None : -1;

	Py_XDECREF(a);
	if (r < 0)
		PyErr_Clear();
	return r;
}

static int type_is(PyObject *o, const char *name)
{
	return strcmp(Py_TYPE(o)->tp_name, name) == 0 &&
	       !(Py_TYPE(o)->tp_flags & Py_TPFLAGS_HEAPTYPE);
}

/* An object of the io module whose finalization (closing it) writes nothing: 1; 0 when it could
 * (an open writer: it flushes), or its class is not one of io's own (whose code would run). */
static int io_quiet(PyObject *o)
{
	PyObject *inner;
	int r;

	if (type_is(o, "_io.FileIO") || type_is(o, "_io.BytesIO") || type_is(o, "_io.StringIO"))
		return 1;       /* unbuffered, or in memory */
	if (type_is(o, "_io.TextIOWrapper")) {
		inner = PyObject_GetAttrString(o, "buffer");
	} else if (type_is(o, "_io.BufferedReader") || type_is(o, "_io.BufferedWriter") ||
		   type_is(o, "_io.BufferedRandom")) {
		inner = PyObject_GetAttrString(o, "raw");
	} else {
		return 0;
	}
	if (!inner) {
		PyErr_Clear();
		return 0;
	}
	r = io_quiet(inner);
	/* a reader, or text over one: nothing to write */
	if (r && (type_is(o, "_io.BufferedReader") || type_is(inner, "_io.BufferedReader"))) {
		Py_DECREF(inner);
		return 1;
	}
	Py_DECREF(inner);
	return r && attr_true(o, "closed") == 1;
}

/* A weakref callback that can run nothing of the program's when its referent dies: a C function
 * (the caches of the abc module), the bookkeeping of weakref's containers, or a
 * weakref.finalize once the exit functions have run it (they set finalize._shutdown). */
static int callback_quiet(PyObject *cb)
{
	PyObject *mod;
	int r = 0;

	if (PyCFunction_Check(cb))
		return 1;
	if (PyFunction_Check(cb)) {
		mod = PyFunction_GetModule(cb);
		return mod && PyUnicode_Check(mod) &&
		       (PyUnicode_CompareWithASCIIString(mod, "weakref") == 0 ||
			PyUnicode_CompareWithASCIIString(mod, "_weakrefset") == 0);
	}
	mod = PyObject_GetAttrString((PyObject *)Py_TYPE(cb), "__module__");
	if (mod && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, "weakref") == 0 &&
	    strcmp(Py_TYPE(cb)->tp_name, "finalize") == 0)
		r = attr_true(cb, "_shutdown") == 1;
	Py_XDECREF(mod);
	PyErr_Clear();
	return r;
}

/* Whether finalizing this object, made by the run, could run the program's code or write. */
static int needs_finalizer(PyObject *o)
{
	PyTypeObject *t = Py_TYPE(o);

	if (is_run_stdio(o))
		return 0;
	if (PyType_Check(o)) {
		/* A class with __del__ whose instances the collector does not track (no __dict__,
		 * no __slots__): they are not in get_objects(), so the class itself decides. */
		PyTypeObject *c = (PyTypeObject *)o;

		return (c->tp_flags & Py_TPFLAGS_HEAPTYPE) && !(c->tp_flags & Py_TPFLAGS_HAVE_GC) &&
		       (c->tp_finalize || c->tp_del);
	}
	if (t->tp_del)
		return 1;
	if (PyWeakref_Check(o)) {
		PyWeakReference *w = (PyWeakReference *)o;

		if (w->wr_callback && w->wr_object != Py_None && !callback_quiet(w->wr_callback))
			return 1;
	}
	if (!t->tp_finalize)
		return 0;
	if (PyGen_CheckExact(o))
		return attr_true(o, "gi_suspended") != 0;      /* its finally and with blocks */
	if (PyCoro_CheckExact(o))
		return attr_none(o, "cr_frame") != 1;          /* "never awaited", or finally */
	if (PyAsyncGen_CheckExact(o))
		return attr_none(o, "ag_frame") != 1;
	return !io_quiet(o);    /* io's own, or a __del__ */
}

/* 1 when Py_FinalizeEx() could show more than the fast end: a Python thread still running (a
 * daemon: it runs until the finalization stops it), objects of the run whose finalization would
 * run code (see needs_finalizer), or objects the program froze itself (out of sight). Objects
 * of C types without collector support are not seen: none of the standard library's writes when
 * finalized. */
static int needs_finalize(void)
{
	PyObject *list, *n;
	Py_ssize_t i;
	long threads;
	int r = 0;

	n = PyObject_CallNoArgs(py.thread_count);
	threads = n ? PyLong_AsLong(n) : -1;
	Py_XDECREF(n);
	if (threads != 0 || py_frozen_grew()) {
		PyErr_Clear();
		return 1;
	}
	list = PyObject_CallNoArgs(py.get_objects);
	if (!list) {
		PyErr_Clear();
		return 1;
	}
	for (i = 0; i < PyList_GET_SIZE(list) && !r; i++)
		r = needs_finalizer(PyList_GET_ITEM(list, i));
	Py_DECREF(list);
	PyErr_Clear();
	return r;
}

/* What the finalization's deallocation of the run's standard streams writes: the buffered data
 * of each one still open, whatever sys names now (the program may have replaced or deleted
 * sys.stdout, leaving its output in the old one's buffer). Errors are ignored, as by dealloc. */
static void flush_run_streams(void)
{
	PyObject *objs[3 + sizeof py.run_std / sizeof py.run_std[0]], *r;
	size_t i, n = 0;

	for (i = 1; i < 3; i++)
		if (py.std[i])
			objs[n++] = py.std[i];
	for (i = 0; i < sizeof py.run_std / sizeof py.run_std[0] && py.run_std[i]; i++)
		objs[n++] = py.run_std[i];
	for (i = 0; i < n; i++) {
		if (file_is_closed(objs[i]))
			continue;
		r = PyObject_CallMethod(objs[i], "flush", NULL);
		Py_XDECREF(r);
		PyErr_Clear();
	}
}

/* exit_sigint() (Modules/main.c): an uncaught KeyboardInterrupt ends python3 by SIGINT. */
static NORETURN void exit_sigint(void)
{
	sigset_t set;

	signal(SIGINT, SIG_DFL);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_UNBLOCK, &set, NULL);
	kill(getpid(), SIGINT);
	_exit(SIGINT + 128);
}

/* Ends the run as Py_RunMain() / Py_Exit() end python3: the non-daemon threads joined, the atexit
 * functions, sys.stdout and sys.stderr flushed (exit 120 when that fails); then, when nothing
 * else could happen in the interpreter's finalization, _exit() at once: finalizing would tear
 * down every object the zygote made (a write to each: most of its memory copied into this
 * process) for nothing to see. Otherwise Py_FinalizeEx() itself. */
NORETURN void py_end(int code)
{
	PyObject *m, *r;
	int status, i;

	/* wait_for_thread_shutdown() (Python/pylifecycle.c) */
	m = PyImport_GetModule(py.threading);
	if (m) {
		r = PyObject_CallMethod(m, "_shutdown", NULL);
		if (!r)
			PyErr_WriteUnraisable(m);
		Py_XDECREF(r);
		Py_DECREF(m);
	}
	PyErr_Clear();
	/* _PyAtExit_Call() */
	r = PyObject_CallNoArgs(py.exitfuncs);
	Py_XDECREF(r);
	PyErr_Clear();
	if (needs_finalize()) {
		/* The zygote's own streams, when the run has them, must be sys's alone: the
		 * finalization deallocates them after the last finalizer ran, and their close()
		 * writes out what that finalizer printed into the buffer. */
		for (i = 0; i < 3; i++)
			Py_CLEAR(py.std[i]);
		status = Py_FinalizeEx();
	} else {
		status = flush_std_files();
		flush_run_streams();
		fflush(stdout);
		fflush(stderr);
	}
	if (status < 0)
		code = 120;
	if (_Py_UnhandledKeyboardInterrupt)
		exit_sigint();
	_exit(code & 0xff);
}

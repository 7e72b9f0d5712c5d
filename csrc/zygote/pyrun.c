/* pyrun.c: the program, in the process the zygote forked, instead of the launcher's execve.
 *
 * py_run_program() makes the process what execve would have made it (exec.c), closes the fds
 * above 2 (the report fd and the pipe to the supervisor too, which then reports the pid as
 * after an execve), tells the interpreter it was forked (PyOS_AfterFork_Child: its locks, its
 * threads, and the os.register_at_fork handlers, random's reseeding among them), brings back
 * Python's own signal dispositions, makes the environment, sys.argv, sys.orig_argv, the
 * standard streams and a fresh __main__ the run's, and runs the program as python3's main
 * (Modules/main.c) runs it, ending as it ends (pyend.c).
 */
#include "python.h"

#include <marshal.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

extern char **environ;

/* Exported by libpython3.11 from its internal headers (pycore_pylifecycle.h): how python3's own
 * main ends a run. */
extern int _Py_UnhandledKeyboardInterrupt;
int _Py_HandleSystemExit(int *exitcode_p);

/* CPython's flush_io() (Python/pythonrun.c), after the main code. */
static void flush_io(void)
{
	PyObject *type, *value, *tb, *f, *r;
	const char *names[2] = { "stderr", "stdout" };
	int i;

	PyErr_Fetch(&type, &value, &tb);
	for (i = 0; i < 2; i++) {
		f = PySys_GetObject(names[i]);
		if (!f)
			continue;
		r = PyObject_CallMethod(f, "flush", NULL);
		if (r)
			Py_DECREF(r);
		else
			PyErr_Clear();
	}
	PyErr_Restore(type, value, tb);
}

/* pymain_err_print() (Modules/main.c): 1 and the code for a SystemExit, else the traceback. */
static int err_print(int *exitcode)
{
	int code;

	if (_Py_HandleSystemExit(&code)) {
		*exitcode = code;
		return 1;
	}
	PyErr_Print();
	return 0;
}

static int exit_err_print(void)
{
	int code = 1;

	err_print(&code);
	return code;
}

/* A run's result: the exit code, and whether a SystemExit ended it inside the code (python3 then
 * ends from PyErr_Print() through Py_Exit(), before the code's epilogue). */
struct result {
	int code;
	int sysexit;
};

/* After the program raised: a SystemExit's code, or the traceback and 1. */
static void raised(struct result *res)
{
	if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
		res->sysexit = 1;
		if (!_Py_HandleSystemExit(&res->code))
			res->code = 1;
		return;
	}
	PyErr_Print();
	res->code = 1;
}

/* set_main_loader() (Python/pythonrun.c). */
static int set_main_loader(PyObject *d, PyObject *filename, PyObject *type)
{
	PyObject *loader = PyObject_CallFunction(type, "sO", "__main__", filename);
	int r;

	if (!loader)
		return -1;
	r = PyDict_SetItemString(d, "__loader__", loader);
	Py_DECREF(loader);
	return r;
}

/* maybe_pyc_file() (Python/pythonrun.c): a .pyc name, or the magic number's first half. */
static int maybe_pyc_file(FILE *fp, const char *path)
{
	size_t n = strlen(path);
	unsigned int halfmagic = (unsigned int)PyImport_GetMagicNumber() & 0xFFFF;
	unsigned char buf[2];
	int ispyc = 0;

	if (n >= 4 && strcmp(path + n - 4, ".pyc") == 0)
		return 1;
	if (ftell(fp) == 0) {
		if (fread(buf, 1, 2, fp) == 2 && ((unsigned int)buf[1] << 8 | buf[0]) == halfmagic)
			ispyc = 1;
		rewind(fp);
	}
	return ispyc;
}

/* run_pyc_file() (Python/pythonrun.c); closes fp. */
static PyObject *run_pyc_file(FILE *fp, PyObject *d)
{
	PyObject *co, *v;
	long magic = PyMarshal_ReadLongFromFile(fp);

	if (magic != PyImport_GetMagicNumber()) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_RuntimeError, "Bad magic number in .pyc file");
		fclose(fp);
		return NULL;
	}
	(void)PyMarshal_ReadLongFromFile(fp);
	(void)PyMarshal_ReadLongFromFile(fp);
	(void)PyMarshal_ReadLongFromFile(fp);
	if (PyErr_Occurred()) {
		fclose(fp);
		return NULL;
	}
	co = PyMarshal_ReadLastObjectFromFile(fp);
	fclose(fp);
	if (!co || !PyCode_Check(co)) {
		Py_XDECREF(co);
		PyErr_SetString(PyExc_RuntimeError, "Bad code object in .pyc file");
		return NULL;
	}
	_Py_UnhandledKeyboardInterrupt = 0;
	v = PyEval_EvalCode(co, d, d);
	if (!v && PyErr_Occurred() == PyExc_KeyboardInterrupt)
		_Py_UnhandledKeyboardInterrupt = 1;
	Py_DECREF(co);
	return v;
}

/* pymain_run_file_obj() (Modules/main.c) and _PyRun_SimpleFileObject() (Python/pythonrun.c). */
static void run_file(PyObject *program_name, PyObject *filename, const char *path,
		     struct result *res)
{
	PyCompilerFlags cf = _PyCompilerFlags_INIT;
	PyObject *d, *v;
	struct stat st;
	FILE *fp;
	int err;

	res->code = 0;
	if (PySys_Audit("cpython.run_file", "O", filename) < 0) {
		res->code = exit_err_print();
		return;
	}
	fp = fopen(path, "rbe");
	if (!fp) {
		err = errno;
		PySys_FormatStderr("%S: can't open file %R: [Errno %d] %s\n", program_name,
				   filename, err, strerror(err));
		res->code = 2;
		return;
	}
	if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
		PySys_FormatStderr("%S: %R is a directory, cannot continue\n", program_name,
				   filename);
		fclose(fp);
		res->code = 1;
		return;
	}
	if (Py_MakePendingCalls() == -1) {
		fclose(fp);
		res->code = exit_err_print();
		return;
	}
	d = py.main_dict;
	if (PyDict_SetItemString(d, "__file__", filename) < 0 ||
	    PyDict_SetItemString(d, "__cached__", Py_None) < 0) {
		fclose(fp);
		res->code = exit_err_print();
		return;
	}
	if (maybe_pyc_file(fp, path)) {
		fclose(fp);
		fp = fopen(path, "rbe");
		if (!fp) {
			fprintf(stderr, "python: Can't reopen .pyc file\n");
			res->code = 1;
			goto done;
		}
		if (set_main_loader(d, filename, py.sourceless_loader) < 0) {
			fprintf(stderr, "python: failed to set __main__.__loader__\n");
			fclose(fp);
			res->code = 1;
			goto done;
		}
		v = run_pyc_file(fp, d);
	} else {
		if (set_main_loader(d, filename, py.source_loader) < 0) {
			fprintf(stderr, "python: failed to set __main__.__loader__\n");
			fclose(fp);
			res->code = 1;
			goto done;
		}
		v = PyRun_FileExFlags(fp, path, Py_file_input, d, d, 1, &cf);
	}
	flush_io();
	if (!v) {
		raised(res);
		if (res->sysexit)
			return;         /* python3 exits from inside PyErr_Print() */
	} else {
		Py_DECREF(v);
	}
done:
	if (PyDict_DelItemString(d, "__file__"))
		PyErr_Clear();
	if (PyDict_DelItemString(d, "__cached__"))
		PyErr_Clear();
}

/* pymain_run_command() (Modules/main.c), PyRun_SimpleStringFlags() (Python/pythonrun.c). */
static void run_command(const char *command, struct result *res)
{
	PyCompilerFlags cf = _PyCompilerFlags_INIT;
	PyObject *u, *bytes, *d, *v;

	res->code = 0;
	u = PyUnicode_DecodeFSDefault(command);
	if (!u)
		goto undecodable;
	if (PySys_Audit("cpython.run_command", "O", u) < 0) {
		Py_DECREF(u);
		res->code = exit_err_print();
		return;
	}
	bytes = PyUnicode_AsUTF8String(u);
	Py_DECREF(u);
	if (!bytes)
		goto undecodable;
	cf.cf_flags |= PyCF_IGNORE_COOKIE;
	d = py.main_dict;
	if (py.command_code && strcmp(command, py.command) == 0)
		v = PyEval_EvalCode(py.command_code, d, d);     /* compiled in the zygote */
	else
		v = PyRun_StringFlags(PyBytes_AsString(bytes), Py_file_input, d, d, &cf);
	Py_DECREF(bytes);
	if (v)
		Py_DECREF(v);
	else
		raised(res);
	return;
undecodable:
	PySys_WriteStderr("Unable to decode the command from the command line:\n");
	res->code = exit_err_print();
}

/* pymain_run_module("__main__") (Modules/main.c): FILE is a zip file or a directory. */
static void run_main_module(PyObject *path0, struct result *res)
{
	PyObject *sys_path = PySys_GetObject("path"), *run, *r;

	res->code = 0;
	if (!sys_path || PyList_Insert(sys_path, 0, path0) < 0) {
		res->code = exit_err_print();
		return;
	}
	if (PySys_Audit("cpython.run_module", "s", "__main__") < 0) {
		res->code = exit_err_print();
		return;
	}
	run = py_attr_of("runpy", "_run_module_as_main");
	if (!run) {
		fprintf(stderr, "Could not import runpy module\n");
		res->code = exit_err_print();
		return;
	}
	_Py_UnhandledKeyboardInterrupt = 0;
	r = PyObject_CallFunction(run, "sO", "__main__", Py_False);
	if (!r && PyErr_Occurred() == PyExc_KeyboardInterrupt)
		_Py_UnhandledKeyboardInterrupt = 1;
	Py_DECREF(run);
	if (r)
		Py_DECREF(r);
	else
		res->code = exit_err_print();
}

/* 1 when path is a regular file without zipimport's end-of-central-directory record ("PK\5\6")
 * in its last 64 KiB + 22 bytes, where zipimport looks for it. */
static int plain_file(const char *path)
{
	static char buf[65535 + 22];
	struct stat st;
	off_t from;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return 0;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		from = st.st_size > (off_t)sizeof buf ? st.st_size - (off_t)sizeof buf : 0;
		n = pread(fd, buf, sizeof buf, from);
		r = n >= 0 && n == st.st_size - from && !memmem(buf, (size_t)n, "PK\5\6", 4);
	}
	close(fd);
	return r;
}

/* PyImport_GetImporter(FILE) asks sys.path_hooks: zipimport's for a zip archive, importlib's
 * FileFinder for a directory; anything else gets None, which it caches in
 * sys.path_importer_cache. With only those two hooks (py.standard_hooks), a plain file gets the
 * same answer and the same cache entry here, without their Python code (zipimport reads the end
 * of the file in Python: a quarter of a hello-world run's time). */
static PyObject *get_importer(PyObject *filename, const char *path)
{
	PyObject *cache, *cached;

	if (py.standard_hooks && plain_file(path)) {
		cache = PySys_GetObject("path_importer_cache");
		if (cache && PyDict_Check(cache)) {
			cached = PyDict_GetItemWithError(cache, filename);
			if (cached) {
				Py_INCREF(cached);
				return cached;
			}
			if (!PyErr_Occurred() && PyDict_SetItem(cache, filename, Py_None) == 0)
				Py_RETURN_NONE;
		}
		PyErr_Clear();
	}
	return PyImport_GetImporter(filename);
}

/* pymain_run_python() (Modules/main.c) for `-I FILE` and `-I -c COMMAND`. */
static void run_main(const struct plan *p, struct result *res)
{
	PyObject *program_name, *filename, *importer;

	if (strcmp(p->args[2], "-c") == 0) {
		run_command(p->args[3], res);
		return;
	}
	program_name = PyUnicode_DecodeFSDefault(p->args[0]);
	filename = PyUnicode_DecodeFSDefault(p->args[2]);
	if (!program_name || !filename) {
		res->code = exit_err_print();
		return;
	}
	/* pymain_get_importer(): a zip file or a directory runs its __main__ */
	importer = get_importer(filename, p->args[2]);
	if (!importer) {
		PySys_WriteStderr("Failed checking if argv[0] is an import path entry\n");
		if (err_print(&res->code)) {
			res->sysexit = 1;
			return;
		}
	} else if (importer != Py_None) {
		Py_DECREF(importer);
		run_main_module(filename, res);
		return;
	}
	Py_XDECREF(importer);
	run_file(program_name, filename, p->args[2], res);
}

/* os.environ (its dict, posix.environ, which os.environb shares) and environ: exactly the plan's
 * --env entries (the first of a name wins, as posix.environ and getenv() have it), then what the
 * start-up set (in place, as setenv() does). The same as os.environ.clear() and an assignment per
 * name, without their Python code. */
static int setup_environ(const struct plan *p)
{
	PyObject *d = py.environ, *k, *v;
	Py_ssize_t i;
	size_t n;

	PyDict_Clear(d);
	for (n = 0; n < p->nenv; n++) {
		const char *e = p->env[n], *eq = strchr(e, '=');

		k = PyBytes_FromStringAndSize(e, eq - e);
		v = k ? PyBytes_FromString(eq + 1) : NULL;
		if (!v || (PyDict_Contains(d, k) == 0 && PyDict_SetItem(d, k, v) < 0)) {
			Py_XDECREF(k);
			Py_XDECREF(v);
			return -1;
		}
		Py_DECREF(k);
		Py_DECREF(v);
	}
	for (i = 0; i < PyList_GET_SIZE(py.extra_env); i++) {
		PyObject *kv = PyList_GET_ITEM(py.extra_env, i);

		if (PyDict_SetItem(d, PyTuple_GET_ITEM(kv, 0), PyTuple_GET_ITEM(kv, 1)) < 0)
			return -1;
	}
	if (clearenv() != 0)
		return -1;
	i = 0;
	while (PyDict_Next(d, &i, &k, &v))
		if (setenv(PyBytes_AS_STRING(k), PyBytes_AS_STRING(v), 1) != 0)
			return -1;
	return 0;
}

/* sys.argv (FILE ARGS..., or -c ARGS...: the command itself is not in it) and sys.orig_argv,
 * decoded as Python decodes its command line. */
static int setup_argv(const struct plan *p)
{
	int command = strcmp(p->args[2], "-c") == 0;
	PyObject *argv = PyList_New(0), *orig = PyList_New(0), *a;
	size_t i;
	int r = -1;

	if (!argv || !orig)
		goto out;
	for (i = 0; i < p->nargs; i++) {
		a = PyUnicode_DecodeFSDefault(p->args[i]);
		if (!a || PyList_Append(orig, a) < 0 ||
		    (i >= 2 && !(command && i == 3) && PyList_Append(argv, a) < 0)) {
			Py_XDECREF(a);
			goto out;
		}
		Py_DECREF(a);
	}
	r = PySys_SetObject("argv", argv) < 0 || PySys_SetObject("orig_argv", orig) < 0 ? -1 : 0;
out:
	Py_XDECREF(argv);
	Py_XDECREF(orig);
	return r;
}

/* sys.stdin, stdout, stderr and their __std*__: the zygote's own when the run's fd is of the
 * kind it was made for, else a new one. */
static int setup_streams(void)
{
	static const char *const names[3][2] = {
		{ "stdin", "__stdin__" }, { "stdout", "__stdout__" }, { "stderr", "__stderr__" },
	};
	static const char *const labels[3] = { "<stdin>", "<stdout>", "<stderr>" };
	struct std_kind k;
	PyObject *s;
	int fd, n = 0;

	for (fd = 0; fd < 3; fd++) {
		std_kind_of(fd, &k);
		if (std_kind_same(&k, &py.kind[fd])) {
			s = py.std[fd];
			Py_INCREF(s);
		} else {
			s = PyObject_CallFunction(py.stream, "iOsOO", fd, fd ? Py_True : Py_False,
						  labels[fd], py.encodings[fd][0], py.encodings[fd][1]);
			if (!s)
				return -1;
			if (s != Py_None) {
				PyObject *buf = PyObject_GetAttrString(s, "buffer");
				PyObject *raw = buf ? PyObject_GetAttrString(buf, "raw") : NULL;

				PyErr_Clear();
				py.run_std[n++] = s;
				if (buf)
					py.run_std[n++] = buf;
				if (raw)
					py.run_std[n++] = raw;
			}
		}
		if (PySys_SetObject(names[fd][0], s) < 0 || PySys_SetObject(names[fd][1], s) < 0) {
			Py_DECREF(s);
			return -1;
		}
		Py_DECREF(s);
	}
	return 0;
}

/* A __main__ of the run's own, made as Python's start-up makes it (add_main_module()): the
 * zygote's is frozen, and a reference cycle through a frozen dict is never collected, so what
 * the program leaves in its globals (a class and its instances) would never be finalized. */
static int setup_main(void)
{
	PyObject *m = PyModule_New("__main__"), *d, *ann;
	int r;

	if (!m)
		return -1;
	d = PyModule_GetDict(m);
	ann = PyDict_New();
	r = !ann || PyDict_SetItemString(d, "__annotations__", ann) < 0 ||
	    PyDict_SetItemString(d, "__builtins__", py.builtins) < 0 ||
	    PyDict_SetItemString(d, "__loader__", py.builtin_importer) < 0 ||
	    PyDict_SetItemString(PyImport_GetModuleDict(), "__main__", m) < 0 ? -1 : 0;
	Py_XDECREF(ann);
	py.main_dict = d;       /* held by the module, in sys.modules */
	Py_DECREF(m);
	return r;
}

/* The run's environment, argv, orig_argv, standard streams, __main__ and time zone. */
static int setup_run(const struct plan *p)
{
	const char *tz = NULL;
	size_t i;

	if (setup_environ(p) != 0 || setup_argv(p) != 0 || setup_streams() != 0 ||
	    setup_main() != 0)
		return -1;
	for (i = 0; i < p->nenv; i++)
		if (strncmp(p->env[i], "TZ=", 3) == 0) {
			tz = p->env[i] + 3;
			break;
		}
	/* time read TZ when it was imported: only another TZ changes what it holds */
	if (py.tzset && (!tz != !py.tz || (tz && strcmp(tz, py.tz) != 0))) {
		PyObject *r = PyObject_CallNoArgs(py.tzset);

		Py_XDECREF(r);
		if (!r)
			return -1;
	}
	return 0;
}

/* The generators seeded once in the zygote that Python's own at-fork handlers leave alone
 * (numpy's): reseeded, or the run does not start (it would draw the numbers every run draws). */
static void reseed(void)
{
	PyObject *r = PyObject_CallNoArgs(py.reseed);

	if (!r) {
		dprintf(STDERR_FILENO, "corral-zygote: a preloaded random generator could not be "
			"reseeded:\n");
		PyErr_Print();
		_exit(1);
	}
	Py_DECREF(r);
}

/* Every fd above 2 closed but keep_a and keep_b (-1: none). */
static void close_fds_but(int keep_a, int keep_b)
{
	int lo = keep_a < keep_b ? keep_a : keep_b, hi = keep_a < keep_b ? keep_b : keep_a;

	if (lo < 3) {
		lo = hi;
		hi = -1;
	}
	if (lo < 3) {
		close_fds(3, -1);
		return;
	}
	if (lo > 3)
		close_fds(3, lo - 1);
	if (hi > lo) {
		if (hi > lo + 1)
			close_fds(lo + 1, hi - 1);
		close_fds(hi + 1, -1);
	} else {
		close_fds(lo + 1, -1);
	}
}

/* --prestart: the program was forked ahead of its run, and waits here for it: the host writes one
 * byte on the report socket when the run's code is in place. EOF: the launch was let go; the
 * program exits as the launcher does then (125), and nothing runs. */
static void await_run(const struct plan *p)
{
	char b;
	ssize_t n;

	if (!p->prestart)
		return;
	do
		n = read(report_get_fd(), &b, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		_exit(EXIT_SETUP);
}

/* --prestart, while no run waits (its byte is not there yet): the parser and compiler run once on a
 * small program, so that the pages they write are this process's own copies (copied from the
 * zygote, a fault each) before the run's code comes. A run that already waits goes first: back to
 * back, that work would be on its path. */
/* The way the run's file goes (run_file): a small program read through a FILE, with its
 * __loader__ and the .pyc check, compiled and run in a dictionary of its own (it prints strings
 * to /dev/null: where the policy does not let it open that, it stops there), then the standard
 * streams flushed (nothing is written: their buffers are empty). The program only binds names
 * in that dictionary, which goes with it; what stays is what any first print() with a keyword
 * leaves (the keywords' tuple of its argument parser). A back-to-back run finds its byte there
 * first and skips it (poll). Measured (ftrace, the program from its byte to its exit, two
 * alternating series of 150 after 5 ms pauses): 162-179 us against 266-296 us with the compile
 * alone. */
static void rehearse_file(void)
{
	static const char src[] =
		"x = ' '.join([str(i) for i in range(3)])\n"
		"with open('/dev/null', 'w') as f:\n"
		"    print(x, 'y', file=f)\n";
	FILE *fp = fmemopen((void *)src, sizeof src - 1, "r");
	PyObject *g, *v;

	if (!fp)
		return;
	g = PyDict_New();
	if (!g) {
		fclose(fp);
		PyErr_Clear();
		return;
	}
	/* its __loader__, as set_main_loader() makes the run's, into that dictionary */
	v = PyUnicode_FromString("<prestart>");
	if (v) {
		set_main_loader(g, v, py.source_loader);
		Py_DECREF(v);
	}
	PyErr_Clear();
	(void)maybe_pyc_file(fp, "<prestart>");
	v = PyRun_FileExFlags(fp, "<prestart>", Py_file_input, g, g, 1, NULL);
	Py_XDECREF(v);
	Py_DECREF(g);
	PyErr_Clear();
	flush_io();
}

static void rehearse(void)
{
	struct pollfd pf = { report_get_fd(), POLLIN, 0 };
	PyObject *c;

	if (poll(&pf, 1, 0) != 0)
		return;
	c = Py_CompileString("import sys\nx = [str(i) for i in range(3)]\nprint(x, 'y', file=None, end='')\n",
			     "<prestart>", Py_file_input);
	Py_XDECREF(c);
	PyErr_Clear();
	if (poll(&pf, 1, 0) == 0)
		rehearse_file();
}

NORETURN void py_run_program(const struct launch *L, int errfd)
{
	struct plan run = *L->plan;     /* with the program's environment and arguments (mounts.c) */
	const struct plan *p = &run;
	struct result res = { 0, 0 };
	int s, ready;

	run.env = mounts_env(L);
	run.args = mounts_args(L);
	if (L->direct)
		exec_rseq_again();   /* the direct init, our parent, shared the zygote's memory */
	/* The process as execve() would leave it (exec.c); a failure is the launcher's exec one. */
	if (exec_like(p) != 0)
		child_die(errfd, W_EXEC, errno);
	/* No fd of the launcher's reaches the program. Before the interpreter's state is made,
	 * every one but the report socket (the run's byte comes on it) and the pipe whose EOF tells
	 * the supervisor the program runs (as after an execve): those two go after the wait. */
	close_fds_but(report_get_fd(), errfd);
	/* The interpreter's state for the run, which does not depend on the code: with --prestart,
	 * before the run comes. */
	PyOS_AfterFork_Child();
	reseed();
	ready = setup_run(p) == 0;
	if (p->prestart)
		rehearse();
	await_run(p);
	close(report_get_fd());
	close(errfd);
	exec_dumpable();        /* after the fds are closed, not before */
	/* Python's own dispositions (SIGINT: KeyboardInterrupt) only now: a signal during the wait
	 * must not reach the run's code. Every one is the default here (child_run reset them all):
	 * only those Python changed are set, two or three calls instead of 62. */
	for (s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP &&
		    (py.sig[s].sa_handler != SIG_DFL || py.sig[s].sa_flags & SA_SIGINFO))
			sigaction(s, &py.sig[s], NULL);
	if (!ready) {
		PyErr_Print();
		_exit(1);
	}
	run_main(p, &res);
	py_end(res.code);
}

--- The prelude: Python source the interpreter runs as `python3 -I -c PRELUDE FILE ARGS...`, which
-- then runs FILE as `python3 -I FILE ARGS...` would, with stdout block-buffered (one write per
-- 8 KiB instead of two per print() under -u) and nothing written lost when the run is ended:
--   * SIGXCPU (RLIMIT_CPU's soft limit; the hard one is a second later): flush stdout and
--     stderr, then die of SIGXCPU as before;
--   * FLUSH_SIGNAL, sent by the run's supervisor to every process of the run before it kills
--     them (a timeout, a stop): flush, then die of SIGKILL, as the kill would have done.
-- Python runs a handler in the main thread between two bytecodes: a program inside one long C
-- call when the run ends loses what it had buffered, as does one that replaces the handlers,
-- dies of another signal, or calls os._exit().
-- The CPU limit's SIGXCPU goes to the thread that was running: a program whose CPU is burnt by
-- another thread while the main one waits gets no flush, and is killed at the hard limit.
-- What the program sees is what FILE's run shows: a fresh __main__ with a script's globals,
-- sys.argv = [FILE, ARGS...], sys.orig_argv without the prelude, an uncaught exception printed
-- without the prelude's frames (and sys.last_* set, a failing or missing sys.excepthook reported
-- as python3 reports it). The prelude's two frames are there above module level: for a walk up
-- the stack (f_back, inspect.stack(), traceback.print_stack()), warnings.warn's stacklevel from
-- module level, and the recursion limit (two frames fewer).
-- A warm run does not go through it (but for a program with a NUL byte): its zygote has the same
-- two handlers, in C (csrc/zygote/pyflush.c), and runs FILE itself, as python3 -I FILE does.
local M = {}

--- The signal a supervisor sends before it kills a run's processes: SIGRTMAX - 1 in the
-- kernel's numbering (glibc and musl agree on SIGRTMAX, not on SIGRTMIN); csrc/launch/launch.h
-- has the same number.
M.FLUSH_SIGNAL = 63

--- The fd a cold run's program reads to its end before it runs its code, when the run has
-- files (corral-launch --files-wait-fd): the init makes them while the interpreter starts. Not
-- the report fd (3).
M.FILES_WAIT_FD = 4

M.source = ([[
def _corral_run():
    import _signal as signal, os, sys  # _signal: the signal module would import enum
    import atexit
    WAIT
    argv, orig = sys.argv, sys.orig_argv
    del argv[0]
    path = argv[0]
    i = orig.index('-c')
    del orig[i:i + 2]

    def flush(signum, frame):
        for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                s.flush()
            except BaseException:
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum if signum == signal.SIGXCPU else signal.SIGKILL)

    # an uncaught KeyboardInterrupt ends python3 by SIGINT after its exit handlers and flush
    interrupted = []

    def last():
        if interrupted:
            for s in (sys.stdout, sys.stderr):
                try:
                    s.flush()
                except BaseException:
                    pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    atexit.register(last)
    signal.signal(signal.SIGXCPU, flush)
    signal.signal(FLUSH, flush)
    main = type(sys)('__main__')
    main.__annotations__ = {}
    main.__builtins__ = sys.modules['builtins']
    main.__cached__ = None
    main.__file__ = path
    main.__loader__ = sys.modules['_frozen_importlib_external'].SourceFileLoader('__main__', path)
    sys.modules['__main__'] = main
    mine = globals()

    def own(e):
        # the exception's traceback without the prelude's frames
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_globals is mine:
            tb = tb.tb_next
        e.__traceback__ = tb
        return tb

    def err(text):
        try:
            sys.stderr.write(text)
        except BaseException:
            pass

    try:
        with open(path, 'rb') as f:
            code = compile(f.read(), path, 'exec', dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        failed = e
    else:
        return
    # as PyErr_PrintEx(), outside the except clause (an error of the hook has no context):
    # sys.last_*, the hook, and what a failing or missing hook prints
    e = failed
    del failed
    tb = own(e)
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    hook = getattr(sys, 'excepthook', None)
    if hook is None:
        err('sys.excepthook is missing\n')
        sys.__excepthook__(type(e), e, tb)
    else:
        try:
            hook(type(e), e, tb)
        except SystemExit:
            raise
        except BaseException as e2:
            err('Error in sys.excepthook:\n')
            sys.__excepthook__(type(e2), e2, own(e2))
            err('\nOriginal exception was:\n')
            sys.__excepthook__(type(e), e, tb)
    if isinstance(e, KeyboardInterrupt):
        interrupted.append(e)
    raise SystemExit(1) from None
_corral_run()
]]):gsub("FLUSH", tostring(M.FLUSH_SIGNAL))

-- The run's files, made while the interpreter started: their end is the byte GO, then EOF on the
-- fd (EOF alone: the init was killed while it made them, and the namespace's end is coming).
-- EBADF: the launcher made them first (no PID namespace) and gave no fd. Anything else is no go:
-- the run ends there, before its code.
local WAIT = ([[
try:
        got = b""
        while True:
            b = os.read(FD, 65536)
            if not b:
                break
            got += b
        os.close(FD)
        if got != GO:
            os._exit(125)
    except OSError as e:
        if e.errno != 9:
            os._exit(125)]]):gsub("FD", tostring(M.FILES_WAIT_FD)):gsub("GO", 'b"y"')

--- The prelude of a run whose program waits for its files (FILES_WAIT_FD) before its code.
M.waiting_source = M.source:gsub("\n    WAIT\n", function() return "\n    " .. WAIT .. "\n" end)
M.source = M.source:gsub("\n    WAIT\n", "\n")

return M

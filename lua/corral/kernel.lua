--- The session kernel: the Python program a session's sandbox runs (corral.session).
--
-- It runs under the session's policy exactly as a run's code does, and serves requests one after
-- another in one interpreter, so that variables, imports, open files and the work dir last from
-- one cell to the next. The protocol (docs/sessions.md):
--
--   host -> kernel, on stdin:   LENGTH "\n" JSON, back to back. {"op": "exec" | "complete" |
--                                "put" | "get" | "list", "token": HEX, ...}, and {"op": "interrupt",
--                                "token": HEX} (at once, by the reader thread: SIGINT to itself
--                                while that cell runs; a cell not started yet starts interrupted)
--   kernel -> host, at the end of each request: on stderr "\0" TOKEN "\0", then on stdout
--                                "\0" TOKEN "\0" LENGTH "\n" JSON
--
-- What a request printed is what came on stdout and stderr before its token: the token is the
-- host's, random, new for each request, so output cannot end a request early by chance. The
-- program can read it from the kernel's memory (it is the same process): it can then confuse its
-- own session's results, and nothing else. The kernel keeps its own copies of fds 0, 1 and 2 and
-- gives each cell the channels back (fds 1 and 2 dup'ed again, sys.stdout/stderr reset, stdin
-- /dev/null), so a cell that closes or redirects them does not end the session.
local M = {}

M.source = [==[
def _corral_kernel():
    import ast, base64, builtins, codeop, io, json, linecache, os, resource, signal, sys, threading
    import time, traceback, types

    req_fd, out_fd, err_fd = os.dup(0), os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    work_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    here = __file__ if "__file__" in globals() else None
    std_out, std_err = sys.stdout, sys.stderr

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    ns = main.__dict__
    sys.argv = [""]

    class CellCPUExceeded(Exception):
        """The cell used its CPU seconds."""

    state = {"running": False, "count": 0, "token": None, "early": set()}
    main_thread = threading.main_thread().ident
    lock = threading.Lock()
    cond = threading.Condition(lock)
    queue = []

    def read_exact(n):
        b = bytearray()
        while len(b) < n:
            chunk = os.read(req_fd, n - len(b))
            if not chunk:
                return None
            b += chunk
        return bytes(b)

    def reader():
        # the process's signals (SIGXCPU, a cell's own) are the main thread's to take
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGXCPU, signal.SIGTERM,
                                                  signal.SIGALRM, signal.SIGCHLD})
        while True:
            head = bytearray()
            while not head.endswith(b"\n"):
                c = os.read(req_fd, 1)
                if not c or len(head) > 20:
                    head = None
                    break
                head += c
            body = read_exact(int(head)) if head and head[:-1].isdigit() else None
            req = None
            if body is not None:
                try:
                    req = json.loads(body)
                except ValueError:
                    req = None
            if isinstance(req, dict) and req.get("op") == "interrupt":
                target = req.get("token")
                with lock:
                    if state["running"] and target in (None, state["token"]):
                        # to the main thread: a system call it waits in ends (EINTR)
                        signal.pthread_kill(main_thread, signal.SIGINT)
                    elif target is not None:
                        # a cell queued behind it and not started yet: it starts interrupted
                        state["early"].add(target)
                continue
            with cond:
                queue.append(req if isinstance(req, dict) else {"op": "eof"})
                cond.notify()
            if not isinstance(req, dict):
                return

    def write_all(fd, data):
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def flush_std():
        for s in (sys.stdout, sys.stderr, std_out, std_err):
            try:
                s.flush()
            except Exception:
                pass

    def respond(token, obj):
        flush_std()
        mark = b"\0" + token.encode() + b"\0"
        data = json.dumps(obj).encode()
        write_all(err_fd, mark)
        write_all(out_fd, mark + str(len(data)).encode() + b"\n" + data)

    def give_back_channels():
        # each cell starts with the session's stdout and stderr, whatever the last one did
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for name, fd, orig in (("stdout", 1, std_out), ("stderr", 2, std_err)):
            s = orig
            if s is None or s.closed:
                s = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=(fd == 2),
                                     errors="backslashreplace")
            setattr(sys, name, s)
        sys.stdin = None

    def tb_text(e):
        # the cell's frames only: the kernel's are left out
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == here:
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(e), e, tb))

    def cap(text, n):
        return (text, False) if len(text) <= n else (text[:n], True)

    def images():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return []
        out = []
        try:
            for num in plt.get_fignums():
                buf = io.BytesIO()
                plt.figure(num).savefig(buf, format="png")
                out.append(base64.b64encode(buf.getvalue()).decode())
            plt.close("all")
        except Exception:
            pass
        return out

    session_cpu = resource.getrlimit(resource.RLIMIT_CPU)[0]

    def on_xcpu(signum, frame):
        if resource.getrlimit(resource.RLIMIT_CPU)[0] == session_cpu:
            # the session's own CPU limit, not a cell's: the session ends of it
            flush_std()
            signal.signal(signal.SIGXCPU, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGXCPU)
        raise CellCPUExceeded("the cell used its CPU seconds")

    def memory():
        # the interpreter's resident memory now, and its peak
        try:
            with open("/proc/self/statm") as f:
                now = int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
        except (OSError, ValueError, IndexError):
            now = None
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return now, max(peak, now or 0)

    def cpu_now():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def run_cell(req):
        state["count"] += 1
        n = state["count"]
        code = req.get("code", "")
        name = "<cell %d>" % n
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        res = {"status": "ok", "execution_count": n, "value": None}
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        t0, c0 = time.monotonic(), cpu_now()
        give_back_channels()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGXCPU, on_xcpu)
        if req.get("cpu"):
            limit = int(c0 + req["cpu"]) + 1
            if hard == resource.RLIM_INFINITY or limit < hard:
                resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
        try:
            try:
                with lock:
                    state["running"] = True
                    state["token"] = req.get("token")
                    early = state["token"] in state["early"]
                if early:
                    raise KeyboardInterrupt
                last = None
                if req.get("interactive"):
                    # as Python's REPL runs a statement: sys.displayhook writes each expression
                    # statement's value to stdout and keeps it as builtins._
                    exec(compile(code, name, "single"), ns)
                else:
                    tree = ast.parse(code, name, "exec")
                    if tree.body and isinstance(tree.body[-1], ast.Expr):
                        last = ast.Expression(tree.body.pop().value)
                    exec(compile(tree, name, "exec"), ns)
                if last is not None:
                    v = eval(compile(last, name, "eval"), ns)
                    if v is not None:
                        ns["_"] = v
                        res["value"], res["value_truncated"] = cap(repr(v), req.get("value_max", 10000))
            finally:
                with lock:
                    state["running"] = False
                    state["early"].discard(state["token"])
        except SystemExit as e:
            code_ = e.code
            res["status"] = "exit"
            res["exit_code"] = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
            if code_ is not None and not isinstance(code_, int):
                sys.stderr.write(str(code_) + "\n")
        except BaseException as e:
            res["status"] = "error"
            res["error"] = {"type": type(e).__name__, "message": str(e), "traceback": tb_text(e)}
            if isinstance(e, KeyboardInterrupt):
                res["status"] = "interrupted"
            elif isinstance(e, CellCPUExceeded):
                res["status"] = "cpu"
            # as a REPL shows it
            try:
                sys.stderr.write(res["error"]["traceback"])
            except Exception:
                pass
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        except (ValueError, OSError):
            pass
        if req.get("images", True):
            res["images"] = images()
        res["wall_s"] = time.monotonic() - t0
        res["cpu_s"] = cpu_now() - c0
        res["memory_kb"], res["memory_peak_kb"] = memory()
        return res

    def complete(req):
        # codeop's answer, as Python's REPL asks it: a code object (complete), None (more lines
        # to come) or an error (complete: running it shows the error)
        try:
            more = codeop.compile_command(str(req.get("source", "")), "<input>", "single") is None
        except (SyntaxError, OverflowError, ValueError):
            more = False
        return {"status": "ok", "complete": not more}

    def walk(path, make=False):
        # the directory holding path's last name, reached without following a link; its fd
        parts = path.split("/")
        d = os.dup(work_fd)
        try:
            for p in parts[:-1]:
                if make:
                    try:
                        os.mkdir(p, 0o755, dir_fd=d)
                    except FileExistsError:
                        pass
                nd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                os.close(d)
                d = nd
        except BaseException:
            os.close(d)
            raise
        return d, parts[-1]

    def path_of(req):
        return os.fsdecode(base64.b64decode(req["path_b64"]))

    def put(req):
        d, last = walk(path_of(req), make=True)
        try:
            try:
                os.stat(last, dir_fd=d, follow_symlinks=False)
                created = False
            except FileNotFoundError:
                created = True
            fd = os.open(last, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                         req.get("mode", 0o644), dir_fd=d)
        finally:
            os.close(d)
        try:
            write_all(fd, base64.b64decode(req["content_b64"]))
            os.fchmod(fd, req.get("mode", 0o644))
        finally:
            os.close(fd)
        return {"status": "ok", "created": created}

    def get(req):
        d, last = walk(path_of(req))
        try:
            fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=d)
        finally:
            os.close(d)
        try:
            st = os.fstat(fd)
            if not (st.st_mode & 0o170000 == 0o100000):
                return {"status": "error", "error": {"type": "IsADirectoryError" if st.st_mode & 0o040000
                                                      else "OSError", "message": "not a regular file"}}
            want = min(st.st_size, req.get("max", 1 << 20))
            chunks, got = [], 0
            while got < want:
                b = os.read(fd, min(1 << 20, want - got))
                if not b:
                    break
                chunks.append(b)
                got += len(b)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        return {"status": "ok", "size": st.st_size, "mode": st.st_mode & 0o7777,
                "content_b64": base64.b64encode(data).decode(), "truncated": len(data) < st.st_size}

    def listing(req):
        out, left = [], req.get("max", 1000)
        truncated = False
        stack = [(os.dup(work_fd), b"")]
        while stack:
            d, prefix = stack.pop()
            try:
                with os.scandir(d) as it:
                    for e in it:
                        if left <= 0:
                            truncated = True
                            break
                        left -= 1
                        name = prefix + os.fsencode(e.name)
                        st = e.stat(follow_symlinks=False)
                        kind = ("directory" if e.is_dir(follow_symlinks=False) else
                                "link" if e.is_symlink() else
                                "file" if e.is_file(follow_symlinks=False) else "other")
                        out.append({"path_b64": base64.b64encode(name).decode(), "type": kind,
                                    "size": st.st_size})
                        if kind == "directory" and len(stack) < 64:
                            try:
                                sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                                stack.append((sub, name + b"/"))
                            except OSError:
                                pass
            finally:
                os.close(d)
        return {"status": "ok", "entries": out, "truncated": truncated}

    # the reader needs little stack: the address space it does not take is the program's
    threading.stack_size(256 * 1024)
    threading.Thread(target=reader, daemon=True).start()
    threading.stack_size(0)
    while True:
        with cond:
            while not queue:
                cond.wait()
            req = queue.pop(0)
        op = req.get("op")
        if op == "eof":
            break
        token = str(req.get("token", ""))
        try:
            if op == "exec":
                res = run_cell(req)
            elif op in ("complete", "put", "get", "list"):
                res = {"complete": complete, "put": put, "get": get, "list": listing}[op](req)
            else:
                res = {"status": "error", "error": {"type": "ValueError", "message": "unknown op"}}
        except KeyboardInterrupt:
            res = {"status": "interrupted"}
        except Exception as e:
            res = {"status": "error", "error": {"type": type(e).__name__, "message": str(e)}}
        try:
            respond(token, res)
        except KeyboardInterrupt:
            respond(token, res)
        if res.get("status") == "exit":
            return res["exit_code"]
    return 0


raise SystemExit(_corral_kernel())
]==]

return M

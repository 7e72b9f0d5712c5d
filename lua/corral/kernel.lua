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
    import ast, base64, builtins, codeop, errno, fnmatch, io, json, linecache, os, resource, signal, sys, threading
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

    CLOCK_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)
    # Past RLIMIT_CPU's soft limit the kernel sends SIGXCPU and raises the soft limit by a
    # second (up to the hard one, then SIGKILL): the soft limit the handler reads is not the one
    # that fired. cell_cpu holds the cell's own limit while one is set below the session's.
    cell_cpu = [None]

    def on_xcpu(signum, frame):
        if cell_cpu[0] is None:
            # the session's own CPU limit: the session ends of it
            flush_std()
            signal.signal(signal.SIGXCPU, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGXCPU)
        # the cell's: its code stops; one that comes once the cell has ended, in the kernel's
        # own work before the limit is lifted, is dropped
        if state["running"]:
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
        # A file's ctime is read from the coarse clock (or a finer one, never behind it): with
        # collect = true the cell begins at that clock's next tick, so that what changed before
        # has an older ctime and what the cell makes or changes has this one or a later one.
        since = time.clock_gettime_ns(CLOCK_COARSE)
        if req.get("collect") is not None and not req["collect"].get("globs"):
            tick = since
            while since == tick:
                time.sleep(0.0005)
                since = time.clock_gettime_ns(CLOCK_COARSE)
        give_back_channels()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGXCPU, on_xcpu)
        if req.get("cpu"):
            # the cell's limit, when it comes before the session's
            limit = int(c0 + req["cpu"]) + 1
            if soft == resource.RLIM_INFINITY or limit < soft:
                cell_cpu[0] = limit
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
        if cell_cpu[0] is not None:
            try:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
            except (ValueError, OSError):
                pass
            cell_cpu[0] = None
        if req.get("collect") is not None:
            # interruptible as the cell is: its timeout cuts the walk, not the session
            try:
                try:
                    with lock:
                        state["running"] = True
                        late = state["token"] in state["early"]
                        state["early"].discard(state["token"])
                    res["files"] = collect(req["collect"], since, late)
                finally:
                    with lock:
                        state["running"] = False
            except KeyboardInterrupt:
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

    def read_file(d, name, most):
        # a regular file's stat and its first `most` bytes, opened from its directory without
        # following a link; (stat, None) when it is not a regular file. `most` is read at most,
        # whatever the file grows to while it is read.
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=d)
        try:
            st = os.fstat(fd)
            if not (st.st_mode & 0o170000 == 0o100000):
                return st, None
            want = min(st.st_size, most)
            chunks, got = [], 0
            while got < want:
                b = os.read(fd, min(1 << 20, want - got))
                if not b:
                    break
                chunks.append(b)
                got += len(b)
            return st, b"".join(chunks)
        finally:
            os.close(fd)

    def get(req):
        d, last = walk(path_of(req))
        try:
            st, data = read_file(d, last, req.get("max", 1 << 20))
        finally:
            os.close(d)
        if data is None:
            return {"status": "error", "error": {"type": "IsADirectoryError" if st.st_mode & 0o040000
                                                  else "OSError", "message": "not a regular file"}}
        return {"status": "ok", "size": st.st_size, "mode": st.st_mode & 0o7777,
                "content_b64": base64.b64encode(data).decode(), "truncated": len(data) < st.st_size}

    # The walk's bounds, as a run's collection has them (csrc/launch/workspace.c); the fds it
    # keeps open along the path it is in (the session's open_files limit is the program's too).
    SCAN_MAX, DEPTH_MAX, PATH_MAX, KEEP_FDS = 100000, 64, 4095, 8

    def open_below(d, names, dev):
        # the directory at names below the directory d, each opened from its parent with
        # O_NOFOLLOW, on the filesystem dev: its fd
        d = os.dup(d)
        try:
            for n in names:
                nd = os.open(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=d)
                os.close(d)
                d = nd
                if os.fstat(d).st_dev != dev:
                    raise OSError(errno.EXDEV, "another filesystem")
        except BaseException:
            os.close(d)
            raise
        return d

    def tree(flags, descend=None):
        # every entry below the work dir, depth first: (path bytes, name, its directory's fd,
        # lstat, kind). Never through a link (each name opened from its directory's fd with
        # O_NOFOLLOW), never onto another filesystem; `descend(path)` says whether a directory
        # is entered. What cuts it short goes into `flags`: "scan" (SCAN_MAX entries looked at),
        # "depth" (DEPTH_MAX directories down), "name" (a path over PATH_MAX bytes). A directory
        # that cannot be opened is not entered. Below KEEP_FDS levels a directory's fd is not
        # kept while its subdirectories are walked: each is opened again from the deepest fd kept.
        seen = [0]
        dev = os.fstat(work_fd).st_dev

        def walk_dir(d, prefix, depth, anchor, below):
            # d: this directory's fd (closed here); anchor: the deepest fd kept (d itself when
            # below is empty), below: the names from it to here
            subs = []
            try:
                try:
                    with os.scandir(d) as it:
                        entries = []
                        for e in it:
                            if seen[0] >= SCAN_MAX:
                                flags.add("scan")
                                break
                            seen[0] += 1
                            name = prefix + os.fsencode(e.name)
                            if len(name) > PATH_MAX:
                                flags.add("name")
                                continue
                            try:
                                st = e.stat(follow_symlinks=False)
                            except OSError:
                                continue
                            if st.st_dev == dev:
                                entries.append((name, e.name, st))
                except OSError:
                    return
                for name, n, st in entries:
                    m = st.st_mode & 0o170000
                    kind = ("directory" if m == 0o040000 else "link" if m == 0o120000 else
                            "file" if m == 0o100000 else "other")
                    yield name, n, d, st, kind
                    if kind == "directory" and not (descend and not descend(name)):
                        if depth >= DEPTH_MAX:
                            flags.add("depth")
                        else:
                            subs.append((name, n))
                if below:
                    # not the anchor: the subdirectories are opened from the anchor
                    os.close(d)
                    d = None
                for name, n in subs:
                    if seen[0] >= SCAN_MAX:
                        return
                    try:
                        sub = open_below(d if d is not None else anchor, below + [n], dev)
                    except OSError:
                        continue
                    if below:
                        yield from walk_dir(sub, name + b"/", depth + 1, anchor, below + [n])
                    elif depth + 1 < KEEP_FDS:
                        yield from walk_dir(sub, name + b"/", depth + 1, sub, [])
                    else:
                        yield from walk_dir(sub, name + b"/", depth + 1, d, [n])
            finally:
                if d is not None:
                    os.close(d)

        d = os.dup(work_fd)
        return walk_dir(d, b"", 0, d, [])

    def listing(req):
        out, left = [], req.get("max", 1000)
        flags = set()
        for name, _, _, st, kind in tree(flags):
            if left <= 0:
                flags.add("files")
                break
            left -= 1
            out.append({"path_b64": base64.b64encode(name).decode(), "type": kind, "size": st.st_size})
        return {"status": "ok", "entries": out, "truncated": bool(flags)}

    # Steps of glob matching a cell's collection may take ("**" tries every split of a path).
    MATCH_MAX = 1 << 20

    def seg_match(pat, name):
        # one name against one segment, as fnmatch(3) with FNM_PERIOD: a leading dot is
        # matched only by a dot
        if name[:1] == b"." and pat[:1] != b".":
            return False
        if pat[:2] == b"[^":
            pat = b"[!" + pat[2:]
        return fnmatch.fnmatchcase(name, pat)

    def gmatch(pat, i, path, j, prefix, left):
        # path[j:] against pat[i:], segment by segment, "**" any number of them; with prefix,
        # whether a path below the directory path[:j] could match. Each call is a step of left.
        if left[0] <= 0:
            return False
        left[0] -= 1
        if j == len(path):
            if prefix:
                return i < len(pat)
            while i < len(pat) and pat[i] == b"**":
                i += 1
            return i == len(pat)
        if i == len(pat):
            return False
        if pat[i] == b"**":
            return gmatch(pat, i + 1, path, j, prefix, left) or gmatch(pat, i, path, j + 1, prefix, left)
        return seg_match(pat[i], path[j]) and gmatch(pat, i + 1, path, j + 1, prefix, left)

    def record(parts, kind, path, size, mode, data):
        parts.append(b"%s\0%s\0%d\0%o\0%d\0" % (kind, path, size, mode & 0o7777, len(data)))
        parts.append(data)

    def collect(c, since, late):
        # The cell's files in the records of a run's collection (docs/internals.md): KIND \0
        # PATH \0 SIZE \0 MODE \0 STORED \0 and the bytes, then "end" \0 SEEN \0 FLAGS \0.
        # c: "globs" (base64) or, without them, every file whose ctime is `since` or later:
        # made or changed during the cell (ctime is the kernel's, which no call sets back);
        # "files", "file_bytes", "bytes": the policy's caps. late: interrupted before it began.
        globs = [base64.b64decode(g).split(b"/") for g in c.get("globs") or ()]
        files_left, bytes_left, per_file = c["files"], c["bytes"], c["file_bytes"]
        flags, parts, left, seen = set(), [], [MATCH_MAX], 0

        def wanted(path, prefix):
            if not globs:
                return True
            segs = path.split(b"/")
            return any(gmatch(g, 0, segs, 0, prefix, left) for g in globs)

        walker = tree(flags, lambda p: wanted(p, True))
        try:
            if late:
                raise KeyboardInterrupt
            for path, name, d, st, kind in walker:
                seen += 1
                if left[0] <= 0:
                    # out of match steps: the walk stops, as at its scan cap
                    flags.add("scan")
                    break
                if kind not in ("file", "link") or not wanted(path, False):
                    continue
                if not globs and st.st_ctime_ns < since:
                    continue
                if files_left <= 0:
                    flags.add("files")
                    break
                files_left -= 1
                try:
                    if kind == "link":
                        t = os.readlink(os.fsencode(name), dir_fd=d)
                        record(parts, b"l", path, len(t), st.st_mode, t)
                        continue
                    room = bytes_left
                    fst, data = read_file(d, name, min(per_file, room))
                    if data is None or fst.st_dev != st.st_dev:
                        raise OSError(errno.EAGAIN, "not what it was")
                except OSError as e:
                    record(parts, b"e", path, st.st_size, st.st_mode,
                           errno.errorcode.get(e.errno, "EIO").encode())
                    continue
                if min(fst.st_size, per_file) > room:
                    flags.add("bytes")
                bytes_left -= len(data)
                record(parts, b"f", path, fst.st_size, fst.st_mode, data)
        except (KeyboardInterrupt, CellCPUExceeded):
            # the cell's timeout, or an interrupt, while its files were read: what was read
            flags.add("interrupted")
        finally:
            walker.close()
        parts.append(b"end\0%d\0%s\0" % (seen, ",".join(sorted(flags)).encode()))
        return base64.b64encode(b"".join(parts)).decode()

    # a cell of the kernel's own, run before the first request and forgotten: what is done once
    # in a process (first calls into the compiler, signal, resource, the measures; memory the
    # interpreter shares with the process it was forked from, copied at a first write) is done
    # by then, and the first cell costs what any later one does
    json.dumps(run_cell({"code": "None", "images": True}))
    state["count"] = 0
    linecache.cache.pop("<cell 1>", None)

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

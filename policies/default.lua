--- default: run_python's behaviour, with the holes closed.
-- rlimits (cpu, memory, file-size, no-core, open-files, processes), a wall-clock timeout, an empty
-- environment, a throwaway work dir, no stdin, capped output, an empty network namespace (one
-- shared by the controller's runs, which cannot reach each other in it); plus a PID namespace whose end kills every descendant (setsid escapees included), a per-run uid when
-- the controller is root (so RLIMIT_NPROC holds), no_new_privs and no inherited fds. What the
-- kernel refuses is left out of `limits` and the run goes on, unless the caller requires network
-- isolation.
local policy = require "corral.policy"

return policy.base {
  name = "default",
  description = "run_python's limits + pid namespace, per-run uid as root, empty netns (shared); degrades gracefully",
  -- run_python's (corral.schema: `corral options` lists them)
  defaults = require("corral.schema").defaults(),
  -- where a bare interpreter name such as "python3" is looked up: the sandbox's own PATH
  python_path = "/usr/local/bin:/usr/bin:/bin",
  -- -I: isolated mode (no PYTHON* variables, no user site, no script dir on sys.path). Without
  -- -u the program runs through corral's prelude: stdout is block-buffered and flushed when the
  -- run is ended (a timeout, the CPU limit); with -u every write is a system call of its own
  python_args = { "-I" },
  env = { PATH = "/usr/bin:/bin", LANG = "C.UTF-8" },
  -- one empty network namespace for every run of this controller, kept by a holder process
  -- (joining it costs microseconds; making and tearing down one per run costs about half a
  -- millisecond and a kernel worker's CPU); runs in it have no inet socket (seccomp) and their
  -- abstract unix sockets scoped (Landlock), or they get a namespace of their own. "new": one
  -- per run (the CLI, one run per process, always does that)
  network = "shared",
  pid_namespace = true,
  -- "auto": a user namespace only where the namespaces are refused without one (not root)
  user_namespace = "auto",
  uid_range = { 60000, 60999 },
  -- with the PID namespace's mount namespace: fresh scratch mounts (MiB) that no other run sees
  -- and that vanish with the run, and the work dir (cwd, HOME, TMPDIR) as a tmpfs of work_mb
  -- /run too: it holds the host's unix sockets (D-Bus, container runtimes, /run/lock), which
  -- neither the network namespace nor Landlock keeps a program from connecting to
  -- /home too: it hides the host's users' files, and holds the work dir's mount point
  tmpfs = { ["/tmp"] = 16, ["/var/tmp"] = 16, ["/dev/shm"] = 64, ["/run"] = 1, ["/home"] = 1 },
  work_mb = 64,
  -- where the program sees its work dir (cwd, HOME, TMPDIR), whatever the host's run directory:
  -- inside one of `tmpfs`. Where it cannot be placed there (no PID namespace), the host path
  work_path = "/home/sandbox",
  -- where the program sees its code dir (tracebacks, __file__, argv), whatever the host's run
  -- directory: inside one of `tmpfs`. Where it cannot be bound there, the host path. Not
  -- /run/corral: that is the controller's lock and socket directory, which a run must not see named
  code_path = "/run/code",
  -- the program's files (`files`, `collect`): the bytes a run may be given, and what it may hand
  -- back: files, bytes of each, bytes in all
  max_files_in_mb = 16,
  max_files_out = 100,
  max_file_out_mb = 8,
  max_files_out_mb = 16,
  -- run directories (code/main.py, the work dir's mount point): on /dev/shm when it is a tmpfs
  -- of a fair size, else /tmp (host.run_dir_base)
  tmp_dir = "auto",
  kill_on_overflow = false,
  grace = 0.2,
  tail_bytes = 1024,
  code_name = "main.py",

  -- Landlock: the program reads and executes only the interpreter's own directories (asked of
  -- the interpreter), the code and these; it writes only in its work dir, its private scratch
  -- mounts and these. "auto": what the kernel offers, the rest listed in `refused`.
  filesystem = "auto",
  fs_read = {
    "/bin", "/lib", "/lib64", "/usr",         -- the dynamic loader and shared libraries
    "/etc/ld.so.cache", "/etc/localtime",
    -- Debian's matplotlib reads its defaults, and fontconfig its own, here (a missing path is
    -- left out of the rules)
    "/etc/matplotlibrc", "/etc/fonts",
    "/dev/urandom", "/dev/random", "/dev/zero",
    -- granted only when it is the run's own /proc (a PID namespace): its processes alone
    "/proc",
  },
  fs_write = { "/dev/null" },
  -- with a network namespace ("shared" or "new"): Landlock also denies TCP bind and connect (a
  -- second wall, and the only one where no network namespace can be made)
  deny_tcp = true,
  -- no signal and no abstract unix socket reaches outside the run (Landlock ABI 6)
  scope = true,
  -- the program walled off from the controller and from other runs: a uid of its own (as root),
  -- or Landlock's filesystem rules with the PID namespace. Without either wall (not root, and no
  -- Landlock: a kernel without it, gVisor; or no user namespace for the PID namespace) it would
  -- have the controller's uid and reach its files, its processes and other runs' directories, so
  -- nothing runs; "auto" runs it anyway (listed in `refused`), and no launch is started ahead
  separation = "require",

  -- seccomp: these system calls fail with EPERM (a clean PermissionError in Python, not a kill)
  seccomp = "auto",
  deny_syscalls = {
    -- other processes' memory and tracing
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    -- the mount table and the root
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    -- namespaces after set-up (clone with CLONE_NEW* flags too, clone3 answers ENOSYS)
    "unshare", "setns",
    -- the kernel keyring, BPF, perf, userfaultfd, io_uring (a path around this filter)
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    -- the machine itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "vhangup", "iopl", "ioperm",
    "modify_ldt", "uselib", "ustat", "sysfs", "fanotify_init", "lookup_dcookie",
    -- files by handle (escapes a bind mount), execution domains
    "open_by_handle_at", "name_to_handle_at", "personality",
    -- memory the budget cannot see: a memfd's pages are in no mount and, once unmapped (or
    -- sent through a unix socket and closed), in no process (memfd_secret: pages the kernel
    -- locks). Files in the run's tmpfs mounts (/dev/shm, shm_open, O_TMPFILE) are counted.
    "memfd_create", "memfd_secret",
  },
  -- per-run quotas of what the kernel counts per uid (without root, every run has the
  -- controller's uid, and one run could take the whole host's share from the others): in each
  -- run's own user namespace, at most 8 inotify instances and 8192 watches (of the host's 128
  -- and fs.inotify.max_user_watches for the whole uid); 1024 queued signals and POSIX timers;
  -- 128 KiB of POSIX message queues (one queue of the default size); no pipe above 64 KiB
  user_quotas = { inotify_instances = 8, inotify_watches = 8192 },
  pending_signals = 1024,
  message_queue_bytes = 131072,
  deny_pipe_growth = true,

  -- where the run has no network namespace of its own (the shared one, or none where none could
  -- be made): socket() of every family but AF_UNIX is refused, and bind(): no socket of a run has
  -- a name other runs would see in /proc/net/unix or need
  deny_sockets = "without-netns",
  -- in every namespace: no unix socket but a connected stream or seqpacket pair (socketpair(),
  -- which multiprocessing.Pipe and asyncio use), so none reaches a host socket by path, whatever
  -- uid the run has. multiprocessing.Manager and Listener (named sockets) fail: "any" gives them
  -- back, with Landlock and the private /tmp, /var/tmp, /dev/shm and /run as the only walls
  unix_sockets = "pairs",

  -- whole-run budgets: cpu_seconds and memory_mb bound every process of the run together.
  -- "auto": a cgroup in `cgroup` (a delegated cgroup v2 directory) when set and usable, else
  -- the launcher polls the run's processes every budget_poll_ms.
  budgets = "auto",
  budget_poll_ms = 10,

  -- speed: one launch kept started ahead of the next run with the same options, its namespaces
  -- and mounts made (two idle processes, a run directory and, as root, a run uid while it waits)
  prestart = 1,
}

-- The deploy files (deploy/), checked without a Docker engine or a cluster: the Kubernetes
-- manifests parsed and their security properties asserted; docker-sandbox.sh linted and driven
-- against a stub Docker client; the Dockerfile's packages looked up in Debian, its build stage
-- replayed from exactly the files it copies, its runtime packages matched against what the
-- built binaries load; its health check run against a fake controller; and the seccomp profile
-- loaded with libseccomp, as a container runtime would, around real corral probes and runs.
local H = require "helper"
local cjson = require "cjson"
local core = require "corral.core"
local policy = require "corral.policy"

local PY = "/usr/bin/python3"

--- Run a shell command: its output (stdout and stderr, trimmed) and whether it exited 0.
local function sh(cmd)
  local out, status = H.sh(cmd)
  return out, status == 0
end

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local read = H.read

local function exists(path)
  return sh("test -e " .. q(path) .. " && echo yes") == "yes"
end

local function tmpdir()
  return (sh("mktemp -d /tmp/deploy-spec.XXXXXX"))
end

local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

local function words(s)
  local t = {}
  for w in s:gmatch("%S+") do t[#t + 1] = w end
  return t
end

local function set(list)
  local t = {}
  for _, v in ipairs(list) do t[v] = true end
  return t
end

local function keys(t)
  local l = {}
  for k in pairs(t) do l[#l + 1] = k end
  table.sort(l)
  return l
end

--- Every document of a YAML file, through PyYAML's safe loader, as Lua tables.
local YAML_TO_JSON = "import json, sys, yaml\n" ..
  "docs = [d for d in yaml.safe_load_all(open(sys.argv[1], encoding='utf-8')) if d is not None]\n" ..
  "print(json.dumps(docs))\n"
local function yaml_docs(path)
  local out, ok = sh(PY .. " -c " .. q(YAML_TO_JSON) .. " " .. q(path))
  assert(ok, path .. " does not parse: " .. out)
  return cjson.decode(out)
end

local function yaml_files()
  local files = lines(sh("ls -1 deploy/k8s/*.yaml deploy/*.yaml"))
  assert(#files >= 8, "YAML files found: " .. table.concat(files, " "))
  return files
end

--- One object by kind (and name), from a list of documents.
local function find(docs, kind, name)
  for _, d in ipairs(docs) do
    if d.kind == kind and (not name or d.metadata.name == name) then return d end
  end
  return nil
end

--- The labels `selector` requires are all in `labels`.
local function selects(selector, labels)
  if type(selector) ~= "table" or next(selector) == nil then return false end
  for k, v in pairs(selector) do
    if labels[k] ~= v then return false end
  end
  return true
end

--- Kubernetes memory quantity in MiB (Ki, Mi, Gi or a plain number of bytes).
local function mib(qty)
  local n, unit = tostring(qty):match("^([%d.]+)(%a*)$")
  local f = ({ [""] = 1 / 1048576, Ki = 1 / 1024, Mi = 1, Gi = 1024 })[unit]
  assert(n and f, "memory quantity " .. tostring(qty))
  return tonumber(n) * f
end

---------------------------------------------------------------------------------------------
-- The Dockerfile, parsed: stages, each a list of instructions {op, args}; comments dropped,
-- continuation lines joined.
local function dockerfile(path)
  local stages, pending = {}, nil
  -- ARGs before the first FROM: the only ones a FROM line may use
  local global = {}
  for line in (read(path) .. "\n"):gmatch("(.-)\n") do
    if not line:match("^%s*#") then
      if pending then line = pending .. " " .. line end
      pending = nil
      if line:match("\\%s*$") then
        pending = line:gsub("\\%s*$", "")
      elseif line:match("%S") then
        local op, args = line:match("^%s*(%a+)%s+(.-)%s*$")
        assert(op, "cannot read Dockerfile line: " .. line)
        op = op:upper()
        if op == "FROM" then
          args = args:gsub("%${?([%w_]+)}?", function(k) return global[k] end)
          local image, name = args:match("^(%S+)%s+[Aa][Ss]%s+(%S+)$")
          stages[#stages + 1] = { from = image or args, name = name, ins = {} }
        elseif op == "ARG" and #stages == 0 then
          local k, v = args:match("^([%w_]+)=(%S+)$")
          assert(k, "a global ARG needs a default: " .. args)
          global[k] = v
        else
          assert(#stages > 0, op .. " before FROM")
          table.insert(stages[#stages].ins, { op = op, args = args })
        end
      end
    end
  end
  return stages
end

local function instructions(stage, op)
  local t = {}
  for _, i in ipairs(stage.ins) do
    if i.op == op then t[#t + 1] = i.args end
  end
  return t
end

--- The Debian packages the stage's RUN lines install with apt-get.
local function apt_packages(stage)
  local pkgs = {}
  for _, run in ipairs(instructions(stage, "RUN")) do
    for seg in (run .. "&&"):gmatch("(.-)&&") do
      local rest = seg:match("apt%-get%s+install%s+(.*)$")
      if rest then
        for _, w in ipairs(words(rest)) do
          if not w:match("^%-") then pkgs[#pkgs + 1] = w end
        end
      end
    end
  end
  return pkgs
end

--- COPY instructions of a stage: {from = stage or nil, sources = {...}, dest = path}.
local function copies(stage)
  local t = {}
  for _, args in ipairs(instructions(stage, "COPY")) do
    local c = { sources = {} }
    local ws = words(args)
    for i, w in ipairs(ws) do
      if w:match("^%-%-from=") then
        c.from = w:match("^%-%-from=(.*)$")
      elseif not w:match("^%-%-") then
        if i == #ws then c.dest = w else c.sources[#c.sources + 1] = w end
      end
    end
    t[#t + 1] = c
  end
  return t
end

local function exec_form(s)
  assert(s and s:match("^%["), "not exec form: " .. tostring(s))
  return cjson.decode(s)
end

--- The words of a Makefile variable assigned on one line (`NAME := a b $(OTHER) c`).
local function make_var(name)
  local value = read("Makefile"):match("\n" .. name .. "%s*:?=%s*([^\n]*)")
  assert(value, "Makefile has no " .. name)
  local t = {}
  for _, w in ipairs(words(value)) do
    if not w:match("^%$") and w ~= "\\" then t[#t + 1] = w end
  end
  return t
end

--- Every package reachable from `pkgs` through Depends and Pre-Depends (what apt-get install
-- --no-install-recommends pulls in, alternatives included).
local function depends_closure(pkgs)
  local out, ok = sh("apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts " ..
    "--no-breaks --no-replaces --no-enhances " .. table.concat(pkgs, " "))
  assert(ok, out)
  local closure = {}
  for _, l in ipairs(lines(out)) do
    if not l:match("^%s") then closure[(l:gsub(":%w+$", ""))] = true end
  end
  return closure
end

--- The Debian package that owns a file (merged /usr: tries the /usr and / spellings).
-- The Debian package that owns each path (path -> package; a path nobody owns is left out), in
-- two dpkg -S calls for the lot: each call reads every package's file list, a second or more.
-- A path is tried as it is, resolved, and with /usr added or taken away (merged /usr).
local function owners(paths)
  local function forms(path, real)
    return { path, real, "/usr" .. path, (path:gsub("^/usr/", "/")), "/usr" .. real }
  end
  local quoted = {}
  for i, p in ipairs(paths) do quoted[i] = q(p) end
  local reals = #paths > 0 and lines(sh("realpath -m " .. table.concat(quoted, " "))) or {}
  local ask, asked = {}, {}
  for i, p in ipairs(paths) do
    for _, f in ipairs(forms(p, reals[i] or p)) do
      if not asked[f] then asked[f] = true; ask[#ask + 1] = q(f) end
    end
  end
  local found = {}
  -- dpkg -S prints "pkg[, pkg...]: path" for each owned path (and fails for the rest)
  for _, l in ipairs(lines(sh("dpkg -S " .. table.concat(ask, " ") .. " 2>/dev/null; true"))) do
    local pkg, path = l:match("^([^:,]+).-: (/.*)$")
    if pkg and not found[path] then found[path] = pkg end
  end
  local out = {}
  for i, p in ipairs(paths) do
    for _, f in ipairs(forms(p, reals[i] or p)) do
      if found[f] then out[p] = found[f] break end
    end
  end
  return out
end

---------------------------------------------------------------------------------------------
describe("the Kubernetes manifests", function()
  it("parse, and every object has apiVersion, kind and metadata.name", function()
    for _, f in ipairs(yaml_files()) do
      local docs = yaml_docs(f)
      assert.is_true(#docs >= 1, f .. " has no document")
      for i, d in ipairs(docs) do
        local where = f .. " document " .. i
        assert.is_string(d.apiVersion, where .. ": apiVersion")
        assert.is_string(d.kind, where .. ": kind")
        if d.kind ~= "Kustomization" then
          assert.is_table(d.metadata, where .. ": metadata")
          assert.is_string(d.metadata.name, where .. ": metadata.name")
        end
      end
    end
  end)

  it("kustomization.yaml lists every manifest but the secret example, and the policy it generates", function()
    local k = yaml_docs("deploy/k8s/kustomization.yaml")[1]
    assert.are.equal("Kustomization", k.kind)
    local listed = set(k.resources)
    for _, f in ipairs(lines(sh("cd deploy/k8s && ls -1 *.yaml"))) do
      if f == "kustomization.yaml" then
        assert.is_nil(listed[f])
      elseif f == "secret.example.yaml" then
        -- a placeholder token must never be applied by `kubectl apply -k`
        assert.is_nil(listed[f], "the secret example must not be applied")
      else
        assert.is_true(listed[f], f .. " is not in kustomization.yaml")
      end
    end
    for r in pairs(listed) do assert.is_true(exists("deploy/k8s/" .. r), r) end
    local gen = k.configMapGenerator[1]
    assert.are.equal("corral-policy", gen.name)
    for _, f in ipairs(gen.files) do assert.is_true(exists("deploy/k8s/" .. f), f) end
    local secret = find(yaml_docs("deploy/k8s/secret.example.yaml"), "Secret", "corral-token")
    assert.is_truthy(secret.stringData.token:find("REPLACE", 1, true), "the example token must be a placeholder")
  end)

  -- the pods: the Deployment's template, and the agent pod
  local workloads = {
    { file = "deploy/k8s/deployment.yaml", kind = "Deployment",
      pod = function(d) return d.spec.template.spec, d.spec.template.metadata.labels end },
    { file = "deploy/k8s-agent-pod.yaml", kind = "Pod",
      pod = function(d) return d.spec, d.metadata.labels end },
  }
  for _, w in ipairs(workloads) do
    it("the " .. w.kind .. " in " .. w.file .. " runs as uid 10001 with a read-only root, no privilege, no capability, a seccomp profile, limits and an in-memory /tmp", function()
      local d = find(yaml_docs(w.file), w.kind)
      assert.is_table(d, w.kind)
      local spec = w.pod(d)
      assert.is_false(spec.automountServiceAccountToken, "automountServiceAccountToken")
      assert.is_false(spec.enableServiceLinks, "enableServiceLinks")
      for _, k in ipairs({ "hostNetwork", "hostPID", "hostIPC" }) do assert.is_not_true(spec[k], k) end
      local psc = spec.securityContext
      assert.is_true(psc.runAsNonRoot, "pod runAsNonRoot")
      assert.are.equal(10001, psc.runAsUser, "pod runAsUser (the image's USER)")
      assert.is_truthy(({ RuntimeDefault = true, Localhost = true })[psc.seccompProfile.type], "pod seccompProfile")
      local volumes = {}
      for _, v in ipairs(spec.volumes) do volumes[v.name] = v end
      for _, c in ipairs(spec.containers) do
        local sc = c.securityContext
        local where = w.kind .. " container " .. c.name .. ": "
        assert.is_true(sc.runAsNonRoot, where .. "runAsNonRoot")
        assert.are.equal(10001, sc.runAsUser or psc.runAsUser, where .. "runAsUser")
        assert.is_true(sc.readOnlyRootFilesystem, where .. "readOnlyRootFilesystem")
        assert.is_false(sc.allowPrivilegeEscalation, where .. "allowPrivilegeEscalation")
        assert.is_not_true(sc.privileged, where .. "privileged")
        assert.are.same({ "ALL" }, sc.capabilities.drop, where .. "capabilities.drop")
        assert.is_nil(sc.capabilities.add, where .. "capabilities.add")
        assert.is_truthy(({ RuntimeDefault = true, Localhost = true })[(sc.seccompProfile or psc.seccompProfile).type],
          where .. "seccompProfile")
        for _, kind in ipairs({ "requests", "limits" }) do
          assert.is_truthy(c.resources[kind].cpu, where .. kind .. ".cpu")
          assert.is_truthy(c.resources[kind].memory, where .. kind .. ".memory")
        end
        local tmp
        for _, m in ipairs(c.volumeMounts) do
          if m.mountPath == "/tmp" then tmp = volumes[m.name] end
        end
        assert.is_table(tmp, where .. "/tmp is a volume (the root is read-only)")
        assert.are.equal("Memory", tmp.emptyDir.medium, where .. "/tmp in memory")
        assert.is_truthy(tmp.emptyDir.sizeLimit, where .. "/tmp has a sizeLimit")
      end
    end)
  end

  it("the controllers listen on 0.0.0.0:8080 with the Secret's token, and the Service and probes use that port", function()
    local d = find(yaml_docs("deploy/k8s/deployment.yaml"), "Deployment", "corral")
    local c = d.spec.template.spec.containers[1]
    local args = table.concat(c.args, " ")
    assert.is_truthy(args:match("^serve "), args)
    assert.is_truthy(args:find("--listen 0.0.0.0:8080", 1, true), args)
    assert.are.equal(8080, c.ports[1].containerPort)
    assert.are.equal("http", c.ports[1].name)
    local token
    for _, e in ipairs(c.env) do if e.name == "CORRAL_TOKEN" then token = e.valueFrom.secretKeyRef end end
    assert.is_table(token, "CORRAL_TOKEN from a Secret")
    local secret = find(yaml_docs("deploy/k8s/secret.example.yaml"), "Secret")
    assert.are.equal(secret.metadata.name, token.name)
    assert.is_string(secret.stringData[token.key])
    assert.is_not_true(token.optional, "the pod must not start without its token")
    -- the Service: ClusterIP on 8080 to the named port, selecting the controllers
    local svc = find(yaml_docs("deploy/k8s/service.yaml"), "Service", "corral")
    assert.are.equal("ClusterIP", svc.spec.type)
    assert.are.equal(8080, svc.spec.ports[1].port)
    assert.are.equal("http", svc.spec.ports[1].targetPort)
    assert.is_true(selects(svc.spec.selector, d.spec.template.metadata.labels), "Service selector")
    assert.is_true(selects(d.spec.selector.matchLabels, d.spec.template.metadata.labels), "Deployment selector")
    assert.is_nil(d.spec.replicas, "replicas belongs to the HPA")
  end)

  it("the readiness and liveness probes GET /healthz on the controller's port, without a token", function()
    local d = find(yaml_docs("deploy/k8s/deployment.yaml"), "Deployment", "corral")
    local c = d.spec.template.spec.containers[1]
    for _, name in ipairs({ "readinessProbe", "livenessProbe" }) do
      local p = c[name]
      assert.is_table(p, name)
      assert.are.equal("/healthz", p.httpGet.path, name)
      assert.are.equal("http", p.httpGet.port, name)
      -- /healthz is exempt from auth in the controller: a probe carries no header
      assert.is_nil(p.httpGet.httpHeaders, name .. " sends no Authorization header")
    end
    assert.is_nil(c.lifecycle, "no preStop: SIGTERM drains")
  end)

  it("terminationGracePeriodSeconds outlasts the longest run the policy allows, and the memory limit holds --concurrency runs at their largest", function()
    local d = find(yaml_docs("deploy/k8s/deployment.yaml"), "Deployment", "corral")
    local spec = d.spec.template.spec
    local c = spec.containers[1]
    local args = table.concat(c.args, " ")
    local path = args:match("%-%-policy (%S+)")
    assert.are.equal("/etc/corral/policy.lua", path)
    -- the policy is mounted from the generated ConfigMap, and loads as corral would load it
    local mounted
    for _, m in ipairs(c.volumeMounts) do if path:sub(1, #m.mountPath + 1) == m.mountPath .. "/" then mounted = m end end
    assert.is_table(mounted, "the policy's directory is mounted")
    for _, v in ipairs(spec.volumes) do
      if v.name == mounted.name then assert.are.equal("corral-policy", v.configMap.name) end
    end
    local p = policy.load("deploy/k8s/policy.lua")
    local timeout = p.maxima.timeout
    assert.is_number(timeout, "the policy bounds the timeout")
    assert.is_true(spec.terminationGracePeriodSeconds > timeout + 2 * p.grace + 5,
      "terminationGracePeriodSeconds " .. spec.terminationGracePeriodSeconds .. " vs maxima.timeout " .. timeout)
    -- memory: each run at its largest holds memory_mb, its tmpfs mounts and its work dir
    local per_run = p.maxima.memory_mb + (p.work_mb or 0)
    for _, size in pairs(p.tmpfs or {}) do per_run = per_run + size end
    local concurrency = tonumber(args:match("%-%-concurrency (%d+)"))
    assert.is_number(concurrency, "--concurrency")
    local tmp_mb
    for _, v in ipairs(spec.volumes) do if v.name == "tmp" then tmp_mb = mib(v.emptyDir.sizeLimit) end end
    local need = concurrency * per_run + tmp_mb + 64   -- + 64 MiB for the controller itself
    assert.is_true(mib(c.resources.limits.memory) >= need,
      "memory limit " .. c.resources.limits.memory .. " < " .. need .. " MiB needed")
  end)

  it("the HPA scales the Deployment on CPU between 2 and 10", function()
    local hpa = find(yaml_docs("deploy/k8s/hpa.yaml"), "HorizontalPodAutoscaler")
    assert.are.equal("autoscaling/v2", hpa.apiVersion)
    assert.are.equal(2, hpa.spec.minReplicas)
    assert.are.equal(10, hpa.spec.maxReplicas)
    assert.are.same({ apiVersion = "apps/v1", kind = "Deployment", name = "corral" }, hpa.spec.scaleTargetRef)
    assert.are.equal("cpu", hpa.spec.metrics[1].resource.name)
    local d = find(yaml_docs("deploy/k8s/deployment.yaml"), "Deployment")
    assert.is_truthy(d.spec.template.spec.containers[1].resources.requests.cpu, "utilization needs a CPU request")
  end)

  it("the NetworkPolicies deny all egress, the agent's all ingress, and the controllers' admit only the gateway pods on 8080", function()
    local cases = {
      { file = "deploy/k8s/networkpolicy.yaml", workload = "deploy/k8s/deployment.yaml", kind = "Deployment" },
      { file = "deploy/k8s-agent-pod.yaml", workload = "deploy/k8s-agent-pod.yaml", kind = "Pod" },
    }
    for _, case in ipairs(cases) do
      local np = find(yaml_docs(case.file), "NetworkPolicy")
      assert.is_table(np, case.file .. ": a NetworkPolicy")
      local types = set(np.spec.policyTypes)
      assert.is_true(types.Egress, case.file .. ": policyTypes Egress")
      assert.is_true(types.Ingress, case.file .. ": policyTypes Ingress")
      assert.is_true(np.spec.egress == nil or #np.spec.egress == 0, case.file .. ": no egress rule")
      local w = find(yaml_docs(case.workload), case.kind)
      local labels = case.kind == "Pod" and w.metadata.labels or w.spec.template.metadata.labels
      assert.is_true(selects(np.spec.podSelector.matchLabels, labels), case.file .. ": selects the pods")
    end
    local np = find(yaml_docs("deploy/k8s/networkpolicy.yaml"), "NetworkPolicy")
    assert.are.equal(1, #np.spec.ingress)
    local rule = np.spec.ingress[1]
    assert.are.same({ { podSelector = { matchLabels = { ["corral/gateway"] = "true" } } } }, rule.from)
    assert.are.same({ { protocol = "TCP", port = 8080 } }, rule.ports)
    local agent = find(yaml_docs("deploy/k8s-agent-pod.yaml"), "NetworkPolicy")
    assert.is_true(agent.spec.ingress == nil or #agent.spec.ingress == 0, "agent: no ingress rule")
  end)

  it("the agent pod never restarts, has a deadline, and its task runs under corral with the pod's arguments", function()
    local docs = yaml_docs("deploy/k8s-agent-pod.yaml")
    local pod = find(docs, "Pod", "corral-agent")
    assert.are.equal("Never", pod.spec.restartPolicy)
    assert.is_number(pod.spec.activeDeadlineSeconds)
    -- the NetworkPolicy is created before the pod
    local order = {}
    for i, d in ipairs(docs) do order[d.kind] = i end
    assert.is_true(order.NetworkPolicy < order.Pod, "NetworkPolicy before the Pod")
    local c = pod.spec.containers[1]
    assert.are.equal("run", c.args[1])
    assert.are.equal("/task/main.py", c.args[#c.args])
    local cm = find(docs, "ConfigMap", "corral-agent-task")
    local dir = tmpdir()
    finally(function() sh("rm -rf " .. q(dir)) end)
    local f = assert(io.open(dir .. "/main.py", "w"))
    f:write(cm.data["main.py"])
    f:close()
    local argv = {}
    for i = 1, #c.args - 1 do argv[#argv + 1] = q(c.args[i]) end
    local out, ok = sh(H.cli .. " " .. table.concat(argv, " ") .. " " .. q(dir .. "/main.py"))
    assert.is_true(ok == true, out)
    local r = cjson.decode(out)
    assert.is_true(r.ok, out)
    assert.is_truthy(r.stdout:find("in the sandbox\n285\n", 1, true), r.stdout)
  end)
end)

---------------------------------------------------------------------------------------------
describe("deploy/docker-sandbox.sh", function()
  local SCRIPT = "deploy/docker-sandbox.sh"
  -- a stub Docker client: records `run`'s arguments and standard input, answers `info`, logs `rm`
  local STUB = [[#!/bin/sh
d=${STUB_DIR:?}
case $1 in
  info) echo "${STUB_RUNTIMES:-runc}"; exit 0 ;;
  rm) echo "$*" >> "$d/rm"; exit 0 ;;
  run) printf '%s\n' "$@" > "$d/args"; cat > "$d/stdin"
       [ -n "${STUB_SLEEP:-}" ] && exec sleep "$STUB_SLEEP"
       printf '%s' "${STUB_OUT:-}"; exit "${STUB_EXIT:-0}" ;;
esac
exit 99
]]
  local dir
  before_each(function()
    dir = tmpdir()
    local f = assert(io.open(dir .. "/docker", "w"))
    f:write(STUB)
    f:close()
    sh("chmod 0755 " .. q(dir .. "/docker") .. " && echo 'print(6 * 7)' > " .. q(dir .. "/prog.py"))
  end)
  after_each(function() sh("rm -rf " .. q(dir)) end)

  --- Run the script with the stub; returns exit status, output (stdout+stderr), run's argv.
  local function sandbox(args, env)
    local out = sh("env DOCKER=" .. q(dir .. "/docker") .. " STUB_DIR=" .. q(dir) .. " " .. (env or "") ..
      " bash " .. SCRIPT .. " " .. args .. " < /dev/null; echo \"rc=$?\"")
    local rc = tonumber(out:match("rc=(%d+)$"))
    local argv = exists(dir .. "/args") and lines(read(dir .. "/args")) or {}
    sh("rm -f " .. q(dir .. "/args"))
    return rc, out:gsub("\n?rc=%d+$", ""), argv
  end

  local function index(list, value, from)
    for i = from or 1, #list do if list[i] == value then return i end end
    return nil
  end

  it("passes bash -n and shellcheck, as every deploy/*.sh must", function()
    local scripts = lines(sh("ls -1 deploy/*.sh"))
    assert.is_true(#scripts >= 1)
    for _, s in ipairs(scripts) do
      local out, ok = sh("bash -n " .. q(s))
      assert.is_true(ok == true, s .. ": " .. out)
      out, ok = sh("shellcheck " .. q(s))
      assert.is_true(ok == true, s .. ": " .. out)
      assert.is_truthy(read(s):find("\nset %-euo pipefail\n"), s .. ": strict mode")
    end
  end)

  it("runs the program in a locked-down throwaway container, sent on its standard input", function()
    local rc, out, argv = sandbox(q(dir .. "/prog.py"))
    assert.are.equal(0, rc, out)
    assert.are.equal("run", argv[1])
    local image = index(argv, "corral:latest")
    assert.is_number(image, table.concat(argv, " "))
    local opts = table.concat(argv, " ", 1, image - 1) .. " "
    for _, flag in ipairs({ "--rm ", "-i ", "--pull never ", "--network none ", "--read-only ",
                            "--tmpfs /tmp:size=64m ", "--memory 768m ", "--memory-swap 768m ",
                            "--pids-limit 128 ", "--cpus 1 ", "--cap-drop ALL ",
                            "--security-opt no-new-privileges ", "--user 65534:65534 ",
                            "--no-healthcheck " }) do
      assert.is_truthy(opts:find(" " .. flag, 1, true), flag .. " missing in: " .. opts)
    end
    assert.is_falsy(opts:find("%-v ") or opts:find("%-%-volume") or opts:find("%-%-mount"), "no host mount")
    assert.is_falsy(opts:find("--runtime", 1, true), "no runtime unless asked")
    -- after the image: corral's own arguments, the program on stdin
    assert.are.same({ "run", "--timeout", "5", "--json", "-" }, { table.unpack(argv, image + 1) })
    assert.are.equal("print(6 * 7)\n", read(dir .. "/stdin"))
  end)

  it("passes corral's limits, the container's and the profiles through", function()
    local rc, out, argv = sandbox("--timeout 2.5 --cpu 1 --memory 64 --processes 8 --max-output 100 " ..
      "--policy bwrap --text --container-memory 1g --container-pids 64 --container-cpus 0.5 " ..
      "--gvisor --seccomp-profile deploy/k8s/seccomp-corral.json --apparmor unconfined " .. q(dir .. "/prog.py"),
      "STUB_RUNTIMES='runc runsc'")
    assert.are.equal(0, rc, out)
    local all = " " .. table.concat(argv, " ") .. " "
    for _, s in ipairs({ " --memory 1g ", " --pids-limit 64 ", " --cpus 0.5 ",
                         " -e CORRAL_POLICY_PATH=/usr/local/share/corral/one-tenant --runtime runsc ",
                         " --security-opt seccomp=deploy/k8s/seccomp-corral.json ",
                         " --security-opt apparmor=unconfined ",
                         " corral:latest run --timeout 2.5 --cpu 1 --memory 64 --processes 8 --max-output 100 --policy bwrap - " }) do
      assert.is_truthy(all:find(s, 1, true), s .. " missing in: " .. all)
    end
    assert.is_falsy(all:find("--json", 1, true), "--text prints the program's output")
  end)

  it("refuses bad usage with exit 2 and a message naming the problem, before calling Docker", function()
    local cases = {
      { "", "missing FILE" },
      { "--frob x.py", "unknown option '--frob'" },
      { "--timeout", "option --timeout needs a value" },
      { "--timeout -1 x.py", "--timeout must be a positive number" },
      { "--timeout 0 x.py", "--timeout must be a positive number" },
      { "--memory 1.5 x.py", "--memory must be a positive integer" },
      { "--container-memory lots x.py", "--container-memory must be a size" },
      { "--policy ../x x.py", "--policy takes the name of a policy" },
      { "--seccomp-profile /nonexistent x.py", "--seccomp-profile: cannot read" },
      { "/nonexistent/prog.py", "no such file" },
      { q(dir .. "/prog.py") .. " other.py", "only one FILE" },
    }
    for _, case in ipairs(cases) do
      local rc, out, argv = sandbox(case[1])
      assert.are.equal(2, rc, case[1] .. ": " .. out)
      assert.is_truthy(out:find(case[2], 1, true), case[1] .. ": " .. out)
      assert.are.equal(0, #argv, case[1] .. ": Docker was called")
    end
    local rc, out = sandbox("--help")
    assert.are.equal(0, rc)
    assert.is_truthy(out:find("usage: docker-sandbox.sh [OPTIONS] FILE|-", 1, true), out)
  end)

  it("exits as corral did inside the container, and prints its result", function()
    for _, code in ipairs({ 0, 1, 2, 124, 125, 137 }) do
      local rc, out = sandbox(q(dir .. "/prog.py"), "STUB_EXIT=" .. code .. " STUB_OUT='{\"ok\":false}'")
      assert.are.equal(code, rc, out)
      assert.are.equal('{"ok":false}', out)
    end
  end)

  it("kills a container that outlives --timeout + --start-grace, and exits 124", function()
    local t0 = tonumber((sh("date +%s.%N")))
    local rc, out = sandbox("--timeout 0.2 --start-grace 0.3 " .. q(dir .. "/prog.py"), "STUB_SLEEP=30")
    local elapsed = tonumber((sh("date +%s.%N"))) - t0
    assert.are.equal(124, rc, out)
    assert.is_true(elapsed < 5, "took " .. elapsed .. " s")
    assert.is_truthy(out:find("no result within 0.500 s", 1, true), out)
    local name = out:match("container (corral%-sandbox%-%d+%-%d+) killed")
    assert.is_string(name, out)
    assert.is_truthy(read(dir .. "/rm"):find("rm -f " .. name, 1, true))
  end)

  it("fails with 125 when Docker lacks the runtime asked for, or is not installed", function()
    local rc, out, argv = sandbox("--gvisor " .. q(dir .. "/prog.py"), "STUB_RUNTIMES='runc'")
    assert.are.equal(125, rc, out)
    assert.is_truthy(out:find("Docker has no runtime 'runsc'", 1, true), out)
    assert.are.equal(0, #argv)
    out = sh("env DOCKER=/nonexistent/docker bash " .. SCRIPT .. " " .. q(dir .. "/prog.py") .. "; echo rc=$?")
    assert.is_truthy(out:find("is not installed", 1, true), out)
    assert.is_truthy(out:match("rc=125$"), out)
  end)
end)

---------------------------------------------------------------------------------------------
describe("deploy/Dockerfile", function()
  local df = dockerfile("deploy/Dockerfile")
  local build, final = df[1], df[#df]

  -- The build stage replayed without Docker: the context (the tree minus the .dockerignore),
  -- each COPY of the build stage into a WORKDIR, each RUN but apt-get's there, /out in a temp dir.
  local tree
  local function image_tree()
    if tree then return tree end
    local tmp = tmpdir()
    tree = { tmp = tmp, src = tmp .. "/src", out = tmp .. "/out" }
    local ctx = tmp .. "/context"
    local copy_ctx = "import fnmatch, os, shutil, sys\n" ..
      "root, dest, ignore = sys.argv[1:4]\n" ..
      "pats = [l.strip().rstrip('/') for l in open(ignore) if l.strip() and not l.startswith('#')]\n" ..
      "def ignored(rel):\n" ..
      "    parts = rel.split('/')\n" ..
      "    for i in range(1, len(parts) + 1):\n" ..
      "        sub = '/'.join(parts[:i])\n" ..
      "        for p in pats:\n" ..
      "            if fnmatch.fnmatchcase(sub, p) or (p.startswith('**/') and fnmatch.fnmatchcase(parts[i - 1], p[3:])):\n" ..
      "                return True\n" ..
      "    return False\n" ..
      "for d, dirs, files in os.walk(root):\n" ..
      "    rel = os.path.relpath(d, root)\n" ..
      "    rel = '' if rel == '.' else rel + '/'\n" ..
      "    dirs[:] = [x for x in dirs if not ignored(rel + x)]\n" ..
      "    os.makedirs(os.path.join(dest, rel), exist_ok=True)\n" ..
      "    for f in files:\n" ..
      "        if not ignored(rel + f):\n" ..
      "            shutil.copy2(os.path.join(d, f), os.path.join(dest, rel + f), follow_symlinks=False)\n"
    local out, ok = sh(PY .. " -c " .. q(copy_ctx) .. " . " .. q(ctx) .. " deploy/Dockerfile.dockerignore")
    assert(ok, out)
    local workdir = instructions(build, "WORKDIR")[1]
    assert(workdir, "the build stage has a WORKDIR")
    sh("mkdir -p " .. q(tree.src))
    for _, c in ipairs(copies(build)) do
      assert(c.from == nil, "the build stage copies from the context only")
      local dest = c.dest:gsub("^%./", ""):gsub("^" .. workdir:gsub("%p", "%%%0") .. "/?", "")
      for _, s in ipairs(c.sources) do
        local from = ctx .. "/" .. s:gsub("/$", "")
        assert(exists(from), "COPY " .. s .. ": not in the build context")
        local target = tree.src .. "/" .. dest
        out, ok = sh("mkdir -p " .. q(target) .. " && if [ -d " .. q(from) .. " ]; then cp -a " .. q(from) ..
          "/. " .. q(target) .. "; else cp -a " .. q(from) .. " " .. q(target) .. "; fi")
        assert(ok, out)
      end
    end
    for _, run in ipairs(instructions(build, "RUN")) do
      if not run:find("apt-get", 1, true) then
        local cmd = run:gsub("DESTDIR=/out", "DESTDIR=" .. tree.out)
        out, ok = sh("cd " .. q(tree.src) .. " && (" .. cmd .. ") > build.log 2>&1 || { tail -30 build.log; exit 1; }")
        assert(ok, "RUN " .. run .. " failed:\n" .. out)
      end
    end
    return tree
  end
  lazy_teardown(function()
    if tree then sh("rm -rf " .. q(tree.tmp)) end
  end)

  it("builds offline and behind a mirror: no syntax directive, the base image a build argument", function()
    local text = read("deploy/Dockerfile")
    -- `# syntax=` makes BuildKit fetch its frontend image from a registry before anything else
    assert.is_falsy(text:match("^%s*#%s*syntax%s*=") or text:match("\n%s*#%s*syntax%s*="), "a # syntax= directive")
    assert.is_truthy(text:match("\nARG BASE=debian:bookworm%-slim\n"), "ARG BASE=debian:bookworm-slim before the first FROM")
    local froms = {}
    for from in text:gmatch("\nFROM (%S+)") do froms[#froms + 1] = from end
    assert.are.same({ "${BASE}", "${BASE}" }, froms)
  end)

  it("builds on debian:bookworm-slim in two stages, and runs as uid 10001 through tini and corral", function()
    assert.are.equal(2, #df)
    for _, s in ipairs(df) do
      assert.is_truthy(s.from:match("^debian:bookworm%-slim$") or s.from:match("^debian:bookworm%-slim@sha256:%x+$")
        or s.from:match("^debian:bookworm$"), s.from)
    end
    assert.are.equal("build", build.name)
    local users = instructions(final, "USER")
    local user = users[#users]
    assert.is_string(user, "the final stage sets USER")
    local uid = user:match("^([^:]+)")
    assert.are.equal("10001", uid)
    assert.are_not.equal("root", uid)
    local entry = exec_form(instructions(final, "ENTRYPOINT")[1])
    assert.are.same({ "/usr/bin/tini", "--", "corral" }, entry)
    local cmd = exec_form(instructions(final, "CMD")[1])
    assert.are.equal("serve", cmd[1])
    for _, e in ipairs(instructions(final, "EXPOSE")) do assert.are.equal("8080", e) end
    -- the image's user is the one the manifests run as
    local d = find(yaml_docs("deploy/k8s/deployment.yaml"), "Deployment")
    assert.are.equal(tonumber(uid), d.spec.template.spec.securityContext.runAsUser)
  end)

  it("installs only packages that exist in Debian 12, no compiler in the final stage", function()
    local all = {}
    for _, s in ipairs(df) do for _, p in ipairs(apt_packages(s)) do all[#all + 1] = p end end
    assert.is_true(#all >= 10, table.concat(all, " "))
    for _, p in ipairs(all) do
      local out, ok = sh("apt-cache show --no-all-versions " .. q(p) .. " 2>&1 | head -3")
      assert.is_true(ok and out:find("Package: " .. p, 1, true) ~= nil,
        p .. " is not a Debian 12 package (or the apt lists are missing: apt-get update): " .. out)
    end
    for _, p in ipairs(apt_packages(final)) do
      assert.is_falsy(p:match("%-dev$") or ({ gcc = 1, make = 1, ["pkg-config"] = 1, cpp = 1 })[p], p .. " in the final stage")
    end
    for _, run in ipairs(instructions(final, "RUN")) do
      if run:find("apt-get install", 1, true) then
        assert.is_truthy(run:find("--no-install-recommends", 1, true))
        assert.is_truthy(run:find("rm -rf /var/lib/apt/lists/*", 1, true))
      end
    end
  end)

  it("installs what the Makefile says building and running need", function()
    local b, r = set(apt_packages(build)), set(apt_packages(final))
    for _, p in ipairs(make_var("BUILD_PKGS")) do assert.is_true(b[p], p .. " (BUILD_PKGS) not in the build stage") end
    local build_pkgs = set(make_var("BUILD_PKGS"))
    for _, p in ipairs(make_var("RUN_PKGS")) do
      if not build_pkgs[p] then assert.is_true(r[p], p .. " (RUN_PKGS) not in the final stage") end
    end
    -- the CLI's interpreter (#!/usr/bin/env lua5.4) and the sandboxed programs' one
    assert.is_true(r["lua5.4"] and r.python3 and r.tini, "lua5.4, python3, tini")
  end)

  it("has, in its build packages and their dependencies, every header the C sources include", function()
    local t = image_tree()
    local closure = depends_closure(apt_packages(build))
    local cmds = sh("cd " .. q(t.src) .. " && make -n -B all"):gsub("\\\n", " ")
    local headers = {}
    for _, l in ipairs(lines(cmds)) do
      if l:match("^%s*cc%s") or l:match("^%s*gcc%s") or l:match("^%s*clang%s") or
          l:match("^%s*%S*musl%-gcc%s") then
        local argv, skip = {}, false
        for _, w in ipairs(words(l)) do
          if skip then skip = false elseif w == "-o" then skip = true else argv[#argv + 1] = w end
        end
        local deps, ok = sh("cd " .. q(t.src) .. " && " .. table.concat(argv, " ") .. " -M")
        assert(ok, deps)
        for path in deps:gmatch("%S+") do
          if path:match("^/") then headers[path] = true end
        end
      end
    end
    assert.is_true(next(headers) ~= nil, "no compile command found")
    local missing = {}
    local paths = keys(headers)
    local owned = owners(paths)
    for _, path in ipairs(paths) do
      local pkg = owned[path]
      if not pkg or not closure[pkg] then missing[#missing + 1] = path .. " (" .. tostring(pkg) .. ")" end
    end
    assert.are.equal("", table.concat(missing, "\n"), "headers from packages the build stage lacks")
  end)

  it("makes, from exactly the files it copies, the tree its final stage copies", function()
    local t = image_tree()
    local lua_mods = lines(sh("cd lua/corral && ls -1 *.lua"))
    local expected = { "bin/corral", "libexec/corral/corral-launch", "lib/lua/5.4/corral/core.so" }
    for _, m in ipairs(lua_mods) do expected[#expected + 1] = "share/lua/5.4/corral/" .. m end
    for _, p in ipairs(lines(sh("cd policies && ls -1 *.lua"))) do expected[#expected + 1] = "share/corral/policies/" .. p end
    for _, f in ipairs(expected) do
      assert.is_true(exists(t.out .. "/usr/local/" .. f), "/usr/local/" .. f .. " not installed")
    end
    assert.are.equal("#!/usr/bin/env lua5.4", read(t.out .. "/usr/local/bin/corral"):match("^[^\n]*"))
    assert.is_truthy(read(t.out .. "/usr/local/share/lua/5.4/corral/paths.lua")
      :find('local INSTALLED_PREFIX = "/usr/local"', 1, true))
    -- every COPY of the final stage: from the build stage's /out, or from the context
    local dests = {}
    for _, c in ipairs(copies(final)) do
      for _, s in ipairs(c.sources) do
        if c.from then
          assert.are.equal("build", c.from)
          assert.is_truthy(s:match("^/out/"), s)
          assert.is_true(exists(t.out .. s:sub(5)), "COPY --from=build " .. s .. ": not made")
        else
          assert.is_true(exists(s), "COPY " .. s .. ": not in the repository")
          assert.is_falsy(sh("grep -qxF " .. q(s) .. " deploy/Dockerfile.dockerignore && echo ignored") == "ignored")
        end
      end
      dests[c.dest] = true
    end
    -- the health check runs a script the image has
    local hc = instructions(final, "HEALTHCHECK")[1]
    local hc_cmd = exec_form(hc:match("CMD%s+(%[.*%])$"))
    assert.are.equal("python3", hc_cmd[1])
    assert.is_true(dests[hc_cmd[#hc_cmd]], hc_cmd[#hc_cmd] .. " is not copied into the image")
    -- the ENTRYPOINT's corral is on the image's PATH
    assert.is_true(dests["/usr/local/"] and exists(t.out .. "/usr/local/bin/corral"))
  end)

  it("has, in its runtime packages and their dependencies, every shared library the built binaries load", function()
    local t = image_tree()
    local closure = depends_closure(apt_packages(final))
    local elves = lines(sh("cd " .. q(t.out) .. " && find . -type f | while read -r f; do " ..
      "[ \"$(head -c 4 \"$f\" | od -An -c | tr -d ' ')\" = '177ELF' ] && echo \"$f\"; done"))
    assert.is_true(#elves >= 2, "ELF files: " .. table.concat(elves, " "))
    local missing, seen, libs = {}, {}, {}
    for _, f in ipairs(elves) do
      local out, ok = sh("ldd " .. q(t.out .. "/" .. f))
      -- a static executable (corral-init) loads no library
      if not ok and out:find("not a dynamic executable", 1, true) then out, ok = "", true end
      assert(ok, out)
      assert.is_falsy(out:find("not found", 1, true), f .. ": " .. out)
      for lib in out:gmatch("=>%s+(/%S+)") do
        if not seen[lib] then
          seen[lib] = f
          libs[#libs + 1] = lib
        end
      end
    end
    local owned = owners(libs)
    for _, lib in ipairs(libs) do
      local pkg = owned[lib]
      if not pkg or not closure[pkg] then missing[#missing + 1] = seen[lib] .. ": " .. lib .. " (" .. tostring(pkg) .. ")" end
    end
    local names = table.concat(keys(seen), " ")
    assert.is_truthy(names:find("libuv.so", 1, true) and names:find("libseccomp.so", 1, true), names)
    assert.are.equal("", table.concat(missing, "\n"), "libraries from packages the final stage lacks")
  end)

  it("gives a CLI that runs a program from the installed tree, away from the sources", function()
    local t = image_tree()
    local L = t.out .. "/usr/local"
    local out = sh("cd / && echo 'print(6 * 7)' | env -i PATH=/usr/bin:/bin" ..
      " LUA_PATH=" .. q(L .. "/share/lua/5.4/?.lua;" .. L .. "/share/lua/5.4/?/init.lua;;") ..
      " LUA_CPATH=" .. q(L .. "/lib/lua/5.4/?.so;;") ..
      " CORRAL_LAUNCH=" .. q(L .. "/libexec/corral/corral-launch") ..
      " CORRAL_POLICY_PATH=" .. q(L .. "/share/corral/policies") ..
      " " .. q(L .. "/bin/corral") .. " run --json -")
    local r = cjson.decode(out)
    assert.is_true(r.ok, out)
    assert.are.equal("42\n", r.stdout)
  end)

  it("has a health check that is healthy on 200 only, over a unix socket and over TCP", function()
    local dir = tmpdir()
    finally(function() sh("rm -rf " .. q(dir)) end)
    -- a fake controller per case: answers GET /healthz with a status, or never answers
    local driver = "import json, os, socket, subprocess, sys, threading, time\n" ..
      "script, d = sys.argv[1], sys.argv[2]\n" ..
      "def serve(srv, status):\n" ..
      "    conn, _ = srv.accept()\n" ..
      "    req = conn.recv(4096)\n" ..
      "    if status:\n" ..
      "        ok = req.startswith(b'GET /healthz HTTP/1.1\\r\\n') and b'authorization' not in req.lower()\n" ..
      "        conn.sendall(b'HTTP/1.1 %d X\\r\\nContent-Length: 0\\r\\n\\r\\n' % (status if ok else 400))\n" ..
      "    else:\n" ..
      "        time.sleep(5)\n" ..
      "    conn.close()\n" ..
      "def case(family, status):\n" ..
      "    if family == 'unix':\n" ..
      "        path = os.path.join(d, 'c%d.sock' % status)\n" ..
      "        srv = socket.socket(socket.AF_UNIX); srv.bind(path); addr = 'unix:' + path\n" ..
      "    else:\n" ..
      "        srv = socket.socket(); srv.bind(('127.0.0.1', 0)); addr = '0.0.0.0:%d' % srv.getsockname()[1]\n" ..
      "    srv.listen(1)\n" ..
      "    threading.Thread(target=serve, args=(srv, status), daemon=True).start()\n" ..
      "    t = time.monotonic()\n" ..
      "    rc = subprocess.run([sys.executable, '-I', script, addr], capture_output=True).returncode\n" ..
      "    return [rc, round(time.monotonic() - t, 1)]\n" ..
      "res = {f + str(s): case(f, s) for f in ('unix', 'tcp') for s in (200, 503, 0)}\n" ..
      "res['absent'] = [subprocess.run([sys.executable, '-I', script, 'unix:' + d + '/none.sock'], capture_output=True).returncode, 0]\n" ..
      "print(json.dumps(res))\n"
    local out, ok = sh(PY .. " -c " .. q(driver) .. " deploy/healthcheck.py " .. q(dir))
    assert.is_true(ok == true, out)
    local r = cjson.decode(out)
    for _, fam in ipairs({ "unix", "tcp" }) do
      assert.are.equal(0, r[fam .. "200"][1], fam .. " 200")
      assert.are.equal(1, r[fam .. "503"][1], fam .. " 503 (draining)")
      assert.are.equal(1, r[fam .. "0"][1], fam .. " no answer")
      assert.is_true(r[fam .. "0"][2] < 4, fam .. ": gave up after " .. r[fam .. "0"][2] .. " s")
    end
    assert.are.equal(1, r.absent[1], "nothing listening")
  end)
end)

---------------------------------------------------------------------------------------------
describe("deploy/k8s/seccomp-corral.json", function()
  local PROFILE = "deploy/k8s/seccomp-corral.json"
  local ADDED = { "unshare", "clone", "mount", "umount2", "pivot_root",
                  "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self" }

  local function profile()
    local out, ok = sh(PY .. " -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' " .. PROFILE)
    assert(ok, PROFILE .. " is not valid JSON: " .. out)
    return cjson.decode(out)
  end

  --- Names a rule allows whatever the arguments.
  local function allowed(p, only_runtime_default)
    local t = {}
    for _, r in ipairs(p.syscalls) do
      if r.action == "SCMP_ACT_ALLOW" and (r.args == nil or #r.args == 0)
        and not (only_runtime_default and r.comment:match("^corral:")) then
        for _, n in ipairs(r.names) do t[n] = true end
      end
    end
    return t
  end

  it("is the runtime default plus corral's rules, each rule saying why", function()
    local p = profile()
    assert.are.equal("SCMP_ACT_ERRNO", p.defaultAction)
    assert.are.equal(1, p.defaultErrnoRet)
    local arches = set(p.architectures)
    assert.is_true(arches.SCMP_ARCH_X86_64 and arches.SCMP_ARCH_AARCH64, "x86_64 and aarch64")
    local added = {}
    for _, r in ipairs(p.syscalls) do
      assert.is_string(r.comment, "every rule has a comment")
      assert.is_truthy(r.comment:match("^runtime default: ") or r.comment:match("^corral: "), r.comment)
      assert.is_true(#r.names > 0)
      if r.comment:match("^corral:") then
        assert.are.equal("SCMP_ACT_ALLOW", r.action)
        for _, n in ipairs(r.names) do added[#added + 1] = n end
      end
      for _, a in ipairs(r.args or {}) do
        -- x86 and arm only: s390's clone takes its flags second, and is not covered
        assert.are.equal(0, a.index, "argument rules check argument 0")
      end
    end
    table.sort(added)
    local want = { table.unpack(ADDED) }
    table.sort(want)
    assert.are.same(want, added)
    -- the runtime default's own clone rules stay: without corral's, clone has no CLONE_NEW*
    local masked, clone3
    for _, r in ipairs(p.syscalls) do
      if r.names[1] == "clone" and r.args then masked = r.args[1] end
      if r.names[1] == "clone3" then clone3 = r end
    end
    assert.are.same({ index = 0, value = 0x7E020000, op = "SCMP_CMP_MASKED_EQ" }, masked)
    assert.are.same({ "SCMP_ACT_ERRNO", 38 }, { clone3.action, clone3.errnoRet })
  end)

  it("allows what the launcher needs and nothing the runtime default keeps from a container without capabilities", function()
    local p = profile()
    local ok = allowed(p)
    for _, n in ipairs({ "unshare", "mount", "umount2", "pivot_root", "landlock_create_ruleset",
                         "landlock_add_rule", "landlock_restrict_self", "prctl", "seccomp", "setresuid",
                         "setresgid", "setgroups", "close_range", "memfd_create", "sched_setaffinity",
                         "signalfd4", "rt_sigtimedwait", "getdents64", "execve", "wait4", "kill", "statfs" }) do
      assert.is_true(ok[n], n .. " is not allowed")
    end
    for _, n in ipairs({ "setns", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load",
                         "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
                         "swapoff", "open_by_handle_at", "userfaultfd", "fsopen", "fsconfig", "fsmount", "fspick",
                         "move_mount", "open_tree", "mount_setattr", "chroot", "acct", "syslog", "settimeofday",
                         "clock_settime", "iopl", "ioperm", "sethostname", "setdomainname", "quotactl",
                         "lookup_dcookie", "kcmp", "pidfd_getfd", "process_madvise", "vhangup", "mbind",
                         "set_mempolicy", "fanotify_init", "nfsservctl", "uselib", "create_module" }) do
      for _, r in ipairs(p.syscalls) do
        assert.is_false(r.action == "SCMP_ACT_ALLOW" and set(r.names)[n] == true, n .. " is allowed")
      end
    end
    local rd = allowed(p, true)
    for _, n in ipairs({ "unshare", "mount", "umount2", "pivot_root" }) do
      assert.is_nil(rd[n], n .. " is corral's addition, not the runtime default's")
    end
  end)

  --- A command under the profile, or under the runtime default; `stdin`: text piped to it.
  local function under(mode, cmd, stdin)
    return sh((stdin and ("printf '%s\\n' " .. q(stdin) .. " | ") or "") ..
      PY .. " spec/seccomp_exec.py " .. PROFILE .. (mode == "default" and " --runtime-default" or "") ..
      " -- " .. cmd)
  end

  it("gives corral its namespaces where the runtime default refuses them, and takes nothing else away", function()
    local base = cjson.decode((sh(H.cli .. " probe --json")))
    local full = cjson.decode((under("corral", H.cli .. " probe --json")))
    local rd = cjson.decode((under("default", H.cli .. " probe --json")))
    for name, c in pairs(base.caps) do
      if c.ok then assert.is_true(full.caps[name].ok, name .. " is refused under the profile") end
    end
    assert.are.equal(base.landlock_abi, full.landlock_abi)
    assert.are.equal(base.landlock_abi, rd.landlock_abi, "the runtime default allows Landlock")
    assert.is_true(rd.caps.seccomp.ok, "corral's own filter loads under the runtime default")
    if not base.caps["user-namespace"].ok then
      pending("this host refuses user namespaces: nothing to compare")
      return
    end
    for _, name in ipairs({ "user-namespace", "userns-pid-namespace", "userns-network-namespace",
                            "pid-namespace", "network-namespace" }) do
      assert.is_false(rd.caps[name].ok, name .. " under the runtime default")
      assert.are.equal("EPERM", rd.caps[name].errno, name)
    end
  end)

  it("starts no program of a launch started ahead before its run came, where the PID namespace is refused", function()
    -- without the namespace the launcher itself must wait for the run's byte: the program
    -- started at once would run before its code is in place
    local marker = os.tmpname()
    os.remove(marker)
    local out = under("default", PY .. " spec/prestart_peer.py csrc/corral-launch " .. q(marker))
    os.remove(marker)
    if not out:find("pid-namespace refused: True", 1, true) then
      pending("the PID namespace is not refused here: " .. out)
      return
    end
    assert.is_truthy(out:find("before the byte: False", 1, true), out)
    assert.is_truthy(out:find("after the byte: True", 1, true), out)
  end)

  it("runs a program with every namespace under the profile, and degraded but contained under the runtime default", function()
    local base = cjson.decode((sh(H.cli .. " probe --json")))
    if not (base.caps["user-namespace"].ok or base.root) then
      pending("this host refuses user namespaces: the profile cannot show them")
      return
    end
    local prog = "import os\nprint(os.getpid())"
    local full_out = under("corral", H.cli .. " run --json -", prog)
    -- without a PID namespace a controller that is not root cannot wall its runs off: the
    -- shipped policies run nothing; deploy/one-tenant's accept it
    local one = "env CORRAL_POLICY_PATH=" .. core.realpath("deploy/one-tenant") .. " "
    local rd_out = under("default", one .. H.cli .. " run --json -", prog)
    if not base.root then
      local refused = cjson.decode((under("default", H.cli .. " run --json -", prog)))
      assert.are.equal("ENOTSUP", refused.error and refused.error.kind, cjson.encode(refused))
    end
    local full, rd = cjson.decode(full_out), cjson.decode(rd_out)
    assert.is_true(full.ok, full_out)
    assert.is_true(rd.ok, rd_out)
    local fl, dl = set(full.limits), set(rd.limits)
    for _, l in ipairs({ "pid-namespace", "no-network", "private-tmp", "work-tmpfs", "private-proc", "seccomp" }) do
      assert.is_true(fl[l], l .. " under the profile: " .. table.concat(full.limits, " "))
    end
    assert.is_true(full.network_isolated)
    -- the program is the first child of its namespace's init
    assert.are.equal("2\n", full.stdout)
    for _, l in ipairs({ "pid-namespace", "no-network", "private-tmp", "work-tmpfs" }) do
      assert.is_nil(dl[l], l .. " under the runtime default")
    end
    -- degraded: what stays without namespaces
    for _, l in ipairs({ "subreaper", "seccomp", "deny-sockets", "unix-pairs-only", "no-new-privs", "budget-cpu", "timeout" }) do
      assert.is_true(dl[l], l .. " under the runtime default: " .. table.concat(rd.limits, " "))
    end
    if base.landlock_abi > 0 then assert.is_true(dl.filesystem, "Landlock under the runtime default") end
    assert.is_false(rd.network_isolated)
    assert.are_not.equal("2\n", rd.stdout, "no PID namespace under the runtime default")
  end)

  -- The same, with /proc as Docker leaves it (spec/docker_proc.sh), as nobody from a copy of
  -- the tree nobody can read: root only, for the mounts.
  local masked_tree
  local function masked(mode, cmd, stdin)
    if not masked_tree then
      masked_tree = H.sh("mktemp -d /tmp/corral-masked.XXXXXX"):gsub("%s+$", "")
      assert(select(2, sh("cp -a bin lua policies csrc " .. q(masked_tree) .. " && mkdir -p " .. q(masked_tree)
        .. "/deploy && cp -a deploy/one-tenant " .. q(masked_tree) .. "/deploy/ && mkdir -p " .. q(masked_tree)
        .. "/spec " .. q(masked_tree) .. "/deploy/k8s && cp spec/seccomp_exec.py spec/docker_proc.sh "
        .. q(masked_tree) .. "/spec/ && cp " .. PROFILE .. " " .. q(masked_tree) .. "/deploy/k8s/ && chmod -R a+rX "
        .. q(masked_tree))))
    end
    return sh("cd " .. q(masked_tree) .. " && " .. (stdin and ("printf '%s\\n' " .. q(stdin) .. " | ") or "")
      .. "unshare -m -p -f --mount-proc --propagation private sh spec/docker_proc.sh " .. PY
      .. " spec/seccomp_exec.py " .. PROFILE .. (mode == "default" and " --runtime-default" or "") .. " -- " .. cmd)
  end
  lazy_teardown(function()
    if masked_tree then sh("rm -rf " .. q(masked_tree)) end
  end)

  it("is what the Deployment runs under, and its policy refuses to serve without the sandbox", function()
    local d = find(yaml_docs("deploy/k8s/deployment.yaml"), "Deployment")
    local pod = d.spec.template.spec
    for _, sc in ipairs({ pod.securityContext, pod.containers[1].securityContext }) do
      assert.are.same({ type = "Localhost", localhostProfile = "profiles/corral.json" }, sc.seccompProfile)
    end
    local p = policy.load("deploy/k8s/policy.lua")
    local req = set(p.require or {})
    for _, l in ipairs({ "user-namespace", "pid-namespace", "no-network", "private-tmp", "work-tmpfs", "seccomp" }) do
      assert.is_true(req[l], "policy.lua requires " .. l)
    end
    -- a protection no host gives: corral serve says what it would enforce, then refuses to start
    local dir = H.sh("mktemp -d /tmp/corral-require.XXXXXX"):gsub("%s+$", "")
    local pol = dir .. "/p.lua"
    local f = assert(io.open(pol, "w"))
    f:write('return require("corral.policy").load("default"):extend { name = "strict", require = { "pid-namespace", "no-such-protection" } }\n')
    f:close()
    local out, okay = sh("timeout 60 " .. H.cli .. " serve --listen unix:" .. dir .. "/s.sock --policy " .. pol .. " 2>&1")
    sh("rm -rf " .. q(dir))
    assert.is_false(okay, out)
    assert.is_truthy(out:find("corral serve: refusing to start: ENOTSUP: policy 'strict' requires", 1, true), out)
    assert.is_truthy(out:find("no-such-protection (not applied)", 1, true), out)
    assert.is_truthy(out:find("protection applied=yes name=seccomp", 1, true), out)
    assert.is_falsy(out:find("listening", 1, true), out)
  end)

  it("runs the bwrap policy under Docker's masked /proc: in bwrap's own PID namespace, or in the launcher's sandbox where bwrap cannot run", function()
    if core.geteuid() ~= 0 then
      pending("replaying a container's /proc needs root (mounts over /proc)")
      return
    end
    local prog = "import os\nprint(os.getpid())"
    -- without the launcher's namespaces RLIMIT_NPROC counts every process of uid nobody on the
    -- machine (other test runs included), and bwrap's clone() fails with EAGAIN past it
    local full_out = masked("corral", H.cli .. " run --processes 4096 --policy bwrap --json -", prog)
    local full = cjson.decode(full_out)
    assert.is_true(full.ok, full_out)
    -- bwrap's pid 1, the relay, then the program
    assert.are.equal("3\n", full.stdout, "the program is the relay's child in bwrap's PID namespace")
    -- a death by signal is one there too, not bwrap's exit 128+N; an exit 139 stays one
    local seg_out = masked("corral", H.cli .. " run --processes 4096 --policy bwrap --json -",
      "import ctypes; ctypes.string_at(0)")
    local seg = cjson.decode(seg_out)
    assert.are.equal(-11, seg.returncode, seg_out)
    assert.are.equal("signal", seg.reason, seg_out)
    local ex = cjson.decode((masked("corral", H.cli .. " run --processes 4096 --policy bwrap --json -",
      "import sys; sys.exit(139)")))
    assert.are.equal(139, ex.returncode)
    assert.are.equal("exit", ex.reason)
    for _, l in ipairs({ "pid-namespace", "no-network", "read-only-root" }) do
      assert.is_true(set(full.limits)[l], l .. " under the profile: " .. table.concat(full.limits, " "))
    end
    -- the default policy's own /proc is refused there, and says so
    local def = cjson.decode((masked("corral", H.cli .. " run --json -", prog)))
    assert.is_true(def.ok)
    assert.is_nil(set(def.limits)["private-proc"])
    assert.are.equal("EPERM", def.refused["private-proc"].errno)
    -- no user namespace for bwrap under the runtime default: the launcher's sandbox instead,
    -- without a PID namespace, which deploy/one-tenant's policies accept
    local base = cjson.decode((sh(H.cli .. " probe --json")))
    local rd_out = masked("default", "env CORRAL_POLICY_PATH=" .. masked_tree .. "/deploy/one-tenant " .. H.cli
      .. " run --policy bwrap --json -", prog)
    local rd = cjson.decode(rd_out)
    assert.is_true(rd.ok, rd_out)
    assert.is_truthy(rd.refused and rd.refused.bwrap, rd_out)
    assert.is_truthy(rd.refused.bwrap.message:find("bwrap: ", 1, true), rd.refused.bwrap.message)
    local rl = set(rd.limits)
    assert.is_nil(rl["read-only-root"], "bwrap's read-only root is not claimed")
    for _, l in ipairs({ "seccomp", "deny-sockets", "unix-pairs-only", "subreaper" }) do
      assert.is_true(rl[l], l .. " in the fallback: " .. table.concat(rd.limits, " "))
    end
    if base.landlock_abi > 0 then assert.is_true(rl.filesystem, "Landlock in the fallback") end
  end)
end)

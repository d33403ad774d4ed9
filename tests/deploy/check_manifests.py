#!/usr/bin/env python3
"""Static checks of the container files and the Kubernetes manifests against
the deployment YAML they implement (deploy/k8s/deploy.yaml) and the programs
this build makes.

  deploy/docker/Dockerfile.*: every COPY source exists and survives the
    .dockerignore; the build targets named exist in this build; the final stage
    runs as a non-root USER whose uid the pods use; the CUDA image runs on a
    CUDA *runtime* base; the CPU image installs the .deb's runtime packages;
    EXPOSE covers the ports the pods open.
  deploy/k8s/: the manifests parse; selectors match their pod labels and every
    Service selects a workload and targets a port it opens; every flag a
    container or probe passes exists in that program's --help; the broker's and
    each worker's arguments are what `mambad up --dry-run` plans for deploy.yaml;
    ports, endpoints, model paths and probe paths agree; GPU pods take one
    nvidia.com/gpu and the CUDA image; CURVE key paths are in the Secret.

usage: check_manifests.py SOURCE_DIR BUILD_DIR
Exit 0 when everything holds, 1 with one line per failure, 77 when PyYAML is
missing (apt-get install python3-yaml)."""
import os
import re
import shlex
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML not found (apt-get install python3-yaml)")
    sys.exit(77)

SRC, BUILD = sys.argv[1], sys.argv[2]
BIN = os.path.join(BUILD, "bin")
K8S = os.path.join(SRC, "deploy", "k8s")
DOCKER = os.path.join(SRC, "deploy", "docker")
failures = []
notes = []


def fail(msg):
    failures.append(msg)


def project_version():
    text = open(os.path.join(SRC, "CMakeLists.txt")).read()
    return re.search(r"project\(mambad VERSION ([0-9.]+)", text).group(1)


# ---- programs and their flags ----------------------------------------------------
_help_cache = {}


def program_help(prog, sub=None):
    """--help text of a built program (stdout + stderr), None when not built."""
    key = (prog, sub)
    if key not in _help_cache:
        path = os.path.join(BIN, prog)
        if not os.access(path, os.X_OK):
            _help_cache[key] = None
        else:
            argv = [path] + ([sub] if sub else []) + ["--help"]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            _help_cache[key] = r.stdout + r.stderr
    return _help_cache[key]


def check_flags(where, argv):
    """Every --flag in argv must appear in its program's --help."""
    prog, rest = argv[0], argv[1:]
    sub = None
    if prog == "mambad" and rest and not rest[0].startswith("-"):
        sub, rest = rest[0], rest[1:]
    text = program_help(prog, sub)
    if text is None:
        notes.append(f"{where}: {prog} is not built here: its flags are not checked")
        return
    for a in rest:
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            if not re.search(re.escape(flag) + r"(?![A-Za-z0-9-])", text):
                fail(f"{where}: {prog}{' ' + sub if sub else ''} has no flag {flag} (see its --help)")


def probe_commands(argv):
    """The mambad command lines inside an exec probe (sh -c strings split)."""
    if argv[:2] == ["sh", "-c"]:
        out = []
        for part in re.split(r"\||&&|;", argv[2]):
            words = shlex.split(part)
            if words and words[0].startswith("mambad"):
                out.append(words)
        return out
    return [argv]


def flag_value(argv, flag):
    for i, a in enumerate(argv[:-1]):
        if a == flag:
            return argv[i + 1]
    return None


def endpoint_port(ep):
    m = re.match(r"tcp://([^:]+):(\d+)$", ep or "")
    return (m.group(1), int(m.group(2))) if m else (None, None)


# ---- Dockerfiles ---------------------------------------------------------------------
def dockerfile_instructions(path):
    """[(stage_index, INSTRUCTION, text)] with continuation lines joined."""
    lines, cur = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        lines.append(cur + line)
        cur = ""
    out, stage = [], -1
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        if word == "FROM":
            stage += 1
        out.append((stage, word, rest.strip()))
    return out


def cmake_targets():
    r = subprocess.run(["cmake", "--build", BUILD, "--target", "help"], capture_output=True,
                       text=True, timeout=60)
    return set(re.findall(r"^\.\.\. ([^\s]+)", r.stdout, re.M)) | set(
        re.findall(r"^([^\s:]+): ", r.stdout, re.M))


def check_dockerfile(name, targets, deb_deps):
    path = os.path.join(DOCKER, name)
    ins = dockerfile_instructions(path)
    ignore = open(path + ".dockerignore").read().split() if os.path.exists(path + ".dockerignore") else []
    allowed = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    last = max(s for s, _, _ in ins)
    args = {}
    for stage, word, rest in ins:
        if word == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v.strip('"')
        if word == "COPY":
            words = shlex.split(rest)
            if any(w.startswith("--from") for w in words):
                continue
            for s in [w for w in words if not w.startswith("--")][:-1]:
                if not os.path.exists(os.path.join(SRC, s)):
                    fail(f"{name}: COPY source {s} does not exist (the context is the repository root)")
                elif allowed and s.rstrip("/").split("/")[0] not in allowed:
                    fail(f"{name}: COPY source {s} is excluded by {name}.dockerignore")
        if word == "RUN":
            for t in re.findall(r"--target\s+(\S+)", rest):
                if not targets:
                    notes.append(f"{name}: this build cannot list its targets: --target {t} not checked")
                elif t not in targets:
                    fail(f"{name}: builds --target {t}, which is not a target of this build")
    froms = [rest for s, w, rest in ins if w == "FROM"]
    users = [rest for s, w, rest in ins if w == "USER" and s == last]
    if not users:
        fail(f"{name}: the final stage sets no USER (it would run as root)")
        uid = None
    else:
        user = users[-1].split(":")[0]
        if user in ("root", "0"):
            fail(f"{name}: the final stage runs as root")
        uid = int(user) if user.isdigit() else None
        if uid is None:
            fail(f"{name}: USER {user}: give a numeric uid so runAsNonRoot can verify it")
    for s, w, rest in ins:
        if w in ("CMD", "ENTRYPOINT") and s == last:
            prog = yaml.safe_load(rest)[0] if rest.startswith("[") else rest.split()[0]
            if not os.path.exists(os.path.join(BIN, prog)):
                fail(f"{name}: {w} runs {prog}, which this build does not make")
    runtime_pkgs = set()
    for s, w, rest in ins:
        if w == "RUN" and s == last:
            m = re.search(r"apt-get install[^&]*", rest)
            if m:
                runtime_pkgs |= {p for p in m.group(0).split() if not p.startswith("-")} - {
                    "apt-get", "install"}
    if "cuda" in name:
        if "devel" not in froms[0]:
            fail(f"{name}: the build stage should use the CUDA devel image ({froms[0]})")
        if "runtime" not in froms[-1]:
            fail(f"{name}: the final stage should use the CUDA runtime image ({froms[-1]})")
    else:
        release = args.get("DEBIAN_RELEASE")
        here = ""
        if os.path.exists("/etc/os-release"):
            m = re.search(r"^VERSION_CODENAME=(\S+)", open("/etc/os-release").read(), re.M)
            here = m.group(1) if m else ""
        if release and release == here and deb_deps:
            for d in deb_deps - {"libc6"}:
                if d not in runtime_pkgs:
                    fail(f"{name}: the runtime stage does not install {d} (a Depends of the .deb)")
        elif deb_deps:
            notes.append(f"{name}: image release {release} is not this host's ({here}): "
                         "runtime packages not compared with the .deb")
    exposed = set()
    for s, w, rest in ins:
        if w == "EXPOSE":
            exposed |= {int(p.split("/")[0]) for p in rest.split()}
    return uid, exposed


# ---- Kubernetes ----------------------------------------------------------------------
def load_k8s():
    docs = {}
    for f in sorted(os.listdir(K8S)):
        if not f.endswith(".yaml") or f == "deploy.yaml":
            continue
        try:
            docs[f] = [d for d in yaml.safe_load_all(open(os.path.join(K8S, f))) if d]
        except yaml.YAMLError as e:
            fail(f"deploy/k8s/{f}: does not parse: {e}")
    return docs


def workloads(docs):
    for f, ds in docs.items():
        for d in ds:
            if d.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
                yield f, d


def dry_run_plan(deploy, tmp):
    """`mambad up --dry-run` on deploy.yaml with model paths made to exist here:
    {"broker": argv, "<worker name>": argv}, and the temp->real path map."""
    cfg = yaml.safe_load(yaml.safe_dump(deploy))
    pathmap = {}
    for i, m in enumerate(cfg.get("models", [])):
        d = os.path.join(tmp, f"model{i}")
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "tokenizer.json"), "w").close()  # so the gateway serves it
        pathmap[d] = m["path"]
        m["path"] = d
    p = os.path.join(tmp, "deploy.yaml")
    with open(p, "w") as f:
        yaml.safe_dump(cfg, f)
    r = subprocess.run([os.path.join(BIN, "mambad-up"), "--config", p, "--dry-run"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fail(f"deploy/k8s/deploy.yaml: mambad up --dry-run rejects it: {r.stderr.strip()}")
        return None, pathmap
    plan = {}
    for line in r.stdout.splitlines():
        argv = shlex.split(line)
        if not argv:
            continue
        if os.path.basename(argv[0]) == "mambad-broker":
            plan["broker"] = argv
        elif os.path.basename(argv[0]) == "mambad-worker":
            plan[flag_value(argv, "--name")] = argv
        elif os.path.basename(argv[0]) == "mambad-gateway":
            plan["gateway"] = argv
    return plan, pathmap


def normalise_args(argv, pathmap, drop=("--connect", "--name", "--device")):
    """argv without the pod-specific flags in drop and with model paths mapped
    back to deploy.yaml's."""
    out, i = [], 1
    while i < len(argv):
        a = argv[i]
        if a in drop:
            i += 2
            continue
        if a == "--model" and i + 1 < len(argv):
            name, _, path = argv[i + 1].partition("=")
            out += [a, f"{name}={pathmap.get(path, path)}"]
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def check_k8s(uid, exposed, version):
    docs = load_k8s()
    deploy = yaml.safe_load(open(os.path.join(K8S, "deploy.yaml")))
    kust = docs.pop("kustomization.yaml", [{}])[0]
    # kustomization: every manifest applied, the ConfigMap made from deploy.yaml.
    manifests = {f for f in docs if not f.endswith(".example.yaml")}
    if set(kust.get("resources", [])) != manifests:
        fail(f"kustomization.yaml resources {sorted(kust.get('resources', []))} != manifests "
             f"{sorted(manifests)}")
    gens = {g["name"]: g.get("files", []) for g in kust.get("configMapGenerator", [])}
    if gens.get("mambad-config") != ["deploy.yaml"]:
        fail("kustomization.yaml: configMapGenerator mambad-config must be made from deploy.yaml")
    images = {i["name"]: i for i in kust.get("images", [])}
    for n in ("mambad", "mambad-cuda"):
        if not str(images.get(n, {}).get("newTag", "")).startswith(version):
            fail(f"kustomization.yaml: image {n} should be tagged {version}-... (the project version)")

    services = [(f, d) for f, ds in docs.items() for d in ds if d.get("kind") == "Service"]
    pods = {}  # workload name -> (file, workload, pod spec, template labels)
    for f, w in workloads(docs):
        name = w["metadata"]["name"]
        tmpl = w["spec"]["template"]
        labels = tmpl["metadata"].get("labels", {})
        sel = w["spec"].get("selector", {}).get("matchLabels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            fail(f"{f}: {name}: selector {sel} does not match its pod labels {labels}")
        for k in ("app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of"):
            if k not in labels:
                fail(f"{f}: {name}: pod labels lack {k}")
        pods[name] = (f, w, tmpl["spec"], labels)

    ports_of = {}  # workload -> {port name: number}
    for name, (f, w, spec, labels) in pods.items():
        sc = spec.get("securityContext", {})
        if sc.get("runAsNonRoot") is not True:
            fail(f"{f}: {name}: runAsNonRoot must be true")
        if uid is not None and sc.get("runAsUser") != uid:
            fail(f"{f}: {name}: runAsUser {sc.get('runAsUser')} is not the image's USER {uid}")
        ports_of[name] = {}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            where = f"{f}: {name}/{c['name']}"
            argv = c.get("command", []) + c.get("args", [])
            if not argv:
                fail(f"{where}: no command")
                continue
            check_flags(where, argv)
            for p in c.get("ports", []):
                ports_of[name][p.get("name")] = p["containerPort"]
                if exposed and p["containerPort"] not in exposed:
                    fail(f"{where}: port {p['containerPort']} is not EXPOSEd by the images")
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                pr = c.get(kind)
                if pr and "exec" in pr:
                    for cmd in probe_commands(pr["exec"]["command"]):
                        check_flags(f"{where} {kind}", cmd)
            if "readinessProbe" not in c:
                fail(f"{where}: no readinessProbe")
            gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            if gpus is not None:
                if int(gpus) != 1:
                    fail(f"{where}: takes {gpus} GPUs: one pod per GPU wants nvidia.com/gpu: 1")
                if flag_value(argv, "--device") != "cuda:0":
                    fail(f"{where}: a one-GPU pod sees its GPU as cuda:0 (--device cuda:0)")
                if c.get("image") != "mambad-cuda":
                    fail(f"{where}: a GPU pod needs the CUDA image (mambad-cuda)")
            elif c.get("image") != "mambad":
                fail(f"{where}: a pod without a GPU uses the CPU image (mambad)")
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            for vname, v in vols.items():
                if v.get("secret", {}).get("secretName") == "mambad-curve":
                    m = mounts.get(vname)
                    if not m or m["mountPath"] != "/etc/mambad/keys" or not m.get("readOnly"):
                        fail(f"{where}: the mambad-curve Secret must be mounted read-only at /etc/mambad/keys")
                    if not v["secret"].get("optional"):
                        fail(f"{where}: the mambad-curve Secret must be optional while curve: false")
            if "mambad-curve" not in {v.get("secret", {}).get("secretName") for v in vols.values()}:
                fail(f"{where}: does not mount the CURVE keys (Secret mambad-curve)")
            # --model NAME=PATH: deploy.yaml's path, under a mounted volume.
            models = {m["name"]: m["path"] for m in deploy.get("models", [])}
            for i, a in enumerate(argv):
                if a == "--model":
                    mname, _, path = argv[i + 1].partition("=")
                    if models.get(mname) != path:
                        fail(f"{where}: --model {argv[i + 1]}: deploy.yaml has {mname}={models.get(mname)}")
                    if not any(path.startswith(m["mountPath"] + "/") for m in c.get("volumeMounts", [])):
                        fail(f"{where}: model path {path} is on no mounted volume")

    # Services select a workload and target ports it opens.
    svc_ports = {}
    for f, s in services:
        sname = s["metadata"]["name"]
        sel = s["spec"].get("selector", {})
        matched = [n for n, (_, _, _, labels) in pods.items()
                   if sel and all(labels.get(k) == v for k, v in sel.items())]
        if not matched:
            fail(f"{f}: Service {sname} selects no pods ({sel})")
        svc_ports[sname] = {}
        for p in s["spec"]["ports"]:
            svc_ports[sname][p["name"]] = p["port"]
            for n in matched:
                tp = p.get("targetPort", p["port"])
                if tp not in ports_of[n] and tp not in ports_of[n].values():
                    fail(f"{f}: Service {sname} port {p['name']} targets {tp}, which {n} does not open")

    broker_ep = deploy["broker"]
    _, clients_port = endpoint_port(broker_ep["clients"].replace("*", "0.0.0.0"))
    _, workers_port = endpoint_port(broker_ep["workers"].replace("*", "0.0.0.0"))
    if svc_ports.get("mambad-broker") != {"clients": clients_port, "workers": workers_port}:
        fail(f"broker.yaml: Service mambad-broker ports {svc_ports.get('mambad-broker')} != "
             f"deploy.yaml's clients {clients_port}, workers {workers_port}")

    # Command lines against `mambad up --dry-run`.
    with tempfile.TemporaryDirectory() as tmp:
        plan, pathmap = dry_run_plan(deploy, tmp)
    if plan is not None:
        f, w, spec, _ = pods["mambad-broker"]
        c = spec["containers"][0]
        got = c["command"] + c["args"]
        if got != ["mambad-broker"] + plan["broker"][1:]:
            fail(f"{f}: broker command line {got} != mambad up's plan {plan['broker']}")
        served = set()
        for name, (f, w, spec, _) in pods.items():
            entry = spec and w["spec"]["template"]["metadata"].get("annotations", {}).get(
                "mambad.dev/deploy-worker")
            if not entry:
                continue
            served.add(entry)
            c = spec["containers"][0]
            got = c["command"] + c["args"]
            if entry not in plan:
                fail(f"{f}: {name} runs deploy.yaml worker '{entry}', which deploy.yaml does not list")
                continue
            if normalise_args(got, {}) != normalise_args(plan[entry], pathmap):
                fail(f"{f}: {name}: worker flags {normalise_args(got, {})} != mambad up's plan for "
                     f"'{entry}' {normalise_args(plan[entry], pathmap)}")
            dev = next(x["device"] for x in deploy["workers"] if x["name"] == entry)
            if flag_value(got, "--device") != dev:
                fail(f"{f}: {name}: --device {flag_value(got, '--device')} != deploy.yaml's {dev}")
            host, port = endpoint_port(flag_value(got, "--connect"))
            if host != "mambad-broker" or port != svc_ports.get("mambad-broker", {}).get("workers"):
                fail(f"{f}: {name}: --connect {flag_value(got, '--connect')} is not the broker "
                     f"Service's workers port (tcp://mambad-broker:{workers_port})")
            if flag_value(got, "--name") != "$(POD_NAME)":
                fail(f"{f}: {name}: --name should be $(POD_NAME) (one name per pod)")
        for x in deploy["workers"]:
            if x["name"] not in served:
                fail(f"deploy.yaml: worker '{x['name']}' is run by no workload")

    # The gateway: mambad up's plan, broker clients port, http.listen, probe paths.
    if "mambad-gateway" in pods:
        f, w, spec, _ = pods["mambad-gateway"]
        c = spec["containers"][0]
        argv = c["command"] + c["args"]
        if plan is not None and "http" in deploy:
            if "gateway" not in plan:
                fail("deploy/k8s/deploy.yaml: mambad up --dry-run plans no gateway for its http: section")
            elif normalise_args(argv, {}, ("--connect",)) != normalise_args(plan["gateway"], pathmap, ("--connect",)):
                fail(f"{f}: gateway flags {normalise_args(argv, {}, ('--connect',))} != mambad up's plan "
                     f"{normalise_args(plan['gateway'], pathmap, ('--connect',))}")
        host, port = endpoint_port(flag_value(argv, "--connect"))
        if host != "mambad-broker" or port != clients_port:
            fail(f"{f}: gateway --connect {flag_value(argv, '--connect')} is not tcp://mambad-broker:{clients_port}")
        listen = deploy.get("http", {}).get("listen", "")
        if flag_value(argv, "--listen") != listen:
            fail(f"{f}: gateway --listen {flag_value(argv, '--listen')} != deploy.yaml http.listen {listen}")
        lport = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
        if ports_of["mambad-gateway"].get("http") != lport:
            fail(f"{f}: gateway containerPort http {ports_of['mambad-gateway'].get('http')} != listen port {lport}")
        want = {"livenessProbe": "/health/live", "readinessProbe": "/health/ready"}
        text = program_help("mambad-gateway")
        for kind, path in want.items():
            got = c.get(kind, {}).get("httpGet", {})
            if got.get("path") != path or got.get("port") not in ("http", lport):
                fail(f"{f}: gateway {kind} should be httpGet {path} on port http, got {got}")
            if text is not None and path not in text:
                fail(f"{f}: mambad-gateway --help does not mention {path}")
    else:
        fail("deploy/k8s: no mambad-gateway Deployment")
    if "mambad-broker" in pods and "livenessProbe" not in pods["mambad-broker"][2]["containers"][0]:
        fail("broker.yaml: the broker has no livenessProbe")

    # CURVE key paths: every /etc/mambad/keys/<file> named is in the Secret.
    secret = docs.get("secret-curve.example.yaml", [{}])[0]
    keys = set(secret.get("stringData", {}))
    for f in ("deploy.yaml", "README.md"):
        for k in set(re.findall(r"/etc/mambad/keys/([A-Za-z0-9._-]+)", open(os.path.join(K8S, f)).read())):
            if k not in keys:
                fail(f"deploy/k8s/{f} names /etc/mambad/keys/{k}, which secret-curve.example.yaml lacks")
    if not keys:
        fail("secret-curve.example.yaml: no keys")


def main():
    version = project_version()
    targets = cmake_targets()
    deb_deps = set()
    cpack = os.path.join(BUILD, "CPackConfig.cmake")
    if os.path.exists(cpack):
        m = re.search(r'CPACK_DEBIAN_PACKAGE_DEPENDS "([^"]*)"', open(cpack).read())
        if m:
            deb_deps = {d.strip().split()[0] for d in m.group(1).split(",") if d.strip()}
    uids, exposed = set(), set()
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        uid, ports = check_dockerfile(name, targets, deb_deps)
        uids.add(uid)
        exposed |= ports
    if len(uids) != 1:
        fail(f"the images run as different users {uids}")
    check_k8s(next(iter(uids)), exposed, version)
    for n in notes:
        print("note:", n)
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("PASS: Dockerfiles and Kubernetes manifests agree with deploy.yaml and the programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Renders every overlay in deploy/overlays with `kubectl kustomize` and checks the objects an
SRE relies on: kinds, ports that match the server's flags, the probes (/readyz for readiness,
/healthz for startup and liveness), graceful termination (drain delay, then drain), the security context, resources, and the GPU only where it belongs; that the cpu and gpu
overlays can run side by side in one namespace (no shared names, selectors that tell them apart);
and that the TLS overlay passes Secrets mounted as files to caliper-server's --tls_* and
--tokens_file flags.

With --validate (the kubernetes-validate tool from PyPI), also checks every object against the
Kubernetes API schemas, strictly (unknown fields fail), for the oldest and newest versions we
support. With --server, also starts the real caliper-server with the args the cpu and TLS overlays
render (listen addresses moved to loopback port 0; for TLS, test certificates and a tokens file
in place of the mounted Secrets) to prove every flag in the ConfigMap is accepted.
Exit 77 (CTest skip) when kubectl is absent."""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    sys.exit("render_test: PyYAML missing: install Debian's python3-yaml "
             "(scripts/install-deps.sh python3-yaml) and run with /usr/bin/python3")

SKIP = 77
# The server's own flag defaults; the manifests must use the same ports.
SERVER_GRPC_PORT = 50051
SERVER_METRICS_PORT = 9464
EXPECTED_DEVICE = {"gpu": "cuda", "cpu": "cpu", "gpu-tls": "cuda", "replicated": "cpu"}
NAMESPACE = "caliper"
# Files the TLS overlay's flags name, each on a read-only Secret volume.
TLS_FLAGS = ("CALIPER_TLS_CERT", "CALIPER_TLS_KEY", "CALIPER_TOKENS_FILE")
HERE = os.path.dirname(os.path.abspath(__file__))
# Overlays whose sessions live in PostgreSQL (--state_store): many replicas, no volume.
REPLICATED = {"replicated"}
# The gRPC health service name readiness asks for with --state_store (NOT_SERVING while the
# database does not answer); liveness keeps the overall "".
# Probe paths on the metrics port: readiness drains (503 from SIGTERM on, and while the state
# store does not answer); startup and liveness stay 200 while the process serves.
PROBE_PATHS = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
# 1.27: first release with gRPC probes on by default (GA); 1.37: the newest schema bundled.
SCHEMA_VERSIONS = ("1.27.0", "1.37.0")
EXPECTED_KINDS = {"ServiceAccount", "ConfigMap", "Service", "Deployment",
                  "PodDisruptionBudget", "ServiceMonitor", "PersistentVolumeClaim"}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def quantity(q):
    """Kubernetes quantity -> float (cores or bytes)."""
    q = str(q)
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", q)
    if not m or (m.group(2) and m.group(2) not in units):
        raise ValueError(f"bad quantity {q!r}")
    return float(m.group(1)) * units.get(m.group(2), 1)


def seconds(duration):
    """The server's --drain_timeout is an absl::Duration: "30s", "1m30s", "500ms"; plain "0"."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(h|ms|us|ns|m|s)", duration)
    if duration == "0":
        return 0.0
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"--drain_timeout={duration!r} is not an absl duration (e.g. 30s)")
    return sum(float(n) * units[u] for n, u in parts)


def port_of(addr):
    m = re.fullmatch(r"(.+):(\d+)", addr)
    return int(m.group(2)) if m else None


def render(kubectl, path):
    out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed:\n{out.stderr}")
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_overlay(name, text, objs):
    p = f"[{name}]"
    before = len(failures)
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    replicated = name in REPLICATED
    kinds = EXPECTED_KINDS - {"PersistentVolumeClaim"} if replicated else EXPECTED_KINDS
    check(set(by_kind) == kinds, f"{p} kinds {sorted(by_kind)} != {sorted(kinds)}")
    for kind in kinds:
        check(len(by_kind.get(kind, [])) == 1, f"{p} expected exactly one {kind}")
    if len(failures) > before:
        return None
    namespaces = {o["metadata"].get("namespace") for o in objs}
    check(namespaces == {NAMESPACE}, f"{p} objects in namespaces {namespaces}, not {NAMESPACE}")

    cm = by_kind["ConfigMap"][0]
    flags = cm["data"]
    dep = by_kind["Deployment"][0]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    if replicated:
        check(dep["spec"].get("replicas", 1) >= 2, f"{p} replicas must be >= 2 (stateless pods)")
    else:
        check(dep["spec"].get("replicas") == 1, f"{p} replicas must be 1 (one session store)")
    check(len(spec["containers"]) == 1, f"{p} one container expected")
    c = spec["containers"][0]

    # Flags: every arg is --flag=$(VAR) with VAR in the ConfigMap, and every key is used.
    check(c["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}],
          f"{p} envFrom must reference the generated ConfigMap {cm['metadata']['name']}")
    used = set()
    for arg in c["args"]:
        m = re.fullmatch(r"--([a-z_]+)=\$\(([A-Z_]+)\)", arg)
        if check(m is not None, f"{p} arg {arg!r} is not --flag=$(VAR)"):
            check(m.group(2) in flags, f"{p} arg {arg} uses {m.group(2)} missing from ConfigMap")
            check(m.group(2) == "CALIPER_" + m.group(1).upper(),
                  f"{p} arg {arg}: variable should be named after the flag")
            used.add(m.group(2))
    check(set(flags) == used, f"{p} ConfigMap keys never passed as flags: {set(flags) - used}")
    check(flags.get("CALIPER_DEVICE") == EXPECTED_DEVICE[name],
          f"{p} CALIPER_DEVICE={flags.get('CALIPER_DEVICE')}, want {EXPECTED_DEVICE[name]}")
    grpc_port = port_of(flags.get("CALIPER_LISTEN", ""))
    metrics_port = port_of(flags.get("CALIPER_METRICS_LISTEN", ""))
    check(grpc_port == SERVER_GRPC_PORT, f"{p} --listen port {grpc_port} != {SERVER_GRPC_PORT}")
    check(metrics_port == SERVER_METRICS_PORT,
          f"{p} --metrics_listen port {metrics_port} != {SERVER_METRICS_PORT}")
    check(flags.get("CALIPER_LOG_FORMAT") in ("json", "text"), f"{p} bad CALIPER_LOG_FORMAT")
    check(int(flags.get("CALIPER_MAX_MESSAGE_BYTES", "0")) > 0, f"{p} bad max_message_bytes")

    # Ports, Service, ServiceMonitor, annotations.
    cports = {cp["name"]: cp["containerPort"] for cp in c["ports"]}
    check(cports == {"grpc": grpc_port, "metrics": metrics_port},
          f"{p} containerPorts {cports} do not match the flags")
    svc = by_kind["Service"][0]
    sports = {sp["name"]: sp for sp in svc["spec"]["ports"]}
    check(set(sports) == {"grpc", "metrics"}, f"{p} Service ports {set(sports)}")
    for pname, sp in sports.items():
        check(sp.get("targetPort") in (pname, cports.get(pname)),
              f"{p} Service port {pname} targets {sp.get('targetPort')}")
        check(sp["port"] == cports.get(pname), f"{p} Service port {pname} is {sp['port']}")
    check(sports["grpc"].get("appProtocol") == "grpc", f"{p} grpc port lacks appProtocol: grpc")
    pod_labels = pod["metadata"]["labels"]
    check(labels_match(svc["spec"]["selector"], pod_labels), f"{p} Service selects no pod")
    check(labels_match(dep["spec"]["selector"]["matchLabels"], pod_labels),
          f"{p} Deployment selector does not match its pods")
    pdb = by_kind["PodDisruptionBudget"][0]
    check(labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels),
          f"{p} PodDisruptionBudget selects no pod")
    sm = by_kind["ServiceMonitor"][0]
    check(labels_match(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]),
          f"{p} ServiceMonitor selects no Service")
    eps = sm["spec"]["endpoints"]
    check(len(eps) == 1 and eps[0].get("port") == "metrics" and eps[0].get("path") == "/metrics",
          f"{p} ServiceMonitor endpoint {eps}")
    ann = pod["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/path") == "/metrics"
          and ann.get("prometheus.io/port") == str(metrics_port),
          f"{p} prometheus.io annotations {ann}")

    # The variant label tells overlays apart: in every selector, so a Service, PDB or
    # ServiceMonitor of one overlay never selects another's pods.
    variant = pod_labels.get("app.kubernetes.io/variant")
    check(variant == name.split("-")[0], f"{p} pods labelled variant {variant!r}")
    for what, selector in (("Service", svc["spec"]["selector"]),
                           ("Deployment", dep["spec"]["selector"]["matchLabels"]),
                           ("PodDisruptionBudget", pdb["spec"]["selector"]["matchLabels"]),
                           ("ServiceMonitor", sm["spec"]["selector"]["matchLabels"])):
        check(selector.get("app.kubernetes.io/variant") == variant,
              f"{p} {what} selector {selector} lacks the variant label")

    # Probes: HTTP GET on the metrics port (answers with TLS and tokens on): /readyz for
    # readiness, /healthz for startup and liveness.
    for probe, path in PROBE_PATHS.items():
        pr = c.get(probe)
        if check(pr is not None, f"{p} {probe} missing"):
            check(set(pr) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"httpGet"},
                  f"{p} {probe} must be an httpGet probe only")
            get = pr.get("httpGet", {})
            check(get.get("path") == path, f"{p} {probe} path {get.get('path')}, not {path}")
            check(get.get("port") in ("metrics", metrics_port),
                  f"{p} {probe} probes port {get.get('port')}, not the metrics port")
    check(int(flags.get("CALIPER_MAX_INFLIGHT_BYTES", "0")) > 0, f"{p} bad max_inflight_bytes")
    tls = "CALIPER_TLS_CERT" in flags

    # Graceful termination longer than the drain: unready for drain_delay, then drain_timeout.
    drain = seconds(flags["CALIPER_DRAIN_TIMEOUT"])
    delay = seconds(flags.get("CALIPER_DRAIN_DELAY", "0s"))
    check(delay > 0, f"{p} no --drain_delay: endpoints would still route to a pod that stopped")
    check("--drain_delay=$(CALIPER_DRAIN_DELAY)" in c.get("args", []),
          f"{p} args do not pass --drain_delay")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    check(grace > delay + drain, f"{p} terminationGracePeriodSeconds {grace} <= --drain_delay "
          f"{delay} + --drain_timeout {drain}")

    # Security context (container settings win over pod settings).
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    eff = {**psc, **csc}
    check(eff.get("runAsNonRoot") is True, f"{p} runAsNonRoot not set")
    check(eff.get("runAsUser", 1) != 0, f"{p} runs as uid 0")
    check(csc.get("readOnlyRootFilesystem") is True, f"{p} root filesystem writable")
    check(csc.get("allowPrivilegeEscalation") is False, f"{p} privilege escalation allowed")
    check(csc.get("privileged", False) is False, f"{p} privileged")
    check(csc.get("capabilities", {}).get("drop") == ["ALL"] and
          not csc.get("capabilities", {}).get("add"), f"{p} capabilities not dropped")
    check(eff.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{p} seccomp not RuntimeDefault")
    check(spec.get("automountServiceAccountToken") is False, f"{p} service account token mounted")
    check(spec.get("hostNetwork", False) is False and spec.get("hostPID", False) is False,
          f"{p} host namespaces used")
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    check("/tmp" in mounts, f"{p} read-only root needs a writable /tmp")

    # TLS and tokens: every file a flag names lies on a read-only Secret volume.
    check(tls == name.endswith("-tls"), f"{p} TLS flags {'missing' if not tls else 'unexpected'}")
    if tls:
        volumes_by_name = {v["name"]: v for v in spec.get("volumes", [])}
        for key in TLS_FLAGS + ("CALIPER_TLS_CLIENT_CA",):
            path = flags.get(key, "")
            if key == "CALIPER_TLS_CLIENT_CA" and not path:
                continue  # mutual TLS is optional
            mount = [m for m in c.get("volumeMounts", [])
                     if path.startswith(m["mountPath"].rstrip("/") + "/")]
            if check(len(mount) == 1, f"{p} {key}={path!r} is not on a mounted volume"):
                volume = volumes_by_name.get(mount[0]["name"], {})
                check("secret" in volume and mount[0].get("readOnly") is True,
                      f"{p} {key} volume {mount[0]['name']} is not a read-only Secret")
                check(volume.get("secret", {}).get("defaultMode", 0o644) & 0o007 == 0,
                      f"{p} {key} Secret files readable by others")
        check("CALIPER_ALLOW_PLAINTEXT_TOKENS" not in flags, f"{p} plaintext tokens allowed")

    if replicated:
        check_replicated(p, dep, spec, c, flags, by_kind["PodDisruptionBudget"][0])
    else:
        check_state_volume(p, dep, spec, c, flags, by_kind["PersistentVolumeClaim"][0])

    # Resources: requests and limits for cpu and memory, requests <= limits.
    res = c.get("resources", {})
    for r in ("cpu", "memory"):
        req, lim = res.get("requests", {}).get(r), res.get("limits", {}).get(r)
        if check(req is not None and lim is not None, f"{p} {r} request/limit missing"):
            check(quantity(req) <= quantity(lim), f"{p} {r} request {req} > limit {lim}")

    # GPU only in the gpu overlays.
    gpu_limit = res.get("limits", {}).get("nvidia.com/gpu")
    tolerates_gpu = any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", []))
    image_tag = c["image"].rsplit(":", 1)[-1]
    if EXPECTED_DEVICE[name] == "cuda":
        check(gpu_limit is not None and int(gpu_limit) == 1, f"{p} nvidia.com/gpu limit {gpu_limit}")
        check(tolerates_gpu, f"{p} no toleration for the nvidia.com/gpu taint")
    else:
        check("nvidia.com/gpu" not in text, f"{p} mentions nvidia.com/gpu")
        check(image_tag.endswith("-cpu"), f"{p} image {c['image']} is not the cpu variant")
    return c, flags


def check_replicated(p, dep, spec, c, flags, pdb):
    """Replicas over PostgreSQL: rolling, drainable, spread, the URI from a Secret, no volume."""
    check("CALIPER_STATE_DIR" not in flags, f"{p} replicas must not use --state_dir")
    strategy = dep["spec"].get("strategy", {})
    check(strategy.get("type") == "RollingUpdate", f"{p} replicas roll: strategy {strategy}")
    check(strategy.get("rollingUpdate", {}).get("maxUnavailable") == 0,
          f"{p} a rollout should never go below the replica count: {strategy}")
    check("minAvailable" not in pdb["spec"] and pdb["spec"].get("maxUnavailable", 0) >= 1,
          f"{p} the PodDisruptionBudget must let a drain evict a replica: {pdb['spec']}")
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    check(bool(anti), f"{p} replicas need pod anti-affinity (spread over nodes)")
    env = {e["name"]: e for e in c.get("env", [])}
    ref = env.get("CALIPER_STATE_STORE", {}).get("valueFrom", {}).get("secretKeyRef", {})
    check(bool(ref.get("name")) and bool(ref.get("key")),
          f"{p} CALIPER_STATE_STORE must come from a Secret (secretKeyRef), got {env.get('CALIPER_STATE_STORE')}")
    check(all(v.get("persistentVolumeClaim") is None for v in spec.get("volumes", [])),
          f"{p} replicas must not mount a PersistentVolumeClaim")


def check_state_volume(p, dep, spec, c, flags, pvc):
    """One pod with --state_dir on its ReadWriteOnce claim."""
    # Durable sessions: --state_dir lies on the PersistentVolumeClaim, not in the container.
    state_dir = flags.get("CALIPER_STATE_DIR", "")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    state_mounts = [m for m in c.get("volumeMounts", [])
                    if state_dir == m["mountPath"] or state_dir.startswith(m["mountPath"].rstrip("/") + "/")]
    if check(len(state_mounts) == 1, f"{p} --state_dir {state_dir!r} is not on a mounted volume"):
        claim = volumes.get(state_mounts[0]["name"], {}).get("persistentVolumeClaim", {})
        check(claim.get("claimName") == pvc["metadata"]["name"],
              f"{p} --state_dir volume is not the PersistentVolumeClaim {pvc['metadata']['name']}")
    check(pvc["spec"].get("accessModes") == ["ReadWriteOnce"], f"{p} state PVC access modes")
    check(dep["spec"].get("strategy", {}).get("type") == "Recreate",
          f"{p} a ReadWriteOnce state volume needs the Recreate strategy")


def validate_schema(validator, name, text):
    """Strict schema validation of the rendered objects (CRDs such as ServiceMonitor have no
    bundled schema and are only warned about)."""
    with tempfile.NamedTemporaryFile("w", suffix=f"-{name}.yaml") as f:
        f.write(text)
        f.flush()
        for version in SCHEMA_VERSIONS:
            out = subprocess.run([validator, "--strict", "--quiet", "-k", version, f.name],
                                 capture_output=True, text=True, timeout=120)
            errors = [l for l in (out.stdout + out.stderr).splitlines() if "ERROR" in l]
            check(out.returncode == 0 and not errors,
                  f"[{name}] Kubernetes {version} schema: " + "\n".join(errors or [out.stderr]))


def tls_files(work):
    """Test certificates and a tokens file standing in for the TLS overlay's Secrets."""
    openssl = shutil.which("openssl")
    if not check(openssl is not None, "openssl missing: cannot run the TLS overlay's server"):
        return None
    subprocess.run(["sh", os.path.join(HERE, "..", "support", "make_test_certs.sh"), openssl, work],
                   check=True, capture_output=True, timeout=60)
    with open(os.path.join(work, "tokens"), "w") as f:
        f.write("tenant-a tenant-a-token-0123456789\n")
    return {"CALIPER_TLS_CERT": os.path.join(work, "server.pem"),
            "CALIPER_TLS_KEY": os.path.join(work, "server.key"),
            "CALIPER_TLS_CLIENT_CA": os.path.join(work, "ca1.pem"),
            "CALIPER_TOKENS_FILE": os.path.join(work, "tokens")}


def http_get(url):
    """(status, body) of a GET; an HTTP error status is returned, not raised."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def run_server_with(server, c, flags, timeout=60):
    """Starts the real server with the rendered args, listen addresses on loopback port 0, the
    CPU backend, and for TLS local files in place of the mounted Secrets."""
    state_dir = tempfile.mkdtemp(prefix="caliper-render-state-")
    env_flags = dict(flags, CALIPER_LISTEN="127.0.0.1:0", CALIPER_METRICS_LISTEN="127.0.0.1:0",
                     CALIPER_STATE_DIR=state_dir, CALIPER_DEVICE="cpu")
    if "CALIPER_TLS_CERT" in flags:
        files = tls_files(state_dir)
        if files is None:
            return
        env_flags.update(files)
    args = [re.sub(r"\$\(([A-Z_]+)\)", lambda m: env_flags[m.group(1)], a) for a in c["args"]]
    proc = subprocess.Popen([server] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    started, lines = False, []
    deadline = time.monotonic() + timeout
    try:
        os.set_blocking(proc.stdout.fileno(), True)
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if "caliper-server listening on 127.0.0.1:" in line:
                started = True
                break
        check(started, f"server did not start with the rendered args {args}:\n" + "\n".join(lines))
        if started:
            # The probes' endpoint answers on the metrics port, without TLS or a token; from
            # SIGTERM on /readyz is 503 while /healthz stays 200 (the drain delay).
            m = re.search(r"\(metrics ([0-9.]+:\d+)", lines[-1])
            metrics = m.group(1) if check(m is not None, f"no metrics address in {lines[-1]!r}") \
                else None
            if metrics:
                for path in ("/healthz", "/readyz"):
                    status, body = http_get(f"http://{metrics}{path}")
                    check(status == 200, f"GET {path} while serving: {status} {body!r}")
            proc.send_signal(signal.SIGTERM)
            if metrics:
                # Polled: on a loaded machine the signal can take longer than a fixed sleep to
                # land; the drain delay (5 s) bounds the wait.
                until = time.monotonic() + 4.0
                while True:
                    time.sleep(0.1)
                    status, body = http_get(f"http://{metrics}/readyz")
                    if status == 503 or time.monotonic() > until:
                        break
                check(status == 503 and "draining" in body,
                      f"GET /readyz after SIGTERM: {status} {body!r}, want 503 draining")
                status, body = http_get(f"http://{metrics}/healthz")
                check(status == 200 and "caliper_up 1" in body,
                      f"GET /healthz while draining: {status} {body!r}, want 200")
            rc = proc.wait(timeout=seconds(flags.get("CALIPER_DRAIN_DELAY", "0s")) +
                           seconds(flags["CALIPER_DRAIN_TIMEOUT"]) + 10)
            check(rc == 0, f"server exited {rc} after SIGTERM")
            print(f"  server accepted {' '.join(args)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(state_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy", required=True, help="the repository's deploy/ folder")
    ap.add_argument("--kubectl", default=shutil.which("kubectl"))
    ap.add_argument("--validate", help="kubernetes-validate executable (schema check)")
    ap.add_argument("--server",
                    help="caliper-server binary: also run it with the cpu and TLS overlays' args")
    a = ap.parse_args()
    if not a.kubectl or not os.path.exists(a.kubectl):
        print("SKIP: kubectl not found; the render test needs kubectl with kustomize")
        return SKIP
    overlays = sorted(os.listdir(os.path.join(a.deploy, "overlays")))
    check(set(overlays) == set(EXPECTED_DEVICE), f"overlays {overlays} != {sorted(EXPECTED_DEVICE)}")
    names = {}
    for name in overlays:
        text, objs = render(a.kubectl, os.path.join(a.deploy, "overlays", name))
        names[name] = {(o["kind"], o["metadata"]["name"]) for o in objs}
        before = len(failures)
        got = check_overlay(name, text, objs)
        print(f"{name}: {len(objs)} objects, {len(failures) - before} problems")
        if a.validate:
            validate_schema(a.validate, name, text)
        if a.server and name in ("cpu", "gpu-tls") and got:
            run_server_with(a.server, *got)
    # The development database renders and provides the Secret the replicated overlay reads.
    pg_dir = os.path.join(a.deploy, "postgres-dev")
    pg_text, pg_objs = render(a.kubectl, pg_dir)
    kinds = sorted(o["kind"] for o in pg_objs)
    check(kinds == ["Secret", "Secret", "Service", "StatefulSet"],
          f"[postgres-dev] kinds {kinds}")
    secrets = {o["metadata"]["name"]: o for o in pg_objs if o["kind"] == "Secret"}
    rep_text, rep_objs = render(a.kubectl, os.path.join(a.deploy, "overlays", "replicated"))
    rep_dep = [o for o in rep_objs if o["kind"] == "Deployment"][0]
    env = {e["name"]: e for e in rep_dep["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    ref = env.get("CALIPER_STATE_STORE", {}).get("valueFrom", {}).get("secretKeyRef", {})
    secret = secrets.get(ref.get("name"))
    if check(secret is not None, f"[postgres-dev] no Secret {ref.get('name')!r} for the replicas"):
        check(ref.get("key") in secret.get("data", {}), f"[postgres-dev] Secret lacks key {ref.get('key')}")
        check(secret["metadata"].get("namespace") == rep_dep["metadata"]["namespace"],
              "[postgres-dev] Secret and replicas in different namespaces")
    sts = [o for o in pg_objs if o["kind"] == "StatefulSet"]
    if sts:
        pod = sts[0]["spec"]["template"]["spec"]
        sc = pod.get("securityContext", {})
        csc = pod["containers"][0].get("securityContext", {})
        check(sc.get("runAsNonRoot") is True and csc.get("allowPrivilegeEscalation") is False and
              csc.get("capabilities", {}).get("drop") == ["ALL"] and
              sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
              "[postgres-dev] the database pod must pass the restricted Pod Security Standard")
    if a.validate:
        validate_schema(a.validate, "postgres-dev", pg_text)
    print(f"postgres-dev: {len(pg_objs)} objects")

    # cpu runs next to gpu (or gpu-tls, which replaces gpu) in one namespace: no shared names.
    for other in ("gpu", "gpu-tls"):
        shared = names.get("cpu", set()) & names.get(other, set())
        check(not shared, f"cpu and {other} overlays both define {sorted(shared)}")
    # The namespace all overlays share, applied on its own.
    text, objs = render(a.kubectl, os.path.join(a.deploy, "namespace"))
    check([(o["kind"], o["metadata"]["name"]) for o in objs] == [("Namespace", NAMESPACE)],
          f"deploy/namespace renders {[(o['kind'], o['metadata']['name']) for o in objs]}")
    check(objs and objs[0]["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
          == "restricted", "namespace does not enforce the restricted Pod Security Standard")
    if a.validate:
        validate_schema(a.validate, "namespace", text)
    # The Grafana dashboard ConfigMap renders too.
    _, objs = render(a.kubectl, os.path.join(a.deploy, "grafana"))
    check([o["kind"] for o in objs] == ["ConfigMap"] and
          "caliper-dashboard.json" in objs[0].get("data", {}),
          "deploy/grafana does not render the dashboard ConfigMap")
    if a.validate:
        print(f"schema: every object validated strictly against Kubernetes {SCHEMA_VERSIONS}")
    else:
        print("schema: not validated (kubernetes-validate not installed; scripts/test.sh installs it)")
    for f in failures:
        print("FAIL:", f)
    print(f"render_test: {len(overlays)} overlays, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

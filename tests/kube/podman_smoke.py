#!/usr/bin/env python3
"""The single-host demo overlay, played with `podman kube play` (no Kubernetes here): PostgreSQL,
two gateway replicas and one cell, from what `kubectl kustomize deploy/kubernetes/overlays/demo`
renders and the Secrets `make-secrets` prints; then one task through a gateway replica.

What podman 4.3 (Debian 12) cannot take as Kubernetes would, and what this does instead (each a
change to the rendered YAML, printed when made):
- StatefulSet: not played. Its pod template runs as the Pod warden-cell-0 (the name the
  StatefulSet would give it), its volumeClaimTemplate as an emptyDir.
- Deployment replicas: one pod each. The gateway's template runs as two Pods.
- containerPort: podman publishes it on the host; dropped (peers use the pod network).
- emptyDir: podman makes it root-owned 0755 (Kubernetes: 0777); a 1777 host directory instead,
  and the cell's volumeClaimTemplate a host directory too.
- env from a fieldRef or a secretKeyRef, and $(VAR) expansion: given as literal values.
- Services and cluster DNS: none. Peers are reached by pod name on one podman network with DNS
  (the URLs in the Secret and the cell's address name the pods).
- Secrets: not played; read from podman's secret store, whose values podman 4.3 mounts and
  exports without decoding base64 (so they are stored decoded), and secret volumes without
  `optional` crash it (set to false).
- readiness probes, PodDisruptionBudgets, the HPA, NetworkPolicies, the namespace, the
  ServiceAccounts, resource requests: not enforced. Liveness probes become podman healthchecks,
  run here once with `podman healthcheck run` (the daemons' `--health`).
- the gateway's example caller token: replaced by a new one, and the default agent is the
  image's `scripted` (the image holds no other agent).
- hostUsers: false, procMount: Unmasked and the Localhost seccomp profile of the cell: podman
  plays the pod without a user namespace, so the cell runs with the runtime's default seccomp
  profile and bubblewrap is not usable there: the supervisor says so and contains agents by
  process group only. The sandbox is not exercised by this smoke test.

Usage: podman_smoke.py WORKDIR (images localhost/warden:0.1.0 and localhost/warden-postgres:0.1.0
built first by deploy/image/build). Exits non-zero, saying where, when a step fails; leaves
nothing running (`podman kube down`, secrets removed) unless KEEP=1.
"""
import base64, json, os, subprocess, sys, time, urllib.request, copy

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NET = "warden-smoke"


def run(*args, check=True, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def note(msg):
    print(f"smoke: {msg}", flush=True)


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    # This host: crun refuses its hybrid cgroups (runc does not), and podman's default ulimits
    # exceed the hard limits here (CAP_SYS_RESOURCE is not held): ask for less.
    if "CONTAINERS_CONF" not in os.environ:
        import resource
        nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 16384)
        conf = os.path.join(work, "containers.conf")
        with open(conf, "w") as f:
            f.write(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc=8192:8192"]\n'
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n')
        os.environ["CONTAINERS_CONF"] = conf
    rendered = run("kubectl", "kustomize", os.path.join(ROOT, "deploy/kubernetes/overlays/demo")).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    secrets = [d for d in yaml.safe_load_all(
        run(os.path.join(ROOT, "deploy/kubernetes/overlays/demo/make-secrets")).stdout) if d]

    pg_host = "warden-postgres-pod-0"
    values = {}
    # Secrets into podman's store, decoded (podman 4.3 does not decode them).
    for s in secrets:
        data = {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
        values[s["metadata"]["name"]] = data
        if s["metadata"]["name"] == "warden-postgres":
            data["url"] = data["url"].replace("warden-postgres.warden.svc.cluster.local", pg_host)
        s = dict(s, data=data)
        path = os.path.join(work, f"secret-{s['metadata']['name']}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(s, f)
        run("podman", "secret", "rm", s["metadata"]["name"], check=False)
        run("podman", "secret", "create", s["metadata"]["name"], path)
    note("secrets in podman's store (url names the PostgreSQL pod: no Service DNS)")

    def pod_of(template, name):
        spec = copy.deepcopy(template["spec"])
        # An emptyDir is world-writable in Kubernetes (0777); podman 4.3 makes a root-owned
        # 0755 volume, where the non-root daemons cannot put their sockets: a 1777 directory
        # of the host instead, one per pod and volume.
        for v in spec.get("volumes", []):
            if "emptyDir" in v:
                d = os.path.join(work, "volumes", name, v["name"])
                os.makedirs(d, exist_ok=True)
                os.chmod(d, 0o1777)
                v.pop("emptyDir")
                v["hostPath"] = {"path": d, "type": "Directory"}
        for v in spec.get("volumes", []):
            if "secret" in v:
                v["secret"]["optional"] = False
        # podman 4.3 reads an env secretKeyRef as a JSON map, a secret volume as a Secret's
        # YAML: one store cannot serve both, so env values from Secrets are given literally.
        for c in spec.get("initContainers", []) + spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    e.pop("valueFrom")
                    e["value"] = values[ref["name"]][ref["key"]]
                # Nor does it expand $(VAR) from a fieldRef: the pod's name is put in.
                if "value" in e:
                    e["value"] = e["value"].replace("$(POD_NAME)", name)
            # A containerPort is published on the host by podman 4.3 (two gateways would
            # collide on 8080): peers reach each other on the pod network, as in a cluster.
            c.pop("ports", None)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "warden",
                             "labels": template["metadata"].get("labels", {}),
                             "annotations": template["metadata"].get("annotations", {})},
                "spec": spec}

    configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
    # The caller: the example [[auth.tokens]] entry replaced by a new token's (as the README
    # tells an operator to), and the image's own agent, scripted, as the default.
    token = "smoke-" + os.urandom(16).hex()
    digest = __import__("hashlib").sha256(token.encode()).hexdigest()
    for cm in configmaps:
        if "gateway.toml" in cm["data"]:
            t = cm["data"]["gateway.toml"]
            t = t.replace("279dba2097250d875175f26b5ca2a8ee271093e370d47991313f6ac79e2c7739", digest)
            cm["data"]["gateway.toml"] = t.replace('default = "claude"', 'default = "scripted"')
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    pg = pod_of(by[("Deployment", "warden-postgres")]["spec"]["template"], "warden-postgres-pod-0")
    gws = [pod_of(by[("Deployment", "warden-gateway")]["spec"]["template"], f"warden-gateway-{i}")
           for i in range(2)]
    sts = by[("StatefulSet", "warden-cell")]
    cell = pod_of(sts["spec"]["template"], "warden-cell-0")
    for t in sts["spec"].get("volumeClaimTemplates", []):
        d = os.path.join(work, "volumes", "warden-cell-0", t["metadata"]["name"])
        os.makedirs(d, exist_ok=True)
        cell["spec"]["volumes"].append(
            {"name": t["metadata"]["name"], "hostPath": {"path": d, "type": "Directory"}})
    for c in cell["spec"]["containers"]:
        if c["name"] == "supervisor":
            for e in c["env"]:
                if e["name"] == "WARDEN_SUPERVISOR__CELL__ADDRESS":
                    e["value"] = "warden-cell-0:7443"
            sc = c["securityContext"]
            # No Localhost profile on this host, no user namespace for the pod (see above).
            sc["seccompProfile"] = {"type": "Unconfined"}
            sc.pop("appArmorProfile", None)
            sc.pop("procMount", None)
    cell["spec"].pop("hostUsers", None)
    note("rendered: StatefulSet -> Pod warden-cell-0, Deployment warden-gateway -> 2 Pods")

    def play(name, objs):
        path = os.path.join(work, f"{name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump_all(configmaps + objs, f)
        p = run("podman", "kube", "play", "--network", NET, path, check=False)
        if p.returncode != 0:
            # podman 4.3 can fail to remove a "once" init container it still sees running;
            # the pod is there, its containers created: start them.
            note(f"podman kube play {name}: {p.stderr.strip().splitlines()[-1:]}; starting the pods")
            time.sleep(2)
            for o in objs:
                run("podman", "pod", "start", o["metadata"]["name"])
        return path

    run("podman", "network", "create", NET, check=False)
    played = [play("postgres", [pg])]
    note("PostgreSQL pod started")
    time.sleep(5)
    played.append(play("cell", [cell]))
    note("cell pod started")
    played.append(play("gateways", gws))
    note("two gateway pods started")
    try:
        check(token)
    finally:
        if not os.environ.get("KEEP"):
            for path in reversed(played):
                run("podman", "kube", "down", path, check=False)
            for s in secrets:
                run("podman", "secret", "rm", s["metadata"]["name"], check=False)


def ip_of(pod):
    infra = run("podman", "pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout.strip()
    return run("podman", "inspect", infra, "--format",
               "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}").stdout.strip()


def call(ip, token, method, params):
    req = urllib.request.Request(
        f"http://{ip}:8080/a2a/jsonrpc",
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode(),
        headers={"Host": "warden-gateway.warden.svc.cluster.local", "A2A-Version": "1.0",
                 "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def check(token):
    ips = [ip_of(f"warden-gateway-{i}") for i in range(2)]
    deadline = time.time() + 120
    while True:
        try:
            call(ips[0], token, "ListTasks", {})
            call(ips[1], token, "ListTasks", {})
            break
        except Exception as e:  # not serving yet
            if time.time() > deadline:
                sys.exit(f"FAILED: the gateways did not serve within 120 s: {e}")
            time.sleep(2)
    # Until the cell has registered (it starts its agents' pool first): a new conversation
    # fails "no live cell" meanwhile, and is tried again with a new context.
    for attempt in range(60):
        r = call(ips[0], token, "SendMessage", {"message": {
            "messageId": f"smoke-m{attempt}", "role": "ROLE_USER",
            "contextId": f"smoke-ctx-{attempt}", "parts": [{"text": "hello"}]}})
        task = r.get("result", {}).get("task", {})
        state = task.get("status", {}).get("state")
        if state == "TASK_STATE_COMPLETED" or "no live cell" not in json.dumps(r):
            break
        time.sleep(3)
    if state != "TASK_STATE_COMPLETED":
        sys.exit(f"FAILED: the task through warden-gateway-0: {json.dumps(r)[:2000]}")
    note(f"task {task['id']} COMPLETED through warden-gateway-0 ({ips[0]})")
    got = call(ips[1], token, "GetTask", {"id": task["id"]})
    if got.get("result", {}).get("status", {}).get("state") != "TASK_STATE_COMPLETED":
        sys.exit(f"FAILED: warden-gateway-1 does not see it: {json.dumps(got)[:2000]}")
    note("warden-gateway-1 answers GetTask for it (the shared PostgreSQL task store)")
    for c in ["warden-gateway-0-gateway", "warden-gateway-1-gateway", "warden-cell-0-supervisor",
              "warden-cell-0-policy", "warden-cell-0-approver"]:
        run("podman", "healthcheck", "run", c)
    note("every warden container's liveness probe (--health, as a podman healthcheck) passes")
    print("smoke: 1 passed, 0 failed")


if __name__ == "__main__":
    main()

"""deploy/k8s: the committed 2P/2D manifests are what render.py writes, and the manifests that
render.py writes for 2P/2D (CUDA) and 3P/4D (CPU, an RDMA device resource) are consistent with
their cluster file: the ConfigMap's cluster.yaml loads with pdserve's own parser (pdctl health
--config: exit 1 "unreachable", never 2 "bad file"); the decode StatefulSet's pods are the decode
entries, at their stable DNS names under the headless Service; container ports, Service ports and
the native gRPC probes use the entries' ports and the services' grpc.health.v1 names; prefill pods
run the template entry, at their pod IP, and join the router's Service; GPU requests follow the
backend and TP; the preStop hook drains through the router. kubectl is not needed (python3-yaml).
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import os
import subprocess
import sys
import tempfile
from collections import Counter

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("PD_SOURCE_DIR", os.path.join(HERE, "..", ".."))
RENDER = os.path.join(SRC, "deploy", "k8s", "render.py")
PDCTL = sys.argv[1] if len(sys.argv) > 1 else "pdctl"
failures = []


def check(name, ok, detail=""):
    print("%s %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else ": " + str(detail)[-1500:]))
    if not ok:
        failures.append(name)


def render(*args):
    return subprocess.run([sys.executable, RENDER] + list(args), capture_output=True, text=True,
                          check=True).stdout


def by_kind(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    return None


def ports(container):
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def check_set(tag, text, n_prefill, n_decode, backend, tp, rdma):
    docs = list(yaml.safe_load_all(text))
    kinds = Counter(d["kind"] for d in docs)
    check(tag + "-kinds", kinds == Counter({"Namespace": 1, "ConfigMap": 1, "Service": 3,
                                            "Deployment": 2, "StatefulSet": 1}), kinds)
    ns = docs[0]["metadata"]["name"]
    check(tag + "-namespace", all(d["metadata"].get("namespace", ns) == ns for d in docs))
    cm = by_kind(docs, "ConfigMap", "pdserve-cluster")
    cfg_text = cm["data"]["cluster.yaml"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(cfg_text)
    p = subprocess.run([PDCTL, "health", "--config", f.name, "--timeout-ms", "1"],
                       capture_output=True, text=True, timeout=60)
    os.unlink(f.name)
    check(tag + "-cluster-file-loads", p.returncode == 1, (p.returncode, p.stderr))
    cfg = yaml.safe_load(cfg_text)
    nodes = cfg["nodes"]
    rlisten = int(cfg["router"]["listen"].rsplit(":", 1)[1])
    rhttp = int(cfg["router"]["http"].rsplit(":", 1)[1])

    # ---- decode: StatefulSet pods == decode entries, at stable DNS names ----
    sts = by_kind(docs, "StatefulSet", "pdserve-decode")
    hsvc = by_kind(docs, "Service", sts["spec"]["serviceName"])
    decodes = [n for n in nodes if n["role"] == "decode"]
    check(tag + "-decode-replicas", sts["spec"]["replicas"] == n_decode == len(decodes))
    check(tag + "-headless", hsvc and hsvc["spec"].get("clusterIP") == "None" and
          hsvc["spec"].get("publishNotReadyAddresses") is True, hsvc)
    want = ["%s-%d" % (sts["metadata"]["name"], i) for i in range(n_decode)]
    check(tag + "-decode-names", [n["name"] for n in decodes] == want, decodes)
    check(tag + "-decode-dns", all(n["host"] == "%s.%s.%s.svc.cluster.local" %
                                   (n["name"], hsvc["metadata"]["name"], ns) for n in decodes),
          [n["host"] for n in decodes])
    dc = sts["spec"]["template"]["spec"]["containers"][0]
    dp = ports(dc)
    check(tag + "-decode-ports", all(dp == {"grpc": n["port"], "ucx": n["ucx_port"],
                                            "http": n["http_port"]} for n in decodes), dp)
    check(tag + "-decode-svc-ports", {p["name"]: p["port"] for p in hsvc["spec"]["ports"]} == dp)
    check(tag + "-decode-args", dc["args"][dc["args"].index("--node") + 1] == "$(POD_NAME)")

    # ---- prefill: a Deployment of the template entry ----
    dep = by_kind(docs, "Deployment", "pdserve-prefill")
    tmpl = [n for n in nodes if n["role"] == "prefill"]
    check(tag + "-prefill-template", len(tmpl) == 1 and tmpl[0].get("template") is True, tmpl)
    check(tag + "-prefill-replicas", dep["spec"]["replicas"] == n_prefill)
    pc = dep["spec"]["template"]["spec"]["containers"][0]
    pa = pc["args"]
    check(tag + "-prefill-args", pa[pa.index("--node") + 1] == tmpl[0]["name"] and
          pa[pa.index("--join-name") + 1] == "$(POD_NAME)" and
          pa[pa.index("--set") + 1] == "host=$(POD_IP)", pa)
    check(tag + "-prefill-ports", ports(pc) == {"grpc": tmpl[0]["port"],
                                                "http": tmpl[0]["http_port"]}, ports(pc))

    # ---- router ----
    rdep = by_kind(docs, "Deployment", "pdserve-router")
    rsvc = by_kind(docs, "Service", "pdserve-router")
    rc = rdep["spec"]["template"]["spec"]["containers"][0]
    check(tag + "-router-ports", ports(rc) == {"grpc": rlisten, "http": rhttp} and
          {p["name"]: p["port"] for p in rsvc["spec"]["ports"]} == {"grpc": rlisten,
                                                                   "http": rhttp}, ports(rc))
    check(tag + "-router-probes", rc["readinessProbe"]["grpc"] == {
        "port": rlisten, "service": "pdserve.v1.Inference"} and
        rc["livenessProbe"]["httpGet"]["path"] == "/live", rc)
    join = "%s.%s.svc.cluster.local:%d" % (rsvc["metadata"]["name"], ns, rlisten)
    for role, c, entry, svc in (("decode", dc, decodes[0], "pdserve.v1.Decode"),
                                ("prefill", pc, tmpl[0], "pdserve.v1.Prefill")):
        a = c["args"]
        check("%s-%s-join" % (tag, role), a[a.index("--join") + 1] == join, a)
        check("%s-%s-probes" % (tag, role),
              c["startupProbe"]["grpc"] == {"port": entry["port"], "service": svc} and
              c["readinessProbe"]["grpc"] == {"port": entry["port"], "service": svc} and
              c["livenessProbe"]["grpc"] == {"port": entry["port"]}, c)
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        check("%s-%s-prestop-drain" % (tag, role), pre[1:3] == ["drain", "$(POD_NAME)"] and
              pre[pre.index("--router") + 1] == join, pre)
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
               for e in c["env"]}
        check("%s-%s-env" % (tag, role), env.get("POD_NAME") == "metadata.name" and
              env.get("POD_IP") == "status.podIP", env)
        res = c["resources"]
        gpus = res["limits"].get("nvidia.com/gpu")
        check("%s-%s-gpus" % (tag, role), gpus == (tp if backend == "cuda" else None) and
              res["requests"].get("nvidia.com/gpu") == gpus and
              entry["backend"] == backend and entry["tp"] == tp, res)
        check("%s-%s-rdma" % (tag, role), (res["limits"].get(rdma) == 1 and
                                          "IPC_LOCK" in c["securityContext"]["capabilities"]["add"])
              if rdma else "securityContext" not in c, c.get("securityContext"))
    # every pod mounts the ConfigMap the cluster file is in, selectors match their pods
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            spec = d["spec"]["template"]["spec"]
            vols = {v["name"]: v for v in spec["volumes"]}
            check("%s-%s-configmap" % (tag, d["metadata"]["name"]),
                  vols["cluster"]["configMap"]["name"] == cm["metadata"]["name"] and
                  any(m["mountPath"] == "/etc/pdserve" for m in
                      spec["containers"][0]["volumeMounts"]))
            check("%s-%s-selector" % (tag, d["metadata"]["name"]),
                  d["spec"]["selector"]["matchLabels"].items() <=
                  d["spec"]["template"]["metadata"]["labels"].items())
        if d["kind"] == "Service":
            pods = [x for x in docs if x["kind"] in ("Deployment", "StatefulSet") and
                    d["spec"]["selector"].items() <= x["spec"]["template"]["metadata"]["labels"].items()]
            check("%s-svc-%s-selects" % (tag, d["metadata"]["name"]), len(pods) == 1)


def main():
    committed = open(os.path.join(SRC, "deploy", "k8s", "pdserve-2p2d.yaml")).read()
    check("committed-2p2d-is-rendered", committed == render("--prefill", "2", "--decode", "2"),
          "run: python3 deploy/k8s/render.py > deploy/k8s/pdserve-2p2d.yaml")
    check_set("2p2d", committed, 2, 2, "cuda", 1, "")
    check_set("3p4d", render("--prefill", "3", "--decode", "4", "--backend", "cpu", "--namespace",
                             "llm", "--rdma-resource", "rdma/rdma_shared_device_a"),
              3, 4, "cpu", 1, "rdma/rdma_shared_device_a")
    check_set("tp2", render("--tp", "2"), 2, 2, "cuda", 2, "")
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Renders pdserve's Kubernetes manifests for P prefill and D decode nodes (deploy/k8s/README.md):

    python3 deploy/k8s/render.py --prefill 2 --decode 2 > pdserve.yaml && kubectl apply -f pdserve.yaml

  - ConfigMap pdserve-cluster: the cluster file every pod reads (/etc/pdserve/cluster.yaml). The
    decode nodes are named after their StatefulSet pods (pdserve-decode-0, ...) at their stable DNS
    names (POD.pdserve-decode.NAMESPACE.svc.cluster.local), which the prefill nodes' UCX endpoints
    and the router's control calls use. The prefill nodes are one `template: true` entry: each pod
    of the Deployment runs it at its pod IP (--set host=$(POD_IP)) and registers with the router
    under its pod name (--join pdserve-router:PORT --join-name $(POD_NAME)).
  - StatefulSet pdserve-decode + headless Service (publishNotReadyAddresses: a node resolves its
    own name before it is ready), Deployments pdserve-prefill and pdserve-router, Services
    pdserve-router (gRPC + HTTP) and pdserve-prefill (ops port, for scraping).
  - Probes: native gRPC probes against grpc.health.v1 (startup and readiness on the node's
    service name; liveness on the nodes' whole-server status; the router's liveness is its HTTP
    /live, since its health follows the nodes'), GPU requests (nvidia.com/gpu), a preStop hook that
    drains the node through the router (pdctl drain) before SIGTERM.
Writes one multi-document YAML to stdout (python3-yaml)."""
import argparse
import sys

import yaml

GRPC_PORT, HTTP_PORT, UCX_PORT = 50060, 50061, 50070
ROUTER_GRPC, ROUTER_HTTP = 50050, 50051
LABEL = "app.kubernetes.io/name"


def cluster_file(a):
    decode_svc = "pdserve-decode.%s.svc.cluster.local" % a.namespace
    nodes = [{"name": "prefill", "role": "prefill", "template": True,
              "host": "pdserve-prefill.%s.svc.cluster.local" % a.namespace,
              "port": GRPC_PORT, "http_port": HTTP_PORT, "backend": a.backend,
              "weights": a.prefill_weights, "kv": "bf16", "tp": a.tp}]
    for i in range(a.decode):
        nodes.append({"name": "pdserve-decode-%d" % i, "role": "decode",
                      "host": "pdserve-decode-%d.%s" % (i, decode_svc), "port": GRPC_PORT,
                      "ucx_port": UCX_PORT, "http_port": HTTP_PORT, "backend": a.backend,
                      "weights": a.decode_weights, "kv": a.decode_kv, "kv_budget": a.kv_budget,
                      "tp": a.tp})
    return {"model": "/models/%s" % a.model,
            "router": {"listen": "0.0.0.0:%d" % ROUTER_GRPC, "http": "0.0.0.0:%d" % ROUTER_HTTP,
                       "prefill_policy": "least_load", "decode_policy": "least_kv",
                       "request_timeout_ms": 60000},
            "transport": {"ucx_tls": a.ucx_tls, "lease_ms": 10000},
            "nodes": nodes}


def grpc_probe(port, service=None, period=10, failures=3, initial=0):
    p = {"grpc": {"port": port}, "periodSeconds": period, "failureThreshold": failures}
    if service:
        p["grpc"]["service"] = service
    if initial:
        p["initialDelaySeconds"] = initial
    return p


def env_pod():
    return [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def volumes():
    return [{"name": "cluster", "configMap": {"name": "pdserve-cluster"}},
            {"name": "models", "persistentVolumeClaim": {"claimName": a_global.models_pvc,
                                                          "readOnly": True}}]


def mounts():
    return [{"name": "cluster", "mountPath": "/etc/pdserve", "readOnly": True},
            {"name": "models", "mountPath": "/models", "readOnly": True}]


def resources(a):
    r = {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "64Gi"}}
    if a.backend == "cuda":
        r["requests"]["nvidia.com/gpu"] = a.tp
        r["limits"]["nvidia.com/gpu"] = a.tp
    if a.rdma_resource:
        r["requests"][a.rdma_resource] = 1
        r["limits"][a.rdma_resource] = 1
    return r


def node_container(a, role):
    binary = "%s-node" % role
    service = "pdserve.v1.Decode" if role == "decode" else "pdserve.v1.Prefill"
    join = "pdserve-router.%s.svc.cluster.local:%d" % (a.namespace, ROUTER_GRPC)
    if role == "decode":
        args = ["--config", "/etc/pdserve/cluster.yaml", "--node", "$(POD_NAME)", "--join", join,
                "--log-format", "json"]
        ports = [{"name": "grpc", "containerPort": GRPC_PORT},
                 {"name": "ucx", "containerPort": UCX_PORT},
                 {"name": "http", "containerPort": HTTP_PORT}]
    else:
        args = ["--config", "/etc/pdserve/cluster.yaml", "--node", "prefill", "--set",
                "host=$(POD_IP)", "--join", join, "--join-name", "$(POD_NAME)",
                "--log-format", "json"]
        ports = [{"name": "grpc", "containerPort": GRPC_PORT},
                 {"name": "http", "containerPort": HTTP_PORT}]
    sec = {"capabilities": {"add": ["IPC_LOCK"]}} if a.rdma_resource else {}
    c = {"name": role, "image": a.image, "command": ["/usr/local/bin/" + binary], "args": args,
         "env": env_pod(), "ports": ports, "volumeMounts": mounts(), "resources": resources(a),
         # loading (and quantizing) the weights: up to startup's 180 x 5 s
         "startupProbe": grpc_probe(GRPC_PORT, service, period=5, failures=180),
         "readinessProbe": grpc_probe(GRPC_PORT, service, period=5, failures=2),
         "livenessProbe": grpc_probe(GRPC_PORT, None, period=10, failures=3),
         # no new work from the router, running requests finish; then SIGTERM drains the rest
         "lifecycle": {"preStop": {"exec": {"command": [
             "/usr/local/bin/pdctl", "drain", "$(POD_NAME)", "--router", join, "--wait-s",
             "120"]}}}}
    if sec:
        c["securityContext"] = sec
    return c


def manifests(a):
    ns = a.namespace
    meta = lambda name, comp: {"name": name, "namespace": ns,  # noqa: E731
                               "labels": {LABEL: "pdserve", "app.kubernetes.io/component": comp}}
    sel = lambda comp: {LABEL: "pdserve", "app.kubernetes.io/component": comp}  # noqa: E731
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("pdserve-cluster", "config"),
             "data": {"cluster.yaml": yaml.safe_dump(cluster_file(a), sort_keys=False)}}]
    # ---- router ----
    docs.append({"apiVersion": "v1", "kind": "Service", "metadata": meta("pdserve-router", "router"),
                 "spec": {"selector": sel("router"),
                          "ports": [{"name": "grpc", "port": ROUTER_GRPC, "targetPort": "grpc"},
                                    {"name": "http", "port": ROUTER_HTTP, "targetPort": "http"}]}})
    router = {"name": "router", "image": a.image, "command": ["/usr/local/bin/router"],
              "args": ["--config", "/etc/pdserve/cluster.yaml", "--log-format", "json"],
              "ports": [{"name": "grpc", "containerPort": ROUTER_GRPC},
                        {"name": "http", "containerPort": ROUTER_HTTP}],
              "volumeMounts": mounts(),
              "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
              # ready once a prefill and a decode node serve; alive while the process answers
              "readinessProbe": grpc_probe(ROUTER_GRPC, "pdserve.v1.Inference", period=5),
              "livenessProbe": {"httpGet": {"path": "/live", "port": "http"}, "periodSeconds": 10}}
    docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": meta("pdserve-router", "router"),
                 "spec": {"replicas": 1, "selector": {"matchLabels": sel("router")},
                          "template": {"metadata": {"labels": sel("router")},
                                       "spec": {"terminationGracePeriodSeconds": 90,
                                                "containers": [router], "volumes": volumes()}}}})
    # ---- prefill ----
    docs.append({"apiVersion": "v1", "kind": "Service",
                 "metadata": meta("pdserve-prefill", "prefill"),
                 "spec": {"selector": sel("prefill"),
                          "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                                    {"name": "http", "port": HTTP_PORT, "targetPort": "http"}]}})
    docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": meta("pdserve-prefill", "prefill"),
                 "spec": {"replicas": a.prefill, "selector": {"matchLabels": sel("prefill")},
                          "strategy": {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                          "template": {"metadata": {"labels": sel("prefill")},
                                       "spec": {"terminationGracePeriodSeconds": 240,
                                                "containers": [node_container(a, "prefill")],
                                                "volumes": volumes()}}}})
    # ---- decode ----
    docs.append({"apiVersion": "v1", "kind": "Service",
                 "metadata": meta("pdserve-decode", "decode"),
                 "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                          "selector": sel("decode"),
                          "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                                    {"name": "ucx", "port": UCX_PORT, "targetPort": "ucx"},
                                    {"name": "http", "port": HTTP_PORT, "targetPort": "http"}]}})
    docs.append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                 "metadata": meta("pdserve-decode", "decode"),
                 "spec": {"replicas": a.decode, "serviceName": "pdserve-decode",
                          "podManagementPolicy": "Parallel",
                          "selector": {"matchLabels": sel("decode")},
                          "updateStrategy": {"type": "RollingUpdate"},
                          "template": {"metadata": {"labels": sel("decode")},
                                       "spec": {"terminationGracePeriodSeconds": 240,
                                                "containers": [node_container(a, "decode")],
                                                "volumes": volumes()}}}})
    return docs


a_global = None


def main(argv=None):
    global a_global
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", type=int, default=2)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--namespace", default="pdserve")
    ap.add_argument("--image", default="pdserve:latest")
    ap.add_argument("--model", default="tiny-llama", help="folder under the models volume")
    ap.add_argument("--models-pvc", default="pdserve-models")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--prefill-weights", default="fp8")
    ap.add_argument("--decode-weights", default="int4")
    ap.add_argument("--decode-kv", default="fp8")
    ap.add_argument("--kv-budget", default="40GiB")
    ap.add_argument("--ucx-tls", default="", help='UCX_TLS ("" : UCX decides; "tcp" without RDMA)')
    ap.add_argument("--rdma-resource", default="",
                    help="an RDMA device plugin's resource (e.g. rdma/rdma_shared_device_a)")
    a = ap.parse_args(argv)
    if a.prefill < 1 or a.decode < 1:
        ap.error("--prefill and --decode need at least 1")
    a_global = a
    yaml.safe_dump_all(manifests(a), sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()

"""TLS and credentials on the router (router.tls_cert / tls_key, api_keys_file, ops_token_file,
control): a certificate made now with the openssl CLI (never committed), a router + prefill +
decode node of deploy/local.yaml on free ports. Checks:
  - gRPC over TLS (python3-grpcio's secure channel, ALPN h2): Generate without a key, with a wrong
    key -> UNAUTHENTICATED; with a key of the file -> the reference greedy ids; grpc.health.v1
    needs none; a plaintext client on the TLS port and a TLS client that does not offer h2 fail;
  - HTTPS (curl --cacert): /v1/completions 401 without the key, 200 with it (Authorization: Bearer,
    as OpenAI clients send it); /health open; /metrics 401 without the ops token, 200 with it and
    counting the refusals (pdserve_router_auth_failures_total);
  - pdserve.v1.Cluster wants the ops token (an API key is not enough), on the TLS port and on the
    plaintext control address, where a node joins with PDSERVE_OPS_TOKEN_FILE and pdctl nodes /
    drain work with PDSERVE_OPS_TOKEN;
  - the nodes' control ports want the cluster token (transport.cluster_token_file): a stray
    client gets UNAUTHENTICATED for Reserve and Stats (health stays open), the router's calls carry
    it (the requests above work), pdctl health --config reads it;
  - pdctl and nodes as TLS clients (issue 16): the prefill node joins through the TLS port with
    PDSERVE_TLS_CA; pdctl generate / models / nodes / drain / undrain --router on the TLS port
    with --tls-ca (or PDSERVE_TLS_CA) work, health --config (router.tls_cert) sees the router
    SERVING; without TLS, with another CA, or with a --tls-server-name the certificate does not
    carry, pdctl fails and says why;
  - the router refuses to start with a key that does not match the certificate.
Run by meson with /usr/bin/python3; argv[1] is pdctl."""
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time

from cluster_testlib import (TEMPLATE_1, all_nodes, check, cluster, finish, model_template, pb,
                             pb_grpc, health_pb, health_grpc, reference, sampling, PDCTL)
import grpc

BIN = {"router": os.path.join(cluster.BUILD_DIR, "router", "router"),
       "prefill": os.path.join(cluster.BUILD_DIR, "prefill-node", "prefill-node"),
       "decode": os.path.join(cluster.BUILD_DIR, "decode-node", "decode-node")}
API_KEY, OPS, CLUSTER_TOKEN = "sk-test-2", "ops-7f3a9c", "cl-51d2e8"
N = 8


def make_cert(d):
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True,
                   capture_output=True)
    other = os.path.join(d, "other-key.pem")
    subprocess.run(["openssl", "genrsa", "-out", other, "2048"], check=True, capture_output=True)
    return cert, key, other


def secure(addr, cert):
    return grpc.secure_channel(addr, grpc.ssl_channel_credentials(open(cert, "rb").read()))


def gen(stub, case, key=None):
    md = [("authorization", "Bearer " + key)] if key else None
    ids = []
    try:
        for m in stub.Generate(pb.GenerateRequest(token_ids=case["input_ids"],
                                                  sampling=sampling(N, ignore_eos=True)),
                               timeout=120, metadata=md):
            ids.extend(m.token_ids)
        return grpc.StatusCode.OK, ids
    except grpc.RpcError as e:
        return e.code(), e.details()


def curl(cert, url, token=None, body=None):
    args = ["curl", "-sS", "--max-time", "60", "--cacert", cert, "-o", "-", "-w",
            "\n%{http_code}", url]
    if token:
        args += ["-H", "Authorization: Bearer " + token]
    if body:
        args += ["-H", "Content-Type: application/json", "-d", body]
    p = subprocess.run(args, capture_output=True, text=True, timeout=90)
    out, _, code = p.stdout.rpartition("\n")
    return int(code or 0), out, p.stderr


def pdctl_tls(tmp, cert, addr, cfg, case):
    """pdctl and a node's --join as TLS clients of the router's public gRPC port."""
    plog = open(os.path.join(tmp, "prefill0.log"), errors="replace").read()
    check("join-over-tls", "join %s: tls" % addr in plog and "registered with the router" in plog,
          plog[-1500:])
    other = os.path.join(tmp, "other-ca.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    os.path.join(tmp, "other-ca-key.pem"), "-out", other, "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_TLS")}
    env = dict(base, PDSERVE_API_KEY=API_KEY, PDSERVE_OPS_TOKEN=OPS)
    gen_args = [PDCTL, "generate", "--router", addr, "--prompt", case["prompt"], "--max-tokens",
                str(N), "--ignore-eos", "--json", "--timeout-ms", "60000"]

    def run(args, e=env):
        p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def ids_of(out):
        try:
            return json.loads(out.strip().splitlines()[-1])["output_ids"]
        except (ValueError, KeyError, IndexError):
            return None
    want = case["greedy_ids"][:N]
    rc, out, err = run(gen_args + ["--tls-ca", cert])
    check("pdctl-generate-tls", rc == 0 and ids_of(out) == want, (rc, out, err))
    rc, out, err = run(gen_args, dict(env, PDSERVE_TLS_CA=cert))
    check("pdctl-generate-tls-env", rc == 0 and ids_of(out) == want, (rc, out, err))
    rc, out, err = run(gen_args)
    check("pdctl-generate-plaintext-on-tls-port-fails", rc != 0 and "UNAVAILABLE" in err,
          (rc, out, err))
    rc, out, err = run(gen_args + ["--tls-ca", other])
    check("pdctl-generate-other-ca-fails", rc != 0 and "tls handshake" in err and
          "self-signed certificate" in err, (rc, out, err))
    rc, out, err = run(gen_args + ["--tls-ca", cert, "--tls-server-name", "other.example"])
    check("pdctl-generate-wrong-name-fails", rc != 0 and "hostname mismatch" in err,
          (rc, out, err))
    rc, out, err = run(gen_args + ["--tls-ca", os.path.join(tmp, "no-such-ca.pem")])
    check("pdctl-generate-missing-ca-fails", rc == 2 and "no-such-ca.pem" in err, (rc, out, err))
    rc, out, err = run([PDCTL, "models", "--router", addr, "--tls-ca", cert])
    check("pdctl-models-tls", rc == 0 and "tiny-llama" in out, (rc, out, err))
    rc, out, err = run([PDCTL, "nodes", "--router", addr, "--tls-ca", cert, "--json"])
    try:
        listed = {n["node"] for n in json.loads(out)}
    except (ValueError, KeyError, TypeError):
        listed = set()
    check("pdctl-nodes-tls", rc == 0 and listed == {"prefill0", "decode0"}, (rc, out, err))
    rc, out, err = run([PDCTL, "drain", "prefill0", "--router", addr, "--tls-ca", cert,
                        "--wait-s", "60"])
    check("pdctl-drain-tls", rc == 0 and "drained" in out, (rc, out, err))
    rc, out, err = run([PDCTL, "undrain", "prefill0", "--router", addr, "--tls-ca", cert])
    check("pdctl-undrain-tls", rc == 0, (rc, out, err))
    rc, out, err = run([PDCTL, "nodes", "--config", cfg, "--json"], dict(env, PDSERVE_TLS_CA=cert))
    check("pdctl-nodes-config-tls", rc == 0 and "prefill0" in out, (rc, out, err))
    rc, out, err = run([PDCTL, "health", "--config", cfg, "--json"], dict(env, PDSERVE_TLS_CA=cert))
    try:
        hj = {n["node"]: n for n in json.loads(out)["nodes"]}
    except (ValueError, KeyError):
        hj = {}
    check("pdctl-health-config-tls", hj.get("router", {}).get("status") == "SERVING",
          (rc, out, err))


def main():
    tmp = tempfile.mkdtemp(prefix="pd-test-tls-")
    cert, key, other_key = make_cert(tmp)
    keys = os.path.join(tmp, "api-keys")
    with open(keys, "w") as f:
        f.write("# one key per line\nsk-test-1\n%s\n" % API_KEY)
    ops = os.path.join(tmp, "ops-token")
    with open(ops, "w") as f:
        f.write(OPS + "\n")
    ctoken = os.path.join(tmp, "cluster-token")
    with open(ctoken, "w") as f:
        f.write("# the nodes' token\n" + CLUSTER_TOKEN + "\n")
    control = cluster.free_port()
    tpl = model_template(TEMPLATE_1, "tiny-llama", tmp)
    ro = {"tls_cert": cert, "tls_key": key, "api_keys_file": keys, "ops_token_file": ops,
          "control": "127.0.0.1:%d" % control}
    with open(tpl) as f:
        text, nodes = cluster.rewrite_config(f.read(), os.path.dirname(tpl),
                                             all_nodes(tpl, weights="bf16", kv="f32"), ro)
    text = text.replace("transport:\n", "transport:\n  cluster_token_file: %s\n" % ctoken, 1)
    cfg = os.path.join(tmp, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write(text)
    router = nodes[0]
    addr = "127.0.0.1:%s" % router["port"]
    http = "https://127.0.0.1:%s" % router["http"].rsplit(":", 1)[1]
    ctl = "127.0.0.1:%d" % control
    case = reference("tiny-llama")["cases"][0]
    procs = []
    env = dict(os.environ, UCX_WARN_UNUSED_ENV_VARS="n", PDSERVE_OPS_TOKEN_FILE=ops)
    try:
        # a key that is not the certificate's: the router refuses to start
        bad = cfg + ".bad"
        with open(bad, "w") as f:
            f.write(text.replace("tls_key: %s" % key, "tls_key: %s" % other_key))
        p = subprocess.run([BIN["router"], "--config", bad], capture_output=True, text=True,
                           timeout=60)
        check("mismatched-key-refused", p.returncode != 0 and "does not match" in p.stderr,
              p.stderr[-500:])

        for n in nodes:
            argv = [BIN[n["role"]], "--config", cfg]
            if n["role"] != "router":
                argv += ["--node", n["name"]]
            nenv = env
            if n["role"] == "decode":  # joins through the control address with the ops token
                argv += ["--join", ctl]
            if n["role"] == "prefill":  # joins through the public TLS port
                argv += ["--join", addr]
                nenv = dict(env, PDSERVE_TLS_CA=cert)
            log = open(os.path.join(tmp, n["name"] + ".log"), "wb")
            procs.append(subprocess.Popen(argv, env=nenv, stdout=log, stderr=subprocess.STDOUT))

        ch = secure(addr, cert)
        hstub = health_grpc.HealthStub(ch)
        end, st = time.time() + 300, None
        while time.time() < end:
            try:
                st = hstub.Check(health_pb.HealthCheckRequest(service=""), timeout=5).status
                if st == health_pb.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError as e:
                st = e.code()
            time.sleep(0.2)
        check("tls-health-open", st == health_pb.HealthCheckResponse.SERVING, st)

        stub = pb_grpc.InferenceStub(ch)
        code, _ = gen(stub, case)
        check("grpc-no-key-unauthenticated", code == grpc.StatusCode.UNAUTHENTICATED, code)
        code, _ = gen(stub, case, "sk-wrong")
        check("grpc-wrong-key-unauthenticated", code == grpc.StatusCode.UNAUTHENTICATED, code)
        code, ids = gen(stub, case, API_KEY)
        check("grpc-tls-generate", code == grpc.StatusCode.OK and ids == case["greedy_ids"][:N],
              (code, ids))

        # plaintext on the TLS port; TLS without h2 on the gRPC port
        pch = grpc.insecure_channel(addr)
        code, _ = gen(pb_grpc.InferenceStub(pch), case, API_KEY)
        check("plaintext-on-tls-port-fails", code == grpc.StatusCode.UNAVAILABLE, code)
        pch.close()
        ctx = ssl.create_default_context(cafile=cert)
        ctx.set_alpn_protocols(["http/1.1"])
        try:
            with socket.create_connection(("127.0.0.1", int(router["port"])), timeout=10) as s:
                with ctx.wrap_socket(s, server_hostname="localhost") as t:
                    alpn = t.selected_alpn_protocol()
            check("grpc-port-needs-h2", False, "handshake succeeded, alpn %s" % alpn)
        except (ssl.SSLError, OSError) as e:
            check("grpc-port-needs-h2", "alert" in str(e).lower() or "no_application_protocol"
                  in str(e).lower(), e)

        # ---- HTTPS ----
        body = json.dumps({"model": "tiny-llama", "prompt": case["prompt"], "max_tokens": 4,
                           "ignore_eos": True})
        code, out, err = curl(cert, http + "/v1/completions", body=body)
        check("https-no-key-401", code == 401 and "unauthorized" in out, (code, out, err))
        code, out, err = curl(cert, http + "/v1/completions", token="sk-nope", body=body)
        check("https-wrong-key-401", code == 401, (code, out, err))
        code, out, err = curl(cert, http + "/v1/completions", token="sk-test-1", body=body)
        try:
            usage = json.loads(out)["usage"]["completion_tokens"]
        except (ValueError, KeyError):
            usage = None
        check("https-completion", code == 200 and usage == 4, (code, out, err))
        code, out, err = curl(cert, http + "/health")
        check("https-health-open", code == 200, (code, out, err))
        code, out, err = curl(cert, http + "/metrics", token=API_KEY)
        check("metrics-needs-ops-token", code == 401, (code, out))
        code, out, err = curl(cert, http + "/metrics", token=OPS)
        refused = [ln for ln in out.splitlines()
                   if ln.startswith("pdserve_router_auth_failures_total") and 'need="api_key"' in ln]
        check("metrics-counts-refusals", code == 200 and
              sum(float(ln.rsplit(" ", 1)[1]) for ln in refused) >= 4, (code, refused))
        p = subprocess.run(["curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w",
                            "%{http_code}", "http" + http[5:] + "/health"], capture_output=True,
                           text=True)
        check("plain-http-on-https-port-fails", p.stdout.strip() != "200", p.stdout + p.stderr)

        # ---- the Cluster service: ops token ----
        cstub = pb_grpc.ClusterStub(ch)
        for what, md in (("none", None), ("api-key", [("authorization", "Bearer " + API_KEY)])):
            try:
                cstub.ListNodes(pb.ListNodesRequest(), timeout=10, metadata=md)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            check("cluster-with-%s-unauthenticated" % what,
                  code == grpc.StatusCode.UNAUTHENTICATED, code)
        rep = cstub.ListNodes(pb.ListNodesRequest(), timeout=10,
                              metadata=[("authorization", "Bearer " + OPS)])
        names = {n.name: n for n in rep.nodes}
        check("cluster-with-ops-token", set(names) == {"prefill0", "decode0"}, rep)
        # the decode node registered itself through the control address with the ops token
        dlog = open(os.path.join(tmp, "decode0.log"), errors="replace").read()
        check("node-joined-with-token", "registered with the router" in dlog, dlog[-1500:])
        p = subprocess.run([PDCTL, "nodes", "--router", ctl], capture_output=True, text=True,
                           env=dict(os.environ, PDSERVE_OPS_TOKEN=""))
        check("pdctl-nodes-without-token", p.returncode == 1 and "UNAUTHENTICATED" in p.stderr,
              p.stdout + p.stderr)
        penv = dict(os.environ, PDSERVE_OPS_TOKEN=OPS)
        p = subprocess.run([PDCTL, "drain", "decode0", "--router", ctl, "--wait-s", "60"],
                           capture_output=True, text=True, env=penv)
        check("pdctl-drain-with-token", p.returncode == 0 and "drained" in p.stdout,
              p.stdout + p.stderr)
        p = subprocess.run([PDCTL, "undrain", "decode0", "--router", ctl], capture_output=True,
                           text=True, env=penv)
        check("pdctl-undrain-with-token", p.returncode == 0, p.stdout + p.stderr)
        pdctl_tls(tmp, cert, addr, cfg, case)
        # the control address is plaintext but still wants an API key for Inference
        pch = grpc.insecure_channel(ctl)
        code, _ = gen(pb_grpc.InferenceStub(pch), case)
        check("control-port-inference-needs-key", code == grpc.StatusCode.UNAUTHENTICATED, code)
        pch.close()
        # ---- the nodes' control ports: the cluster token ----
        dnode = [n for n in nodes if n["role"] == "decode"][0]
        nch = grpc.insecure_channel("127.0.0.1:%s" % dnode["port"])
        dstub = pb_grpc.DecodeStub(nch)
        for what, call in (("reserve", lambda md: dstub.Reserve(pb.ReserveRequest(
                               request_id="stray", n_tokens=4, max_tokens=4), timeout=10,
                               metadata=md)),
                           ("stats", lambda md: dstub.Stats(pb.StatsRequest(), timeout=10,
                                                            metadata=md))):
            for how, md in (("none", None), ("wrong", [("authorization", "Bearer nope")])):
                try:
                    call(md)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                check("node-%s-%s-token-unauthenticated" % (what, how),
                      code == grpc.StatusCode.UNAUTHENTICATED, code)
        st = dstub.Stats(pb.StatsRequest(), timeout=10,
                         metadata=[("authorization", "Bearer " + CLUSTER_TOKEN)])
        check("node-stats-with-token", st.pages_total > 0, st)
        hs = health_grpc.HealthStub(nch).Check(health_pb.HealthCheckRequest(service=""),
                                               timeout=10)
        check("node-health-open", hs.status == health_pb.HealthCheckResponse.SERVING, hs)
        nch.close()
        p = subprocess.run([PDCTL, "health", "--config", cfg, "--json"], capture_output=True,
                           text=True, env={k: v for k, v in os.environ.items()
                                           if not k.startswith("PDSERVE_CLUSTER_TOKEN")})
        try:
            hj = {n["node"]: n for n in json.loads(p.stdout)["nodes"]}
        except (ValueError, KeyError):
            hj = {}
        check("pdctl-health-reads-cluster-token", hj.get("decode0", {}).get("stats") is not None,
              p.stdout + p.stderr)
        dlog = open(os.path.join(tmp, "decode0.log"), errors="replace").read()
        check("node-refusal-logged", "refused: no cluster token" in dlog, dlog[-1000:])
        ch.close()
        rlog = open(os.path.join(tmp, "router.log"), errors="replace").read()
        check("refusals-logged", "auth: grpc /pdserve.v1.Inference/Generate: missing" in rlog,
              rlog[-1500:])
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    check("router-exit-0", procs and procs[0].returncode == 0, procs and procs[0].returncode)
    for name in ("key.pem", "other-key.pem", "other-ca-key.pem"):  # never left behind
        try:
            os.unlink(os.path.join(tmp, name))
        except OSError:
            pass
    import cluster_testlib
    if cluster_testlib.failures:
        print("logs kept in %s" % tmp)
    else:
        shutil.rmtree(tmp, True)
    finish()


if __name__ == "__main__":
    main()

//! The node's kubelet API and the API server's ways to it: `nodes/proxy`,
//! `pods/proxy` and `services/proxy` (also through `kubectl proxy`), the
//! kubelet's certificate (checked against the cluster CA) and who may call
//! it (client certificates, service-account tokens, node subresources).

mod common;

use std::process::{Command, Stdio};

use common::node::{Node, BUSYBOX};

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl").args(["-sS", "-o", "-", "-w", "\n%{http_code}"]).args(args).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (code.to_string(), body.to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn kubelet_api_is_reached_through_the_api_server_and_guards_itself() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, labels: {{app: web}}}}
spec:
  containers:
  - name: httpd
    image: {BUSYBOX}
    command: ["sh", "-c", "mkdir -p /www/sub && echo hello-from-web > /www/index.html && echo deep > /www/sub/x && printf '<a href=\"/sub/x\">deep</a>' > /www/links.html && exec httpd -f -p 8080 -h /www"]
    ports: [{{name: http, containerPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  selector: {{app: web}}
  ports: [{{name: www, port: 80, targetPort: http}}]
---
apiVersion: v1
kind: Service
metadata: {{name: nobody, namespace: default}}
spec:
  selector: {{app: nobody}}
  ports: [{{port: 80}}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: watcher, namespace: default}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: node-pods-reader}}
rules: [{{apiGroups: [""], resources: [nodes/proxy], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: watcher-node-pods}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: node-pods-reader}}
subjects: [{{kind: ServiceAccount, name: watcher, namespace: default}}]
"#
    ));
    node.eventually("web runs", 60, || node.get(&["pod", "web"], "{.status.phase}") == "Running");
    node.eventually("web has an endpoint", 30, || {
        !node
            .get(&["endpointslices", "-l", "kubernetes.io/service-name=web"], "{.items[*].endpoints[*].addresses}")
            .is_empty()
    });

    // nodes/proxy: the kubelet's own paths.
    let healthz = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/healthz", node.name)]);
    assert_eq!(healthz.trim(), "ok");
    let pods = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/pods", node.name)]);
    let pods: serde_json::Value = serde_json::from_str(&pods).expect("PodList");
    assert_eq!(pods["kind"], "PodList");
    assert!(pods["items"].as_array().unwrap().iter().any(|p| p["metadata"]["name"] == "web"), "{pods}");

    // pods/proxy by port number and by port name; services/proxy by port name.
    for path in [
        "/api/v1/namespaces/default/pods/web:8080/proxy/index.html",
        // No port: the first one the pod's containers declare.
        "/api/v1/namespaces/default/pods/web/proxy/index.html",
        "/api/v1/namespaces/default/pods/web:http/proxy/index.html",
        "/api/v1/namespaces/default/services/web:www/proxy/index.html",
        "/api/v1/namespaces/default/services/web/proxy/index.html",
    ] {
        assert_eq!(node.ok(&["get", "--raw", path]).trim(), "hello-from-web", "{path}");
    }
    assert_eq!(node.ok(&["get", "--raw", "/api/v1/namespaces/default/services/web:80/proxy/sub/x"]).trim(), "deep");
    // An HTML page's links go through the proxy again, as upstream rewrites them.
    for prefix in
        ["/api/v1/namespaces/default/pods/web:8080/proxy", "/api/v1/namespaces/default/services/web:www/proxy"]
    {
        let page = node.ok(&["get", "--raw", &format!("{prefix}/links.html")]);
        assert_eq!(page.trim(), format!(r#"<a href="{prefix}/sub/x">deep</a>"#));
    }
    let (ok, out) = node.kubectl(&["get", "--raw", "/api/v1/namespaces/default/services/nobody:80/proxy/"]);
    assert!(!ok && out.contains("no endpoints available for service"), "{out}");
    let (ok, out) = node.kubectl(&["get", "--raw", "/api/v1/namespaces/default/pods/web:http/proxy/missing"]);
    assert!(!ok && out.contains("NotFound"), "{out}");

    // kubectl proxy, then a plain HTTP client on it.
    let port = common::free_port();
    let mut proxy = Command::new("kubectl")
        .env("KUBECONFIG", node.kubeconfig())
        .args(["proxy", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl proxy");
    let url = format!("http://127.0.0.1:{port}/api/v1/namespaces/default/services/web:www/proxy/");
    node.eventually("kubectl proxy serves the Service", 20, || {
        curl(&[&url]) == ("200".into(), "hello-from-web\n".into())
    });
    let _ = proxy.kill();
    let _ = proxy.wait();

    // The kubelet API itself: its certificate is the cluster CA's, for the node's address.
    let tls = node.dir.path().join("server").join("tls");
    let ca = tls.join("server-ca.crt");
    let kubelet = format!("https://{}:10250", node.ip);
    let (cert, key) = (tls.join("client-admin.crt"), tls.join("client-admin.key"));
    let mut args =
        vec!["--cacert", ca.to_str().unwrap(), "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()];
    let healthz_url = format!("{kubelet}/healthz");
    args.push(&healthz_url);
    assert_eq!(curl(&args), ("200".into(), "ok".into()));
    // No credentials: 401; a token of an account allowed nodes/proxy but
    // not nodes/metrics: /pods yes, /metrics no, with upstream's text.
    let pods_url = format!("{kubelet}/pods");
    assert_eq!(curl(&["--cacert", ca.to_str().unwrap(), &pods_url]).0, "401");
    let token = node.ok(&["create", "token", "watcher"]);
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let (code, body) = curl(&["--cacert", ca.to_str().unwrap(), "-H", &bearer, &pods_url]);
    assert_eq!(code, "200", "{body}");
    let metrics_url = format!("{kubelet}/metrics");
    let (code, body) = curl(&["--cacert", ca.to_str().unwrap(), "-H", &bearer, &metrics_url]);
    assert_eq!(code, "403", "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=system:serviceaccount:default:watcher, verb=get, resource=nodes, subresource=metrics)"
    );
    let (code, _) = curl(&["--cacert", ca.to_str().unwrap(), "-H", "Authorization: Bearer not-a-token", &pods_url]);
    assert_eq!(code, "401");
}

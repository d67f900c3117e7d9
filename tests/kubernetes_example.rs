//! conf/kubernetes/corral.yaml, checked: parsed as YAML (by Debian's python3 and its yaml
//! module, python3-yaml, which scripts/setup-peers.sh installs), its probes must name the status listener's `/ping` and
//! `/ready` on the port the embedded corral.toml gives `[status]`, the corral container must
//! expose the http listener's port, the stop budget must hold (the app outlives corral's
//! shutdown_delay + grace, and terminationGracePeriodSeconds outlives both), and the embedded
//! configuration must pass `corral check`.

mod support;

use std::collections::HashMap;
use std::process::Command;

/// Debian's interpreter, which python3-yaml serves (the `python3` on PATH may be another).
const PYTHON: &str = "/usr/bin/python3";

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/kubernetes/corral.yaml");

/// Reads the manifest with PyYAML: the facts as `key=value` lines, and the ConfigMap's
/// corral.toml written to argv[2].
const EXTRACT: &str = r#"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = {d["kind"]: d for d in docs}
config = kinds["ConfigMap"]["data"]["corral.toml"]
open(sys.argv[2], "w").write(config)
pod = kinds["Deployment"]["spec"]["template"]["spec"]
out = {"termination_grace": pod["terminationGracePeriodSeconds"]}
mounted = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
out["config_volume_is_the_configmap"] = kinds["ConfigMap"]["metadata"]["name"] in mounted.values()
for c in pod["containers"]:
    name = c["name"]
    for probe in ("livenessProbe", "readinessProbe"):
        if probe in c:
            get = c[probe]["httpGet"]
            out["%s.%s.path" % (name, probe)] = get["path"]
            out["%s.%s.port" % (name, probe)] = get["port"]
            out["%s.%s.period" % (name, probe)] = c[probe].get("periodSeconds", 10)
            out["%s.%s.failures" % (name, probe)] = c[probe].get("failureThreshold", 3)
    out["%s.ports" % name] = ",".join(str(p["containerPort"]) for p in c.get("ports", []))
    if "args" in c:
        out["%s.args" % name] = " ".join(c["args"])
    for m in c.get("volumeMounts", []):
        out["%s.mount.%s" % (name, m["name"])] = m["mountPath"]
    stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if stop:
        out["%s.prestop" % name] = " ".join(stop)
for k, v in out.items():
    print("%s=%s" % (k, v))
"#;

fn seconds(text: &str) -> u64 {
    humantime::parse_duration(text)
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
        .as_secs()
}

#[test]
fn the_kubernetes_example_probes_the_status_listener_and_its_config_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("corral.toml");
    let out = Command::new(PYTHON)
        .args(["-c", EXTRACT, MANIFEST])
        .arg(&config_path)
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        out.status.success(),
        "the manifest does not parse as the example it should be:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let facts: HashMap<String, String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let fact = |k: &str| {
        facts
            .get(k)
            .unwrap_or_else(|| panic!("no {k} in {facts:#?}"))
            .as_str()
    };

    // The embedded configuration, as corral reads it.
    let text = std::fs::read_to_string(&config_path).unwrap();
    let config: toml::Table = toml::from_str(&text).unwrap();
    let status = config["status"]["address"].as_str().unwrap();
    let status_port = status.rsplit_once(':').unwrap().1;
    let http_port = config["listen"].as_array().unwrap()[0]["address"]
        .as_str()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1;
    let server = config["server"].as_table().unwrap();
    let delay = seconds(server["shutdown_delay"].as_str().unwrap());
    let grace = seconds(server["grace"].as_str().unwrap());

    // Liveness on /ping, readiness on /ready, both on the status listener.
    assert_eq!(fact("corral.livenessProbe.path"), "/ping");
    assert_eq!(fact("corral.readinessProbe.path"), "/ready");
    assert_eq!(fact("corral.livenessProbe.port"), status_port);
    assert_eq!(fact("corral.readinessProbe.port"), status_port);
    let ports: Vec<&str> = fact("corral.ports").split(',').collect();
    assert!(ports.contains(&http_port), "{ports:?} lacks {http_port}");
    assert!(
        ports.contains(&status_port),
        "{ports:?} lacks {status_port}"
    );
    // corral runs the ConfigMap's file.
    assert_eq!(fact("config_volume_is_the_configmap"), "True");
    let mount = fact("corral.mount.config");
    assert_eq!(
        fact("corral.args"),
        format!("run -c {mount}/corral.toml"),
        "corral must run the mounted corral.toml"
    );

    // The stop budget: the endpoint is removed (readiness fails) within shutdown_delay...
    let readiness: u64 = fact("corral.readinessProbe.period").parse::<u64>().unwrap()
        * fact("corral.readinessProbe.failures")
            .parse::<u64>()
            .unwrap();
    assert!(
        readiness < delay,
        "readiness takes {readiness}s to fail, shutdown_delay is {delay}s"
    );
    // ...the app keeps serving until corral has drained...
    let prestop = fact("php.prestop");
    let sleep: u64 = prestop
        .strip_prefix("sleep ")
        .unwrap_or_else(|| panic!("{prestop:?}"))
        .parse()
        .unwrap();
    assert!(
        sleep >= delay + grace,
        "the app stops after {sleep}s, corral drains until {}s",
        delay + grace
    );
    // ...and nothing is killed before both are done.
    let termination: u64 = fact("termination_grace").parse().unwrap();
    assert!(
        termination > sleep && termination > delay + grace,
        "terminationGracePeriodSeconds {termination} is not above {sleep}s and {}s",
        delay + grace
    );

    // corral itself accepts the file.
    let checked = support::corral(&["check", "-c", config_path.to_str().unwrap()]);
    assert_eq!(
        checked.code,
        Some(0),
        "{}{}",
        checked.stdout,
        checked.stderr
    );
}

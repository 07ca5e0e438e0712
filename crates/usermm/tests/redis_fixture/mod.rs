//! Test fixture: a Redis Cluster of 3 primaries and 3 replicas on loopback ports, in a temporary
//! directory of its own, password-protected (`requirepass`/`masterauth`) with an ACL user
//! `swapper`. Started with `redis-server` and `redis-cli --cluster create`, torn down on drop
//! (every node killed by pid, the directory removed), also when the test fails.
//! Shared by the swap device's conformance test (src/swap/conformance.rs) and tests/redis.rs;
//! `bench/redis-cluster.sh` does the same for benchmarks.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PASSWORD: &str = "usermm-test-pw";
pub const USER: &str = "swapper";

pub struct Cluster {
    pub dir: PathBuf,
    pub ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

/// Whether the Redis tools are installed (`.ci/run` installs them).
pub fn available() -> bool {
    ["redis-server", "redis-cli"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
        && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok()
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-a",
            PASSWORD,
            "--no-auth-warning",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Cluster {
    /// Starts the cluster and waits until it reports `cluster_state:ok` (panics after 60 s).
    pub fn start() -> Cluster {
        static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let mut base = 21000 + (std::process::id() % 200) as u16 * 40;
        let dir = std::env::temp_dir().join(format!(
            "usermm-redis-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Cluster {
            dir,
            ports: Vec::new(),
            children: Vec::new(),
        };
        while c.ports.len() < 6 {
            base += 1;
            if base > 29990 {
                base = 21000;
            }
            if free(base) {
                c.ports.push(base);
            }
        }
        for i in 0..6 {
            c.children.push(Some(c.spawn(i)));
        }
        for &p in &c.ports {
            c.wait_for(&format!("node {p} answering"), || {
                cli(p, &["ping"]).trim() == "PONG"
            });
        }
        let nodes: Vec<String> = c.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = cli(c.ports[0], &args);
        assert!(
            out.contains("[OK] All 16384 slots covered"),
            "cluster create: {out}"
        );
        c.wait_ok();
        for &p in &c.ports {
            let r = cli(
                p,
                &[
                    "acl",
                    "setuser",
                    USER,
                    "on",
                    &format!(">{PASSWORD}"),
                    "~*",
                    "&*",
                    "+@all",
                ],
            );
            assert_eq!(r.trim(), "OK", "ACL SETUSER on {p}");
        }
        c
    }

    fn spawn(&self, i: usize) -> Child {
        let p = self.ports[i];
        let d = self.dir.join(p.to_string());
        std::fs::create_dir_all(&d).unwrap();
        // Through util-linux's setpriv: the server gets SIGKILL when the thread that started
        // it ends, so a test killed by a signal (SIGBUS, a timeout) leaves no server behind.
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL", "redis-server"]);
            c
        } else {
            Command::new("redis-server")
        };
        cmd.args([
            "--port",
            &p.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            d.to_str().unwrap(),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1500",
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            PASSWORD,
            "--masterauth",
            PASSWORD,
            "--logfile",
            "redis.log",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting redis-server")
    }

    fn wait_for(&self, what: &str, mut ok: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !ok() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "redis cluster: timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub fn wait_ok(&self) {
        let live: Vec<u16> = (0..6)
            .filter(|&i| self.children[i].is_some())
            .map(|i| self.ports[i])
            .collect();
        self.wait_for("cluster_state:ok", || {
            live.iter()
                .all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
        });
        // A replica is assigned before its first sync is done; WAIT on a primary whose
        // replica is still syncing times out. Wait until every primary with a live replica
        // sees it online.
        self.wait_for("replicas online", || {
            live.iter().all(|&p| {
                let info = cli(p, &["info", "replication"]);
                !info.contains("role:master")
                    || info.contains("connected_slaves:0")
                    || info
                        .lines()
                        .any(|l| l.starts_with("slave0:") && l.contains("state=online"))
            })
        });
    }

    /// `redis://USER@host:port,...` of every node.
    pub fn spec(&self, user: bool) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        if user {
            format!("redis://{USER}@{}", nodes.join(","))
        } else {
            format!("redis://{}", nodes.join(","))
        }
    }

    /// Indexes of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<usize> {
        (0..6)
            .filter(|&i| self.children[i].is_some())
            .filter(|&i| cli(self.ports[i], &["role"]).starts_with("master"))
            .collect()
    }

    /// Kills node `i` (SIGKILL) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn kill_all(&mut self) {
        for i in 0..6 {
            self.kill(i);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

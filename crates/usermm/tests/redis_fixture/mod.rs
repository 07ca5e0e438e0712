//! Test fixture: a Redis Cluster of 3 primaries and 3 replicas on loopback ports, in a temporary
//! directory of its own, password-protected (`requirepass`/`masterauth`) with an ACL user
//! `swapper`. Started with `redis-server` and `redis-cli --cluster create`, torn down on drop
//! (every node killed by pid, the directory removed), also when the test fails.
//! [`Cluster::start_tls`] starts the same cluster speaking only TLS (`--port 0 --tls-port`,
//! `--tls-cluster yes`, `--tls-replication yes`, client certificates required) with a throwaway
//! CA, server and client certificates made by `openssl` in the cluster's directory.
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
    /// The certificates of a TLS cluster (None: plain TCP).
    pub tls: Option<Certs>,
    children: Vec<Option<Child>>,
    /// This cluster's turn (see [`ONE_CLUSTER`]), released after the nodes are killed.
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// One cluster at a time per test binary: each starts six servers, and two clusters forming at
/// once on a loaded 2-CPU machine can miss the fixture's deadline.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// PEM files made at start in the cluster's directory: the CA, the nodes' certificate (for
/// 127.0.0.1, also the one they present to each other), a client certificate, and a second CA
/// that signed none of them.
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub other_ca: PathBuf,
}

/// Whether `openssl` is installed (`.ci/run` installs it), for [`Cluster::start_tls`].
pub fn openssl_available() -> bool {
    Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `openssl ARGS` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Certs {
    /// A CA, a server certificate for 127.0.0.1/localhost (server and client use, as cluster
    /// nodes present it to each other), a client certificate, and an unrelated second CA: P-256
    /// keys, valid for two days.
    fn make(dir: &Path) -> Certs {
        const EC: [&str; 5] = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let run = |args: &[&str]| openssl(dir, args);
        for ca in ["ca", "other-ca"] {
            let (key, crt, subj) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=usermm test {ca}"),
            );
            run(&[
                &["req", "-x509", "-new"],
                &EC[..],
                &[
                    "-keyout",
                    &key,
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-subj",
                    &subj,
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            ]
            .concat());
        }
        // Nodes present the server certificate to clients and to each other (cluster bus,
        // replication), hence both uses.
        const SERVER: &str = "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
                              extendedKeyUsage=serverAuth,clientAuth\n";
        const CLIENT: &str = "extendedKeyUsage=clientAuth\n";
        const LEAF: &str =
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n";
        for (n, serial, ext) in [("server", "1", SERVER), ("client", "2", CLIENT)] {
            let key = format!("{n}.key");
            let csr = format!("{n}.csr");
            let crt = format!("{n}.crt");
            let extf = format!("{n}.ext");
            let subj = format!("/CN=usermm test {n}");
            let req = ["-keyout", &key, "-out", &csr, "-subj", &subj];
            run(&[&["req", "-new"], &EC[..], &req[..]].concat());
            std::fs::write(dir.join(&extf), format!("{ext}{LEAF}")).unwrap();
            let ca = ["-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", serial];
            let out = ["-days", "2", "-out", &crt, "-extfile", &extf];
            run(&[&["x509", "-req", "-in", &csr], &ca[..], &out[..]].concat());
        }
        Certs {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            other_ca: dir.join("other-ca.crt"),
        }
    }
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

impl Cluster {
    /// `redis-cli` on node `port` (over TLS with the client certificate for a TLS cluster).
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-a",
            PASSWORD,
            "--no-auth-warning",
        ]);
        if let Some(t) = &self.tls {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.client_cert)
                .arg("--key")
                .arg(&t.client_key);
        }
        let out = cmd
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts the cluster and waits until it reports `cluster_state:ok` (panics after 60 s).
    pub fn start() -> Cluster {
        Self::start_with(false)
    }

    /// [`Cluster::start`], the nodes speaking only TLS (see the module documentation); needs
    /// `openssl` ([`openssl_available`]).
    pub fn start_tls() -> Cluster {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Cluster {
        // A test that failed holding the turn poisons the lock; its cluster is gone all the same.
        let turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
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
            tls: None,
            children: Vec::new(),
            _turn: turn,
        };
        // Made after `c` exists, so its drop removes the directory if openssl fails.
        if tls {
            c.tls = Some(Certs::make(&c.dir));
        }
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
        for i in 0..6 {
            let p = c.ports[i];
            c.wait_for(&format!("node {p} answering"), |c| {
                c.cli(p, &["ping"]).trim() == "PONG"
            });
        }
        let nodes: Vec<String> = c.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = c.cli(c.ports[0], &args);
        assert!(
            out.contains("[OK] All 16384 slots covered"),
            "cluster create: {out}"
        );
        c.wait_ok();
        for &p in &c.ports {
            let r = c.cli(
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
        let port = p.to_string();
        match &self.tls {
            None => cmd.args(["--port", &port]),
            Some(t) => cmd
                .args(["--port", "0", "--tls-port", &port])
                .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                .args(["--tls-auth-clients", "yes"])
                .arg("--tls-cert-file")
                .arg(&t.server_cert)
                .arg("--tls-key-file")
                .arg(&t.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&t.ca),
        };
        cmd.args([
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

    fn wait_for(&mut self, what: &str, mut ok: impl FnMut(&Cluster) -> bool) {
        let t0 = Instant::now();
        while !ok(self) {
            // A node that exited (a bad option, TLS not built in) fails now, with its log.
            for i in 0..6 {
                let Some(c) = self.children.get_mut(i).and_then(Option::as_mut) else {
                    continue;
                };
                if let Ok(Some(st)) = c.try_wait() {
                    let log = self.dir.join(self.ports[i].to_string()).join("redis.log");
                    let log = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    panic!(
                        "redis cluster: node {} exited ({st}) while waiting for {what}: {}",
                        self.ports[i],
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    );
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "redis cluster: timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub fn wait_ok(&mut self) {
        let live: Vec<u16> = (0..6)
            .filter(|&i| self.children[i].is_some())
            .map(|i| self.ports[i])
            .collect();
        self.wait_for("cluster_state:ok", |c| {
            live.iter()
                .all(|&p| c.cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
        });
        // A replica is assigned before its first sync is done; WAIT on a primary whose
        // replica is still syncing times out. Wait until every primary with a live replica
        // sees it online.
        self.wait_for("replicas online", |c| {
            live.iter().all(|&p| {
                let info = c.cli(p, &["info", "replication"]);
                !info.contains("role:master")
                    || info.contains("connected_slaves:0")
                    || info
                        .lines()
                        .any(|l| l.starts_with("slave0:") && l.contains("state=online"))
            })
        });
    }

    /// `redis://USER@host:port,...` of every node (`rediss://` for a TLS cluster).
    pub fn spec(&self, user: bool) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        if user {
            format!("{scheme}://{USER}@{}", nodes.join(","))
        } else {
            format!("{scheme}://{}", nodes.join(","))
        }
    }

    /// Indexes of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<usize> {
        (0..6)
            .filter(|&i| self.children[i].is_some())
            .filter(|&i| self.cli(self.ports[i], &["role"]).starts_with("master"))
            .collect()
    }

    /// Keys stored in the cluster: the sum of the primaries' `DBSIZE`.
    pub fn keys(&self) -> u64 {
        self.primaries()
            .into_iter()
            .map(|i| {
                self.cli(self.ports[i], &["dbsize"])
                    .trim()
                    .parse::<u64>()
                    .unwrap_or_else(|e| panic!("DBSIZE of node {i}: {e}"))
            })
            .sum()
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

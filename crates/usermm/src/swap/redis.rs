//! The Redis Cluster swap device: far memory on an existing distributed store. Swap slots are
//! keys of a Redis Cluster reached through the `redis` crate's cluster client. Mirrors the swap
//! path of `mm/page_io.c` (`swap_writepage` / `swap_read_folio`) over a remote store, in the
//! spirit of far-memory swap systems (Infiniswap, Fastswap) but on stock Redis.
//!
//! Keys: the 64 slots of a group share one Redis string, `usermm:{<device id>:<s / 64>}`,
//! slot `s` at byte `(s % 64) * 4104` of it: its page, then an 8-byte trailer (`s + 1`,
//! little-endian). The part in braces is the hash tag, so a group lives on one cluster node,
//! and a run of slots inside it (a reclaim batch or a readahead window) is one `SETRANGE` or
//! `GETRANGE` of one contiguous range: one command, not one per page. Redis's cost is per
//! command (on this 2-vCPU VM `redis-benchmark` does 207k SETs/s of 4 KiB, 810 MiB/s, but
//! 47k of 64 KiB, 3 GB/s), so a page per key capped the device below 1 GiB/s. Runs that span
//! groups go out as one cluster pipeline (every node's commands sent before any reply is
//! read). A wholly freed group is deleted (`DEL`, discard); a partly freed one keeps its
//! bytes until it is reused or wholly freed.
//!
//! A page that is not there reads as an error, never as zeros: a value too short for the
//! slot, or a trailer that is not the slot's (a group lost in a failover and recreated by a
//! later `SETRANGE`, which zero-fills what lies before it) fails the read naming the key.
//!
//! Durability: a write returns once the primary has the pages; with `sync_replicas` = N it
//! then sends `WAIT N` to that primary (not to every primary, where the cluster client would
//! send a keyless command) and fails unless N replicas acknowledged, so a failover loses
//! nothing that was acknowledged. A primary that a failover left with fewer than N replicas
//! (its replica promoted, none to spare; `CLUSTER SLOTS` lists the available ones) is asked
//! for all it has, and such writes are counted (`redis_wait_degraded`) and logged: the pages
//! go on being swapped rather than pinned in memory until an operator adds a replica. A failed write leaves the pages resident and dirty (the core retries them
//! later); a read retries through a failover (the client follows MOVED/redirections and
//! reconnects) and, if the key is gone, fails naming the key: the core then poisons the page
//! (SIGBUS on access), counts `swap_read_error` and logs the error. Every operation is bounded by
//! the connection and response timeouts, so nothing hangs on a dead node.
//!
//! Credentials: `redis://user@host:port,...` names the ACL user; the password comes from
//! `USERMM_REDIS_PASSWORD` or the file named by `USERMM_REDIS_PASSWORD_FILE`, never from the
//! spec (a spec with a password is refused).
//!
//! TLS: `rediss://...` reaches every node over TLS (the `redis` crate's rustls, ring as its
//! crypto provider), the nodes' certificates checked against the CA in the PEM file named by
//! `USERMM_REDIS_CACERT` (the system's roots if unset) and, for mutual TLS, a client certificate
//! and key from the PEM files `USERMM_REDIS_CERT` and `USERMM_REDIS_KEY` (both or neither). The
//! files are read and checked when the device opens, so a missing or wrong file fails
//! `Mm::new` naming the variable and the path; so does a TLS variable set for a plain
//! `redis://` spec (the pages would travel in the clear).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::crypt::SlotCipher;
use super::file::{check_pool_pages, check_slots, pages_for_size};
use super::{SlotRun, SwapDevice};
use crate::conv::{Narrow, Saturate};
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::sys::{Mapping, PAGE_SIZE};

/// Slots per hash tag: one Redis string, one node, one command per run.
pub const SLOTS_PER_TAG: u64 = 64;

/// Bytes of a slot's trailer: `slot + 1`, little-endian (never zero, so a zero-filled range
/// is told from a stored page).
const TRAILER: usize = 8;

/// Bytes a slot takes in its group's string: the page and its trailer.
pub const SLOT_STRIDE: usize = PAGE_SIZE + TRAILER;

/// A run's part in one group: (first slot, slots, index of the first in the run's pages).
type Group = (u64, usize, usize);

/// The trailer stored after `slot`'s page.
fn trailer(slot: u64) -> [u8; TRAILER] {
    (slot + 1).to_le_bytes()
}

/// The swap-in readahead window the device asks for ([`SwapDevice::ra_pages`]), whatever
/// `page_cluster` says: four hash tags. swap-w-seq's read-back at 256 MiB: 186 MiB/s with 32
/// pages, 213 with 128, 294 with 256 (one run each, loopback cluster of 3 + 3 on this 2-vCPU
/// VM).
pub const RA_PAGES: u32 = 256;
const _: () = assert!(RA_PAGES as u64 == 4 * SLOTS_PER_TAG);

/// The variable naming a run (`usermm run` sets it for the program it starts): a device opened
/// with it set names its keys `usermm:{<run>-<pid>-<time>:<group>}`, so that whoever started
/// the run can delete every key the run's processes left ([`purge_run`]), also those of a
/// process killed before it could delete its own.
pub const RUN_ENV: &str = "USERMM_REDIS_RUN";

/// The variable naming the PEM file of the CA that signed the nodes' certificates.
pub const CACERT_ENV: &str = "USERMM_REDIS_CACERT";
/// The variable naming the PEM file of the client certificate (chain) for mutual TLS.
pub const CERT_ENV: &str = "USERMM_REDIS_CERT";
/// The variable naming the PEM file of the client certificate's private key.
pub const KEY_ENV: &str = "USERMM_REDIS_KEY";

/// TLS settings of a `rediss://` device: PEM files; a field left None is taken from its
/// variable ([`CACERT_ENV`], [`CERT_ENV`], [`KEY_ENV`]) when the device opens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// The CA certificate(s) the nodes' certificates must chain to; with neither this nor
    /// `USERMM_REDIS_CACERT`, the system's root store.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate chain for mutual TLS (with `key`).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
}

/// Settings of a Redis Cluster device (`redis[s]://[user@]host:port[,host:port...]`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// Seed nodes, `host:port`.
    pub nodes: Vec<String>,
    /// ACL user; None = the default user.
    pub user: Option<String>,
    /// TLS (`rediss://`); None = plain TCP (`redis://`).
    pub tls: Option<RedisTls>,
    /// Replicas that must acknowledge a write (`WAIT`); 0 = the primary only.
    pub sync_replicas: u32,
    /// Connect and response timeout.
    pub timeout: Duration,
    /// Capacity in bytes.
    pub size: u64,
    /// The password; None = from `USERMM_REDIS_PASSWORD` / `USERMM_REDIS_PASSWORD_FILE` when
    /// the device opens. Never part of the spec, never printed.
    pub password: Option<String>,
    /// How long a read keeps retrying through a failover before it fails.
    pub read_retry: Duration,
    /// Encrypt every page before it leaves the process (ChaCha20-Poly1305, a random key held
    /// only in memory; see `crypt.rs`): the cluster's operators, its RDB/AOF files and the
    /// network see ciphertext, and a value altered or moved in the store fails the read.
    pub encrypt: bool,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("spec", &self.spec())
            .field("tls", &self.tls)
            .field("sync_replicas", &self.sync_replicas)
            .field("timeout", &self.timeout)
            .field("size", &self.size)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl RedisConfig {
    /// Parses `redis://[user@]host:port[,host:port...]`, or `rediss://...` for TLS.
    pub fn parse(spec: &str, size: u64) -> Result<RedisConfig, String> {
        let (rest, tls) = if let Some(r) = spec.strip_prefix("rediss://") {
            (r, Some(RedisTls::default()))
        } else if let Some(r) = spec.strip_prefix("redis://") {
            (r, None)
        } else {
            return Err(format!("{spec:?} is not a redis:// or rediss:// address"));
        };
        let (user, hosts) = match rest.rsplit_once('@') {
            Some((u, h)) => {
                if u.contains(':') {
                    return Err(
                        "a password in the swap spec is refused (it would show in ps and logs): \
                         set USERMM_REDIS_PASSWORD or USERMM_REDIS_PASSWORD_FILE"
                            .into(),
                    );
                }
                if u.is_empty() {
                    return Err("empty user name before '@'".into());
                }
                (Some(u.to_string()), h)
            }
            None => (None, rest),
        };
        let mut nodes = Vec::new();
        for h in hosts.split(',').map(str::trim) {
            let ok = h.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(format!("node {h:?} is not host:port"));
            }
            nodes.push(h.to_string());
        }
        Ok(RedisConfig {
            nodes,
            user,
            tls,
            sync_replicas: 0,
            timeout: Duration::from_secs(2),
            size,
            password: None,
            read_retry: Duration::from_secs(15),
            encrypt: false,
        })
    }

    /// The spec [`RedisConfig::parse`] reads back.
    pub fn spec(&self) -> String {
        let scheme = self.scheme();
        match &self.user {
            Some(u) => format!("{scheme}://{u}@{}", self.nodes.join(",")),
            None => format!("{scheme}://{}", self.nodes.join(",")),
        }
    }

    /// `rediss` with TLS, `redis` without.
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }
}

/// A PEM file of the TLS settings: where it came from (the variable or the `RedisTls` field,
/// for messages), its path and its bytes.
struct PemFile {
    from: String,
    path: PathBuf,
    pem: Vec<u8>,
}

impl PemFile {
    /// Reads the file `field` names, or the one its variable `var` names; None if neither is set.
    fn load(
        field: &Option<PathBuf>,
        field_name: &str,
        var: &str,
        env: &dyn Fn(&str) -> Option<OsString>,
        what: &str,
    ) -> io::Result<Option<PemFile>> {
        let (from, path) = match (field, env(var)) {
            (Some(p), _) => (format!("RedisTls::{field_name}"), p.clone()),
            (None, Some(v)) => (var.to_string(), PathBuf::from(v)),
            (None, None) => return Ok(None),
        };
        if path.as_os_str().is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{from} is empty: set it to the PEM file of {what}, or unset it"),
            ));
        }
        let pem = std::fs::read(&path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot read {from} {}: {e}: it must name the PEM file of {what}",
                    path.display()
                ),
            )
        })?;
        Ok(Some(PemFile { from, path, pem }))
    }

    /// `FROM PATH`, for messages.
    fn named(&self) -> String {
        format!("{} {}", self.from, self.path.display())
    }

    /// The certificates in the file; an error naming it if it holds none or a broken one.
    fn certificates(&self) -> io::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&self.pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a valid PEM certificate file: {e}", self.named()),
                )
            })?;
        if certs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds no certificate (no -----BEGIN CERTIFICATE----- block)",
                    self.named()
                ),
            ));
        }
        Ok(certs)
    }
}

/// The certificates of a `rediss://` device from `tls` and the variables `env` looks up, read
/// and checked (every certificate parses and is usable as a trust anchor, the key parses and
/// matches the client certificate) by building the rustls client configuration the `redis`
/// crate will build; None when there is nothing to add to the crate's defaults (the system's
/// roots, no client certificate). Errors name the variable (or field), the path and what to do.
fn tls_certificates(
    tls: &RedisTls,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> io::Result<Option<redis::TlsCertificates>> {
    let ca = PemFile::load(
        &tls.ca_cert,
        "ca_cert",
        CACERT_ENV,
        env,
        "the CA that signed the cluster nodes' certificates",
    )?;
    let cert = PemFile::load(
        &tls.cert,
        "cert",
        CERT_ENV,
        env,
        "the client certificate (mutual TLS)",
    )?;
    let key = PemFile::load(
        &tls.key,
        "key",
        KEY_ENV,
        env,
        "the client certificate's private key",
    )?;
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &ca {
        for c in ca.certificates()? {
            roots.add(c).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: a certificate is not a usable CA: {e}", ca.named()),
                )
            })?;
        }
    }
    let client = match (cert, key) {
        (None, None) => None,
        (Some(c), None) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is set but not its key: mutual TLS needs both; set {KEY_ENV} to the \
                     key's PEM file",
                    c.named()
                ),
            ))
        }
        (None, Some(k)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is set but not the certificate: mutual TLS needs both; set {CERT_ENV} to \
                     the client certificate's PEM file",
                    k.named()
                ),
            ))
        }
        (Some(c), Some(k)) => {
            use rustls::pki_types::pem::PemObject;
            let chain = c.certificates()?;
            let der = rustls::pki_types::PrivateKeyDer::from_pem_slice(&k.pem).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} holds no usable private key ({e}): give the PEM key (PKCS#8, \
                         PKCS#1 or SEC1) of {}",
                        k.named(),
                        c.named()
                    ),
                )
            })?;
            // What the redis crate does with them: the key must be usable and match.
            rustls::ClientConfig::builder()
                .with_root_certificates(roots.clone())
                .with_client_auth_cert(chain, der)
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the client certificate {} and key {} do not go together: {e}",
                            c.named(),
                            k.named()
                        ),
                    )
                })?;
            Some(redis::ClientTlsConfig {
                client_cert: c.pem,
                client_key: k.pem,
            })
        }
    };
    if ca.is_none() && client.is_none() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: client,
        root_cert: ca.map(|c| c.pem),
    }))
}

/// Makes ring rustls's process-wide crypto provider unless one is installed already (rustls
/// panics when it must pick among several compiled in).
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: theirs is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The TLS variables that are set (not empty), for refusing them with a plain `redis://` spec.
fn tls_vars_set(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<&'static str> {
    [CACERT_ENV, CERT_ENV, KEY_ENV]
        .into_iter()
        .filter(|v| env(v).is_some_and(|x| !x.is_empty()))
        .collect()
}

/// A hint for a failed connection of a `rediss://` device, from rustls's and the socket's
/// words; empty when the error says nothing about TLS.
fn tls_hint(cfg: &RedisConfig, ca: Option<&Path>, e: &str) -> String {
    let ca = match ca {
        Some(p) => format!("the CA in {}", p.display()),
        None => format!("the system's roots ({CACERT_ENV} is not set)"),
    };
    let any = |words: &[&str]| words.iter().any(|w| e.contains(w));
    if cfg.tls.is_none() {
        return if any(&["reset by peer", "roken pipe", "closed", "dropped"]) {
            ": the node closed the connection; if the nodes speak TLS, use rediss://".into()
        } else {
            String::new()
        };
    }
    if any(&["UnknownIssuer", "BadSignature"]) {
        format!(
            ": the nodes' certificate is not signed by {ca}; set {CACERT_ENV} to the PEM file of \
             the CA that signed it"
        )
    } else if any(&["NotValidForName"]) {
        ": the nodes' certificate does not name the address in the spec (nor the one the \
         cluster announces): it needs that IP address or host name as a subjectAltName"
            .into()
    } else if any(&["Expired", "NotValidYet"]) {
        ": the nodes' certificate is outside its validity period".into()
    } else if any(&[
        "CertificateRequired",
        "HandshakeFailure",
        "BadCertificate",
        "UnknownCA",
        "reset by peer",
    ]) {
        format!(
            ": the node refused the TLS handshake; if it requires client certificates \
             (tls-auth-clients), set {CERT_ENV} and {KEY_ENV} to a certificate and key its \
             CA accepts"
        )
    } else if any(&[
        "corrupt message",
        "InvalidContentType",
        "InvalidMessage",
        "timed out",
        // A read timeout of the handshake: EAGAIN.
        "os error 11",
    ]) {
        ": no TLS answer: are these the nodes' tls-ports? Use redis:// for plain TCP ports".into()
    } else {
        String::new()
    }
}

/// The password from `USERMM_REDIS_PASSWORD` or the file `USERMM_REDIS_PASSWORD_FILE`.
fn password() -> io::Result<Option<String>> {
    if let Ok(p) = std::env::var("USERMM_REDIS_PASSWORD") {
        return Ok(Some(p));
    }
    if let Ok(f) = std::env::var("USERMM_REDIS_PASSWORD_FILE") {
        let p = std::fs::read_to_string(&f).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot read USERMM_REDIS_PASSWORD_FILE {f}: {e}"),
            )
        })?;
        return Ok(Some(p.trim_end_matches(['\n', '\r']).to_string()));
    }
    Ok(None)
}

/// A swap device on a Redis Cluster (see the module documentation).
pub struct RedisSwap {
    cfg: RedisConfig,
    client: redis::cluster::ClusterClient,
    /// Idle connections (the cluster connection is not shareable between threads).
    conns: Mutex<Vec<redis::cluster::ClusterConnection>>,
    id: String,
    nr_pages: u64,
    writes: AtomicU64,
    reads: AtomicU64,
    round_trips: AtomicU64,
    errors: AtomicU64,
    missing: AtomicU64,
    retries: AtomicU64,
    /// Writes acknowledged by fewer than `sync_replicas` replicas because their primary had
    /// fewer (a failover promoted a replica and left it none).
    degraded: AtomicU64,
    /// The cluster's replicas per hash-slot range (`CLUSTER SLOTS`: first, last, replicas
    /// available), read when a WAIT falls short, and when it was read. While fresh, WAIT asks
    /// a primary left short by a failover for the replicas it has.
    replica_map: Mutex<Option<ReplicaMap>>,
    /// When reads began failing to reach the cluster (None while it answers).
    outage: Mutex<Option<std::time::Instant>>,
    /// Encryption at rest (`RedisConfig::encrypt`).
    crypt: Option<SlotCipher>,
    /// One bit per group that may hold data in the cluster: set before a write, cleared when
    /// a discard deletes the group. Dropping the device deletes the groups still set, so a
    /// process that exits leaves nothing in the cluster.
    live: Vec<AtomicU64>,
}

impl std::fmt::Debug for RedisSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSwap")
            .field("spec", &self.cfg.spec())
            .field("id", &self.id)
            .finish()
    }
}

/// Redis Cluster's `HASH_SLOT` of a key or hash tag with no braces: CRC16/XMODEM mod 16384.
fn hash_slot_of(tag: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag) % 16384
}

/// When `CLUSTER SLOTS` was read, and its ranges: (first hash slot, last, replicas).
type ReplicaMap = (std::time::Instant, Vec<(u16, u16, u32)>);

/// `CLUSTER SLOTS` as (first hash slot, last hash slot, replicas listed): each entry is
/// `[first, last, primary, replica...]`, and Redis lists only the replicas available.
fn parse_cluster_slots(v: &redis::Value) -> Vec<(u16, u16, u32)> {
    let redis::Value::Array(ranges) = v else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|r| match r {
            redis::Value::Array(e) if e.len() >= 3 => match (&e[0], &e[1]) {
                // Hash slots are 0..16384; anything else is not a slot range.
                (redis::Value::Int(a), redis::Value::Int(b)) => Some((
                    u16::try_from(*a).ok()?,
                    u16::try_from(*b).ok()?,
                    (e.len() - 3).u32(),
                )),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn redis_err(what: &str, e: redis::RedisError) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        io::ErrorKind::ConnectionRefused
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("{what}: {e}"))
}

impl RedisSwap {
    /// Connects to the cluster and checks the credentials (a wrong password fails here, with
    /// the user named).
    pub fn open(cfg: &RedisConfig) -> io::Result<RedisSwap> {
        Self::open_with_env(cfg, &|v| std::env::var_os(v))
    }

    /// [`RedisSwap::open`] with the variables (`USERMM_REDIS_*`) looked up by `env`.
    pub(super) fn open_with_env(
        cfg: &RedisConfig,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> io::Result<RedisSwap> {
        let nr_pages = pages_for_size(cfg.size)?;
        let certs = match &cfg.tls {
            Some(tls) => tls_certificates(tls, env)?,
            None => {
                let set = tls_vars_set(env);
                if !set.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{} set, but the swap spec {} is plain TCP (pages would travel in \
                             the clear): use rediss:// for TLS, or unset {}",
                            set.join(", "),
                            cfg.spec(),
                            set.join(" and ")
                        ),
                    ));
                }
                None
            }
        };
        let ca_path = cfg.tls.as_ref().and_then(|t| {
            t.ca_cert
                .clone()
                .or_else(|| env(CACERT_ENV).map(PathBuf::from))
        });
        let scheme = cfg.scheme();
        let urls: Vec<String> = cfg
            .nodes
            .iter()
            .map(|n| format!("{scheme}://{n}"))
            .collect();
        let mut b = redis::cluster::ClusterClientBuilder::new(urls)
            .connection_timeout(cfg.timeout)
            .response_timeout(cfg.timeout)
            .retries(3)
            .min_retry_wait(100)
            .max_retry_wait(1000);
        if let Some(u) = &cfg.user {
            b = b.username(u.clone());
        }
        let pw = match &cfg.password {
            Some(p) => Some(p.clone()),
            None => password()?,
        };
        if let Some(p) = pw {
            b = b.password(p);
        }
        if let Some(c) = certs {
            b = b.certs(c);
        }
        let client = b
            .build()
            .map_err(|e| redis_err(&format!("redis cluster {}", cfg.spec()), e))?;
        let user = cfg.user.as_deref().unwrap_or("default");
        let mut conn = client.get_connection().map_err(|e| {
            let hint = if e.kind() == redis::ErrorKind::AuthenticationFailed
                || e.to_string().contains("WRONGPASS")
                || e.to_string().contains("NOAUTH")
                || e.to_string().contains("AuthenticationFailed")
            {
                format!(
                    ": authentication as user {user:?} failed; set the password in \
                     USERMM_REDIS_PASSWORD or USERMM_REDIS_PASSWORD_FILE"
                )
            } else {
                tls_hint(cfg, ca_path.as_deref(), &format!("{e:?} {e}"))
            };
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("cannot connect to redis cluster {}: {e}{hint}", cfg.spec()),
            )
        })?;
        let pong: String = redis::cmd("PING")
            .query(&mut conn)
            .map_err(|e| redis_err(&format!("PING redis cluster {}", cfg.spec()), e))?;
        if pong != "PONG" {
            return Err(io::Error::other(format!(
                "redis cluster {} answered PING with {pong:?}",
                cfg.spec()
            )));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let run = match env(RUN_ENV) {
            Some(r) if !r.is_empty() => {
                let r = r.to_string_lossy().into_owned();
                check_run(&r).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("{RUN_ENV}={r:?}: {e}"))
                })?;
                format!("{r}-")
            }
            _ => String::new(),
        };
        Ok(RedisSwap {
            cfg: cfg.clone(),
            client,
            conns: Mutex::new(vec![conn]),
            id: format!("{run}{}-{:x}", std::process::id(), now & 0xffff_ffff_ffff),
            nr_pages,
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            missing: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            degraded: AtomicU64::new(0),
            replica_map: Mutex::new(None),
            outage: Mutex::new(None),
            live: (0..nr_pages.div_ceil(SLOTS_PER_TAG).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            crypt: if cfg.encrypt {
                Some(SlotCipher::new(nr_pages)?)
            } else {
                None
            },
        })
    }

    /// The key of `slot`'s group (the Redis string that holds it).
    pub fn key(&self, slot: u64) -> String {
        format!("usermm:{{{}:{}}}", self.id, slot / SLOTS_PER_TAG)
    }

    /// Where `slot`'s bytes start in its group's string.
    pub fn offset(slot: u64) -> usize {
        (slot % SLOTS_PER_TAG).usize() * SLOT_STRIDE
    }

    /// The cluster hash slot of slot `slot`'s key: CRC16/XMODEM of its hash tag, mod 16384
    /// (the Redis Cluster specification's `HASH_SLOT`).
    fn hash_slot(&self, slot: u64) -> u16 {
        hash_slot_of(format!("{}:{}", self.id, slot / SLOTS_PER_TAG).as_bytes())
    }

    /// `WAIT` on the primary of hash slot `hs` (slot `s`'s group) for `n` replicas, or for all
    /// it has when a failover left it fewer (`CLUSTER SLOTS` lists the available ones): such a
    /// write is accepted with every replica there is, counted (`redis_wait_degraded`) and
    /// logged; the cluster is asked again once its map is a few seconds old.
    fn wait_replicas(
        &self,
        conn: &mut redis::cluster::ClusterConnection,
        s: u64,
        hs: u16,
        n: u32,
    ) -> io::Result<()> {
        const FRESH: Duration = Duration::from_secs(5);
        let known = |map: &Option<ReplicaMap>| {
            map.as_ref()
                .filter(|(t, _)| t.elapsed() < FRESH)
                .and_then(|(_, v)| v.iter().find(|&&(a, b, _)| a <= hs && hs <= b))
                .map(|&(_, _, r)| r)
        };
        let cached = known(&self.replica_map.lock());
        let target = cached.map_or(n, |r| r.min(n));
        let acked: i64 = if target == 0 {
            0
        } else {
            // WAIT's own timeout is shorter than the response timeout, so a short count comes
            // back as a count, not as a timed-out read.
            let mut wait = redis::cmd("WAIT");
            wait.arg(target)
                .arg((self.cfg.timeout.as_millis().sat_u64() / 2).max(1));
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                hs,
                SlotAddr::Master,
            )));
            conn.route_command(&wait, route)
                .and_then(|v| redis::from_redis_value(&v))
                .map_err(|e| redis_err("redis WAIT", e))?
        };
        if acked >= i64::from(n) {
            return Ok(());
        }
        if cached.is_some() && acked >= i64::from(target) {
            self.degraded.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let v = cluster_slots(conn)?;
        let map = parse_cluster_slots(&v);
        let fresh = Some((std::time::Instant::now(), map));
        let r = known(&fresh);
        *self.replica_map.lock() = fresh;
        match r {
            Some(r) if r < n && acked >= i64::from(r) => {
                log::warn!(
                    "redis: the primary of hash slot {hs} has {r} of the {n} replicas asked for \
                     (a failover left it short); its writes are acknowledged by the {r} there are"
                );
                self.degraded.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "redis WAIT: only {acked} of {n} replicas acknowledged the write of {}",
                    self.key(s)
                ),
            )),
        }
    }

    fn with_conn<R>(
        &self,
        f: impl FnOnce(&mut redis::cluster::ClusterConnection) -> io::Result<R>,
    ) -> io::Result<R> {
        let conn = self.conns.lock().pop();
        let mut conn = match conn {
            Some(c) => c,
            None => self.client.get_connection().map_err(|e| {
                // A node that cannot be reached is an error of the device like a failed command.
                self.errors.fetch_add(1, Ordering::Relaxed);
                redis_err(&format!("connecting to {}", self.cfg.spec()), e)
            })?,
        };
        let r = f(&mut conn);
        match &r {
            // A connection that failed may be broken: drop it, the next call makes a new one.
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => self.conns.lock().push(conn),
        }
        r
    }

    /// Runs of `[slot, slot+n)` that share a hash tag: (first slot, count, index of the first).
    fn groups(slot: u64, n: usize) -> Vec<Group> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < n {
            let s = slot + i as u64;
            let left = (SLOTS_PER_TAG - s % SLOTS_PER_TAG).usize();
            let k = left.min(n - i);
            out.push((s, k, i));
            i += k;
        }
        out
    }
}

impl SwapDevice for RedisSwap {
    fn name(&self) -> String {
        let sync = if self.cfg.sync_replicas > 0 {
            format!(", WAIT {}", self.cfg.sync_replicas)
        } else {
            String::new()
        };
        let enc = if self.crypt.is_some() {
            ", encrypted"
        } else {
            ""
        };
        format!("{} ({} pages{sync}{enc})", self.cfg.spec(), self.nr_pages)
    }

    fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    /// A failover (a replica promoted after the node timeout) heals failing writes: waited
    /// for as long as reads retry.
    fn retry_window(&self) -> Duration {
        self.cfg.read_retry
    }

    /// Four hash tags (256 pages, 1 MiB) per major fault: every read is a network round trip
    /// and a Redis command, so a sequential reader gets this window even with a smaller
    /// `page_cluster` (chosen for a local device).
    fn ra_pages(&self) -> Option<u32> {
        Some(RA_PAGES)
    }

    fn write_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        check_slots(slot, pages.len() as u64, self.nr_pages)?;
        check_pool_pages(pool, pages)?;
        if pages.is_empty() {
            return Ok(());
        }
        let groups = Self::groups(slot, pages.len());
        let mut cmds = Vec::with_capacity(groups.len());
        for &(s, k, i) in &groups {
            self.set_live(s / SLOTS_PER_TAG, true);
            // The run's pages, each followed by its trailer: one contiguous range of the group.
            let mut val = vec![0u8; k * SLOT_STRIDE];
            for (j, chunk) in val.chunks_exact_mut(SLOT_STRIDE).enumerate() {
                let (page, tail) = chunk.split_at_mut(PAGE_SIZE);
                pool.read_bytes(pages[i + j], page)?;
                if let Some(c) = &self.crypt {
                    c.seal(s + j as u64, page)?;
                }
                tail.copy_from_slice(&trailer(s + j as u64));
            }
            // A whole group is a SET: Redis keeps the argument as the value, where SETRANGE
            // copies it into a string it first makes and zero-fills.
            let cmd = if k as u64 == SLOTS_PER_TAG {
                let mut c = redis::cmd("SET");
                c.arg(self.key(s)).arg(&val[..]);
                c
            } else {
                let mut c = redis::cmd("SETRANGE");
                c.arg(self.key(s)).arg(Self::offset(s)).arg(&val[..]);
                c
            };
            cmds.push(cmd);
        }
        self.with_conn(|conn| {
            self.exec(conn, cmds).map_err(|e| {
                redis_err(
                    &format!(
                        "redis SETRANGE of {} pages at {} (slot {slot})",
                        pages.len(),
                        self.key(slot)
                    ),
                    e,
                )
            })?;
            if self.cfg.sync_replicas > 0 {
                // WAIT goes to the primary that took each group's write. (Sent as a plain
                // command, the cluster client asks every primary and takes the minimum: one
                // shard left without a replica by a failover would fail every write.)
                let n = self.cfg.sync_replicas;
                let mut waited = Vec::new();
                for &(s, _, _) in &groups {
                    let hs = self.hash_slot(s);
                    if waited.contains(&hs) {
                        continue;
                    }
                    waited.push(hs);
                    self.wait_replicas(conn, s, hs, n)?;
                }
            }
            Ok(())
        })?;
        self.writes.fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn read_pages(&self, slot: u64, pool: &Mapping, pages: &[usize]) -> io::Result<()> {
        self.read_runs(&[SlotRun { slot, pages }], pool)
            .pop()
            .unwrap_or(Ok(()))
    }

    /// Every run's groups in one cluster pipeline: a readahead window whose slots are not
    /// consecutive costs one round trip to each node it touches, not one per run.
    fn read_runs(&self, runs: &[SlotRun<'_>], pool: &Mapping) -> Vec<io::Result<()>> {
        let checked: Vec<io::Result<()>> = runs
            .iter()
            .map(|r| {
                check_slots(r.slot, r.pages.len() as u64, self.nr_pages)?;
                check_pool_pages(pool, r.pages)
            })
            .collect();
        // Runs that passed the checks and have pages, with their groups.
        let todo: Vec<(usize, Vec<Group>)> = runs
            .iter()
            .enumerate()
            .filter(|&(i, r)| checked[i].is_ok() && !r.pages.is_empty())
            .map(|(i, r)| (i, Self::groups(r.slot, r.pages.len())))
            .collect();
        let mut out = checked;
        if todo.is_empty() {
            return out;
        }
        // A node that is down may come back as its replica is promoted: retry connection
        // failures and timeouts until `read_retry` has passed since the outage began (the
        // first read that failed and no read succeeded since), so a cluster that stays down
        // costs the retry window once, not once per page; a missing page fails at once.
        let began = *self
            .outage
            .lock()
            .get_or_insert_with(std::time::Instant::now);
        let values = loop {
            match self.fetch(&todo) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Other
                    ) && began.elapsed() < self.cfg.read_retry =>
                {
                    log::warn!("{e}; retrying");
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    let text = e.to_string();
                    for &(i, _) in &todo {
                        out[i] = Err(io::Error::new(e.kind(), text.clone()));
                    }
                    return out;
                }
                // The cluster answered (the data, or that it is gone): no outage.
                Ok(v) => {
                    *self.outage.lock() = None;
                    break v;
                }
            }
        };
        let mut values = values.into_iter();
        for (i, groups) in &todo {
            let pages = runs[*i].pages;
            let mut r = Ok(());
            for &(s, k, at) in groups {
                let v = values.next().unwrap_or_default();
                if r.is_ok() {
                    r = self.unpack(s, &v, &pages[at..at + k], pool);
                }
            }
            if r.is_ok() {
                self.reads.fetch_add(pages.len() as u64, Ordering::Relaxed);
            }
            out[*i] = r;
        }
        out
    }

    fn discard(&self, slot: u64, n: u64) -> io::Result<()> {
        self.discard_inner(slot, n)
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.counter_values()
    }
}

impl RedisSwap {
    /// Sends `cmds` and returns their replies: one command alone, more as one cluster pipeline
    /// (every node's commands are sent before any reply is read). One round trip either way.
    fn exec(
        &self,
        conn: &mut redis::cluster::ClusterConnection,
        cmds: Vec<redis::Cmd>,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        use redis::ConnectionLike;
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        if cmds.len() == 1 {
            let v = conn.req_command(&cmds[0])?;
            return v.extract_error().map(|v| vec![v]);
        }
        let mut pipe = redis::cluster::cluster_pipe();
        for c in cmds {
            pipe.add_command(c);
        }
        pipe.query(conn)
    }

    /// The stored bytes of every group of `todo`'s runs, in order: one `GETRANGE` each.
    fn fetch(&self, todo: &[(usize, Vec<Group>)]) -> io::Result<Vec<Vec<u8>>> {
        let mut cmds = Vec::new();
        for (_, groups) in todo {
            for &(s, k, _) in groups {
                let start = Self::offset(s);
                let mut cmd = redis::cmd("GETRANGE");
                cmd.arg(self.key(s))
                    .arg(start)
                    .arg(start + k * SLOT_STRIDE - 1);
                cmds.push(cmd);
            }
        }
        let first = todo[0].1[0].0;
        let n = cmds.len();
        let what = || format!("redis GETRANGE of {n} range(s) from {}", self.key(first));
        self.with_conn(|conn| {
            let vals = self.exec(conn, cmds).map_err(|e| redis_err(&what(), e))?;
            vals.into_iter()
                .map(redis::from_owned_redis_value::<Vec<u8>>)
                .collect::<redis::RedisResult<Vec<_>>>()
                .map_err(|e| redis_err(&what(), e))
        })
    }

    /// Checks and copies group bytes `v` (slots `s..s + pages.len()`) into `pages`.
    fn unpack(&self, s: u64, v: &[u8], pages: &[usize], pool: &Mapping) -> io::Result<()> {
        // Decryption works in place: a copy of each page, only when encrypted.
        let mut buf = if self.crypt.is_some() {
            vec![0u8; PAGE_SIZE]
        } else {
            Vec::new()
        };
        for (j, &off) in pages.iter().enumerate() {
            let slot = s + j as u64;
            let Some(chunk) = v.get(j * SLOT_STRIDE..(j + 1) * SLOT_STRIDE) else {
                // The core reads only slots it wrote: a value too short is lost data.
                self.missing.fetch_add(1, Ordering::Relaxed);
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "redis key {} ends before slot {slot} (lost in a failover, evicted, or \
                         deleted): the page is gone",
                        self.key(slot)
                    ),
                ));
            };
            let (page, tail) = chunk.split_at(PAGE_SIZE);
            if tail != trailer(slot) {
                self.missing.fetch_add(1, Ordering::Relaxed);
                let zeros = tail.iter().all(|&b| b == 0);
                return Err(io::Error::new(
                    if zeros {
                        io::ErrorKind::NotFound
                    } else {
                        io::ErrorKind::InvalidData
                    },
                    if zeros {
                        format!(
                            "redis key {} holds zeros where slot {slot} was written (the key \
                             was lost and written again): the page is gone",
                            self.key(slot)
                        )
                    } else {
                        format!(
                            "redis key {} holds another slot's bytes at slot {slot}",
                            self.key(slot)
                        )
                    },
                ));
            }
            match &self.crypt {
                Some(c) => {
                    buf.copy_from_slice(page);
                    c.open(slot, &mut buf).inspect_err(|_| {
                        self.missing.fetch_add(1, Ordering::Relaxed);
                    })?;
                    pool.write_bytes(off, &buf)?;
                }
                None => pool.write_bytes(off, page)?,
            }
        }
        Ok(())
    }

    /// Deletes the groups `[slot, slot + n)` covers wholly; a group it covers in part keeps its
    /// bytes (the core discards whole swap clusters, 256 slots, four groups).
    fn discard_inner(&self, slot: u64, n: u64) -> io::Result<()> {
        check_slots(slot, n, self.nr_pages)?;
        if n == 0 {
            return Ok(());
        }
        if let Some(c) = &self.crypt {
            c.forget(slot, n);
        }
        let whole: Vec<u64> = Self::groups(slot, n.usize())
            .into_iter()
            .filter(|&(_, k, _)| k as u64 == SLOTS_PER_TAG)
            .map(|(s, _, _)| s / SLOTS_PER_TAG)
            .collect();
        self.delete_groups(&whole)
    }

    /// Marks group `g` as possibly holding data (or not).
    fn set_live(&self, g: u64, live: bool) {
        let (w, bit) = ((g / 64).usize(), 1u64 << (g % 64));
        if live {
            if self.live[w].load(Ordering::Relaxed) & bit == 0 {
                self.live[w].fetch_or(bit, Ordering::Relaxed);
            }
        } else {
            self.live[w].fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Deletes groups `gs` (`DEL`, one pipeline) and marks them empty.
    fn delete_groups(&self, gs: &[u64]) -> io::Result<()> {
        let Some(&first) = gs.first() else {
            return Ok(());
        };
        let cmds: Vec<redis::Cmd> = gs
            .iter()
            .map(|&g| {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(self.key(g * SLOTS_PER_TAG));
                cmd
            })
            .collect();
        self.with_conn(|conn| {
            self.exec(conn, cmds)
                .map_err(|e| {
                    redis_err(
                        &format!(
                            "redis DEL of {} group(s) from {}",
                            gs.len(),
                            self.key(first * SLOTS_PER_TAG)
                        ),
                        e,
                    )
                })
                .map(drop)
        })?;
        for &g in gs {
            self.set_live(g, false);
        }
        Ok(())
    }

    /// The groups that may still hold data.
    fn live_groups(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, word) in self.live.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                out.push(w as u64 * 64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
        out
    }
    fn counter_values(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("redis_read_retries", self.retries.load(Ordering::Relaxed)),
            ("redis_pages_written", self.writes.load(Ordering::Relaxed)),
            ("redis_pages_read", self.reads.load(Ordering::Relaxed)),
            (
                "redis_round_trips",
                self.round_trips.load(Ordering::Relaxed),
            ),
            ("redis_errors", self.errors.load(Ordering::Relaxed)),
            ("redis_missing_keys", self.missing.load(Ordering::Relaxed)),
            ("redis_wait_degraded", self.degraded.load(Ordering::Relaxed)),
        ]
    }
}

/// Whether `run` can name a run ([`RUN_ENV`]): 1 to 64 letters, digits, `_` or `-` (it is
/// part of every key and of a SCAN pattern).
pub fn check_run(run: &str) -> Result<(), String> {
    if run.is_empty()
        || run.len() > 64
        || !run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err("a run is named by 1 to 64 letters, digits, '_' or '-'".into());
    }
    Ok(())
}

/// Deletes every key of run `run` ([`RUN_ENV`]) from the cluster `cfg` names: each primary is
/// scanned (`SCAN` with the run's pattern) and its keys deleted in pipelines. Returns how many
/// keys were deleted. Bounded by the device's timeouts; an error names what failed.
pub fn purge_run(cfg: &RedisConfig, run: &str) -> io::Result<u64> {
    check_run(run)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{run:?}: {e}")))?;
    let mut c = cfg.clone();
    c.size = c.size.max(PAGE_SIZE as u64);
    c.encrypt = false;
    let dev = RedisSwap::open_with_env(&c, &|v| {
        if v == RUN_ENV {
            None
        } else {
            std::env::var_os(v)
        }
    })?;
    let pattern = format!("usermm:{{{run}-*");
    dev.with_conn(|conn| {
        let v = cluster_slots(conn)?;
        let mut deleted = 0u64;
        for (host, port) in cluster_primaries(&v) {
            let node = || {
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                })
            };
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, keys): (u64, Vec<String>) = conn
                    .route_command(&scan, node())
                    .and_then(redis::from_owned_redis_value)
                    .map_err(|e| redis_err(&format!("redis SCAN of {host}:{port}"), e))?;
                if !keys.is_empty() {
                    let n = keys.len() as u64;
                    let cmds = keys
                        .into_iter()
                        .map(|k| {
                            let mut c = redis::cmd("DEL");
                            c.arg(k);
                            c
                        })
                        .collect();
                    dev.exec(conn, cmds)
                        .map_err(|e| redis_err(&format!("redis DEL of run {run}'s keys"), e))?;
                    deleted += n;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(deleted)
    })
}

/// `CLUSTER SLOTS`, asked of any primary.
fn cluster_slots(conn: &mut redis::cluster::ClusterConnection) -> io::Result<redis::Value> {
    let mut slots = redis::cmd("CLUSTER");
    slots.arg("SLOTS");
    conn.route_command(
        &slots,
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
    )
    .map_err(|e| redis_err("redis CLUSTER SLOTS", e))
}

/// The primaries of a `CLUSTER SLOTS` answer, each once: (host, port).
fn cluster_primaries(v: &redis::Value) -> Vec<(String, u16)> {
    let redis::Value::Array(ranges) = v else {
        return Vec::new();
    };
    let mut out: Vec<(String, u16)> = Vec::new();
    for r in ranges {
        let redis::Value::Array(e) = r else { continue };
        let Some(redis::Value::Array(node)) = e.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(redis::Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(port) = (match node.get(1) {
            Some(redis::Value::Int(p)) => u16::try_from(*p).ok(),
            _ => None,
        }) else {
            continue;
        };
        if !out.iter().any(|(h, p)| *h == host && *p == port) {
            out.push((host, port));
        }
    }
    out
}

/// Nothing in swap outlives its device: the groups that may still hold pages are deleted, a
/// pipeline of `DEL`s per 1024 groups. A cluster that cannot be reached is given up on after
/// the first failure (bounded by the connection and response timeouts) and the keys left are
/// logged with their prefix; so are a process's keys when it is killed before this runs
/// (`usermm:{<pid>-<time>:*}`; `redis-cli -c -p PORT --scan --pattern 'usermm:{<pid>-*'` on
/// each primary lists them).
impl Drop for RedisSwap {
    fn drop(&mut self) {
        let live = self.live_groups();
        for chunk in live.chunks(1024) {
            if let Err(e) = self.delete_groups(chunk) {
                log::warn!(
                    "{e}: {} group(s) of keys usermm:{{{}:*}} are left in the cluster",
                    self.live_groups().len(),
                    self.id
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        hash_slot_of, parse_cluster_slots, tls_certificates, RedisConfig, RedisSwap, RedisTls,
        CACERT_ENV, CERT_ENV, KEY_ENV,
    };
    use redis::Value;
    use std::ffi::OsString;

    #[test]
    fn rediss_selects_tls_and_reads_back() {
        let r =
            RedisConfig::parse("rediss://swapper@10.0.0.1:6380,10.0.0.2:6380", 1 << 20).unwrap();
        assert_eq!(r.tls, Some(RedisTls::default()));
        assert_eq!(r.user.as_deref(), Some("swapper"));
        assert_eq!(r.spec(), "rediss://swapper@10.0.0.1:6380,10.0.0.2:6380");
        let r = RedisConfig::parse("redis://10.0.0.1:6379", 1 << 20).unwrap();
        assert_eq!(
            (&r.tls, r.spec().as_str()),
            (&None, "redis://10.0.0.1:6379")
        );
        for (bad, named) in [
            ("rediss://u:pw@h:1", "password in the swap spec is refused"),
            ("rediss://h", "\"h\" is not host:port"),
            ("redisss://h:1", "not a redis:// or rediss:// address"),
        ] {
            let e = RedisConfig::parse(bad, 1 << 20).unwrap_err();
            assert!(e.contains(named), "{bad}: {e}");
        }
        let z = crate::SwapConfig::parse("zswap+rediss://h:1", 1 << 20).unwrap();
        assert_eq!(z.spec().unwrap(), "zswap:lz4,pool=20%+rediss://h:1");
    }

    /// An environment of `vars` for [`tls_certificates`] and [`RedisSwap::open_with_env`].
    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn tls_files_from_the_environment_fail_clearly() {
        let none = RedisTls::default();
        assert!(tls_certificates(&none, &env(&[])).unwrap().is_none());
        let err = |vars: &[(&str, &str)]| {
            tls_certificates(&none, &env(vars))
                .err()
                .expect("an error")
                .to_string()
        };
        let e = err(&[(CACERT_ENV, "/nonexistent/ca.pem")]);
        assert!(
            e.contains("cannot read USERMM_REDIS_CACERT /nonexistent/ca.pem")
                && e.contains("the CA that signed the cluster nodes' certificates"),
            "{e}"
        );
        let e = err(&[(CACERT_ENV, "")]);
        assert!(e.contains("USERMM_REDIS_CACERT is empty"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let junk = junk.to_str().unwrap();
        let e = err(&[(CACERT_ENV, junk)]);
        assert!(e.contains("holds no certificate"), "{e}");
        let e = err(&[(CERT_ENV, junk)]);
        assert!(
            e.contains("USERMM_REDIS_CERT") && e.contains("set USERMM_REDIS_KEY"),
            "{e}"
        );
        let e = err(&[(KEY_ENV, junk)]);
        assert!(
            e.contains("USERMM_REDIS_KEY") && e.contains("set USERMM_REDIS_CERT"),
            "{e}"
        );
        // A field of the configuration wins over the variable, and is named as such.
        let field = RedisTls {
            ca_cert: Some("/nonexistent/field.pem".into()),
            ..RedisTls::default()
        };
        let e = tls_certificates(&field, &env(&[(CACERT_ENV, junk)]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("cannot read RedisTls::ca_cert /nonexistent/field.pem"),
            "{e}"
        );
    }

    #[test]
    fn tls_variables_with_a_plain_spec_are_refused() {
        let r = RedisConfig::parse("redis://127.0.0.1:1", 1 << 20).unwrap();
        let e = RedisSwap::open_with_env(&r, &env(&[(CACERT_ENV, "/x/ca.pem")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "USERMM_REDIS_CACERT set, but the swap spec redis://127.0.0.1:1 is plain TCP"
            ) && e.contains("use rediss://"),
            "{e}"
        );
        // Empty is unset: the device goes on to connect (and fails: nothing listens on port 1).
        let e = RedisSwap::open_with_env(&r, &env(&[(CACERT_ENV, "")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot connect to redis cluster redis://127.0.0.1:1"),
            "{e}"
        );
    }

    #[test]
    fn hash_slots_match_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        // CRC16/XMODEM check value of "123456789" is 0x31c3 (< 16384).
        assert_eq!(hash_slot_of(b"123456789"), 0x31c3);
        assert_eq!(hash_slot_of(b"somekey"), 11058);
        assert_eq!(hash_slot_of(b"hash_tag"), 2515);
    }

    #[test]
    fn cluster_slots_give_the_replicas_of_each_range() {
        let node = |p: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(p),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node(1)]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node(2), node(3)]),
        ]);
        assert_eq!(
            parse_cluster_slots(&v),
            vec![(0, 5460, 0), (5461, 16383, 1)]
        );
        assert!(parse_cluster_slots(&Value::Nil).is_empty());
    }
}

//! A memory manager swapping to a live Redis Cluster (tests/redis_fixture: 3 primaries, 3
//! replicas on loopback): a primary killed mid-workload with WAIT 1, and every word verified
//! after the failover; every node killed; and the same cluster over TLS (`rediss://`), set up
//! from the `USERMM_*` variables as the front ends do.

mod common;
mod redis_fixture;

use std::time::Duration;

use usermm::swap::RedisConfig;
use usermm::{Mm, MmConfig, SwapConfig};

/// A running cluster (one at a time: the fixture takes turns), and a device configuration for
/// it: the ACL user, the fixture's password, 64 MiB.
struct Fixture {
    cluster: redis_fixture::Cluster,
    cfg: RedisConfig,
}

/// None (with a message) where redis-server is not installed.
fn fixture() -> Option<Fixture> {
    if !redis_fixture::available() {
        common::skip("redis-server/redis-cli not installed (.ci/run installs them)");
        return None;
    }
    let _ = env_logger::builder().is_test(true).try_init();
    let cluster = redis_fixture::Cluster::start();
    let mut cfg = RedisConfig::parse(&cluster.spec(true), 64 << 20).unwrap();
    cfg.password = Some(redis_fixture::PASSWORD.into());
    Some(Fixture { cluster, cfg })
}

fn word(i: usize, pass: u64) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ pass
}

// While the killed primary's slots have no owner, swap-out writes to them fail; reclaim keeps
// those pages resident and dirty and a fault that needs a frame waits up to the device's
// retry window (`SwapDevice::retry_window`: the read-retry time for Redis) instead of giving
// up after 50 ms and poisoning the page.
#[test]
fn primary_killed_mid_workload_loses_nothing() {
    let Some(Fixture {
        cluster: mut c,
        cfg: mut r,
    }) = fixture()
    else {
        return;
    };
    r.sync_replicas = 1;
    r.read_retry = Duration::from_secs(30);
    let mm = Mm::new(MmConfig::new(8 << 20).swap(SwapConfig::Redis(r))).unwrap();
    let len = 24 << 20;
    let reg = mm.map_anon(len).unwrap();
    for i in (0..len / 8).step_by(8) {
        reg.write_u64(i * 8, word(i, 1));
    }
    let vm = mm.vmstat();
    assert!(vm.val("redis_pages_written") > 0, "{vm}");
    // Kill one primary; its replica takes over after the node timeout (1.5 s).
    let victim = c.primaries()[0];
    c.kill(victim);
    // Keep working through the failover: reads of its pages retry, writes to it fail and
    // leave the pages resident until they can be written.
    for i in (0..len / 8).step_by(8) {
        assert_eq!(reg.read_u64(i * 8), word(i, 1), "word {i} during failover");
        reg.write_u64(i * 8, word(i, 2));
    }
    c.wait_ok();
    for i in (0..len / 8).step_by(8) {
        assert_eq!(reg.read_u64(i * 8), word(i, 2), "word {i} after failover");
    }
    let vm = mm.vmstat();
    eprintln!(
        "swap_write_error {} redis_read_retries {} redis_errors {} swap_read_error {} redis_wait_degraded {}",
        vm.val("swap_write_error"),
        vm.val("redis_read_retries"),
        vm.val("redis_errors"),
        vm.val("swap_read_error"),
        vm.val("redis_wait_degraded")
    );
    assert_eq!(vm.val("swap_read_error"), 0, "{vm}");
    assert_eq!(vm.val("redis_missing_keys"), 0, "{vm}");
}

/// Every node of the cluster killed under a running manager: the pages that were swapped out
/// are gone. Each access to one fails (here from kernel mode, so EFAULT instead of SIGBUS),
/// the first after the device's bounded read retry and the rest at once (the outage is older
/// than the window), is counted (`swap_read_error`) and stays poisoned; resident pages keep
/// working; nothing waits forever.
#[test]
fn all_nodes_killed_poison_swapped_pages_and_nothing_hangs() {
    let Some(Fixture {
        cluster: mut c,
        cfg: mut r,
    }) = fixture()
    else {
        return;
    };
    r.read_retry = Duration::from_secs(2);
    let mut cfg = MmConfig::new(8 << 20).swap(SwapConfig::Redis(r));
    cfg.uffd_policy = usermm_sys::uffd::OpenPolicy::Full;
    let mm = Mm::new(cfg).unwrap();
    let len = 24 << 20;
    let reg = mm.map_anon(len).unwrap();
    for i in (0..len / 8).step_by(512) {
        reg.write_u64(i * 8, word(i, 1));
    }
    // Everything that can go out goes out: the pages read below are all on the cluster.
    mm.reclaim_to(0);
    assert!(reg.swapped_pages() > 0, "{}", mm.vmstat());
    c.kill_all();
    let t0 = std::time::Instant::now();
    let base = reg.as_ptr() as usize;
    let mut lost = Vec::new();
    // The first pages written are the coldest: swapped out.
    for p in 0..8usize {
        match usermm_sys::kernel_read_u64(base + p * 4096) {
            Ok(v) => assert_eq!(v, word(p * 512, 1), "page {p}"),
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => lost.push(p),
            Err(e) => panic!("kernel read of page {p}: {e}"),
        }
    }
    assert!(
        !lost.is_empty(),
        "no swapped-out page failed with every node down"
    );
    let vm = mm.vmstat();
    assert!(vm.val("swap_read_error") >= 1, "{vm}");
    // A lost page stays lost (no retry now: it is poisoned), quickly.
    let t1 = std::time::Instant::now();
    let e = usermm_sys::kernel_read_u64(base + lost[0] * 4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    assert!(t1.elapsed() < Duration::from_secs(1), "{:?}", t1.elapsed());
    // The outage costs the read-retry window (2 s) once, not once per page.
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "{:?} for 8 pages with a 2 s retry window",
        t0.elapsed()
    );
    let h = mm.health();
    assert_eq!(h.handler_panics, 0, "{h:?}");
}

/// Mm::from_env's configuration in a child of this test binary (TLS_CHILD): the spec and the
/// certificate files come from the variables, as for the C ABI, Python and `usermm run`.
const TLS_CHILD: &str = "tls_cluster_from_the_environment";

/// A manager swapping to the TLS cluster through `zswap+rediss://...`, configured only by the
/// `USERMM_*` variables (in a child process, as the variables are the process's): a region of
/// three times the budget written, read back and verified word by word; the pages crossed the
/// TLS connections both ways. Then the same with a CA that did not sign the nodes' certificates:
/// `Mm::new` fails naming the file and the variable.
#[test]
fn tls_cluster_from_the_environment() {
    if common::is_child(TLS_CHILD) {
        return tls_child();
    }
    if !redis_fixture::openssl_available() {
        common::skip("openssl not installed (.ci/run installs it)");
        return;
    }
    let Some(c) = redis_fixture::available().then(redis_fixture::Cluster::start_tls) else {
        common::skip("redis-server/redis-cli not installed (.ci/run installs them)");
        return;
    };
    let t = c.tls.as_ref().unwrap();
    let child = |ca: &std::path::Path| {
        let exe = std::env::current_exe().unwrap();
        std::process::Command::new(exe)
            .args([TLS_CHILD, "--exact", "--nocapture", "--test-threads=1"])
            .env(common::CHILD_ENV, TLS_CHILD)
            .env("RUST_LOG", "off")
            .env("USERMM_BUDGET", "8M")
            .env("USERMM_SWAP", format!("zswap:pool=1M+{}", c.spec(true)))
            .env("USERMM_SWAP_SIZE", "64M")
            .env("USERMM_REDIS_PASSWORD", redis_fixture::PASSWORD)
            .env("USERMM_REDIS_CACERT", ca)
            .env("USERMM_REDIS_CERT", &t.client_cert)
            .env("USERMM_REDIS_KEY", &t.client_key)
            .output()
            .unwrap()
    };
    let out = child(&t.ca);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("TLS child: verified"),
        "{:?}\n{stderr}",
        out.status
    );
    let out = child(&t.other_ca);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("not signed by the CA in ")
            && stderr.contains("other-ca.crt")
            && stderr.contains("set USERMM_REDIS_CACERT"),
        "{:?}\n{stderr}",
        out.status
    );
}

fn tls_child() {
    let cfg = MmConfig::from_env().unwrap();
    assert!(
        cfg.swap.spec().unwrap().contains("+rediss://swapper@"),
        "{:?}",
        cfg.swap
    );
    let mm = match Mm::new(cfg) {
        Ok(mm) => mm,
        Err(e) => panic!("Mm::new: {e}"),
    };
    let len = 24 << 20;
    let reg = mm.map_anon(len).unwrap();
    for i in 0..len / 8 {
        reg.write_u64(i * 8, word(i, 3));
    }
    for i in 0..len / 8 {
        assert_eq!(reg.read_u64(i * 8), word(i, 3), "word {i}");
    }
    let vm = mm.vmstat();
    assert!(vm.val("redis_pages_written") > 0, "{vm}");
    assert!(vm.val("redis_pages_read") > 0, "{vm}");
    assert_eq!(vm.val("swap_read_error"), 0, "{vm}");
    eprintln!(
        "TLS child: verified {} words; redis_pages_written {} redis_pages_read {}",
        len / 8,
        vm.val("redis_pages_written"),
        vm.val("redis_pages_read")
    );
}

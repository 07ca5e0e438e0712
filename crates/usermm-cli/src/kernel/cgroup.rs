//! The memory cgroup the kernel engine's workload runs in: found (cgroup v2 where its memory
//! controller is available, else the v1 memory hierarchy), created with a limit equal to the
//! budget, read (memory.stat, peak usage, OOM kills) and removed.
//!
//! Mirrors what `shared/measure/kernel-usemem.sh` did by hand (mkdir, `memory.limit_in_bytes`,
//! `cgroup.procs`) and the v2 equivalents (`memory.max`, `cgroup.subtree_control`), as described
//! in the kernel's Documentation/admin-guide/cgroup-v1/memory.rst and cgroup-v2.rst.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::counters::Counters;

/// Which cgroup interface holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// One line of /proc/self/mountinfo, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The path inside the mounted hierarchy that is mounted (field 4).
    pub root: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub super_options: String,
}

/// Parses /proc/self/mountinfo (proc(5)): `id parent maj:min root mountpoint options
/// [optional...] - fstype source superoptions`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            if sep < 6 || f.len() < sep + 3 {
                return None;
            }
            Some(Mount {
                root: unescape(f[3]),
                mount_point: PathBuf::from(unescape(f[4])),
                fstype: f[sep + 1].to_string(),
                super_options: f[sep + 3].to_string(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup path of this process for `version`, from /proc/self/cgroup (`0::/path` for v2,
/// `N:controllers:/path` with `memory` among the controllers for v1).
pub fn own_path(proc_cgroup: &str, version: Version) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (id, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = match version {
            Version::V2 => id == "0" && ctrls.is_empty(),
            Version::V1 => ctrls.split(',').any(|c| c == "memory"),
        };
        hit.then(|| path.to_string())
    })
}

/// Where the memory controller lives: its interface and the directory new cgroups are created
/// in. v2 is chosen when its root lists `memory` in cgroup.controllers; new cgroups then go
/// under the v2 root (a non-root v2 cgroup that holds processes cannot enable controllers for
/// children). v1 cgroups nest under this process's own memory cgroup, so any limit above it
/// still applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub version: Version,
    pub parent: PathBuf,
}

/// Chooses the location from mountinfo, /proc/self/cgroup and a reader for the v2 root's
/// cgroup.controllers (parameters so that tests can feed other machines' files).
pub fn choose(
    mountinfo: &str,
    proc_cgroup: &str,
    v2_controllers: impl Fn(&Path) -> Option<String>,
) -> Result<Location, String> {
    let mounts = parse_mountinfo(mountinfo);
    if let Some(m) = mounts.iter().find(|m| {
        m.fstype == "cgroup2"
            && v2_controllers(&m.mount_point)
                .is_some_and(|c| c.split_whitespace().any(|x| x == "memory"))
    }) {
        return Ok(Location {
            version: Version::V2,
            parent: m.mount_point.clone(),
        });
    }
    let m = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "memory"))
        .ok_or_else(|| {
            "no memory cgroup controller is mounted (neither cgroup v2 with the memory \
             controller nor a cgroup v1 memory hierarchy): mount one, e.g. \
             `mount -t cgroup2 none /sys/fs/cgroup`"
                .to_string()
        })?;
    let mut parent = m.mount_point.clone();
    if let Some(own) = own_path(proc_cgroup, Version::V1) {
        // Inside a cgroup namespace or a bind mount of a sub-tree, the mount's root is a prefix
        // of (or equal to) our path.
        let rel = if m.root != "/" {
            own.strip_prefix(&m.root).unwrap_or(&own).to_string()
        } else {
            own
        };
        let rel = rel.trim_start_matches('/');
        if !rel.is_empty() {
            parent = parent.join(rel);
        }
    }
    Ok(Location {
        version: Version::V1,
        parent,
    })
}

/// This machine's location.
pub fn locate() -> Result<Location, String> {
    let mi = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let pc = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let loc = choose(&mi, &pc, |p| {
        fs::read_to_string(p.join("cgroup.controllers")).ok()
    })?;
    if !loc.parent.is_dir() {
        return Err(format!(
            "memory cgroup directory {} does not exist",
            loc.parent.display()
        ));
    }
    Ok(loc)
}

/// A memory cgroup this process created; removed by [`Cgroup::remove`] (the kernel engine's
/// guard calls it on every path out).
#[derive(Debug)]
pub struct Cgroup {
    pub dir: PathBuf,
    pub version: Version,
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("cannot write {value:?} to {}: {e}", path.display()))
}

impl Cgroup {
    /// Creates `name` under `loc.parent` with a memory limit of `limit` bytes (swap is not
    /// limited: the workload may use all of the swap device).
    pub fn create(loc: &Location, name: &str, limit: u64) -> Result<Cgroup, String> {
        if loc.version == Version::V2 {
            let ctl = loc.parent.join("cgroup.subtree_control");
            let cur = fs::read_to_string(&ctl).unwrap_or_default();
            if !cur.split_whitespace().any(|c| c == "memory") {
                write(&ctl, "+memory")?;
            }
        }
        let dir = loc.parent.join(name);
        fs::create_dir(&dir)
            .map_err(|e| format!("cannot create memory cgroup {}: {e}", dir.display()))?;
        let cg = Cgroup {
            dir,
            version: loc.version,
        };
        let limit_file = match cg.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        if let Err(e) = write(&cg.dir.join(limit_file), &limit.to_string()) {
            let _ = fs::remove_dir(&cg.dir);
            return Err(e);
        }
        Ok(cg)
    }

    /// Moves process `pid` into this cgroup.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// The memory limit in force (bytes).
    pub fn limit(&self) -> Option<u64> {
        let f = match self.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        fs::read_to_string(self.dir.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Peak usage since creation (v1 memory.max_usage_in_bytes, v2 memory.peak), if the kernel
    /// has it.
    pub fn peak(&self) -> Option<u64> {
        let f = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        fs::read_to_string(self.dir.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Processes the OOM killer killed in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let f = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        fs::read_to_string(self.dir.join(f))
            .map(|t| Counters::parse(&t).val("oom_kill"))
            .unwrap_or(0)
    }

    /// The swappiness reclaim in this cgroup uses (v1 has it per cgroup; v2 uses the global
    /// vm.swappiness).
    pub fn swappiness(&self) -> Option<u64> {
        let p = match self.version {
            Version::V1 => self.dir.join("memory.swappiness"),
            Version::V2 => PathBuf::from("/proc/sys/vm/swappiness"),
        };
        fs::read_to_string(p).ok()?.trim().parse().ok()
    }

    /// Removes the cgroup. Processes that just exited may keep it busy for a moment: EBUSY is
    /// retried for up to five seconds.
    pub fn remove(&self) -> Result<(), String> {
        remove_dir(&self.dir)
    }
}

/// memory.stat of the cgroup at `dir` (empty when unreadable).
pub fn stat_of(dir: &Path) -> Counters {
    fs::read_to_string(dir.join("memory.stat"))
        .map(|t| Counters::parse(&t))
        .unwrap_or_default()
}

/// Removes a cgroup directory, retrying while it is busy; a missing directory is fine.
pub fn remove_dir(dir: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(16) && t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                return Err(format!(
                    "cannot remove cgroup {}: {e}{}",
                    dir.display(),
                    if procs.trim().is_empty() {
                        String::new()
                    } else {
                        format!(
                            " (processes still in it: {})",
                            procs.split_whitespace().collect::<Vec<_>>().join(" ")
                        )
                    }
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This VM's kind of layout: systemd's hybrid mode, memory on v1, an empty v2 at
    /// /sys/fs/cgroup/unified.
    const HYBRID: &str = "\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 31 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
";
    const HYBRID_CG: &str = "\
9:name=systemd:/
4:memory:/process_api/5a92
1:cpu,cpuacct:/
0::/
";

    #[test]
    fn hybrid_chooses_v1_under_own_cgroup() {
        let loc = choose(HYBRID, HYBRID_CG, |p| {
            assert_eq!(p, Path::new("/sys/fs/cgroup/unified"));
            Some("hugetlb\n".to_string())
        })
        .unwrap();
        assert_eq!(
            loc,
            Location {
                version: Version::V1,
                parent: PathBuf::from("/sys/fs/cgroup/memory/process_api/5a92"),
            }
        );
    }

    #[test]
    fn unified_chooses_v2_root() {
        let mi = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let cg = "0::/user.slice/user-0.slice/session-3.scope\n";
        let loc = choose(mi, cg, |_| Some("cpuset cpu io memory pids\n".into())).unwrap();
        assert_eq!(loc.version, Version::V2);
        assert_eq!(loc.parent, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn namespaced_v1_root_is_stripped() {
        let mi =
            "40 31 0:30 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
        let cg = "5:memory:/docker/abc/inner\n";
        let loc = choose(mi, cg, |_| None).unwrap();
        assert_eq!(loc.parent, PathBuf::from("/sys/fs/cgroup/memory/inner"));
    }

    #[test]
    fn no_memory_controller_is_an_error_saying_so() {
        let mi = "32 31 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let e = choose(mi, "0::/\n", |_| Some("cpu io\n".into())).unwrap_err();
        assert!(e.contains("no memory cgroup controller"), "{e}");
    }

    #[test]
    fn own_paths() {
        assert_eq!(
            own_path(HYBRID_CG, Version::V1).as_deref(),
            Some("/process_api/5a92")
        );
        assert_eq!(own_path(HYBRID_CG, Version::V2).as_deref(), Some("/"));
        assert_eq!(own_path("1:cpu:/\n", Version::V1), None);
    }

    #[test]
    fn mountinfo_escapes() {
        let m = parse_mountinfo("1 2 0:1 / /mnt/a\\040b rw - ext4 /dev/x rw\n");
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!(m[0].fstype, "ext4");
        assert!(parse_mountinfo("garbage\n").is_empty());
    }
}

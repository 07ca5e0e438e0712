//! Kernel swap for the kernel engine: a zram device of its own (hot-added through
//! /sys/class/zram-control, so an existing /dev/zram0 is left alone), a swap file it creates,
//! formatted with mkswap and enabled with swapon at the highest priority, or zswap in front of
//! such a swap file (compressor and `max_pool_percent` set and zswap enabled through
//! /sys/module/zswap/parameters, the previous values saved); torn down with swapoff, zram reset
//! and hot_remove, removal of the file, and the zswap parameters restored.
//!
//! Mirrors the setup in `shared/measure/kernel-usemem.sh` and the kernel's
//! Documentation/admin-guide/blockdev/zram.rst and Documentation/admin-guide/mm/zswap.rst.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What `--swap` asks of the kernel engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    None,
    /// A zram device of `size` bytes.
    Zram {
        size: u64,
    },
    /// A swap file of `size` bytes: at `path` (which must not exist), or in `dir`.
    File {
        path: Option<PathBuf>,
        dir: PathBuf,
        size: u64,
    },
    /// zswap with `compressor` and `max_pool_percent` (of RAM: the kernel knows no other
    /// bound) in front of a swap file (`file` is a [`Spec::File`]).
    Zswap {
        compressor: String,
        max_pool_percent: u32,
        file: Box<Spec>,
    },
}

const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";

/// zswap's parameters before the kernel engine changed them, restored on teardown.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ZswapSaved {
    pub enabled: String,
    pub compressor: String,
    pub max_pool_percent: String,
}

fn zswap_param(name: &str) -> Result<String, String> {
    let p = format!("{ZSWAP_PARAMS}/{name}");
    fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("cannot read {p} ({e}): this kernel has no zswap (CONFIG_ZSWAP)"))
}

/// The algorithms the kernel's crypto API offers (/proc/crypto's `name` lines).
fn crypto_algorithms() -> Vec<String> {
    fs::read_to_string("/proc/crypto")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("name"))
        .filter_map(|l| l.split_once(':'))
        .map(|(_, n)| n.trim().to_string())
        .collect()
}

/// The compressor for the kernel's zswap: `wanted` if the crypto API has it (or it may be a
/// module: no /proc/crypto entry for anything), else the fastest of lz4, lzo-rle, lzo, zstd,
/// deflate it has, with a note saying so for the setup line.
fn zswap_compressor(wanted: &str) -> Result<(String, String), String> {
    pick_compressor(wanted, &crypto_algorithms())
}

/// [`zswap_compressor`] given the crypto API's algorithms.
fn pick_compressor(wanted: &str, have: &[String]) -> Result<(String, String), String> {
    if have.is_empty() || have.iter().any(|a| a == wanted) {
        return Ok((wanted.to_string(), String::new()));
    }
    ["lz4", "lzo-rle", "lzo", "zstd", "deflate"]
        .iter()
        .find(|a| have.iter().any(|h| h == *a))
        .map(|a| {
            (
                a.to_string(),
                format!(": this kernel's crypto API has no {wanted}"),
            )
        })
        .ok_or_else(|| {
            format!(
                "the kernel's zswap cannot compress with {wanted}: /proc/crypto lists none of \
                 lz4, lzo-rle, lzo, zstd, deflate"
            )
        })
}

fn set_zswap_param(name: &str, value: &str) -> Result<(), String> {
    let p = format!("{ZSWAP_PARAMS}/{name}");
    fs::write(&p, value).map_err(|e| format!("cannot write {value:?} to {p}: {e}"))
}

/// One active kernel swap area this process set up. Its fields say what exists, so a partial
/// setup tears down exactly what was done (and a state file of a killed run can be replayed).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KernelSwap {
    /// The swap area's path as /proc/swaps shows it (/dev/zramN or the file).
    pub dev: PathBuf,
    /// zram device number, when hot-added.
    pub zram: Option<u32>,
    /// The swap file, when created.
    pub file: Option<PathBuf>,
    /// swapon succeeded.
    pub active: bool,
    pub size: u64,
    /// Description for the report ("zram1 (lzo-rle)", "file /tmp/...").
    pub name: String,
    /// zswap's parameters before this setup enabled it (Some once they were changed).
    #[serde(default)]
    pub zswap_saved: Option<ZswapSaved>,
}

/// Runs a system tool, turning failure into a message with its stderr.
fn run(tool: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(tool).args(args).output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            format!("{tool} not found: install util-linux (it provides mkswap, swapon, swapoff)")
        } else {
            format!("cannot run {tool}: {e}")
        }
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{tool} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Active swap areas (first column of /proc/swaps).
pub fn active_swaps() -> Vec<PathBuf> {
    fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .collect()
}

const ZRAM_CONTROL: &str = "/sys/class/zram-control";

/// Makes sure the zram module is loaded (modprobe zram).
fn zram_control() -> Result<PathBuf, String> {
    let ctl = PathBuf::from(ZRAM_CONTROL);
    if !ctl.exists() {
        run("modprobe", &["zram"]).map_err(|e| {
            format!("zram is not available ({e}); load it with `modprobe zram`, or use --swap file")
        })?;
        let t0 = Instant::now();
        while !ctl.exists() && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !ctl.exists() {
            return Err(format!(
                "modprobe zram succeeded but {ZRAM_CONTROL} did not appear; use --swap file"
            ));
        }
    }
    Ok(ctl)
}

/// The compression algorithm a zram device uses (the bracketed entry of comp_algorithm).
fn zram_algorithm(id: u32) -> String {
    let s = fs::read_to_string(format!("/sys/block/zram{id}/comp_algorithm")).unwrap_or_default();
    s.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_else(|| "?".into())
}

impl KernelSwap {
    /// Sets up what `spec` asks for. `progress` is called after every step that created
    /// something (so the caller can record it); on error, what was created is in `out` for the
    /// caller's teardown.
    pub fn setup(
        spec: &Spec,
        out: &mut Option<KernelSwap>,
        progress: &mut dyn FnMut(&KernelSwap),
    ) -> Result<(), String> {
        match spec {
            Spec::None => Ok(()),
            Spec::Zswap {
                compressor,
                max_pool_percent,
                file,
            } => {
                let saved = ZswapSaved {
                    enabled: zswap_param("enabled")?,
                    compressor: zswap_param("compressor")?,
                    max_pool_percent: zswap_param("max_pool_percent")?,
                };
                Self::setup(file, out, progress)?;
                let s = out.as_mut().expect("the swap file was set up");
                s.zswap_saved = Some(saved);
                progress(s);
                // zswap compresses through the crypto API: this kernel may lack the algorithm
                // usermm uses (lz4 is often a module, or not built). Then the fastest it has.
                let (algo, note) = zswap_compressor(compressor)?;
                if set_zswap_param("compressor", &algo).is_err() {
                    // The algorithm may be a module not loaded yet.
                    let _ = run("modprobe", &[&algo]);
                    set_zswap_param("compressor", &algo)?;
                }
                set_zswap_param("max_pool_percent", &max_pool_percent.to_string())?;
                set_zswap_param("enabled", "Y")?;
                // What the kernel uses, read back: zswap set up lazily falls back to its
                // default compressor if the one named cannot be allocated.
                let actual = zswap_param("compressor").unwrap_or(algo);
                s.name = format!(
                    "zswap ({actual}{note}, max_pool_percent {max_pool_percent}) over {}",
                    s.name
                );
                progress(s);
                Ok(())
            }
            Spec::Zram { size } => {
                let ctl = zram_control()?;
                let id: u32 = fs::read_to_string(ctl.join("hot_add"))
                    .map_err(|e| format!("cannot add a zram device ({ZRAM_CONTROL}/hot_add): {e}"))?
                    .trim()
                    .parse()
                    .map_err(|e| format!("{ZRAM_CONTROL}/hot_add gave no device number: {e}"))?;
                let s = out.insert(KernelSwap {
                    dev: PathBuf::from(format!("/dev/zram{id}")),
                    zram: Some(id),
                    size: *size,
                    name: format!("zram{id}"),
                    ..Default::default()
                });
                progress(s);
                let disksize = format!("/sys/block/zram{id}/disksize");
                fs::write(&disksize, size.to_string())
                    .map_err(|e| format!("cannot set {disksize} to {size}: {e}"))?;
                s.name = format!("zram{id} ({})", zram_algorithm(id));
                // devtmpfs creates the node; give udev-less systems a moment.
                let t0 = Instant::now();
                while !s.dev.exists() && t0.elapsed() < Duration::from_secs(2) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let dev = s.dev.to_string_lossy().into_owned();
                run("mkswap", &[&dev])?;
                run("swapon", &["--priority", "32767", &dev])?;
                s.active = true;
                progress(s);
                Ok(())
            }
            Spec::File { path, dir, size } => {
                let p = match path {
                    Some(p) => p.clone(),
                    None => dir.join(format!("usermm-kernel-swap-{}", std::process::id())),
                };
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&p)
                    .map_err(|e| {
                        if e.kind() == io::ErrorKind::AlreadyExists {
                            format!(
                                "swap file {} already exists: the kernel engine creates (and \
                                 removes) its own swap file; give a path that does not exist",
                                p.display()
                            )
                        } else {
                            format!("cannot create swap file {}: {e}", p.display())
                        }
                    })?;
                let s = out.insert(KernelSwap {
                    dev: p.clone(),
                    file: Some(p.clone()),
                    size: *size,
                    name: format!("file {}", p.display()),
                    ..Default::default()
                });
                progress(s);
                usermm_sys::fallocate(&f, *size).map_err(|e| {
                    format!(
                        "cannot allocate {size} bytes for swap file {}: {e}",
                        p.display()
                    )
                })?;
                drop(f);
                let ps = p.to_string_lossy().into_owned();
                run("mkswap", &[&ps])?;
                run("swapon", &["--priority", "32767", &ps]).map_err(|e| {
                    format!(
                        "{e}\n(the filesystem of {} cannot hold a swap file? tmpfs, overlayfs \
                         and copy-on-write btrfs cannot: give --swap file:PATH on ext4 or xfs)",
                        p.display()
                    )
                })?;
                s.active = true;
                progress(s);
                Ok(())
            }
        }
    }

    /// Undoes the setup: swapoff, zram reset and hot_remove, file removal. Every step is tried;
    /// the errors are returned together.
    pub fn teardown(&mut self) -> Result<(), String> {
        let mut errs = Vec::new();
        let dev = self.dev.to_string_lossy().into_owned();
        if self.active || active_swaps().iter().any(|p| p == &self.dev) {
            if active_swaps().iter().any(|p| p == &self.dev) {
                if let Err(e) = run("swapoff", &[&dev]) {
                    errs.push(e);
                }
            }
            self.active = false;
        }
        // After swapoff (which brings zswap's pages back): the parameters as they were.
        if let Some(z) = self.zswap_saved.take() {
            for (n, v) in [
                ("enabled", &z.enabled),
                ("compressor", &z.compressor),
                ("max_pool_percent", &z.max_pool_percent),
            ] {
                if let Err(e) = set_zswap_param(n, v) {
                    errs.push(e);
                }
            }
        }
        if let Some(id) = self.zram.take() {
            let reset = format!("/sys/block/zram{id}/reset");
            if Path::new(&reset).exists() {
                if let Err(e) = fs::write(&reset, "1") {
                    errs.push(format!("cannot reset zram{id}: {e}"));
                }
                if let Err(e) = fs::write(format!("{ZRAM_CONTROL}/hot_remove"), id.to_string()) {
                    errs.push(format!("cannot remove zram{id}: {e}"));
                }
            }
        }
        if let Some(f) = self.file.take() {
            match fs::remove_file(&f) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => errs.push(format!("cannot remove swap file {}: {e}", f.display())),
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pick_compressor;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn zswap_takes_the_asked_compressor_or_says_which_it_took() {
        let have = names(&["aes", "lzo", "lzo-rle", "deflate"]);
        assert_eq!(
            pick_compressor("lz4", &have).unwrap(),
            (
                "lzo-rle".to_string(),
                ": this kernel's crypto API has no lz4".to_string()
            )
        );
        assert_eq!(
            pick_compressor("lzo", &have).unwrap(),
            ("lzo".to_string(), String::new())
        );
        // Nothing listed: the algorithm may be a module; ask for it as given.
        assert_eq!(
            pick_compressor("lz4", &[]).unwrap(),
            ("lz4".to_string(), String::new())
        );
        let e = pick_compressor("lz4", &names(&["aes"])).unwrap_err();
        assert!(e.contains("lz4") && e.contains("/proc/crypto"), "{e}");
    }
}

//! Writes `usermm.pc` for the build tree into `target/<profile>/pkgconfig/` (next to
//! libusermm.so and libusermm.a), so that
//! `PKG_CONFIG_PATH=target/release/pkgconfig pkg-config --cflags --libs usermm` works right
//! after `cargo build --release -p usermm-capi`. `install.sh` writes the installed variant.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=usermm.pc.in");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: the profile directory holds the
    // libraries.
    let Some(profile_dir) = out.ancestors().nth(3).map(Path::to_path_buf) else {
        return;
    };
    let template = std::fs::read_to_string(manifest.join("usermm.pc.in")).expect("usermm.pc.in");
    let pc = template
        .replace("@PREFIX@", &profile_dir.display().to_string())
        .replace("@LIBDIR@", &profile_dir.display().to_string())
        .replace(
            "@INCLUDEDIR@",
            &manifest.join("include").display().to_string(),
        )
        .replace(
            "@VERSION@",
            &std::env::var("CARGO_PKG_VERSION").expect("version"),
        );
    let dir = profile_dir.join("pkgconfig");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join("usermm.pc"), pc);
    }
}

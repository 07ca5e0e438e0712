//! The checked-in header `include/usermm.h` must equal what cbindgen generates from the
//! crate's source. `UPDATE_HEADER=1 cargo test -p usermm-capi --test header` rewrites it.

use std::path::PathBuf;

#[test]
fn header_matches_cbindgen_output() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cfg =
        cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen generating usermm.h")
        .write(&mut out);
    let path = dir.join("include/usermm.h");
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&path, &out).expect("writing include/usermm.h");
        return;
    }
    let have = std::fs::read(&path).unwrap_or_default();
    assert!(
        have == out,
        "include/usermm.h is out of date with src/lib.rs: run `UPDATE_HEADER=1 cargo test -p usermm-capi --test header` and commit the result"
    );
}

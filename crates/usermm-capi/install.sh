#!/usr/bin/env bash
# Installs libusermm.so, libusermm.a, usermm.h and usermm.pc under PREFIX (default /usr/local).
# Build first: cargo build --release -p usermm-capi
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prefix="${1:-/usr/local}"
target="${CARGO_TARGET_DIR:-$root/target}/release"
for f in libusermm.so libusermm.a; do
  [ -f "$target/$f" ] || { echo "install.sh: $target/$f missing: run cargo build --release -p usermm-capi" >&2; exit 1; }
done
install -d "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig"
install -m 0755 "$target/libusermm.so" "$prefix/lib/"
install -m 0644 "$target/libusermm.a" "$prefix/lib/"
install -m 0644 "$here/include/usermm.h" "$prefix/include/"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|\${prefix}/lib|" -e "s|@INCLUDEDIR@|\${prefix}/include|" \
    -e "s|@VERSION@|$version|" "$here/usermm.pc.in" > "$prefix/lib/pkgconfig/usermm.pc"
echo "installed usermm $version under $prefix (ldconfig may be needed for $prefix/lib)"

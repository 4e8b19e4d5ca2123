#!/usr/bin/env bash
# Builds the Debian packages application developers install (into target/debian/):
#   libtorusnet-client0     the shared library libtorusnet_client.so.0 (SONAME, version)
#   libtorusnet-client-dev  torusnet.h, the libtorusnet_client.so link, torusnet.pc for
#                           pkg-config, and the C example under its documentation
# Packages what target/release holds (build first: cargo build --release -p torusnet-client).
# Prints the two packages' paths, one per line.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "package-client-deb: $*" >&2; exit 2; }
for t in dpkg-deb objdump strip; do command -v $t >/dev/null || fail "$t missing (scripts/install-deps.sh --packaging installs it)"; done
lib=target/release/libtorusnet_client.so
[ -f "$lib" ] || fail "$lib missing: build first (cargo build --release -p torusnet-client)"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | awk 'NR == 1')
[ -n "$version" ] || fail "no version in Cargo.toml's [workspace.package]"
major=${version%%.*}
soname=libtorusnet_client.so.$major
got=$(objdump -p "$lib" | awk '$1 == "SONAME" { print $2 }')
[ "$got" = "$soname" ] || fail "$lib has SONAME '$got', expected $soname (client/build.rs sets it)"
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
[ -n "$multiarch" ] || multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=usr/lib/$multiarch
maintainer="torusnet developers <torusnet@localhost>"
# A private tree per run, so two runs side by side cannot empty each other's.
mkdir -p target/debian
work=$(mktemp -d target/deb-client.XXXXXX)
trap 'rm -rf "$work"' EXIT

# What the library needs at run time, as the packages that ship those libraries.
# No reader here stops before the end of its input: under pipefail, a writer killed by
# SIGPIPE (ldconfig's 40 KB, once in a few hundred runs) ended the script without a word.
depends=""
cache=$(ldconfig -p)
for needed in $(objdump -p "$lib" | awk '$1 == "NEEDED" { print $2 }'); do
  path=$(awk -v n="$needed" '$1 == n && /x86-64|x86_64|64bit|AArch64/ && !p { p = $NF } END { print p }' <<<"$cache")
  [ -n "$path" ] || path=$(awk -v n="$needed" '$1 == n && !p { p = $NF } END { print p }' <<<"$cache")
  [ -n "$path" ] || fail "cannot find $needed, which $lib needs"
  pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | awk -F: 'NR == 1 { print $1 }') \
    || pkg=$(dpkg -S "$path" 2>/dev/null | awk -F: 'NR == 1 { print $1 }') || true
  [ -n "$pkg" ] || fail "no package owns $path ($needed)"
  case ",$depends," in *",$pkg,"*) ;; *) depends=${depends:+$depends,}$pkg ;; esac
done
depends=$(echo "$depends" | sed 's/,/, /g')

copyright() {
  mkdir -p "$1/usr/share/doc/$2"
  {
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: torusnet"
    echo
    echo "Files: *"
    echo "License: MIT or Apache-2.0"
    echo
    sed 's/^$/./; s/^/ /' LICENSE-MIT
  } > "$1/usr/share/doc/$2/copyright"
}

# The run-time library.
run=$work/libtorusnet-client$major
mkdir -p "$run/DEBIAN" "$run/$libdir"
install -m 0644 "$lib" "$run/$libdir/libtorusnet_client.so.$version"
strip --strip-unneeded "$run/$libdir/libtorusnet_client.so.$version"
ln -s "libtorusnet_client.so.$version" "$run/$libdir/$soname"
copyright "$run" "libtorusnet-client$major"
cat > "$run/DEBIAN/control" <<CONTROL
Package: libtorusnet-client$major
Version: $version
Architecture: $arch
Maintainer: $maintainer
Section: libs
Priority: optional
Multi-Arch: same
Depends: $depends
Installed-Size: $(du -sk "$run" | cut -f1)
Description: torusnet's application library (shared library)
 Applications attach through it to the torusd of their server and exchange
 messages across a torus fabric over a shared-memory channel (C ABI; the
 Python binding and C programs load it).
CONTROL
echo "libtorusnet_client $major libtorusnet-client$major (>= $version)" > "$run/DEBIAN/shlibs"
echo "activate-noawait ldconfig" > "$run/DEBIAN/triggers"

# The development files.
dev=$work/libtorusnet-client-dev
mkdir -p "$dev/DEBIAN" "$dev/$libdir/pkgconfig" "$dev/usr/include" \
  "$dev/usr/share/doc/libtorusnet-client-dev/examples"
install -m 0644 client/include/torusnet.h "$dev/usr/include/torusnet.h"
ln -s "$soname" "$dev/$libdir/libtorusnet_client.so"
cat > "$dev/$libdir/pkgconfig/torusnet.pc" <<PC
prefix=/usr
libdir=\${prefix}/lib/$multiarch
includedir=\${prefix}/include

Name: torusnet
Description: torusnet's application library: attach to torusd, exchange messages across the torus
Version: $version
Libs: -L\${libdir} -ltorusnet_client
Cflags: -I\${includedir}
PC
install -m 0644 client/examples/c/echo.c "$dev/usr/share/doc/libtorusnet-client-dev/examples/echo.c"
install -m 0644 client/examples/c/rmem.c "$dev/usr/share/doc/libtorusnet-client-dev/examples/rmem.c"
install -m 0644 client/examples/c/on_path.c "$dev/usr/share/doc/libtorusnet-client-dev/examples/on_path.c"
copyright "$dev" libtorusnet-client-dev
cat > "$dev/DEBIAN/control" <<CONTROL
Package: libtorusnet-client-dev
Version: $version
Architecture: $arch
Maintainer: $maintainer
Section: libdevel
Priority: optional
Multi-Arch: same
Depends: libtorusnet-client$major (= $version)
Suggests: pkgconf
Installed-Size: $(du -sk "$dev" | cut -f1)
Description: torusnet's application library (development files)
 The C header torusnet.h, the link-time library and torusnet.pc, so that
 an application builds with: cc app.c \$(pkg-config --cflags --libs torusnet)
 The C echo example is in /usr/share/doc/libtorusnet-client-dev/examples.
CONTROL

for p in "$run" "$dev"; do
  find "$p" -type d -exec chmod 0755 {} +
  name=$(sed -n 's/^Package: //p' "$p/DEBIAN/control")
  out=target/debian/${name}_${version}_$arch.deb
  # Built beside its final name and renamed: a reader never sees a half-written package.
  dpkg-deb --root-owner-group -Zxz --build "$p" "$work/$name.deb" >/dev/null
  mv -f "$work/$name.deb" "$out"
  echo "$out"
done

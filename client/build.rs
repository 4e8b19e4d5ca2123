//! Gives the shared library (the cdylib, for C and Python applications) a SONAME, so that an
//! application linked against `libtorusnet_client.so` records the major version it was built
//! for (`libtorusnet_client.so.0`) and the Debian package can install it as a shared library.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtorusnet_client.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}

//! Links `libdl.so.2` explicitly: on glibc older than 2.34 `dlsym` lives there, and plain `-ldl`
//! would pick up the empty `libdl.a` of newer glibc. Tells the tests the target triple, so that
//! they build the library they test for the target they run on.
fn main() {
    let target = std::env::var("TARGET").expect("TARGET");
    println!("cargo:rustc-env=MOCKFS_SHIM_TARGET={target}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg=-l:libdl.so.2");
}

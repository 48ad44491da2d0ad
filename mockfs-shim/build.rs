//! Links `libdl.so.2` explicitly: on glibc older than 2.34 `dlsym` lives there, and plain `-ldl`
//! would pick up the empty `libdl.a` of newer glibc.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg=-l:libdl.so.2");
}

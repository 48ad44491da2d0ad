//! Sets the SONAME programs link against (`libnvidia-ml.so.1`).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}

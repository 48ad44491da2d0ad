//! Sets the SONAME programs link against (`libnvidia-ml.so.1`), and tells the tests the target
//! triple, so that they build the library they test for the target they run on.
fn main() {
    let target = std::env::var("TARGET").expect("TARGET");
    println!("cargo:rustc-env=NVML_TARGET={target}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}

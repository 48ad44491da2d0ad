//! Generates the rust-protobuf messages and async ttrpc services from `proto/api.proto`.

use std::{env, fs, path::PathBuf};

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let proto = "proto/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    Codegen::new()
        .out_dir(&out_dir)
        .inputs([proto])
        .include("proto")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .expect("ttrpc code generation from proto/api.proto");
    // The generated files start with inner attributes, so they cannot be `include!`d inside an
    // inline module; a module file of our own next to them can declare them instead.
    fs::write(out_dir.join("mod.rs"), "pub mod api;\npub mod api_ttrpc;\n")
        .expect("write OUT_DIR/mod.rs");
}

//! Golden files: every built-in profile rendered on a fixed host must match
//! `tests/golden/<profile>.txt` byte for byte. Regenerate with `UPDATE_GOLDEN=1 cargo test`.

mod common;

use mockgpu_api::profile::BUILTIN;

#[test]
fn every_builtin_profile_matches_its_golden_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut mismatched = Vec::new();
    for (name, _) in BUILTIN {
        let (_, tree) = common::fixed_tree(name);
        let got = common::dump(&tree);
        let path = dir.join(format!("{name}.txt"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
                path.display()
            )
        });
        if got != want {
            let line = got.lines().zip(want.lines()).position(|(a, b)| a != b);
            mismatched.push(format!("{name}: first difference at line {line:?}"));
        }
    }
    assert!(mismatched.is_empty(), "golden mismatch: {mismatched:?}");
}

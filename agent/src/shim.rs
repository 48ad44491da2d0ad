//! The `libmockfs.so` shim, carried inside the agent binary and installed where it is used.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The shim library's bytes (built from the `mockfs-shim` crate by the build script).
pub const LIBRARY: &[u8] = include_bytes!(env!("MOCKGPU_SHIM_PATH"));

/// File name of the installed library.
pub const FILE_NAME: &str = "libmockfs.so";

/// Writes the library to `dir/libmockfs.so` atomically (write, then rename), mode 0755.
/// Running processes that mapped an older copy keep it.
pub fn install(dir: &Path) -> io::Result<std::path::PathBuf> {
    fs::create_dir_all(dir)?;
    let path = dir.join(FILE_NAME);
    let tmp = dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
    fs::write(&tmp, LIBRARY)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn carries_an_elf_shared_object() {
        assert_eq!(&super::LIBRARY[..4], b"\x7fELF");
    }
}

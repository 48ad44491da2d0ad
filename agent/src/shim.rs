//! The `libmockfs.so` shim, carried inside the agent binary and installed where it is used.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The shim library's bytes (built from the `mockfs-shim` crate by the build script).
pub(crate) const LIBRARY: &[u8] = include_bytes!(env!("MOCKGPU_SHIM_PATH"));

/// File name of the installed library.
pub(crate) const FILE_NAME: &str = "libmockfs.so";

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
    /// `e_machine` of the architecture this agent is compiled for.
    #[cfg(target_arch = "x86_64")]
    const MACHINE: u16 = 62; // EM_X86_64
    #[cfg(target_arch = "aarch64")]
    const MACHINE: u16 = 183; // EM_AARCH64

    #[test]
    fn carries_a_shared_object_for_the_agents_architecture() {
        let elf = super::LIBRARY;
        assert_eq!(&elf[..4], b"\x7fELF");
        let class = if cfg!(target_pointer_width = "64") {
            2
        } else {
            1
        };
        assert_eq!(elf[4], class, "ELF class (1: 32-bit, 2: 64-bit)");
        let data = if cfg!(target_endian = "little") { 1 } else { 2 };
        assert_eq!(
            elf[5], data,
            "ELF data encoding (1: little-endian, 2: big-endian)"
        );
        // The header's byte order is the agent's own (checked just above).
        let half = |at: usize| u16::from_ne_bytes([elf[at], elf[at + 1]]);
        assert_eq!(half(16), 3, "e_type (3: shared object)");
        assert_eq!(half(18), MACHINE, "e_machine");
    }
}

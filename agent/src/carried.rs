//! The files the agent carries inside its binary and installs where they are used: the shim
//! (`libmockfs.so`), the mock NVML (`libnvidia-ml.so.1`) and `nvidia-smi`.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use mockgpu_api::layout::{NVML_FILE, NVML_LINK, SHIM_FILE, SMI_FILE};

/// Whether a carried file goes into the library or the program directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A shared library.
    Library,
    /// A program.
    Program,
}

/// One carried file.
#[derive(Debug)]
pub struct Carried {
    /// Its file name where it is installed.
    pub name: &'static str,
    /// Other names of it in the same directory (symbolic links).
    pub links: &'static [&'static str],
    /// Library or program.
    pub kind: Kind,
    /// Its bytes (built by the build script from this workspace's packages).
    pub bytes: &'static [u8],
}

/// The shim (the `mockfs-shim` package).
pub const SHIM: Carried = Carried {
    name: SHIM_FILE,
    links: &[],
    kind: Kind::Library,
    bytes: include_bytes!(env!("MOCKGPU_SHIM_PATH")),
};

/// The mock NVML (the `mockgpu-nvml` package's library).
pub const NVML: Carried = Carried {
    name: NVML_FILE,
    links: &[NVML_LINK],
    kind: Kind::Library,
    bytes: include_bytes!(env!("MOCKGPU_NVML_PATH")),
};

/// The mock's `nvidia-smi` (the `mockgpu-nvml` package's program).
pub const NVIDIA_SMI: Carried = Carried {
    name: SMI_FILE,
    links: &[],
    kind: Kind::Program,
    bytes: include_bytes!(env!("MOCKGPU_SMI_PATH")),
};

/// Every carried file.
pub const ALL: [&Carried; 3] = [&SHIM, &NVML, &NVIDIA_SMI];

/// A carried file that could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install {path}: {source}")]
pub struct InstallError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub source: io::Error,
}

impl Carried {
    /// Writes the file to `dir/<name>` atomically (write, then rename), mode 0755, and its links
    /// beside it. Running processes that mapped an older copy keep it.
    pub fn install(&self, dir: &Path) -> Result<PathBuf, InstallError> {
        let path = dir.join(self.name);
        let failed = |source| InstallError {
            path: path.clone(),
            source,
        };
        fs::create_dir_all(dir).map_err(failed)?;
        let tmp = dir.join(format!(".{}.{}", self.name, std::process::id()));
        fs::write(&tmp, self.bytes).map_err(failed)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).map_err(failed)?;
        fs::rename(&tmp, &path).map_err(failed)?;
        for link in self.links {
            let at = dir.join(link);
            let tmp = dir.join(format!(".{link}.{}", std::process::id()));
            let _ = fs::remove_file(&tmp);
            std::os::unix::fs::symlink(self.name, &tmp)
                .and_then(|()| fs::rename(&tmp, &at))
                .map_err(|source| InstallError { path: at, source })?;
        }
        Ok(path)
    }
}

/// Installs every carried file: libraries into `lib`, programs into `bin`.
pub fn install_all(lib: &Path, bin: &Path) -> Result<(), InstallError> {
    for carried in ALL {
        carried.install(match carried.kind {
            Kind::Library => lib,
            Kind::Program => bin,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `e_machine` of the architecture this agent is compiled for.
    #[cfg(target_arch = "x86_64")]
    const MACHINE: u16 = 62; // EM_X86_64
    #[cfg(target_arch = "aarch64")]
    const MACHINE: u16 = 183; // EM_AARCH64

    #[test]
    fn carries_elf_files_for_the_agents_architecture() {
        for carried in ALL {
            let elf = carried.bytes;
            let name = carried.name;
            assert_eq!(&elf[..4], b"\x7fELF", "{name}");
            let class = if cfg!(target_pointer_width = "64") {
                2
            } else {
                1
            };
            assert_eq!(elf[4], class, "{name}: ELF class (1: 32-bit, 2: 64-bit)");
            let data = if cfg!(target_endian = "little") { 1 } else { 2 };
            assert_eq!(
                elf[5], data,
                "{name}: ELF data encoding (1: little-endian, 2: big-endian)"
            );
            // The header's byte order is the agent's own (checked just above).
            let half = |at: usize| u16::from_ne_bytes([elf[at], elf[at + 1]]);
            // 3: a shared object, which a position-independent program is as well; 2: a program
            let types: &[u16] = match carried.kind {
                Kind::Library => &[3],
                Kind::Program => &[2, 3],
            };
            assert!(types.contains(&half(16)), "{name}: e_type {}", half(16));
            assert_eq!(half(18), MACHINE, "{name}: e_machine");
        }
    }

    #[test]
    fn installs_each_file_with_its_links_and_replaces_older_copies() {
        let tmp = tempfile::tempdir().unwrap();
        let (lib, bin) = (tmp.path().join("lib"), tmp.path().join("bin"));
        fs::create_dir(&lib).unwrap();
        fs::write(lib.join(NVML_FILE), "old").unwrap();
        fs::write(lib.join(NVML_LINK), "a file, not a link").unwrap();
        install_all(&lib, &bin).unwrap();
        // twice: the second replaces the first's files and links
        install_all(&lib, &bin).unwrap();
        for carried in ALL {
            let dir = match carried.kind {
                Kind::Library => &lib,
                Kind::Program => &bin,
            };
            let path = dir.join(carried.name);
            assert_eq!(
                fs::read(&path).unwrap(),
                carried.bytes,
                "{}",
                path.display()
            );
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755, "{}", path.display());
            for link in carried.links {
                assert_eq!(
                    fs::read_link(dir.join(link)).unwrap(),
                    Path::new(carried.name)
                );
            }
        }
        let mut names: Vec<String> = fs::read_dir(&lib)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [SHIM_FILE, NVML_LINK, NVML_FILE],
            "no temporary file left"
        );
    }

    #[test]
    fn an_unwritable_directory_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        let e = NVML.install(&file.join("lib")).unwrap_err();
        assert_eq!(e.path, file.join("lib").join(NVML_FILE));
        assert!(e.to_string().starts_with("cannot install "), "{e}");
    }
}

//! A cgroup v2 group whose BPF device program refuses chosen minors of NVIDIA's major 195, as
//! Slurm's `ConstrainDevices` (cgroup/v2) and runc build them: opening such a node fails with
//! `EPERM` before any driver is looked up. Needs root and a cgroup2 mount (on a cgroup v1 host,
//! the empty hybrid one at `/sys/fs/cgroup/unified` serves: BPF device programs need no
//! controller). The group is removed on drop, the program with it.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

/// NVIDIA's static character major (`/dev/nvidia<N>` is 195:N).
const NVIDIA_MAJOR: i32 = 195;

pub struct DeviceCgroup {
    dir: PathBuf,
    _program: OwnedFd,
}

impl DeviceCgroup {
    /// A new group (named after `name` and this process) refusing 195:`minors`, allowing the rest.
    pub fn denying(name: &str, minors: &[u32]) -> DeviceCgroup {
        let dir = cgroup2_mount().join(format!("mockgpu-test-{name}-{}", std::process::id()));
        fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("mkdir {} (needs root): {e}", dir.display()));
        let program = load_program(minors).unwrap_or_else(|e| {
            let _ = fs::remove_dir(&dir);
            panic!("loading the BPF device program: {e}")
        });
        let group = DeviceCgroup {
            dir,
            _program: program,
        };
        group.attach().expect("attaching the BPF device program");
        group
    }

    /// The file a process writes its pid to, to join the group.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn attach(&self) -> io::Result<()> {
        let dir = fs::File::open(&self.dir)?;
        #[repr(C)]
        struct Attach {
            target_fd: u32,
            attach_bpf_fd: u32,
            attach_type: u32,
            attach_flags: u32,
        }
        let attr = Attach {
            target_fd: fd_u32(dir.as_raw_fd()),
            attach_bpf_fd: fd_u32(self._program.as_raw_fd()),
            attach_type: BPF_CGROUP_DEVICE,
            attach_flags: 0,
        };
        bpf(BPF_PROG_ATTACH, &attr).map(drop)
    }
}

impl Drop for DeviceCgroup {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}

/// Where cgroup2 is mounted (`/proc/self/mountinfo`).
fn cgroup2_mount() -> PathBuf {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split(' ').next() == Some("cgroup2")).then(|| left.split(' ').nth(4))?
        })
        .map(PathBuf::from)
        .expect("no cgroup2 mount in /proc/self/mountinfo")
}

fn fd_u32(fd: i32) -> u32 {
    u32::try_from(fd).unwrap()
}

const BPF_PROG_LOAD: i32 = 5;
const BPF_PROG_ATTACH: i32 = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;

/// `bpf(cmd, attr, sizeof attr)`.
fn bpf<T>(cmd: i32, attr: &T) -> io::Result<i32> {
    // SAFETY: `attr` is a valid, initialised `union bpf_attr` prefix of its size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_ref(attr),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::try_from(r).unwrap())
}

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

/// `r2 = *(u32 *)(r1 + off)`: a field of `struct bpf_cgroup_dev_ctx` {access_type, major, minor}.
fn load_ctx(off: i16) -> Insn {
    Insn {
        code: 0x61,
        regs: 0x12,
        off,
        imm: 0,
    }
}

/// `if r2 <op> imm goto +off` (op 0x10: ==, 0x50: !=).
fn jump(op: u8, imm: i32, off: i16) -> Insn {
    Insn {
        code: 0x05 | op,
        regs: 0x02,
        off,
        imm,
    }
}

/// `r0 = imm; exit`.
fn ret(imm: i32) -> [Insn; 2] {
    [
        Insn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm,
        },
        Insn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ]
}

/// The program: 1 (allow) for every device but 195:`minors`, which get 0 (`EPERM`).
fn load_program(minors: &[u32]) -> io::Result<OwnedFd> {
    let n = i16::try_from(minors.len()).unwrap();
    let mut insns = vec![load_ctx(4), jump(0x50, NVIDIA_MAJOR, n + 1), load_ctx(8)];
    for (i, &minor) in (0..).zip(minors) {
        // to the `deny` pair, past the remaining tests and the `allow` pair
        insns.push(jump(0x10, i32::try_from(minor).unwrap(), n - i - 1 + 2));
    }
    insns.extend(ret(1));
    insns.extend(ret(0));
    let license = CString::new("GPL").unwrap();
    let mut log = vec![0u8; 64 * 1024];
    #[repr(C)]
    struct Load {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
    }
    let attr = Load {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(insns.len()).unwrap(),
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: u32::try_from(log.len()).unwrap(),
        log_buf: log.as_mut_ptr() as u64,
    };
    match bpf(BPF_PROG_LOAD, &attr) {
        // SAFETY: a new descriptor the kernel returned, owned by no one else.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(e.kind(), format!("{e}; verifier: {text}")))
        }
    }
}

//! Pure path logic: configuration, lexical normalisation and prefix matching.
//!
//! Nothing here touches the system, allocates or panics, so it is unit-tested directly; the
//! hooks in `hooks.rs` feed it bytes, stack buffers and a physical resolver.
//!
//! Matching rules:
//! - A path is matched after lexical normalisation: empty and `.` components are dropped and `..`
//!   removes the previous component (never going above `/`). Symlinks matter only for `..`
//!   (last rule).
//! - A prefix such as `/proc/driver/nvidia` covers itself and everything below it, on component
//!   boundaries: `/proc/driver/nvidia/version` matches, `/proc/driver/nvidia2` does not.
//! - A prefix written with a trailing `*`, such as `/dev/nvidia*`, matches its last component as a
//!   name prefix: it covers `/dev/nvidia0`, `/dev/nvidiactl`, `/dev/nvidia-uvm` and everything below
//!   them, but not `/dev/nv`.
//! - A covered path `P` is rewritten to `<root>P`. Because `P` is normalised, the result can never
//!   leave the mock root.
//! - Before a `..` leaves a covered directory, that directory is resolved physically (through the
//!   mock's symlinks, as the kernel would), so `/sys/bus/pci/devices/<bdf>/../../../bus` is
//!   `/sys/bus`, as on a real system, not `/sys/bus/bus`.

use core::ffi::CStr;

/// Longest path the shim builds (including the terminating NUL), as the kernel's `PATH_MAX`.
pub const PATH_MAX: usize = 4096;
/// Longest accepted prefix, in bytes.
pub const PREFIX_MAX: usize = 256;
/// Longest accepted mock root, in bytes.
pub const ROOT_MAX: usize = 1024;
/// Most prefixes kept; further entries are ignored.
pub const MAX_PREFIXES: usize = 64;

/// The mock root without `MOCKFS_ROOT`: where the agent mounts its tree (the layout's
/// `fs/`, owned by `mockgpu-api`; a unit test keeps the two equal).
pub const DEFAULT_ROOT: &[u8] = b"/run/mockgpu/fs";
/// The file below the mock root that lists further prefixes (the GPUs' sysfs directories).
pub const PREFIXES_FILE: &core::ffi::CStr = c"prefixes";

/// Prefixes redirected unless `MOCKFS_PREFIXES` replaces them.
pub const DEFAULT_PREFIXES: [&[u8]; 5] = [
    b"/proc/devices",
    b"/proc/driver/nvidia",
    b"/sys/bus/pci/drivers/nvidia",
    b"/sys/bus/pci/devices",
    b"/sys/module/nvidia",
];
/// Added to the defaults when `MOCKFS_DEV=1` (local `exec` runs only).
pub const DEV_PREFIX: &[u8] = b"/dev/nvidia*";

/// Whether `path` names one of the NVIDIA driver's device nodes (`/dev/nvidia0`, `/dev/nvidiactl`,
/// `/dev/nvidia-uvm`, `/dev/nvidia-caps/…`): an open of one that the device cgroup lets through
/// but no driver backs gets a stand-in (`hooks.rs`).
pub fn is_gpu_node(path: &[u8]) -> bool {
    path.starts_with(b"/dev/nvidia") && !path.split(|&b| b == b'/').any(|c| c == b"..")
}

/// A built path does not fit its buffer: reported to the caller as `ENAMETOOLONG`.
#[derive(Debug, PartialEq, Eq)]
pub struct TooLong;

/// Why a configured prefix was ignored.
#[derive(Debug, PartialEq, Eq)]
pub enum Rejected {
    Empty,
    Relative,
    DotDot,
    TooLong,
    Root,
    BareStar,
    Full,
}

impl Rejected {
    /// A short reason for the debug log.
    pub fn reason(&self) -> &'static [u8] {
        match self {
            Rejected::Empty => b"empty",
            Rejected::Relative => b"not absolute",
            Rejected::DotDot => b"contains '..'",
            Rejected::TooLong => b"too long",
            Rejected::Root => b"is '/'",
            Rejected::BareStar => b"'*' must follow a name",
            Rejected::Full => b"too many prefixes",
        }
    }
}

/// Resolves a NUL-terminated path physically (symlinks and `..`) into the buffer, returning it.
pub trait Physical: for<'o> FnMut(&CStr, &'o mut [u8; PATH_MAX]) -> Option<&'o [u8]> {}
impl<F: for<'o> FnMut(&CStr, &'o mut [u8; PATH_MAX]) -> Option<&'o [u8]>> Physical for F {}

/// What a hook should do with a path.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// Call the real function with the caller's path, untouched.
    Pass,
    /// Call it with the NUL-terminated path that starts at this offset of the buffer.
    Redirect(usize),
}

/// An absolute path under construction in a caller's buffer: `buf[..floor]` is a fixed head (the
/// mock root, or nothing), `buf[floor..len]` the normalised logical path (empty for `/`).
struct Builder<'a> {
    buf: &'a mut [u8],
    floor: usize,
    len: usize,
}

impl<'a> Builder<'a> {
    fn new(buf: &'a mut [u8], head: &[u8]) -> Result<Self, TooLong> {
        buf.get_mut(..head.len())
            .ok_or(TooLong)?
            .copy_from_slice(head);
        Ok(Builder {
            buf,
            floor: head.len(),
            len: head.len(),
        })
    }

    fn logical(&self) -> &[u8] {
        self.buf.get(self.floor..self.len).unwrap_or_default()
    }

    /// Appends `/` and `comp`.
    fn push(&mut self, comp: &[u8]) -> Result<(), TooLong> {
        let end = self
            .len
            .checked_add(comp.len())
            .and_then(|n| n.checked_add(1))
            .ok_or(TooLong)?;
        let (slash, rest) = self
            .buf
            .get_mut(self.len..end)
            .and_then(|d| d.split_first_mut())
            .ok_or(TooLong)?;
        *slash = b'/';
        rest.copy_from_slice(comp);
        self.len = end;
        Ok(())
    }

    /// Drops the last component (nothing at `/`).
    fn pop(&mut self) {
        if let Some(i) = self.logical().iter().rposition(|&b| b == b'/') {
            self.len = self.floor.saturating_add(i);
        }
    }

    /// Applies the components of `path` (absolute or relative) to the path built so far; `on_up`
    /// runs before each `..` takes effect.
    fn walk(
        &mut self,
        path: &[u8],
        mut on_up: impl FnMut(&mut Self) -> Result<(), TooLong>,
    ) -> Result<(), TooLong> {
        for comp in path.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => {
                    on_up(self)?;
                    self.pop();
                }
                _ => self.push(comp)?,
            }
        }
        Ok(())
    }

    /// Replaces the path by its physical form, so that a following `..` leaves the directory a
    /// symlink points to, as the kernel's does. `physical` resolves `<head><path>` (`None` when
    /// it cannot: the lexical path is kept); a result inside `head` is taken back out of it.
    fn follow(&mut self, physical: &mut impl Physical) -> Result<(), TooLong> {
        *self.buf.get_mut(self.len).ok_or(TooLong)? = 0;
        let Some(mapped) = self
            .buf
            .get(..=self.len)
            .and_then(|b| CStr::from_bytes_with_nul(b).ok())
        else {
            return Ok(());
        };
        let mut out = [0u8; PATH_MAX];
        let Some(real) = physical(mapped, &mut out) else {
            return Ok(());
        };
        let head = self.buf.get(..self.floor).unwrap_or_default();
        let real = match real.strip_prefix(head) {
            Some(inside) if inside.is_empty() || inside.starts_with(b"/") => inside,
            _ => real,
        };
        self.len = self.floor;
        self.walk(real, |_| Ok(()))
    }

    /// NUL-terminates the path from `start`, first appending `/` when a directory is required
    /// and `/` alone when the logical path is empty.
    fn finish(mut self, start: usize, dir: bool) -> Result<Target, TooLong> {
        if self.len == self.floor || dir {
            self.push(b"")?;
        }
        *self.buf.get_mut(self.len).ok_or(TooLong)? = 0;
        Ok(Target::Redirect(start))
    }
}

/// One redirected prefix, stored normalised.
#[derive(Clone, Copy)]
pub struct Prefix {
    bytes: [u8; PREFIX_MAX],
    len: usize,
    name_prefix: bool,
}

impl Prefix {
    const EMPTY: Prefix = Prefix {
        bytes: [0; PREFIX_MAX],
        len: 0,
        name_prefix: false,
    };

    /// Parses a configured entry: absolute, without `..`, not `/`, optionally ending in `*`.
    pub fn parse(entry: &[u8]) -> Result<Prefix, Rejected> {
        let (path, name_prefix) = match entry.strip_suffix(b"*") {
            Some(p) => (p, true),
            None => (entry, false),
        };
        if path.is_empty() {
            return Err(Rejected::Empty);
        }
        if !path.starts_with(b"/") {
            return Err(Rejected::Relative);
        }
        if name_prefix && path.ends_with(b"/") {
            return Err(Rejected::BareStar);
        }
        let mut p = Prefix {
            name_prefix,
            ..Prefix::EMPTY
        };
        let mut dotdot = false;
        let mut b = Builder::new(&mut p.bytes, b"").map_err(|_| Rejected::TooLong)?;
        b.walk(path, |_| {
            dotdot = true;
            Ok(())
        })
        .map_err(|_| Rejected::TooLong)?;
        // Keep one byte free so the stored prefix never fills its buffer.
        if b.len >= PREFIX_MAX {
            return Err(Rejected::TooLong);
        }
        let len = b.len;
        if dotdot {
            return Err(Rejected::DotDot);
        }
        if len == 0 {
            return Err(Rejected::Root);
        }
        p.len = len;
        Ok(p)
    }

    /// The normalised prefix, without the `*`.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }

    /// Whether the normalised absolute path `l` is covered.
    pub fn covers(&self, l: &[u8]) -> bool {
        match l.strip_prefix(self.as_bytes()) {
            Some(rest) => self.name_prefix || rest.is_empty() || rest.starts_with(b"/"),
            None => false,
        }
    }
}

/// One component of some prefix, as the fast filter compares it: length and first eight bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Comp {
    head: u64,
    /// `head_mask(len)`, for name prefixes.
    mask: u64,
    len: usize,
    /// The last component of a `*` prefix: matched as a name prefix.
    name_prefix: bool,
    /// The first component of its prefix (all that an absolute path is compared with).
    top: bool,
}

/// Most distinct components the fast filter tracks; beyond, it lets every path through.
const MAX_COMPS: usize = 128;

/// The first eight bytes of `c`, zero-padded.
fn head(c: &[u8]) -> u64 {
    if let Some(eight) = c.first_chunk::<8>() {
        return u64::from_le_bytes(*eight);
    }
    let mut h = [0u8; 8];
    for (d, s) in h.iter_mut().zip(c) {
        *d = *s;
    }
    u64::from_le_bytes(h)
}

/// Keeps the first `len` bytes of a `head`.
fn head_mask(len: usize) -> u64 {
    u32::try_from(len.saturating_mul(8))
        .ok()
        .and_then(|bits| 1u64.checked_shl(bits))
        .map_or(u64::MAX, |bit| bit.wrapping_sub(1))
}

impl Comp {
    const EMPTY: Comp = Comp {
        head: 0,
        mask: 0,
        len: 0,
        name_prefix: false,
        top: false,
    };

    /// `false` only when a component with head `h` and length `len` certainly differs from this
    /// one (false positives are fine).
    fn may_match(&self, h: u64, len: usize) -> bool {
        if self.name_prefix {
            len >= self.len && h & self.mask == self.head
        } else {
            len == self.len && h == self.head
        }
    }
}

/// Whether `path` has a `..` component (a fast word-at-a-time scan for `..` first).
fn has_dotdot(path: &[u8]) -> bool {
    const DOTS: u64 = u64::from_le_bytes([b'.'; 8]);
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    fn bytes(chunk: &[u8], prev_dot: &mut bool) -> bool {
        chunk.iter().any(|&b| {
            let pair = *prev_dot && b == b'.';
            *prev_dot = b == b'.';
            pair
        })
    }
    let mut prev_dot = false;
    let mut chunks = path.chunks_exact(8);
    let mut pair = false;
    for chunk in &mut chunks {
        let x = head(chunk) ^ DOTS;
        if x.wrapping_sub(ONES) & !x & HIGH == 0 {
            prev_dot = false; // no `.` in these eight bytes
        } else if bytes(chunk, &mut prev_dot) {
            pair = true;
            break;
        }
    }
    (pair || bytes(chunks.remainder(), &mut prev_dot))
        && path.split(|&b| b == b'/').any(|c| c == b"..")
}

/// The shim's configuration: mock root and prefixes, fixed at load time.
pub struct Config {
    root: [u8; ROOT_MAX],
    root_len: usize,
    prefixes: [Prefix; MAX_PREFIXES],
    count: usize,
    /// The distinct components of all prefixes, for the fast filter.
    comps: [Comp; MAX_COMPS],
    comp_count: usize,
    /// Bit `b` is set when some prefix's first component starts with byte `b`…
    top_bytes: ByteSet,
    /// …and when any of its components does.
    all_bytes: ByteSet,
}

/// A set of bytes, 256 bits.
#[derive(Clone, Copy)]
struct ByteSet([u64; 4]);

impl ByteSet {
    const EMPTY: ByteSet = ByteSet([0; 4]);

    fn insert(&mut self, b: u8) {
        if let Some(word) = self.0.get_mut(usize::from(b / 64)) {
            *word |= 1 << (b % 64);
        }
    }

    fn contains(&self, b: u8) -> bool {
        self.0
            .get(usize::from(b / 64))
            .is_some_and(|w| (w >> (b % 64)) & 1 == 1)
    }
}

impl Config {
    /// No root and no prefixes.
    pub const EMPTY: Config = Config {
        root: [0; ROOT_MAX],
        root_len: 0,
        prefixes: [Prefix::EMPTY; MAX_PREFIXES],
        count: 0,
        comps: [Comp::EMPTY; MAX_COMPS],
        comp_count: 0,
        top_bytes: ByteSet::EMPTY,
        all_bytes: ByteSet::EMPTY,
    };

    /// The mock root (canonical, absolute, without a trailing slash).
    pub fn root(&self) -> &[u8] {
        self.root.get(..self.root_len).unwrap_or_default()
    }

    /// The configured prefixes.
    pub fn prefixes(&self) -> &[Prefix] {
        self.prefixes.get(..self.count).unwrap_or_default()
    }

    /// Sets the mock root; `root` must be absolute, free of `.`/`..`/`//`, not `/`, and short.
    pub fn set_root(&mut self, root: &[u8]) -> bool {
        let root = root.strip_suffix(b"/").unwrap_or(root);
        let clean = root.starts_with(b"/")
            && root
                .split(|&b| b == b'/')
                .skip(1)
                .all(|c| !matches!(c, b"" | b"." | b".."));
        match self.root.get_mut(..root.len()) {
            Some(dst) if clean && !root.is_empty() => {
                dst.copy_from_slice(root);
                self.root_len = root.len();
                true
            }
            _ => false,
        }
    }

    /// Adds one prefix entry.
    pub fn add_prefix(&mut self, entry: &[u8]) -> Result<(), Rejected> {
        let p = Prefix::parse(entry)?;
        let slot = self.prefixes.get_mut(self.count).ok_or(Rejected::Full)?;
        *slot = p;
        self.count = self.count.saturating_add(1);
        let mut parts = p.as_bytes().split(|&b| b == b'/').skip(1).peekable();
        let mut top = true;
        while let Some(part) = parts.next() {
            let name_prefix = p.name_prefix && parts.peek().is_none();
            if let Some(&b) = part.first() {
                self.all_bytes.insert(b);
                if top {
                    self.top_bytes.insert(b);
                }
            }
            let comp = Comp {
                head: head(part),
                mask: head_mask(part.len()),
                len: part.len(),
                name_prefix,
                top,
            };
            top = false;
            if !self.comps().contains(&comp) {
                // When the table is full, `comp_count` passes MAX_COMPS and the filter gives up.
                if let Some(slot) = self.comps.get_mut(self.comp_count) {
                    *slot = comp;
                }
                self.comp_count = self.comp_count.saturating_add(1);
            }
        }
        Ok(())
    }

    /// Whether some prefix covers the normalised absolute path `l`.
    pub fn covers(&self, l: &[u8]) -> bool {
        self.prefixes().iter().any(|p| p.covers(l))
    }

    fn comps(&self) -> &[Comp] {
        self.comps.get(..self.comp_count).unwrap_or(&self.comps)
    }

    /// Whether `comp` may be a component of some prefix (the first one, for `top`).
    fn is_component(&self, comp: &[u8], top: bool) -> bool {
        let (h, len) = (head(comp), comp.len());
        self.comp_count > MAX_COMPS
            || self
                .comps()
                .iter()
                .any(|c| (c.top || !top) && c.may_match(h, len))
    }

    /// The fast filter, run on every call: `false` means `path` is certainly not covered,
    /// whatever its base directory (unless that base already lies inside the mock root, where the
    /// kernel resolves the path there by itself); `true` means the slow path must decide.
    pub fn needs_work(&self, path: &[u8]) -> bool {
        let absolute = path.starts_with(b"/");
        // Most paths are rejected by the first byte of their first component alone.
        let lead = path.iter().find(|&&b| b != b'/').copied().unwrap_or(b'/');
        let bytes = if absolute {
            &self.top_bytes
        } else {
            &self.all_bytes
        };
        if lead != b'.' && !bytes.contains(lead) && self.comp_count <= MAX_COMPS {
            return has_dotdot(path);
        }
        let Some(first) = path
            .split(|&b| b == b'/')
            .find(|c| !matches!(*c, b"" | b"."))
        else {
            return false;
        };
        if first == b".." {
            return true;
        }
        if !self.is_component(first, absolute) {
            return has_dotdot(path);
        }
        if !absolute {
            return true;
        }
        // An absolute path into a prefix's first directory: decided here when already normal.
        let mut simple = true;
        for comp in path.split(|&b| b == b'/').skip(1) {
            match comp {
                b".." => return true,
                b"" | b"." => simple = false,
                _ => {}
            }
        }
        !simple || self.covers(path)
    }

    /// If `path` lies inside the mock root at a covered logical path, that logical path.
    pub fn logical_of<'p>(&self, path: &'p [u8]) -> Option<&'p [u8]> {
        let l = path.strip_prefix(self.root())?;
        (l.starts_with(b"/") && self.covers(l.strip_suffix(b"/").unwrap_or(l))).then_some(l)
    }

    /// Resolves `path` into `buf`; a relative one against the directory `base` writes into the
    /// buffer it is given (canonical and absolute, as the kernel reports it; `None`: unknown).
    ///
    /// A covered path becomes `<root><path>`. A path that went through the mock (its base is a
    /// redirected directory, or a `..` climbed out of a prefix) but ends up outside every prefix
    /// becomes its plain logical path, so `/proc/driver/nvidia/../../../etc/passwd` is the real
    /// `/etc/passwd`. Anything else passes through untouched.
    pub fn resolve(
        &self,
        buf: &mut [u8],
        path: &[u8],
        base: impl FnOnce(&mut [u8]) -> Option<Result<usize, TooLong>>,
        mut physical: impl Physical,
    ) -> Result<Target, TooLong> {
        if path.is_empty() {
            return Ok(Target::Pass);
        }
        let floor = self.root_len;
        buf.get_mut(..floor)
            .ok_or(TooLong)?
            .copy_from_slice(self.root());
        let mut via_mock = false;
        let mut len = floor;
        if !path.starts_with(b"/") {
            // The base goes straight behind the root, where the logical path is built.
            let region = buf.get_mut(floor..).ok_or(TooLong)?;
            let Some(n) = base(region) else {
                return Ok(Target::Pass);
            };
            let dir = region.get_mut(..n?).ok_or(TooLong)?;
            if !dir.starts_with(b"/") {
                return Ok(Target::Pass);
            }
            let n = dir.len();
            match self.logical_of(dir).map(<[u8]>::len) {
                Some(logical) => {
                    via_mock = true;
                    dir.copy_within(n.saturating_sub(logical).., 0);
                    len = floor.saturating_add(logical);
                }
                None => len = floor.saturating_add(n),
            }
            if len == floor.saturating_add(1) {
                len = floor; // the base is `/`
            }
        }
        let mut b = Builder { buf, floor, len };
        b.walk(path, |b| {
            if self.covers(b.logical()) {
                via_mock = true;
                b.follow(&mut physical)?;
            }
            Ok(())
        })?;
        let dir = path.ends_with(b"/") || path.ends_with(b"/.") || path == b".";
        if self.covers(b.logical()) {
            b.finish(0, dir)
        } else if via_mock {
            b.finish(floor, dir)
        } else {
            Ok(Target::Pass)
        }
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn config(prefixes: &[&[u8]]) -> Box<Config> {
        let mut c = Box::new(Config::EMPTY);
        assert!(c.set_root(b"/mock/root"));
        for p in prefixes {
            c.add_prefix(p).unwrap();
        }
        c
    }

    fn defaults() -> Box<Config> {
        let mut all = DEFAULT_PREFIXES.to_vec();
        all.push(b"/sys/devices/pci0008:06/0008:06:00.0");
        all.push(DEV_PREFIX);
        config(&all)
    }

    /// The mock tree's symlinks, as the kernel would resolve them (other paths: unresolvable).
    fn fake_physical<'o>(path: &CStr, out: &'o mut [u8; PATH_MAX]) -> Option<&'o [u8]> {
        let real: &[u8] = match path.to_bytes() {
            b"/mock/root/sys/bus/pci/devices/0008:06:00.0" => {
                b"/mock/root/sys/devices/pci0008:06/0008:06:00.0"
            }
            b"/mock/root/sys/bus/pci/devices/0000:00:03.0" => {
                b"/sys/devices/pci0000:00/0000:00:03.0"
            }
            b"/mock/root/proc/driver/nvidia" => b"/mock/root/proc/driver/nvidia",
            b"/mock/root/proc/driver/nvidia/gpus" => b"/mock/root/proc/driver/nvidia/gpus",
            _ => return None,
        };
        out[..real.len()].copy_from_slice(real);
        Some(&out[..real.len()])
    }

    /// A base directory as the kernel would report it (`None` for "").
    fn fake_base(base: &str) -> impl FnOnce(&mut [u8]) -> Option<Result<usize, TooLong>> + '_ {
        move |region| {
            if base.is_empty() {
                return None;
            }
            let Some(dst) = region.get_mut(..base.len()) else {
                return Some(Err(TooLong));
            };
            dst.copy_from_slice(base.as_bytes());
            Some(Ok(base.len()))
        }
    }

    /// Resolves and returns the redirected path, or `None` for a pass-through.
    fn run(c: &Config, base: &str, path: &str) -> Result<Option<String>, TooLong> {
        let mut buf = [0xffu8; PATH_MAX];
        Ok(
            match c.resolve(&mut buf, path.as_bytes(), fake_base(base), fake_physical)? {
                Target::Pass => None,
                Target::Redirect(start) => {
                    let s = &buf[start..];
                    let end = s.iter().position(|&b| b == 0).unwrap();
                    Some(String::from_utf8(s[..end].to_vec()).unwrap())
                }
            },
        )
    }

    fn redirect(c: &Config, base: &str, path: &str) -> Option<String> {
        run(c, base, path).unwrap()
    }

    #[test]
    fn covered_paths_move_under_the_root() {
        let c = defaults();
        assert_eq!(
            redirect(&c, "", "/proc/driver/nvidia/version").as_deref(),
            Some("/mock/root/proc/driver/nvidia/version")
        );
        assert_eq!(
            redirect(&c, "", "/proc/driver/nvidia").as_deref(),
            Some("/mock/root/proc/driver/nvidia")
        );
        assert_eq!(
            redirect(&c, "", "//proc/./driver//nvidia/gpus/").as_deref(),
            Some("/mock/root/proc/driver/nvidia/gpus/")
        );
        assert_eq!(
            redirect(&c, "", "/sys/devices/pci0008:06/0008:06:00.0/vendor").as_deref(),
            Some("/mock/root/sys/devices/pci0008:06/0008:06:00.0/vendor")
        );
        assert_eq!(
            redirect(&c, "", "/usr/../proc/driver/nvidia/params").as_deref(),
            Some("/mock/root/proc/driver/nvidia/params")
        );
    }

    #[test]
    fn component_boundaries_and_name_prefixes() {
        let c = defaults();
        assert_eq!(redirect(&c, "", "/proc/driver/nvidia2"), None);
        assert_eq!(redirect(&c, "", "/proc/driver/nvidia-uvm"), None);
        assert_eq!(redirect(&c, "", "/proc/driver"), None);
        assert_eq!(
            redirect(&c, "", "/sys/devices/pci0008:06/0008:06:00.1"),
            None
        );
        for dev in [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-caps/nvidia-cap1",
        ] {
            assert_eq!(
                redirect(&c, "", dev),
                Some(format!("/mock/root{dev}")),
                "{dev}"
            );
        }
        assert_eq!(redirect(&c, "", "/dev/nv"), None);
        assert_eq!(redirect(&c, "", "/dev/null"), None);
    }

    #[test]
    fn dotdot_never_escapes_the_root() {
        let c = defaults();
        // Climbing out of a prefix gives the real path, not one inside (or above) the root.
        assert_eq!(
            redirect(&c, "", "/proc/driver/nvidia/../../../etc/passwd").as_deref(),
            Some("/etc/passwd")
        );
        assert_eq!(
            redirect(&c, "", "/proc/driver/nvidia/../../../../../..").as_deref(),
            Some("/")
        );
        assert_eq!(
            redirect(&c, "", "/proc/driver/nvidia/gpus/../version").as_deref(),
            Some("/mock/root/proc/driver/nvidia/version")
        );
        // Untouched by the mock: passed through for the kernel to resolve.
        assert_eq!(redirect(&c, "", "/usr/lib/../bin/ls"), None);
        assert_eq!(redirect(&c, "", "/proc/self/../1/status"), None);
    }

    #[test]
    fn dotdot_leaves_a_symlinked_directory_physically() {
        let c = defaults();
        // lspci: <device link>/../../../bus/pci/drivers/nvidia
        let gpu = "/sys/bus/pci/devices/0008:06:00.0";
        assert_eq!(
            redirect(&c, "", &format!("{gpu}/../../../bus/pci/drivers/nvidia")).as_deref(),
            Some("/mock/root/sys/bus/pci/drivers/nvidia")
        );
        assert_eq!(
            redirect(&c, "", &format!("{gpu}/..")).as_deref(),
            Some("/sys/devices/pci0008:06")
        );
        // A real device behind an absolute link: its real parent.
        let real = "/sys/bus/pci/devices/0000:00:03.0/../../../class/net";
        assert_eq!(redirect(&c, "", real).as_deref(), Some("/sys/class/net"));
        // Unresolvable (missing) directories fall back to the lexical `..`.
        assert_eq!(
            redirect(&c, "", "/proc/driver/nvidia/missing/../version").as_deref(),
            Some("/mock/root/proc/driver/nvidia/version")
        );
    }

    #[test]
    fn relative_paths_use_their_base() {
        let c = defaults();
        assert_eq!(
            redirect(&c, "/", "proc/driver/nvidia/version").as_deref(),
            Some("/mock/root/proc/driver/nvidia/version")
        );
        assert_eq!(
            redirect(&c, "/proc/driver", "nvidia/gpus").as_deref(),
            Some("/mock/root/proc/driver/nvidia/gpus")
        );
        assert_eq!(
            redirect(&c, "/dev", "nvidia3").as_deref(),
            Some("/mock/root/dev/nvidia3")
        );
        assert_eq!(
            redirect(&c, "/", "sys/bus/pci/devices/0000:00:1f.0/vendor").as_deref(),
            Some("/mock/root/sys/bus/pci/devices/0000:00:1f.0/vendor")
        );
        assert_eq!(redirect(&c, "/", "proc/cpuinfo"), None);
        assert_eq!(redirect(&c, "/usr", "lib"), None);
        // A base inside the mock root stands for its logical path.
        assert_eq!(
            redirect(&c, "/mock/root/proc/driver/nvidia/gpus", "../params").as_deref(),
            Some("/mock/root/proc/driver/nvidia/params")
        );
        assert_eq!(
            redirect(&c, "/mock/root/proc/driver/nvidia", "..").as_deref(),
            Some("/proc/driver")
        );
        assert_eq!(
            redirect(&c, "/mock/root/proc/driver/nvidia", "../../cpuinfo").as_deref(),
            Some("/proc/cpuinfo")
        );
        assert_eq!(
            redirect(&c, "/mock/root/proc/driver/nvidia", "version").as_deref(),
            Some("/mock/root/proc/driver/nvidia/version")
        );
        // A base inside the root but outside every prefix is an ordinary directory.
        assert_eq!(redirect(&c, "/mock/root", "proc"), None);
        // Unusable bases pass through.
        assert_eq!(redirect(&c, "socket:[12]", "proc/driver/nvidia"), None);
        assert_eq!(redirect(&c, "/", ""), None);
    }

    #[test]
    fn overlong_paths_are_refused_not_truncated() {
        let c = defaults();
        let long = format!("/proc/driver/nvidia/{}", "x".repeat(5000));
        assert_eq!(run(&c, "", &long), Err(TooLong));
        let deep = format!("/proc/driver/nvidia/{}", "a/".repeat(2040));
        assert_eq!(run(&c, "", &deep), Err(TooLong));
        let fits = format!("/proc/driver/nvidia/{}", "y".repeat(PATH_MAX - 40));
        assert!(run(&c, "", &fits).unwrap().unwrap().ends_with('y'));
    }

    #[test]
    fn the_fast_filter_is_conservative() {
        let c = defaults();
        for p in [
            "/usr/bin/ls",
            "lib",
            "./share/doc",
            "/etc/passwd",
            "x..y",
            "/a/b..c/d",
            "",
        ] {
            assert!(!c.needs_work(p.as_bytes()), "{p}");
        }
        for p in [
            "/proc//self",
            "/proc/driver/nvidia",
            "/proc/driver/nvidia/",
            "/dev/nvidia0",
            "proc/driver",
            "nvidia",
            "../x",
            "/usr/../proc",
            "devices",
            "./sys",
            "nvidia-uvm",
            "0008:06:00.0",
        ] {
            assert!(c.needs_work(p.as_bytes()), "{p}");
        }
    }

    /// Exhaustively over short paths: whenever the fast filter says "no", the full resolution
    /// agrees.
    #[test]
    fn the_fast_filter_never_hides_a_redirect() {
        let c = defaults();
        let comps = [
            "proc",
            "driver",
            "nvidia",
            "nvidia0",
            "sys",
            "devices",
            "pci0008:06",
            "0008:06:00.0",
            "usr",
            "..",
            ".",
            "",
            "a.b..",
            "..c",
            "longer.than..eight",
        ];
        // Bases outside the root and outside every prefix (see `needs_work`).
        let bases = ["/", "/proc", "/proc/driver", "/dev", "/usr", "/sys/devices"];
        let mut checked = 0;
        for n in 1..=4u32 {
            for i in 0..comps.len().pow(n) {
                let rel: Vec<_> = (0..n)
                    .map(|k| comps[i / comps.len().pow(k) % comps.len()])
                    .collect();
                let rel = rel.join("/");
                for (path, base_list) in
                    [(format!("/{rel}"), &bases[..1]), (rel.clone(), &bases[..])]
                {
                    if c.needs_work(path.as_bytes()) {
                        continue;
                    }
                    for base in base_list {
                        assert_eq!(run(&c, base, &path), Ok(None), "{base} + {path}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn dotdot_components_are_found_anywhere() {
        for p in [
            "..",
            "../x",
            "/a/..",
            "/a/../b",
            "/abcdefgh/ijklmno/..",
            "/abcdefg/../",
            "x/./..",
        ] {
            assert!(has_dotdot(p.as_bytes()), "{p}");
        }
        for p in [
            "",
            ".",
            "/a.b/c..d/..e/f../...",
            "/abcdefg.",
            "/abcdefgh.i.j.k.l",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ] {
            assert!(!has_dotdot(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn a_full_component_table_lets_everything_through() {
        let mut c = Config::EMPTY;
        for i in 0..MAX_PREFIXES {
            c.add_prefix(format!("/p{i}/q{i}/r{i}").as_bytes()).unwrap();
        }
        // Every relative path goes to the slow path; absolute ones are still decided exactly.
        assert!(c.needs_work(b"unrelated"));
        assert!(c.needs_work(b"/p63/q63/r63/x"));
        assert!(!c.needs_work(b"/p63/q63"));
        assert!(!defaults().needs_work(b"unrelated"));
    }

    #[test]
    fn prefix_entries_are_validated() {
        assert!(matches!(Prefix::parse(b""), Err(Rejected::Empty)));
        assert!(matches!(
            Prefix::parse(b"proc/driver"),
            Err(Rejected::Relative)
        ));
        assert!(matches!(Prefix::parse(b"/a/../b"), Err(Rejected::DotDot)));
        assert!(matches!(Prefix::parse(b"/"), Err(Rejected::Root)));
        assert!(matches!(Prefix::parse(b"//./"), Err(Rejected::Root)));
        assert!(matches!(Prefix::parse(b"/dev/*"), Err(Rejected::BareStar)));
        let long = format!("/{}", "a".repeat(300));
        assert!(matches!(
            Prefix::parse(long.as_bytes()),
            Err(Rejected::TooLong)
        ));
        assert_eq!(Rejected::DotDot.reason(), b"contains '..'");
        assert_eq!(Prefix::parse(b"/x//y/./z/").unwrap().as_bytes(), b"/x/y/z");
        let mut c = Config::EMPTY;
        let mut notes = Vec::new();
        for e in [&b"/a"[..], b"", b"rel", b"/b/../c", b"/d"] {
            if let Err(why) = c.add_prefix(e) {
                notes.push((e.to_vec(), why));
            }
        }
        assert_eq!(c.prefixes().len(), 2);
        assert_eq!(notes.len(), 3);
        for i in 0..MAX_PREFIXES + 3 {
            let r = c.add_prefix(format!("/p{i}").as_bytes());
            assert_eq!(r.is_ok(), i + 2 < MAX_PREFIXES);
        }
    }

    #[test]
    fn roots_are_validated() {
        let mut c = Config::EMPTY;
        assert!(!c.set_root(b""));
        assert!(!c.set_root(b"/"));
        assert!(!c.set_root(b"rel/dir"));
        assert!(!c.set_root(b"/a/../b"));
        assert!(!c.set_root(&vec![b'a'; ROOT_MAX + 1]));
        assert!(c.set_root(b"/run/mockgpu/fs/"));
        assert_eq!(c.root(), b"/run/mockgpu/fs");
    }

    #[test]
    fn logical_paths_of_results() {
        let c = defaults();
        assert_eq!(
            c.logical_of(b"/mock/root/proc/driver/nvidia/version"),
            Some(&b"/proc/driver/nvidia/version"[..])
        );
        assert_eq!(c.logical_of(b"/mock/root/etc"), None);
        assert_eq!(c.logical_of(b"/mock/rootx/proc/driver/nvidia"), None);
        assert_eq!(c.logical_of(b"/proc/driver/nvidia"), None);
    }

    #[test]
    fn defaults_follow_the_agents_layout() {
        let layout = mockgpu_api::Layout::default();
        assert_eq!(
            DEFAULT_ROOT,
            layout.mount_point().to_str().unwrap().as_bytes()
        );
        assert_eq!(
            PREFIXES_FILE.to_bytes(),
            mockgpu_api::layout::PREFIXES_FILE.as_bytes()
        );
    }

    #[test]
    fn gpu_nodes_are_the_drivers_dev_nodes() {
        for p in [
            "/dev/nvidia0",
            "/dev/nvidia17",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-caps/nvidia-cap1",
        ] {
            assert!(is_gpu_node(p.as_bytes()), "{p}");
        }
        for p in [
            "/dev/null",
            "dev/nvidia0",
            "/dev/nvidia0/../sda",
            "/proc/driver/nvidia/gpus",
            "/dev/nvidi",
        ] {
            assert!(!is_gpu_node(p.as_bytes()), "{p}");
        }
    }
}

//! Loading through `/etc/ld.so.preload`, with the environment reset (as for Slurm jobs). Runs in a
//! private mount namespace with an overlay on `/etc`, so the host's file is never touched.

mod common;

use common::{GPU, Tree, VERSION, in_namespace, ok, plain};

/// Mounts an overlay on `/etc` (upper layer in a private tmpfs) and lists the shim in
/// `/etc/ld.so.preload`; `$WORK` is a scratch directory for it.
const PRELOAD: &str = "mount -t tmpfs mockgpu-test \"$WORK\" && mkdir \"$WORK/up\" \"$WORK/work\" && \
     mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$WORK/up\",workdir=\"$WORK/work\" /etc && \
     echo \"$SHIM\" > /etc/ld.so.preload && ";

fn run(t: &Tree, script: &str) -> String {
    let work = tempfile::tempdir().unwrap();
    // `in_namespace` sets SHIM and TREE; WORK is substituted here.
    let script = format!("WORK={}; {PRELOAD}{script}", work.path().display());
    ok(in_namespace(t, &script))
}

#[test]
fn works_from_ld_so_preload_with_an_explicit_root() {
    let t = Tree::new();
    let out = run(
        &t,
        "env -i MOCKFS_ROOT=\"$TREE\" /bin/cat /proc/driver/nvidia/version && \
         env -i MOCKFS_ROOT=\"$TREE\" /bin/ls /proc/driver/nvidia/gpus && \
         env -i MOCKFS_ROOT=\"$TREE\" $(command -v /usr/bin/python3 || command -v python3) -c \"print(open('/sys/module/nvidia/version').read(), end='')\"",
    );
    assert_eq!(out, format!("{VERSION}{GPU}\n580.173.02\n"));
}

#[test]
fn works_from_ld_so_preload_with_no_environment_at_all() {
    let t = Tree::new();
    let out = run(
        &t,
        "mount -t tmpfs mockgpu-test /run && mkdir -p /run/mockgpu/fs && cp -a \"$TREE\"/. /run/mockgpu/fs/ && \
         env -i /bin/cat /proc/driver/nvidia/params && env -i /bin/sh -c 'cd /proc/driver/nvidia && /bin/cat version'",
    );
    assert_eq!(out, format!("EnableMSI: 1\n{VERSION}"));
}

#[test]
fn a_missing_root_leaves_every_program_working() {
    let t = Tree::new();
    let out = run(
        &t,
        "env -i /bin/cat /etc/hostname && env -i /bin/ls /proc/driver && env -i /bin/true",
    );
    assert_eq!(
        out,
        format!(
            "{}{}",
            plain("cat", &["/etc/hostname"]),
            plain("ls", &["/proc/driver"])
        )
    );
}

//! A job sees only the GPUs its device cgroup allows, as under Slurm's `ConstrainDevices` (needs
//! root and a cgroup2 mount). Each job runs in a private mount namespace whose `/dev` is a tmpfs
//! holding the GPU nodes a container of a mock node has (195:N, no driver behind them), inside a
//! cgroup whose BPF device program refuses some minors, as Slurm's cgroup/v2 plugin builds it.
//! The kernel answers, not a fake: `EPERM` for a refused node, `ENXIO` for an allowed one (which
//! the shim turns into an open).

mod common;
#[path = "common/devcgroup.rs"]
mod devcgroup;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::Rendered;
use devcgroup::DeviceCgroup;

/// Makes `/dev` a tmpfs with `/dev/null` and `/dev/nvidia<m>` for each of `$MINORS`, joins the
/// cgroup `$PROCS` names (if any), then runs its arguments.
const JOB: &str = r#"
mount -t tmpfs -o mode=755 tmpfs /dev
mknod -m 666 /dev/null c 1 3
for m in $MINORS; do mknod -m 666 /dev/nvidia$m c 195 $m; done
if [ -n "$PROCS" ]; then echo $$ > "$PROCS"; fi
exec "$@"
"#;

/// Prints `<minor> <result>` for opening each `/dev/nvidia<minor>` read-write.
const OPEN_ALL: &str = r#"
import errno, os
for m in range(4):
    try:
        os.close(os.open(f"/dev/nvidia{m}", os.O_RDWR))
        print(m, "ok")
    except OSError as e:
        print(m, errno.errorcode[e.errno])
"#;

/// A started job, and the directory of the library it loads.
struct Job(Child, #[allow(dead_code)] tempfile::TempDir);

/// `args` started as a job with the nodes of `minors`, in `cgroup` when given.
fn job(tree: &Rendered, minors: &str, cgroup: Option<&DeviceCgroup>, args: &[&str]) -> Job {
    let lib = common::library_dir();
    let smi_dir = Path::new(env!("CARGO_BIN_EXE_nvidia-smi"))
        .parent()
        .unwrap();
    let child = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-ec",
            JOB,
            "sh",
        ])
        .args(args)
        .env("MINORS", minors)
        .env("PROCS", cgroup.map(DeviceCgroup::procs).unwrap_or_default())
        .env("MOCKFS_ROOT", tree.root())
        .env("LD_LIBRARY_PATH", lib.path())
        .env(
            "PATH",
            format!("{}:{}", smi_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env_remove("LD_PRELOAD")
        .env_remove("MOCKFS_DEV")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (needs root)");
    Job(child, lib)
}

fn finish(job: Job) -> String {
    let out: Output = job.0.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{:?}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `nvidia-smi -L`'s UUIDs, in its order.
fn listed(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let rest = l
                .strip_prefix(&format!("GPU {i}: NVIDIA GB300 (UUID: "))
                .unwrap_or_else(|| panic!("line {i} of nvidia-smi -L: {l:?}\n{text}"));
            rest.strip_suffix(')').unwrap().to_string()
        })
        .collect()
}

/// The driver files' UUIDs of `minors`.
fn uuids(tree: &Rendered, minors: &[u32]) -> Vec<String> {
    let gpus = tree.driver_gpus();
    minors
        .iter()
        .map(|&m| {
            gpus.iter()
                .find(|g| g.gpu.minor == m)
                .unwrap()
                .gpu
                .uuid
                .clone()
        })
        .collect()
}

#[test]
fn a_confined_job_lists_and_opens_only_its_gpus() {
    let tree = Rendered::new("gb300");
    let cgroup = DeviceCgroup::denying("confined", &[0, 2]);
    let smi = finish(job(&tree, "0 1 2 3", Some(&cgroup), &["nvidia-smi", "-L"]));
    assert_eq!(listed(&smi), uuids(&tree, &[1, 3]), "{smi}");
    // What the library's probe reads: the cgroup refuses before any driver is looked up.
    let opens = finish(job(
        &tree,
        "0 1 2 3",
        Some(&cgroup),
        &["python3", "-c", OPEN_ALL],
    ));
    assert_eq!(opens, "0 EPERM\n1 ENXIO\n2 EPERM\n3 ENXIO\n");
    // With the shim (in a container through /etc/ld.so.preload): the allowed ones open.
    let shim =
        common::cargo_build(&["--release", "-p", "mockfs-shim"]).join("release/libmockfs.so");
    let preload = format!("LD_PRELOAD={}", shim.display());
    let opens = finish(job(
        &tree,
        "0 1 2 3",
        Some(&cgroup),
        &["env", &preload, "python3", "-c", OPEN_ALL],
    ));
    assert_eq!(opens, "0 EPERM\n1 ok\n2 EPERM\n3 ok\n");
}

#[test]
fn two_concurrent_jobs_see_disjoint_pairs() {
    let tree = Rendered::new("gb300");
    let (a, b) = (
        DeviceCgroup::denying("job-a", &[2, 3]),
        DeviceCgroup::denying("job-b", &[0, 1]),
    );
    let (ja, jb) = (
        job(&tree, "0 1 2 3", Some(&a), &["nvidia-smi", "-L"]),
        job(&tree, "0 1 2 3", Some(&b), &["nvidia-smi", "-L"]),
    );
    let (la, lb) = (listed(&finish(ja)), listed(&finish(jb)));
    assert_eq!(la, uuids(&tree, &[0, 1]));
    assert_eq!(lb, uuids(&tree, &[2, 3]));
    let union: BTreeSet<_> = la.iter().chain(&lb).collect();
    assert_eq!(union.len(), 4);
}

#[test]
fn without_confinement_a_job_sees_every_gpu() {
    let tree = Rendered::new("gb300");
    let smi = finish(job(&tree, "0 1 2 3", None, &["nvidia-smi", "-L"]));
    assert_eq!(listed(&smi), uuids(&tree, &[0, 1, 2, 3]));
}

#[test]
fn a_container_given_two_nodes_sees_those_two() {
    let tree = Rendered::new("gb300");
    let smi = finish(job(&tree, "1 3", None, &["nvidia-smi", "-L"]));
    assert_eq!(listed(&smi), uuids(&tree, &[1, 3]));
}

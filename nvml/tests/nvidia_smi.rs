//! The built `nvidia-smi` against the package's own library (as `libnvidia-ml.so.1` on
//! `LD_LIBRARY_PATH`) and a tree the agent rendered: what it prints must be the profile's and the
//! driver files', and its failures the real tool's messages and exit codes.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::Rendered;
use mockgpu_api::fault::{Fault, FaultKind};

/// `nvidia-smi ARGS` with the libraries of `lib_dir` and the mock tree at `root`.
fn smi(lib_dir: &Path, root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nvidia-smi"))
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("MOCKFS_ROOT", root)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Runs `args` on a gb300 tree, expecting success; returns stdout.
fn run_ok(tree: &Rendered, args: &[&str]) -> String {
    let lib = common::library_dir();
    let out = smi(lib.path(), &tree.root(), args);
    assert!(
        out.status.success(),
        "nvidia-smi {args:?}: {:?}\n{}{}",
        out.status,
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

#[test]
fn list_shows_the_profiles_gpus_with_the_driver_files_uuids() {
    let tree = Rendered::new("gb300");
    let driver = tree.driver_gpus();
    assert_eq!(driver.len(), 4);
    let want: String = driver
        .iter()
        .map(|g| format!("GPU {}: NVIDIA GB300 (UUID: {})\n", g.gpu.minor, g.gpu.uuid))
        .collect();
    assert_eq!(run_ok(&tree, &["-L"]), want);
}

#[test]
fn query_gpu_values_equal_the_profiles() {
    let tree = Rendered::new("gb300");
    let p = &tree.topo.profile;
    let out = run_ok(
        &tree,
        &[
            "--query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,vbios_version,count",
            "--format=csv,noheader,nounits",
        ],
    );
    let driver = tree.driver_gpus();
    let rows: Vec<Vec<String>> = out
        .lines()
        .map(|l| l.split(", ").map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), driver.len(), "{out}");
    for (i, row) in rows.iter().enumerate() {
        let g = &driver[i].gpu;
        assert_eq!(row[0], i.to_string());
        assert_eq!(row[1], p.model);
        assert_eq!(row[2], g.uuid);
        // NVML's bus id: an 8-digit domain, upper-case hex
        let bus = g.bus_id.to_string();
        assert_eq!(row[3], format!("0000{}", bus.to_ascii_uppercase()));
        assert_eq!(row[4], p.driver_version.to_string());
        assert_eq!(row[5], p.memory_mib.to_string());
        assert_eq!(row[6], p.vbios);
        assert_eq!(row[7], driver.len().to_string());
    }
    let header = run_ok(
        &tree,
        &["--query-gpu=memory.total,power.draw", "--format=csv"],
    );
    assert_eq!(
        header.lines().next(),
        Some("memory.total [MiB], power.draw [W]")
    );
}

#[test]
fn one_gpu_by_index_uuid_or_bus_id() {
    let tree = Rendered::new("gb300");
    let g = &tree.driver_gpus()[2].gpu;
    let bus = format!("0000{}", g.bus_id.to_string().to_ascii_uppercase());
    for id in ["2", g.uuid.as_str(), bus.as_str()] {
        let out = run_ok(&tree, &["-L", "-i", id]);
        assert_eq!(
            out,
            format!("GPU 2: NVIDIA GB300 (UUID: {})\n", g.uuid),
            "-i {id}"
        );
    }
    let q = run_ok(&tree, &["-q", "-i", "2", "-d", "MEMORY"]);
    assert!(q.contains(&format!("\nGPU {bus}\n")), "{q}");
    assert_eq!(q.matches("\nGPU ").count(), 1, "{q}");
    let lib = common::library_dir();
    let none = smi(lib.path(), &tree.root(), &["-L", "-i", "7"]);
    assert_eq!(none.status.code(), Some(6));
    assert_eq!(stdout(&none), "No devices were found\n");
}

#[test]
fn summary_query_and_topology_show_every_gpu() {
    let tree = Rendered::new("gb300");
    let p = &tree.topo.profile;
    let table = run_ok(&tree, &[]);
    assert!(
        table.contains(&format!(
            "Driver Version: {:<15}",
            p.driver_version.to_string()
        )),
        "{table}"
    );
    assert_eq!(table.matches("NVIDIA GB300").count(), 4, "{table}");
    assert!(
        table.contains(&format!("/ {}MiB |", p.memory_mib)),
        "{table}"
    );
    assert!(table.contains("|  No running processes found"), "{table}");

    let q = run_ok(&tree, &["-q"]);
    assert!(
        q.starts_with("\n==============NVSMI LOG==============\n"),
        "{q}"
    );
    assert!(
        q.contains(&format!("Attached GPUs{}: 4\n", " ".repeat(42))),
        "{q}"
    );
    assert_eq!(q.matches("    Product Name").count(), 4);
    assert!(
        q.contains(&format!(
            "        Total{}: {} MiB\n",
            " ".repeat(42),
            p.memory_mib
        )),
        "{q}"
    );

    let topo = run_ok(&tree, &["topo", "-m"]);
    let lines: Vec<&str> = topo.lines().collect();
    assert_eq!(
        lines[0],
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    );
    for (i, g) in tree.topo.gpus.iter().enumerate() {
        let cells: Vec<&str> = lines[i + 1].split('\t').collect();
        assert_eq!(cells[0], format!("GPU{i}"));
        assert_eq!(cells[i + 1], " X ");
        // CPU affinity is the driver files' local_cpulist
        assert_eq!(cells[5], g.cpus.to_string(), "{topo}");
    }
    assert!(topo.contains("\nLegend:\n"));
}

#[test]
fn without_the_library_it_says_so_and_exits_12() {
    let tree = Rendered::new("gb300");
    let empty = tempfile::tempdir().unwrap();
    let out = smi(empty.path(), &tree.root(), &["-L"]);
    assert_eq!(out.status.code(), Some(12));
    assert_eq!(
        stdout(&out),
        "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display Driver is properly installed and present in your system.\nPlease also try adding directory that contains libnvidia-ml.so to your system PATH.\n"
    );
}

#[test]
fn without_a_tree_it_cannot_talk_to_the_driver_and_exits_9() {
    let lib = common::library_dir();
    let nothing = tempfile::tempdir().unwrap();
    for args in [&["-L"][..], &[], &["--query-gpu=name", "--format=csv"]] {
        let out = smi(lib.path(), &nothing.path().join("absent"), args);
        assert_eq!(out.status.code(), Some(9), "{args:?}");
        assert_eq!(
            stdout(&out),
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n"
        );
    }
}

#[test]
fn bad_arguments_exit_2_before_loading_anything() {
    let empty = tempfile::tempdir().unwrap();
    let out = smi(
        empty.path(),
        empty.path(),
        &["--query-gpu=index,cuda_version", "--format=csv"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stdout(&out),
        "Field \"cuda_version\" is not a valid field to query.\n\n"
    );
    let help = smi(empty.path(), empty.path(), &["-h"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("--query-gpu"));
}

/// A GPU fallen off the bus (Xid 79).
fn lost(gpu: u32) -> Fault {
    Fault::xid(gpu, 79)
}

#[test]
fn a_lost_gpu_is_reported_on_stderr_and_the_others_listed() {
    let tree = Rendered::with_faults("gb300", &[lost(1)]);
    let gpus = &tree.topo.gpus;
    let b = &gpus[1].bus_id;
    let message = format!(
        "Unable to determine the device handle for GPU{:04X}:{:02X}:{:02X}.0: GPU is lost. Reboot the system to recover this GPU\n",
        b.domain, b.bus, b.slot
    );
    let lib = common::library_dir();
    let out = smi(lib.path(), &tree.root(), &["-L"]);
    assert_eq!(out.status.code(), Some(15));
    assert_eq!(String::from_utf8_lossy(&out.stderr), message);
    let want: String = [0, 2, 3]
        .iter()
        .map(|&i| format!("GPU {i}: NVIDIA GB300 (UUID: {})\n", gpus[i].uuid))
        .collect();
    assert_eq!(stdout(&out), want);

    let table = smi(lib.path(), &tree.root(), &[]);
    assert_eq!(table.status.code(), Some(15));
    assert_eq!(String::from_utf8_lossy(&table.stderr), message);
    assert_eq!(stdout(&table).matches("NVIDIA GB300").count(), 3);

    let by_uuid = smi(lib.path(), &tree.root(), &["-L", "-i", &gpus[1].uuid]);
    assert_eq!(by_uuid.status.code(), Some(15));
    assert_eq!(String::from_utf8_lossy(&by_uuid.stderr), message);
    assert_eq!(stdout(&by_uuid), "");
}

#[test]
fn ecc_errors_and_thermal_slowdown_show_in_the_log_and_the_csv() {
    let faults = [
        Fault {
            single_bit: Some(4),
            double_bit: Some(2),
            kind: FaultKind::Ecc,
            xid: None,
            ..lost(0)
        },
        Fault {
            kind: FaultKind::Thermal,
            xid: None,
            ..lost(0)
        },
    ];
    let tree = Rendered::with_faults("h100", &faults);
    let q = run_ok(
        &tree,
        &["-q", "-i", "0", "-d", "ECC,ROW_REMAPPER,PERFORMANCE"],
    );
    let key = |depth: usize, k: &str, v: &str| {
        let label = format!("{}{k}", "    ".repeat(depth));
        format!("\n{label:<55}: {v}\n")
    };
    for line in [
        key(3, "DRAM Correctable", "4"),
        key(3, "DRAM Uncorrectable", "2"),
        key(3, "SRAM Uncorrectable", "0"),
        key(2, "Uncorrectable Error", "2"),
        key(2, "Pending", "Yes"),
        key(2, "SW Thermal Slowdown", "Active"),
        key(3, "HW Thermal Slowdown", "Active"),
        key(2, "Idle", "Active"),
    ] {
        assert!(q.contains(&line), "missing {line:?} in\n{q}");
    }
    assert_eq!(
        q.matches(&key(3, "DRAM Uncorrectable", "2")).count(),
        2,
        "volatile and aggregate"
    );

    let csv = run_ok(
        &tree,
        &[
            "--query-gpu=ecc.errors.uncorrected.volatile.total,clocks_event_reasons.hw_thermal_slowdown,clocks_throttle_reasons.sw_thermal_slowdown,temperature.gpu",
            "--format=csv,noheader",
        ],
    );
    let rows: Vec<&str> = csv.lines().collect();
    let nvml_file = |gpu: usize| {
        std::fs::read_to_string(
            tree.root()
                .join(mockgpu_api::nvml::gpu_file(&tree.topo.gpus[gpu].bus_id)),
        )
        .unwrap()
    };
    let temperature = |gpu: usize| {
        nvml_file(gpu)
            .lines()
            .find_map(|l| l.strip_prefix("Temperature: "))
            .unwrap()
            .to_string()
    };
    assert_eq!(rows[0], format!("2, Active, Active, {}", temperature(0)));
    assert_eq!(
        rows[1],
        format!("0, Not Active, Not Active, {}", temperature(1))
    );
}

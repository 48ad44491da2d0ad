//! The summary table `nvidia-smi` prints without arguments, in the layout of its driver branch:
//! 580 and later close the header with `+---+`, older ones with `|---|`; 570 and later widen the
//! processes' PID column.

use std::fmt::Write as _;

use crate::info::{Gpu, ProcessRow, System};
use crate::words::{Stamp, compute_mode_short, cuda_version, mib, or_na, pstate, whole_watts};

const WIDTH: usize = 89;

fn rule(left: char, fill: char, joint: char) -> String {
    format!(
        "{left}{}{joint}{}{joint}{}{left}",
        fill.to_string().repeat(41),
        fill.to_string().repeat(24),
        fill.to_string().repeat(22)
    )
}

/// `on`/`off` of an `nvmlEnableState_t`, or `N/A`.
fn on_off(v: &crate::nvml::Val<u32>, on: &str, off: &str) -> String {
    or_na(v, |&s| if s == 0 { off } else { on }.to_string())
}

/// The name cell: names longer than the column are cut to their first 24 characters and `...`.
fn short_name(name: &str) -> String {
    if name.chars().count() > 28 {
        let cut: String = name.chars().take(24).collect();
        format!("{cut}...")
    } else {
        name.to_string()
    }
}

fn gpu_rows(out: &mut String, g: &Gpu) {
    let name = or_na(&g.name, |n| short_name(n));
    let bus_id = or_na(&g.bus_id().map(str::to_string), Clone::clone);
    let ecc = match (&g.ecc_mode, &g.ecc_volatile_uncorrected) {
        (Ok((0, _)), _) => "Off".to_string(),
        (Ok(_), count) => or_na(count, u64::to_string),
        (Err(e), _) => e.na().to_string(),
    };
    let fan = or_na(&g.fan_speed, |f| format!("{f}%"));
    let temp = or_na(&g.temperature, |t| format!("{t}C"));
    let perf = or_na(&g.performance_state, |&p| pstate(p));
    let usage = or_na(&g.power_draw, |&p| format!("{}W", whole_watts(p)));
    let cap = or_na(&g.enforced_power_limit, |&p| format!("{}W", whole_watts(p)));
    let (used, total) = match &g.memory {
        Ok(m) => (
            format!("{}MiB", mib(m.used)),
            format!("{}MiB", mib(m.total)),
        ),
        Err(e) => (e.na().to_string(), e.na().to_string()),
    };
    let util = or_na(&g.utilization, |(gpu, _)| format!("{gpu}%"));
    let mode = or_na(&g.compute_mode, |&m| compute_mode_short(m).to_string());
    let mig = or_na(&g.mig_mode, |&(cur, _)| {
        crate::words::enabled(cur).to_string()
    });
    let persistence = on_off(&g.persistence_mode, "On", "Off");
    let display = on_off(&g.display_active, "On", "Off");
    let _ = writeln!(
        out,
        "|{:>4}  {name:<31}{persistence:<3} |   {bus_id:<16} {display:>3} |{ecc:>21} |",
        g.index
    );
    let _ = writeln!(
        out,
        "|{fan:>4}{temp:>6}{perf:>6}{usage:>16} / {cap:>5} |{used:>11} / {total:>9} |{util:>8}{mode:>13} |"
    );
    let _ = writeln!(out, "|{:41}|{:24}|{mig:>21} |", "", "");
    let _ = writeln!(out, "{}", rule('+', '-', '+'));
}

fn process_row(out: &mut String, gpu: u32, p: &ProcessRow, pid_width: usize) {
    let mem = format!("{}MiB", mib(p.used_memory));
    let prefix = format!(
        "|{gpu:>5}{:>6}{:>5}{:>pid_width$}{:>7}   ",
        "N/A", "N/A", p.pid, "C"
    );
    let room = WIDTH + 2 - prefix.len() - mem.len() - 3;
    let name = or_na(&p.name, Clone::clone);
    let name = if name.chars().count() > room {
        let keep: String = name
            .chars()
            .skip(name.chars().count() - (room - 3))
            .collect();
        format!("...{keep}")
    } else {
        name
    };
    let _ = writeln!(out, "{prefix}{name:<room$} {mem} |");
}

/// The whole table, headed by `now`.
pub fn render(sys: &System, gpus: &[Gpu], now: &Stamp) -> String {
    let major = sys.driver_major().unwrap_or(580);
    let mut out = String::new();
    let full = "-".repeat(WIDTH);
    let blank = " ".repeat(WIDTH);
    let driver = or_na(&sys.driver, Clone::clone);
    let cuda = or_na(&sys.cuda, |&v| cuda_version(v));
    let _ = writeln!(out, "{}       ", now.ctime());
    let _ = writeln!(out, "+{full}+");
    let _ = writeln!(
        out,
        "| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|"
    );
    let _ = writeln!(
        out,
        "{}",
        if major >= 580 {
            rule('+', '-', '+')
        } else {
            rule('|', '-', '+')
        }
    );
    let _ = writeln!(
        out,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |"
    );
    let _ = writeln!(
        out,
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |"
    );
    let _ = writeln!(
        out,
        "|                                         |                        |               MIG M. |"
    );
    let _ = writeln!(out, "{}", rule('|', '=', '+'));
    for g in gpus {
        gpu_rows(&mut out, g);
    }
    // 580 leaves an empty line before the processes; older branches a line of spaces.
    let _ = writeln!(out, "{}", if major >= 580 { "" } else { &blank });
    let pid_width = if major >= 570 { 16 } else { 10 };
    let _ = writeln!(out, "+{full}+");
    let _ = writeln!(out, "| {:<88}|", "Processes:");
    let pid_header = format!("{:>w$}", "PID", w = pid_width + 1);
    let head = format!("|  GPU   GI   CI{pid_header}   Type   Process name");
    let _ = writeln!(out, "{head:<w$}GPU Memory |", w = WIDTH + 1 - 11);
    let _ = writeln!(out, "|        ID   ID{:<63}Usage      |", "");
    let _ = writeln!(out, "|{}|", "=".repeat(WIDTH));
    let rows: Vec<(u32, &ProcessRow)> = gpus
        .iter()
        .flat_map(|g| g.processes.iter().flatten().map(move |p| (g.index, p)))
        .collect();
    if rows.is_empty() {
        let _ = writeln!(out, "|  {:<87}|", "No running processes found");
    }
    for (gpu, p) in rows {
        process_row(&mut out, gpu, p, pid_width);
    }
    let _ = writeln!(out, "+{full}+");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::sample;
    use crate::nvml::{Memory, Ret};
    use crate::words::tests::STAMP;

    /// What the real tool printed for the sample H200 (driver 580.173.02).
    const H200: &str = "\
Tue Sep  1 20:41:56 2026       
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.173.02             Driver Version: 580.173.02     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:83:00.0 Off |                    0 |
| N/A   37C    P0             85W /  700W |       0MiB / 143771MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
";

    #[test]
    fn h200_table_matches_the_real_tool() {
        let out = render(&sample::system(), &[sample::h200()], &STAMP);
        for (i, (got, want)) in out.lines().zip(H200.lines()).enumerate() {
            assert_eq!(got, want, "line {i}");
        }
        assert_eq!(out, H200);
    }

    /// A four-GPU GB200 tray as the real tool printed it: 1200 W, 189471 MiB, one row block each.
    #[test]
    fn gb200_rows_align() {
        let gpus: Vec<Gpu> = (0..4u32)
            .map(|i| {
                let mut g = sample::h200();
                g.index = i;
                g.name = Ok("NVIDIA GB200".to_string());
                g.temperature = Ok(29);
                g.power_draw = Ok(162_000);
                g.enforced_power_limit = Ok(1_200_000);
                g.memory = Ok(Memory {
                    total: 189_471 * 1024 * 1024,
                    reserved: None,
                    used: 0,
                    free: 189_471 * 1024 * 1024,
                });
                g.pci.as_mut().unwrap().bus_id =
                    format!("0000000{}:01:00.0", [8, 9][i as usize % 2]);
                g
            })
            .collect();
        let out = render(&sample::system(), &gpus, &STAMP);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[8],
            "|   0  NVIDIA GB200                   On  |   00000008:01:00.0 Off |                    0 |"
        );
        assert_eq!(
            lines[9],
            "| N/A   29C    P0            162W / 1200W |       0MiB / 189471MiB |      0%      Default |"
        );
        assert_eq!(lines[11], rule('+', '-', '+'));
        assert!(lines[12].starts_with("|   1  NVIDIA GB200"));
        // four blocks of four lines after the eight of the header
        assert_eq!(lines[8 + 16], "");
        assert!(
            lines
                .iter()
                .all(|l| l.is_empty() || l.len() == 91 || l.starts_with("Tue"))
        );
    }

    #[test]
    fn older_branches_keep_their_rules_and_pid_column() {
        let mut sys = sample::system();
        sys.driver = Ok("550.90.12".to_string());
        let mut g = sample::h200();
        g.fan_speed = Ok(33);
        g.ecc_mode = Ok((0, 0));
        g.display_active = Err(Ret(3));
        let out = render(&sys, &[g], &STAMP);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[3], rule('|', '-', '+'));
        assert!(lines[8].ends_with("|   00000000:83:00.0 N/A |                  Off |"));
        assert!(lines[9].starts_with("| 33%   37C"));
        assert_eq!(lines[12], " ".repeat(89));
        assert_eq!(
            lines[15],
            "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |"
        );
    }

    #[test]
    fn processes_are_listed_in_the_table() {
        let mut g = sample::h200();
        g.processes = Ok(vec![ProcessRow {
            pid: 4242,
            name: Ok("python".to_string()),
            used_memory: 1024 * 1024 * 1024,
        }]);
        let out = render(&sample::system(), &[g], &STAMP);
        let row = out
            .lines()
            .find(|l| l.contains("4242"))
            .expect("a process row");
        assert_eq!(row.len(), 91);
        assert!(row.contains("python"));
        assert!(row.ends_with(" 1024MiB |"));
        assert!(!out.contains("No running processes found"));
    }
}

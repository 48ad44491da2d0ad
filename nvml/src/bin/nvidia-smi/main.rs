//! `nvidia-smi`: NVIDIA's System Management Interface over NVML, for mockgpu nodes.
//!
//! It reaches the GPUs only through `libnvidia-ml.so.1`, loaded by name as the real tool does;
//! collects what a format shows into plain structs ([`info`]) and formats them with pure
//! functions ([`summary`], [`query`], [`csv`], [`topo`]). Output and failures follow the real
//! tool: its messages on stdout and NVML's return code as the exit status.

mod args;
mod csv;
mod help;
mod info;
mod nvml;
mod query;
mod summary;
mod topo;
mod words;

use std::io::Write as _;
use std::process::ExitCode;

use args::Command;
use info::{Gpu, Listed, System, Topology};
use nvml::{Device, Found, Missing, Nvml, Ret, StartError};
use words::{Stamp, or_na};

const NO_LIBRARY: &str = "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display Driver is properly installed and present in your system.\nPlease also try adding directory that contains libnvidia-ml.so to your system PATH.";
const NO_DRIVER: &str = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.";
const NO_DEVICES: &str = "No devices were found";

/// A message for stdout and the exit status, as the real tool ends on failure.
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn new(message: impl Into<String>, ret: Ret) -> Self {
        Failure {
            message: message.into(),
            code: u8::try_from(ret.0).unwrap_or(255),
        }
    }
}

fn start() -> Result<Nvml, Failure> {
    Nvml::start().map_err(|e| match e {
        StartError::LibraryNotFound => Failure::new(NO_LIBRARY, Ret(12)),
        StartError::Init(Ret::DRIVER_NOT_LOADED) => Failure::new(NO_DRIVER, Ret::DRIVER_NOT_LOADED),
        StartError::Init(r) => {
            Failure::new(format!("Failed to initialize NVML: {}", r.message()), r)
        }
    })
}

/// The GPUs `-i` names (all of them without `-i`), with their indexes. A GPU fallen off the bus
/// is left out, its line added to `lost`, as the real tool reports it.
fn devices(
    nvml: &Nvml,
    sys: &System,
    ids: Option<&[String]>,
    lost: &mut Vec<String>,
) -> Result<Vec<(u32, Device)>, Failure> {
    let none = || Failure::new(NO_DEVICES, Ret::NOT_FOUND);
    let count = *sys
        .count
        .as_ref()
        .map_err(|&e| Failure::new(NO_DEVICES, e))?;
    if count == 0 {
        return Err(none());
    }
    let mut all = Vec::new();
    for i in 0..count {
        match nvml.by_index(i) {
            Err(m) if m.ret != Ret::GPU_IS_LOST => {
                return Err(Failure::new(
                    format!("Unable to determine the device handle: {}", m.ret.message()),
                    m.ret,
                ));
            }
            found => all.push((i, found)),
        }
    }
    let picked: Vec<(u32, Found)> = match ids {
        None => all,
        Some(ids) => ids
            .iter()
            .map(|id| {
                if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
                    let i: usize = id.parse().map_err(|_| none())?;
                    return all.get(i).copied().ok_or_else(none);
                }
                let found = if id.starts_with("GPU-") || id.starts_with("MIG-") {
                    nvml.by_uuid(id)
                } else if id.contains(':') {
                    nvml.by_bus_id(id)
                } else {
                    nvml.by_serial(id)
                };
                match found {
                    Ok(d) => Ok((nvml.index(d).map_err(|_| none())?, Ok(d))),
                    Err(m) if m.ret == Ret::GPU_IS_LOST => Ok((0, Err(m))),
                    Err(_) => Err(none()),
                }
            })
            .collect::<Result<_, _>>()?,
    };
    let mut out = Vec::new();
    for (i, found) in picked {
        match found {
            Ok(d) => out.push((i, d)),
            Err(m) => lost.push(lost_line(nvml, &m)),
        }
    }
    Ok(out)
}

/// The real tool's line for a GPU fallen off the bus, named by its bus id when NVML still gives
/// it (`Unable to determine the device handle for GPU0000:06:00.0: GPU is lost. …`).
fn lost_line(nvml: &Nvml, m: &Missing) -> String {
    let bus = m.handle.and_then(|d| nvml.pci(d).ok()).map_or_else(
        || "Unknown".to_string(),
        |p| format!("{:04X}:{:02X}:{:02X}.0", p.domain, p.bus, p.device),
    );
    format!(
        "Unable to determine the device handle for GPU{bus}: {}. Reboot the system to recover this GPU",
        m.ret.message()
    )
}

/// A GPU's line of `-L`: `GPU 0: NVIDIA GB300 (UUID: GPU-…)`.
fn list_line(g: &Listed) -> String {
    format!(
        "GPU {}: {} (UUID: {})\n",
        g.index,
        or_na(&g.name, Clone::clone),
        or_na(&g.uuid, Clone::clone)
    )
}

/// NVML started, and the system's values every format shows.
fn ready() -> Result<(Nvml, System), Failure> {
    let nvml = start()?;
    let sys = System::collect(&nvml);
    Ok((nvml, sys))
}

fn gpus(
    nvml: &Nvml,
    sys: &System,
    ids: Option<&[String]>,
    lost: &mut Vec<String>,
) -> Result<Vec<Gpu>, Failure> {
    Ok(devices(nvml, sys, ids, lost)?
        .into_iter()
        .map(|(i, d)| Gpu::collect(nvml, i, d))
        .collect())
}

/// Runs `cmd`; the lines of the GPUs found lost go to `lost`.
fn run(cmd: Command, lost: &mut Vec<String>) -> Result<String, Failure> {
    let now = Stamp::now();
    Ok(match cmd {
        Command::Help => help::text(),
        Command::HelpQueryGpu => csv::help(),
        Command::List { ids } => {
            let (nvml, sys) = ready()?;
            devices(&nvml, &sys, ids.as_deref(), lost)?
                .into_iter()
                .map(|(i, d)| list_line(&Listed::collect(&nvml, i, d)))
                .collect()
        }
        Command::Summary { ids } => {
            let (nvml, sys) = ready()?;
            summary::render(&sys, &gpus(&nvml, &sys, ids.as_deref(), lost)?, &now)
        }
        Command::Query { ids, display } => {
            let (nvml, sys) = ready()?;
            let gpus = gpus(&nvml, &sys, ids.as_deref(), lost)?;
            query::render(&sys, &gpus, display.as_deref(), &now)
        }
        Command::QueryGpu {
            ids,
            fields,
            header,
            units,
        } => {
            let (nvml, sys) = ready()?;
            let gpus = gpus(&nvml, &sys, ids.as_deref(), lost)?;
            let ctx = csv::Ctx {
                sys: &sys,
                now: &now,
            };
            csv::render(&ctx, &gpus, &fields, header, units)
        }
        Command::Topo => {
            let (nvml, sys) = ready()?;
            let all: Vec<Device> = devices(&nvml, &sys, None, lost)?
                .into_iter()
                .map(|(_, d)| d)
                .collect();
            topo::render(&Topology::collect(&nvml, &all))
        }
        Command::Version => {
            let (_nvml, sys) = ready()?;
            format!(
                "NVIDIA-SMI version  : {}\nNVML version        : {}\nDRIVER version      : {}\nCUDA Version        : {}\n",
                or_na(&sys.driver, Clone::clone),
                or_na(&sys.nvml, |v| words::nvml_version(v)),
                or_na(&sys.driver, Clone::clone),
                or_na(&sys.cuda, |&v| words::cuda_version(v)),
            )
        }
    })
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut lost = Vec::new();
    let (out, mut code) = match args::parse(&argv) {
        Err(args::Usage(message)) => (format!("{message}\n"), 2),
        Ok(cmd) => match run(cmd, &mut lost) {
            Ok(out) => (out, 0),
            Err(f) => (format!("{}\n", f.message), f.code),
        },
    };
    // A lost GPU is reported on stderr and ends the run with `GPU_IS_LOST`, the others shown.
    if !lost.is_empty() {
        eprintln!("{}", lost.join("\n"));
        if code == 0 {
            code = Ret::GPU_IS_LOST.0 as u8;
        }
    }
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::from(255);
    }
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_lines_as_the_real_tool_prints_them() {
        let g = Listed {
            index: 0,
            name: Ok("NVIDIA H200".to_string()),
            uuid: Ok("GPU-00000000-0000-0000-0000-000000000000".to_string()),
        };
        assert_eq!(
            list_line(&g),
            "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
        );
        let unknown = Listed {
            index: 3,
            name: Err(Ret::NOT_SUPPORTED),
            uuid: Err(Ret(999)),
        };
        assert_eq!(list_line(&unknown), "GPU 3: N/A (UUID: Unknown Error)\n");
    }
}

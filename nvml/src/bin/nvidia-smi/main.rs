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
use nvml::{Device, Nvml, Ret, StartError};
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

/// The GPUs `-i` names (all of them without `-i`), with their indexes.
fn devices(
    nvml: &Nvml,
    sys: &System,
    ids: Option<&[String]>,
) -> Result<Vec<(u32, Device)>, Failure> {
    let none = || Failure::new(NO_DEVICES, Ret::NOT_FOUND);
    let count = *sys
        .count
        .as_ref()
        .map_err(|&e| Failure::new(NO_DEVICES, e))?;
    if count == 0 {
        return Err(none());
    }
    let all: Vec<Device> = (0..count)
        .map(|i| nvml.by_index(i))
        .collect::<Result<_, _>>()
        .map_err(|e| {
            Failure::new(
                format!("Unable to determine the device handle: {}", e.message()),
                e,
            )
        })?;
    let Some(ids) = ids else {
        return Ok(all
            .into_iter()
            .enumerate()
            .map(|(i, d)| (i as u32, d))
            .collect());
    };
    ids.iter()
        .map(|id| {
            let found = if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
                let i: u32 = id.parse().map_err(|_| none())?;
                return all.get(i as usize).map(|&d| (i, d)).ok_or_else(none);
            } else if id.starts_with("GPU-") || id.starts_with("MIG-") {
                nvml.by_uuid(id)
            } else if id.contains(':') {
                nvml.by_bus_id(id)
            } else {
                nvml.by_serial(id)
            };
            let d = found.map_err(|_| none())?;
            let index = nvml.index(d).map_err(|_| none())?;
            Ok((index, d))
        })
        .collect()
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

fn gpus(nvml: &Nvml, sys: &System, ids: Option<&[String]>) -> Result<Vec<Gpu>, Failure> {
    Ok(devices(nvml, sys, ids)?
        .into_iter()
        .map(|(i, d)| Gpu::collect(nvml, i, d))
        .collect())
}

fn run(cmd: Command) -> Result<String, Failure> {
    let now = Stamp::now();
    Ok(match cmd {
        Command::Help => help::text(),
        Command::HelpQueryGpu => csv::help(),
        Command::List { ids } => {
            let (nvml, sys) = ready()?;
            devices(&nvml, &sys, ids.as_deref())?
                .into_iter()
                .map(|(i, d)| list_line(&Listed::collect(&nvml, i, d)))
                .collect()
        }
        Command::Summary { ids } => {
            let (nvml, sys) = ready()?;
            summary::render(&sys, &gpus(&nvml, &sys, ids.as_deref())?, &now)
        }
        Command::Query { ids, display } => {
            let (nvml, sys) = ready()?;
            let gpus = gpus(&nvml, &sys, ids.as_deref())?;
            query::render(&sys, &gpus, display.as_deref(), &now)
        }
        Command::QueryGpu {
            ids,
            fields,
            header,
            units,
        } => {
            let (nvml, sys) = ready()?;
            let gpus = gpus(&nvml, &sys, ids.as_deref())?;
            let ctx = csv::Ctx {
                sys: &sys,
                now: &now,
            };
            csv::render(&ctx, &gpus, &fields, header, units)
        }
        Command::Topo => {
            let (nvml, sys) = ready()?;
            let all: Vec<Device> = devices(&nvml, &sys, None)?
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
    let (out, code) = match args::parse(&argv) {
        Err(args::Usage(message)) => (format!("{message}\n"), 2),
        Ok(cmd) => match run(cmd) {
            Ok(out) => (out, 0),
            Err(f) => (format!("{}\n", f.message), f.code),
        },
    };
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

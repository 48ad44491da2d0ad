//! The command line, parsed as the real tool reads it: short and long flags, `--flag=value` or
//! `--flag value`, `-i` with indexes, UUIDs, PCI bus ids or serials, and the `topo` subcommand.

use crate::csv::{self, Field};
use crate::query::Display;

/// What to do.
pub enum Command {
    Summary {
        ids: Option<Vec<String>>,
    },
    List {
        ids: Option<Vec<String>>,
    },
    Query {
        ids: Option<Vec<String>>,
        display: Option<Vec<Display>>,
    },
    QueryGpu {
        ids: Option<Vec<String>>,
        fields: Vec<&'static Field>,
        header: bool,
        units: bool,
    },
    Topo,
    Version,
    Help,
    HelpQueryGpu,
}

/// A command line the tool rejects: the message, and the exit code (`2`, an invalid argument).
#[derive(Debug, PartialEq, Eq)]
pub struct Usage(pub String);

const INVALID: &str =
    "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.";

fn invalid() -> Usage {
    Usage(INVALID.to_string())
}

/// Splits `--flag=value`; takes the next argument for `--flag value`.
fn value<'a>(
    arg: &'a str,
    inline: Option<&'a str>,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a str, Usage> {
    match inline {
        Some(v) => Ok(v),
        None => rest.next().map(String::as_str).ok_or_else(|| {
            Usage(format!(
                "Option \"{arg}\" requires a value. Please run 'nvidia-smi -h' for help."
            ))
        }),
    }
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

pub fn parse(args: &[String]) -> Result<Command, Usage> {
    if args.first().map(String::as_str) == Some("topo") {
        return match args[1..].iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["-m"] | ["--matrix"] => Ok(Command::Topo),
            _ => Err(Usage(
                "Invalid combination of input arguments. Please run 'nvidia-smi topo -h' for help."
                    .to_string(),
            )),
        };
    }
    let (mut list_gpus, mut query, mut help, mut version, mut help_query) =
        (false, false, false, false, false);
    let mut ids = None;
    let mut display = None;
    let mut query_gpu = None;
    let mut format = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (arg.as_str(), None),
        };
        match flag {
            "-h" | "--help" => help = true,
            "--version" => version = true,
            "-L" | "--list-gpus" => list_gpus = true,
            "-q" | "--query" => query = true,
            "--help-query-gpu" => help_query = true,
            "-i" | "--id" => ids = Some(list(value(flag, inline, &mut rest)?)),
            "-d" | "--display" => {
                let names = list(value(flag, inline, &mut rest)?);
                let parsed = names
                    .iter()
                    .map(|n| {
                        Display::parse(n).ok_or_else(|| {
                            Usage(format!(
                                "\"{n}\" is not a valid display type. Please run 'nvidia-smi -h' for help."
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                display = Some(parsed);
            }
            "--query-gpu" => query_gpu = Some(value(flag, inline, &mut rest)?),
            "--format" => format = Some(value(flag, inline, &mut rest)?),
            _ => return Err(invalid()),
        }
    }
    if help {
        return Ok(Command::Help);
    }
    if help_query {
        return Ok(Command::HelpQueryGpu);
    }
    if version {
        return Ok(Command::Version);
    }
    if let Some(q) = query_gpu {
        if list_gpus || query || display.is_some() {
            return Err(invalid());
        }
        let fields = list(q)
            .iter()
            .map(|name| {
                csv::lookup(name).ok_or_else(|| {
                    Usage(format!("Field \"{name}\" is not a valid field to query.\n"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if fields.is_empty() {
            return Err(invalid());
        }
        let Some(format) = format else {
            return Err(Usage(
                "The option --format is required with --query-gpu (e.g. --format=csv). Please run 'nvidia-smi -h' for help."
                    .to_string(),
            ));
        };
        let opts = list(format);
        if !opts.iter().any(|o| o == "csv") {
            return Err(Usage(format!(
                "\"{format}\" is not a valid format: csv is mandatory. Please run 'nvidia-smi -h' for help."
            )));
        }
        if let Some(bad) = opts
            .iter()
            .find(|o| !["csv", "noheader", "nounits"].contains(&o.as_str()))
        {
            return Err(Usage(format!(
                "\"{bad}\" is not a valid format option. Please run 'nvidia-smi -h' for help."
            )));
        }
        return Ok(Command::QueryGpu {
            ids,
            fields,
            header: !opts.iter().any(|o| o == "noheader"),
            units: !opts.iter().any(|o| o == "nounits"),
        });
    }
    if format.is_some() || (list_gpus && query) || (display.is_some() && !query) {
        return Err(invalid());
    }
    if list_gpus {
        return Ok(Command::List { ids });
    }
    if query {
        return Ok(Command::Query { ids, display });
    }
    Ok(Command::Summary { ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, Usage> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn no_arguments_is_the_summary() {
        assert!(matches!(p(&[]), Ok(Command::Summary { ids: None })));
    }

    #[test]
    fn ids_take_both_spellings_and_lists() {
        let Ok(Command::List { ids: Some(ids) }) = p(&["-L", "-i", "0,GPU-abc"]) else {
            panic!("not a list");
        };
        assert_eq!(ids, ["0", "GPU-abc"]);
        let Ok(Command::Query {
            ids: Some(ids),
            display: Some(d),
        }) = p(&["-q", "--id=00000008:06:00.0", "-d", "MEMORY,power"])
        else {
            panic!("not a query");
        };
        assert_eq!(ids, ["00000008:06:00.0"]);
        assert_eq!(d, [Display::Memory, Display::Power]);
    }

    #[test]
    fn query_gpu_reads_fields_and_format() {
        let Ok(Command::QueryGpu {
            fields,
            header,
            units,
            ..
        }) = p(&[
            "--query-gpu=index,gpu_name,memory.total",
            "--format=csv,noheader",
        ])
        else {
            panic!("not a query-gpu");
        };
        let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["index", "name", "memory.total"]);
        assert!(!header);
        assert!(units);
    }

    #[test]
    fn unknown_fields_are_named_as_the_real_tool_does() {
        let Err(Usage(msg)) = p(&["--query-gpu=index,cuda_version", "--format=csv"]) else {
            panic!("accepted");
        };
        assert_eq!(
            msg,
            "Field \"cuda_version\" is not a valid field to query.\n"
        );
    }

    #[test]
    fn bad_command_lines_are_refused() {
        for args in [
            &["--query-gpu=index"][..],
            &["--query-gpu=index", "--format=json"],
            &["--query-gpu=index", "--format=csv,bogus"],
            &["-L", "-q"],
            &["-d", "MEMORY"],
            &["-q", "-d", "NOPE"],
            &["--frobnicate"],
            &["-i"],
            &["topo"],
        ] {
            assert!(p(args).is_err(), "{args:?} accepted");
        }
        assert_eq!(p(&["-x"]).err(), Some(invalid()));
    }

    #[test]
    fn topo_matrix() {
        assert!(matches!(p(&["topo", "-m"]), Ok(Command::Topo)));
        assert!(matches!(p(&["topo", "--matrix"]), Ok(Command::Topo)));
    }
}

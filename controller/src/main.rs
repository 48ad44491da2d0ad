use clap::{Parser, Subcommand};

/// mockgpu's central controller.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the GpuNode CustomResourceDefinition (YAML) for `kubectl apply -f -`.
    Crd,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", mockgpu_controller::crd::yaml()?),
    }
    Ok(())
}

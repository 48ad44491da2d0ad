//! `nvidia-smi -h`: the real tool's layout, listing what this one does.

/// The usage text.
pub fn text() -> String {
    format!(
        "\
NVIDIA System Management Interface -- mockgpu {version}

This nvidia-smi is mockgpu's. Like NVIDIA's, it reads the GPUs only through NVML: it loads
libnvidia-ml.so.1 by name, which on a mockgpu node is the mock NVML over the driver files the
agent serves, and on a real node is NVIDIA's. It prints the real tool's formats for the options
below; the device modification options and the other subcommands are not provided.

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.

          --version             Print version information and exit.

  LIST OPTIONS:

    -L,   --list-gpus           Display a list of GPUs connected to the system.

  SUMMARY OPTIONS:

    <no arguments>              Show a summary of GPUs connected to the system.

    [plus any of]

    -i,   --id=                 Target a specific GPU.

  QUERY OPTIONS:

    -q,   --query               Display GPU info.

    [plus any of]

    -i,   --id=                 Target a specific GPU.
    -d,   --display=            Display only selected information: MEMORY,
                                    UTILIZATION, ECC, TEMPERATURE, POWER, CLOCK,
                                    COMPUTE, PIDS, PERFORMANCE, PAGE_RETIREMENT,
                                    ROW_REMAPPER
                                Flags can be combined with comma e.g. ECC,POWER.

  SELECTIVE QUERY OPTIONS:

    Allows the caller to pass an explicit list of properties to query.

    --query-gpu                 Information about GPU.
                                Call --help-query-gpu for more info.

    [mandatory]

    --format=                   Comma separated list of format options:
                                  csv - comma separated values (MANDATORY)
                                  noheader - skip the first line with column headers
                                  nounits - don't print units for numerical
                                             values

    [plus any of]

    -i,   --id=                 Target a specific GPU.

  A GPU (-i) is named by its index, its UUID, its PCI bus id or its board serial number;
  several are separated by commas.

 TOPOLOGY:
    topo -m                     Display the GPUDirect communication matrix of the system.

Exit status: 0 on success; otherwise NVML's return code: 2 an invalid argument,
6 no GPU found, 9 no driver (no mock tree served), 12 no libnvidia-ml.so.1 found.
",
        version = env!("CARGO_PKG_VERSION")
    )
}

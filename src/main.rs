//! ferrok: Kubernetes in one executable.

mod cli;
mod store;

fn main() -> std::process::ExitCode {
    cli::main()
}

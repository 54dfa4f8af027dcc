//! ferrok: Kubernetes in one executable.

fn main() -> std::process::ExitCode {
    ferrok::cli::main()
}
